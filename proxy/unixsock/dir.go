package unixsock

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// dirEntry is what the directory checks read of one path: who owns it and
// its mode bits (as lstat gives them; st_mode).
type dirEntry struct {
	path string
	uid  uint32
	mode uint32
}

// checkDirs decides whether a socket directory is safe for uid: dir, the
// directory the socket goes in, must be a directory owned by uid (another
// user could swap the socket and receive the engines' frames and memory
// fds); every directory above it must be owned by uid or root, and must
// not be writable by group or others unless its sticky bit is set (as
// /tmp's is), since whoever can write a directory can rename what is in
// it and put their own in its place. trustParent accepts a directory
// above that is writable by group or others without the sticky bit (a
// Kubernetes emptyDir, which only the pod's containers can write). The
// ancestors' symlinks are skipped: who may replace one is decided by the
// directory it is in, which is in ancestors too. Pure: the caller stats.
func checkDirs(uid uint32, dir dirEntry, ancestors []dirEntry, trustParent bool) error {
	if dir.mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s is not a directory (mode %#o)", dir.path, dir.mode)
	}
	if dir.uid != uid {
		return fmt.Errorf("%s is owned by uid %d, not this sidecar's uid %d: that user could replace the socket and receive the engines' frames and memory; remove the directory or choose another path (control_socket, node.socket_dir)", dir.path, dir.uid, uid)
	}
	for _, a := range ancestors {
		if a.mode&unix.S_IFMT == unix.S_IFLNK {
			continue
		}
		if a.uid != uid && a.uid != 0 {
			return fmt.Errorf("%s, above the socket directory %s, is owned by uid %d (neither this sidecar's uid %d nor root): that user could rename %s and put their own in its place; choose a path under directories of yours or root's", a.path, dir.path, a.uid, uid, dir.path)
		}
		if a.mode&(unix.S_IWGRP|unix.S_IWOTH) != 0 && a.mode&unix.S_ISVTX == 0 && !trustParent {
			return fmt.Errorf("%s, above the socket directory %s, is writable by group or others without the sticky bit (mode %#o): any of them could rename %s and put their own in its place; chmod +t or go-w it, choose another path, or set security.trust_socket_parent when only trusted users can write it (a Kubernetes emptyDir)", a.path, dir.path, a.mode&0o7777, dir.path)
		}
	}
	return nil
}

// ancestorPaths lists the directories above dir, nearest first, up to /:
// of dir as written (made absolute) and, where it differs, of dir with
// its symlinks resolved.
func ancestorPaths(dir string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for _, p := range []string{abs, real} {
		for a := filepath.Dir(p); !seen[a]; a = filepath.Dir(a) {
			seen[a] = true
			out = append(out, a)
			if a == "/" {
				break
			}
		}
	}
	return out, nil
}

func lstatEntry(path string, follow bool) (dirEntry, error) {
	stat := os.Lstat
	if follow {
		stat = os.Stat
	}
	fi, err := stat(path)
	if err != nil {
		return dirEntry{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return dirEntry{}, fmt.Errorf("stat %s: no owner in %T", path, fi.Sys())
	}
	return dirEntry{path: path, uid: st.Uid, mode: st.Mode}, nil
}

// MakeDir makes dir (and what is missing above it) for a socket, checks
// it as checkDirs says (the error names the path and why), and chmods it
// 0700. trustParent: see checkDirs.
func MakeDir(dir string, trustParent bool) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("directory %s: %w", dir, err)
	}
	d, err := lstatEntry(dir, true)
	if err != nil {
		return fmt.Errorf("directory %s: %w", dir, err)
	}
	paths, err := ancestorPaths(dir)
	if err != nil {
		return fmt.Errorf("directory %s: %w", dir, err)
	}
	anc := make([]dirEntry, 0, len(paths))
	for _, p := range paths {
		e, err := lstatEntry(p, false)
		if err != nil {
			return fmt.Errorf("directory %s: above it: %w", dir, err)
		}
		anc = append(anc, e)
	}
	if err := checkDirs(uint32(os.Geteuid()), d, anc, trustParent); err != nil {
		return fmt.Errorf("refusing socket directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("directory %s: chmod 0700: %w", dir, err)
	}
	return nil
}
