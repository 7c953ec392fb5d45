package containere2e

// A container runtime just big enough for the test, since no daemon (Docker,
// podman) runs where it runs: the image's layers unpacked into a root
// filesystem (go-containerregistry's mutate.Extract applies them in order
// and honours whiteouts), and each container a process of this test binary
// re-executed in new mount, PID, UTS and IPC namespaces that joins its pod's
// network namespace, mounts /proc, a /dev of its own and its volumes, makes
// the root read-only, chroots, drops every capability, sets
// no_new_privs, becomes the image's user and executes the image's
// entrypoint, which is then PID 1 of its container as under a real
// runtime.

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/sys/unix"
)

// initEnv carries a container's spec to the re-executed test binary.
const initEnv = "STAGE_IMAGE_TEST_CONTAINER_INIT"

func TestMain(m *testing.M) {
	if s := os.Getenv(initEnv); s != "" {
		containerInit(s) // does not return
	}
	os.Exit(m.Run())
}

// mount is a bind mount from the host into a container.
type mount struct {
	Source, Target string
	ReadOnly       bool
}

// spec is what one container runs, and where.
type spec struct {
	Root     string // the unpacked image; mounted read-only
	NetNS    string // the pod's network namespace, /run/netns/NAME
	Hostname string
	Mounts   []mount
	UID, GID int
	Dir      string
	Env      []string
	Args     []string
}

// containerInit runs in the re-executed test binary, PID 1 of a new PID
// namespace: it sets the container up and executes its process, or exits
// 127 saying what failed.
func containerInit(encoded string) {
	runtime.LockOSThread() // setns changes this thread, which then executes the process
	var s spec
	err := json.Unmarshal([]byte(encoded), &s)
	if err == nil && len(s.Args) == 0 {
		err = errors.New("no command: the image config has no entrypoint or cmd, and none was given")
	}
	if err == nil {
		err = s.enter()
	}
	fmt.Fprintf(os.Stderr, "container init: %v\n", err)
	os.Exit(127)
}

// enter sets the container up and executes its process; it returns only
// on failure.
func (s *spec) enter() error {
	// Nothing mounted here reaches the host: it all goes with the
	// namespace when the container's last process ends.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if err := unix.Mount(s.Root, s.Root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mounting the root %s: %w", s.Root, err)
	}
	in := func(p string) string { return filepath.Join(s.Root, p) }
	if err := unix.Mount("proc", in("/proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	if err := s.mountDev(in("/dev")); err != nil {
		return err
	}
	for _, m := range s.Mounts {
		if err := unix.Mount(m.Source, in(m.Target), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s on %s: %w", m.Source, m.Target, err)
		}
		if m.ReadOnly {
			if err := unix.Mount("", in(m.Target), "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
				return fmt.Errorf("making %s read-only: %w", m.Target, err)
			}
		}
	}
	if err := unix.Mount("", s.Root, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("making the root read-only: %w", err)
	}
	ns, err := unix.Open(s.NetNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the pod's network namespace %s: %w", s.NetNS, err)
	}
	err = unix.Setns(ns, unix.CLONE_NEWNET)
	unix.Close(ns)
	if err != nil {
		return fmt.Errorf("joining the pod's network namespace %s: %w", s.NetNS, err)
	}
	if err := unix.Sethostname([]byte(s.Hostname)); err != nil {
		return fmt.Errorf("setting the hostname: %w", err)
	}
	if err := unix.Chroot(s.Root); err != nil {
		return fmt.Errorf("chroot %s: %w", s.Root, err)
	}
	if err := unix.Chdir(s.Dir); err != nil {
		return fmt.Errorf("entering the working directory %s: %w", s.Dir, err)
	}
	exe, err := lookPath(s.Args[0], s.Env)
	if err != nil {
		return err
	}
	// Like docker's --cap-drop ALL --security-opt no-new-privileges: no
	// capability can come back, not even through a setuid binary.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	for c := 0; ; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) {
				break // past the last capability
			}
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
		}
	}
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("clearing supplementary groups: %w", err)
	}
	if err := syscall.Setgid(s.GID); err != nil {
		return fmt.Errorf("setgid %d: %w", s.GID, err)
	}
	if err := syscall.Setuid(s.UID); err != nil {
		return fmt.Errorf("setuid %d: %w", s.UID, err)
	}
	// A change of user clears the parent-death signal: set it again, so
	// the container dies with the test however the test ends.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("setting the parent-death signal: %w", err)
	}
	if err := syscall.Exec(exe, s.Args, s.Env); err != nil {
		return fmt.Errorf("executing %s: %w", exe, err)
	}
	return nil
}

// mountDev gives the container a /dev of its own: a tmpfs with the usual
// character devices bound from the host's, and /dev/shm.
func (s *spec) mountDev(dev string) error {
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=65536k"); err != nil {
		return fmt.Errorf("mounting /dev: %w", err)
	}
	for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		if _, err := os.Stat("/dev/" + d); err != nil {
			continue // the host has none to lend
		}
		p := filepath.Join(dev, d)
		if err := os.WriteFile(p, nil, 0o666); err != nil {
			return fmt.Errorf("making /dev/%s: %w", d, err)
		}
		if err := unix.Mount("/dev/"+d, p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding /dev/%s: %w", d, err)
		}
	}
	for l, to := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(to, filepath.Join(dev, l)); err != nil {
			return fmt.Errorf("making /dev/%s: %w", l, err)
		}
	}
	shm := filepath.Join(dev, "shm")
	if err := os.Mkdir(shm, 0o1777); err != nil {
		return fmt.Errorf("making /dev/shm: %w", err)
	}
	if err := unix.Mount("shm", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size=65536k"); err != nil {
		return fmt.Errorf("mounting /dev/shm: %w", err)
	}
	return nil
}

