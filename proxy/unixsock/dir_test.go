package unixsock

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCheckDirs(t *testing.T) {
	const me, other = 1000, 1001
	dir := func(uid uint32, perm uint32) dirEntry {
		return dirEntry{path: "/run/x/stage", uid: uid, mode: unix.S_IFDIR | perm}
	}
	up := func(path string, uid uint32, perm uint32) dirEntry {
		return dirEntry{path: path, uid: uid, mode: unix.S_IFDIR | perm}
	}
	root := up("/", 0, 0o755)
	for _, tc := range []struct {
		name  string
		dir   dirEntry
		anc   []dirEntry
		trust bool
		want  string // "": accepted
	}{
		{"ours under root's", dir(me, 0o700), []dirEntry{up("/run/x", 0, 0o755), root}, false, ""},
		{"ours under tmp", dir(me, 0o755), []dirEntry{up("/tmp", 0, 0o777|unix.S_ISVTX), root}, false, ""},
		{"ours under our own", dir(me, 0o700), []dirEntry{up("/run/x", me, 0o700), root}, false, ""},
		{"another user's", dir(other, 0o700), []dirEntry{root}, false, "owned by uid 1001, not this sidecar's uid 1000"},
		{"root's, we are not root", dir(0, 0o700), []dirEntry{root}, false, "owned by uid 0"},
		{"not a directory", dirEntry{path: "/run/x/stage", uid: me, mode: unix.S_IFREG | 0o600}, nil, false, "not a directory"},
		{"parent another user's", dir(me, 0o700), []dirEntry{up("/run/x", other, 0o755), root}, false, "/run/x, above the socket directory /run/x/stage, is owned by uid 1001"},
		{"parent world-writable", dir(me, 0o700), []dirEntry{up("/run/x", 0, 0o777), root}, false, "/run/x, above the socket directory /run/x/stage, is writable by group or others without the sticky bit (mode 0777)"},
		{"parent group-writable", dir(me, 0o700), []dirEntry{up("/run/x", me, 0o770), root}, false, "without the sticky bit (mode 0770)"},
		{"grandparent world-writable", dir(me, 0o700), []dirEntry{up("/run/x", me, 0o755), up("/run", 0, 0o777), root}, false, "/run, above"},
		{"world-writable parent trusted", dir(me, 0o700), []dirEntry{up("/run/x", 0, 0o777), root}, true, ""},
		{"trusted, yet another user's parent", dir(me, 0o700), []dirEntry{up("/run/x", other, 0o777), root}, true, "owned by uid 1001"},
		{"symlink above skipped", dir(me, 0o700), []dirEntry{{path: "/var/run", uid: other, mode: unix.S_IFLNK | 0o777}, root}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkDirs(me, tc.dir, tc.anc, tc.trust)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("got %v, want accepted", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestListenRefusesUnsafeDir: issue 35, item 2, on a real file system. A
// socket directory made beforehand by another user, or one inside a
// directory everyone may write without the sticky bit, is refused with
// the path and the reason; the socket is never created there.
func TestListenRefusesUnsafeDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a directory to another uid (chown)")
	}
	base := filepath.Join(t.TempDir(), "base")
	if err := os.Mkdir(base, 0o755); err != nil {
		t.Fatal(err)
	}
	theirs := filepath.Join(base, "theirs")
	if err := os.Mkdir(theirs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	sticky := filepath.Join(base, "sticky")
	if err := os.Mkdir(sticky, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sticky, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		path  string
		trust bool
		want  string
	}{
		{"another uid's directory", filepath.Join(theirs, "s.sock"), false, theirs + " is owned by uid 65534"},
		{"world-writable parent", filepath.Join(open, "stage", "s.sock"), false, open + ", above the socket directory " + filepath.Join(open, "stage") + ", is writable by group or others without the sticky bit"},
		{"world-writable parent, trusted", filepath.Join(open, "stage2", "s.sock"), true, ""},
		{"sticky parent", filepath.Join(sticky, "stage", "s.sock"), false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := Listen(tc.path, tc.trust)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Listen: %v", err)
				}
				_ = ln.Close()
				return
			}
			if err == nil {
				_ = ln.Close()
				t.Fatalf("Listen(%s): got nil error, want one containing %q", tc.path, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if _, err := os.Lstat(tc.path); !os.IsNotExist(err) {
				t.Errorf("socket %s exists after the refusal (%v)", tc.path, err)
			}
		})
	}
	st, err := os.Stat(theirs)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o700 {
		t.Errorf("the refused directory's mode changed to %#o", st.Mode().Perm())
	}
}
