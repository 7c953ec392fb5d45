package sidecars

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// TokenEnv carries the peers' shared token to a started sidecar.
const TokenEnv = "STAGE_SECURITY_TOKEN"

// readyPrefix starts the line staged prints on stdout once it serves.
const readyPrefix = "staged ready "

// DefaultReadyTimeout is how long Start waits for the ready line.
const DefaultReadyTimeout = 15 * time.Second

// tailLines is how much of the log an error carries.
const tailLines = 30

// Options says how to start one sidecar.
type Options struct {
	Bin    string   // the staged binary
	Dir    string   // where NAME.yaml and NAME.log go
	Name   string   // names the files and the errors
	Config string   // the YAML the sidecar runs with (see Config)
	Token  string   // the peers' shared token (TokenEnv); empty: none set
	Env    []string // more environment, after this process's own
	Args   []string // more flags, after --config

	// ReadyTimeout bounds the wait for the ready line (0: DefaultReadyTimeout).
	ReadyTimeout time.Duration
	// DieWithParent asks the kernel to send SIGTERM to the sidecar when
	// the thread that started it exits: a killed stagectl takes its
	// sidecars with it.
	DieWithParent bool
}

// Process is a started, ready staged.
type Process struct {
	Name string
	Cmd  *exec.Cmd
	// From the ready line: where peers dial, the control socket, and the
	// metrics and profiler addresses when they serve ("" otherwise).
	Peers, Socket, Metrics, Pprof string
	ConfigPath, LogPath           string

	done chan struct{} // closed once the process has exited
	err  error         // its exit status; read after done
}

// Start writes the config, starts the sidecar and waits for its ready line.
// If the sidecar exits first, does not get ready in time or ctx ends, it
// is killed and the error carries its log's tail.
func Start(ctx context.Context, o Options) (*Process, error) {
	p := &Process{Name: o.Name, ConfigPath: filepath.Join(o.Dir, o.Name+".yaml"), LogPath: filepath.Join(o.Dir, o.Name+".log"),
		done: make(chan struct{})}
	if err := os.WriteFile(p.ConfigPath, []byte(o.Config), 0o600); err != nil {
		return nil, fmt.Errorf("sidecar %s: write its config: %w", o.Name, err)
	}
	logf, err := os.Create(p.LogPath)
	if err != nil {
		return nil, fmt.Errorf("sidecar %s: create its log: %w", o.Name, err)
	}
	p.Cmd = exec.Command(o.Bin, append([]string{"--config", p.ConfigPath}, o.Args...)...)
	p.Cmd.Env = os.Environ()
	if o.Token != "" {
		p.Cmd.Env = append(p.Cmd.Env, TokenEnv+"="+o.Token)
	}
	p.Cmd.Env = append(p.Cmd.Env, o.Env...)
	if o.DieWithParent {
		p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	}
	p.Cmd.Stderr = logf
	out, err := p.Cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, fmt.Errorf("sidecar %s: %w", o.Name, err)
	}
	if err := p.Cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("sidecar %s: start %s: %w", o.Name, o.Bin, err)
	}
	ready := make(chan string, 1)
	go readReady(out, ready)
	go func() {
		p.err = p.Cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	timeout := o.ReadyTimeout
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case line := <-ready:
		p.parseReady(line)
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("sidecar %s exited before it was ready (%w); its log:\n%s", o.Name, p.exitErr(), p.Tail(tailLines))
	case <-timer.C:
		p.kill()
		return nil, fmt.Errorf("sidecar %s not ready after %v; its log:\n%s", o.Name, timeout, p.Tail(tailLines))
	case <-ctx.Done():
		p.kill()
		return nil, fmt.Errorf("sidecar %s: waiting for it to get ready: %w", o.Name, ctx.Err())
	}
}

// readReady hands on the first ready line and reads stdout to its end, so
// that the sidecar never blocks on a full pipe.
func readReady(out io.Reader, ready chan<- string) {
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, readyPrefix) {
			select {
			case ready <- line:
			default:
			}
		}
	}
}

// parseReady reads the key=value fields of the ready line.
func (p *Process) parseReady(line string) {
	for _, f := range strings.Fields(strings.TrimPrefix(line, readyPrefix)) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "peers":
			p.Peers = v
		case "socket":
			p.Socket = v
		case "metrics":
			p.Metrics = v
		case "pprof":
			p.Pprof = v
		}
	}
}

// kill ends a process that never got ready and waits for it.
func (p *Process) kill() {
	_ = p.Cmd.Process.Kill()
	<-p.done
}

// exitErr is the exit status, never nil: a sidecar exiting 0 before it is
// ready is a failure too.
func (p *Process) exitErr() error {
	if p.err == nil {
		return errors.New("exit status 0")
	}
	return p.err
}

// Exited is closed once the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.done }

// Err is the process's exit status (nil: it exited 0); valid once Exited
// is closed.
func (p *Process) Err() error { return p.err }

// Stop sends sig and waits up to timeout for the process to exit; past
// it, the process is killed. An exit with a non-zero status, or a kill, is
// an error carrying the log's tail. A process that has already exited is
// not signalled: its exit status is returned.
func (p *Process) Stop(sig os.Signal, timeout time.Duration) error {
	select {
	case <-p.done:
	default:
		_ = p.Cmd.Process.Signal(sig)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("sidecar %s exited with %w; its log:\n%s", p.Name, p.err, p.Tail(tailLines))
		}
		return nil
	case <-timer.C:
		p.kill()
		return fmt.Errorf("sidecar %s did not exit within %v of %v (killed); its log:\n%s", p.Name, timeout, sig, p.Tail(tailLines))
	}
}

// Tail returns the last n lines of the log.
func (p *Process) Tail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// LogHas reports whether the log holds s.
func (p *Process) LogHas(s string) bool {
	b, _ := os.ReadFile(p.LogPath)
	return strings.Contains(string(b), s)
}