// lookPath finds a command in the PATH of env, inside the chroot.
func lookPath(cmd string, env []string) (string, error) {
	if strings.Contains(cmd, "/") {
		return cmd, nil
	}
	var dirs string
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			dirs = v
		}
	}
	for _, d := range filepath.SplitList(dirs) {
		p := filepath.Join(d, cmd)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found in the image's PATH %q", cmd, dirs)
}

// unpack writes the image's filesystem, its layers applied in order, into
// dir (which must be empty), and returns how many device nodes and FIFOs
// it left out (the runtime's /dev stands for them). Every write goes
// through an os.Root, so no entry (a path with "..", a symlink) reaches
// outside dir.
func unpack(img v1.Image, dir string) (skipped int, err error) {
	rc := mutate.Extract(img)
	defer rc.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, fmt.Errorf("opening %s: %w", dir, err)
	}
	defer root.Close()
	// Hard links are made last: a link may come before its target, as
	// Extract writes the upper layers first.
	var links [][2]string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return skipped, fmt.Errorf("reading the image's layers: %w", err)
		}
		name := entryName(h.Name)
		if name == "" {
			continue // the root directory itself
		}
		if parent := path.Dir(name); parent != "." {
			if err := root.MkdirAll(parent, 0o755); err != nil {
				return skipped, fmt.Errorf("unpacking %s: %w", name, err)
			}
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return skipped, fmt.Errorf("unpacking %s: %w", name, err)
			}
		case tar.TypeReg:
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				return skipped, fmt.Errorf("unpacking %s: %w", name, err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return skipped, fmt.Errorf("unpacking %s: %w", name, err)
			}
		case tar.TypeSymlink:
			if err := root.Symlink(h.Linkname, name); err != nil {
				return skipped, fmt.Errorf("unpacking %s: %w", name, err)
			}
			if err := root.Lchown(name, h.Uid, h.Gid); err != nil {
				return skipped, fmt.Errorf("unpacking %s: %w", name, err)
			}
			continue
		case tar.TypeLink:
			links = append(links, [2]string{entryName(h.Linkname), name})
			continue
		default: // devices, FIFOs
			skipped++
			continue
		}
		// Owner first: chown clears the setuid and setgid bits.
		if err := root.Lchown(name, h.Uid, h.Gid); err != nil {
			return skipped, fmt.Errorf("unpacking %s: %w", name, err)
		}
		mode := h.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		if err := root.Chmod(name, mode); err != nil {
			return skipped, fmt.Errorf("unpacking %s: %w", name, err)
		}
	}
	for _, l := range links {
		if err := root.Link(l[0], l[1]); err != nil {
			return skipped, fmt.Errorf("unpacking the hard link %s: %w", l[1], err)
		}
	}
	return skipped, nil
}

// entryName is a layer entry's path relative to the root ("" for the root).
func entryName(n string) string {
	return strings.TrimPrefix(path.Clean("/"+n), "/")
}

// logBuffer collects a container's output.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// container is one running container.
type container struct {
	name string
	cmd  *exec.Cmd
	out  logBuffer
	done chan struct{}
	err  error // how it ended; read after done
}

// startContainer starts s as a container; the caller stops it.
func startContainer(name string, s spec) (*container, error) {
	enc, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", name, err)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("container %s: finding the test binary: %w", name, err)
	}
	c := &container{name: name, done: make(chan struct{})}
	c.cmd = exec.Command(self)
	c.cmd.Env = []string{initEnv + "=" + string(enc)}
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	c.cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting container %s: %w", name, err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// exited reports whether the container has ended.
func (c *container) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// exitCode is the container's exit status, or -1 when a signal ended it.
func (c *container) exitCode() int { return c.cmd.ProcessState.ExitCode() }

// wait waits up to within for the container to end; false if it did not.
func (c *container) wait(within time.Duration) bool {
	select {
	case <-c.done:
		return true
	case <-time.After(within):
		return false
	}
}

// kill ends the container (its init, PID 1 of its namespace, takes every
// other process of it along) and waits for it.
func (c *container) kill() {
	if !c.exited() {
		_ = c.cmd.Process.Kill()
	}
	<-c.done
}

// run runs a command as a one-shot container and returns its output and
// exit status; an error means it could not be started or did not end
// within the context's time.
func runContainer(ctx context.Context, name string, s spec) (string, int, error) {
	c, err := startContainer(name, s)
	if err != nil {
		return "", 0, err
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		c.kill()
		return c.out.String(), 0, fmt.Errorf("%s (%s): %w", name, strings.Join(s.Args, " "), ctx.Err())
	}
	return c.out.String(), c.exitCode(), nil
}

// imageUser parses the config's User, which must be numeric (uid or
// uid:gid): the test does not look names up.
func imageUser(u string) (uid, gid int, err error) {
	us, gs, hasGroup := strings.Cut(u, ":")
	if uid, err = strconv.Atoi(us); err != nil {
		return 0, 0, fmt.Errorf("the image's user %q is not numeric", u)
	}
	gid = uid
	if hasGroup {
		if gid, err = strconv.Atoi(gs); err != nil {
			return 0, 0, fmt.Errorf("the image's group in %q is not numeric", u)
		}
	}
	return uid, gid, nil
}

// ip runs iproute2's ip.
func ip(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
