package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/stage-kv/stage/internal/certgen"
)

// sidecar is a staged process started by stagectl (demo, local benchmarks).
type sidecar struct {
	name   string
	cmd    *exec.Cmd
	peers  string // address peers dial
	socket string
	pprof  string // profiler address, when started with --pprof
	log    string
	exited chan error
}

// stagedPath finds staged: the flag, else beside this executable, else PATH.
func stagedPath(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "staged")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("staged")
	if err != nil {
		return "", fmt.Errorf("cannot find the staged binary beside stagectl or on PATH; build it (make build) or pass --staged")
	}
	return p, nil
}

func randomToken() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// startSidecar writes cfgYAML to dir/name.yaml and starts staged with it
// and any extra flags, waiting for its "staged ready" line.
func startSidecar(ctx context.Context, bin, dir, name, cfgYAML, token string, extra ...string) (*sidecar, error) {
	cfgPath := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(cfgYAML), 0o600); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, append([]string{"--config", cfgPath}, extra...)...)
	cmd.Env = append(os.Environ(), "STAGE_SECURITY_TOKEN="+token)
	// If stagectl dies (a closed pipe, a kill), its sidecars go with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	sc := &sidecar{name: name, cmd: cmd, log: logPath, exited: make(chan error, 1)}
	ready := make(chan string, 1)
	go func() {
		r := bufio.NewScanner(out)
		for r.Scan() {
			line := r.Text()
			if strings.HasPrefix(line, "staged ready ") {
				select {
				case ready <- line:
				default:
				}
			}
		}
	}()
	go func() {
		err := cmd.Wait()
		logf.Close()
		sc.exited <- err
	}()
	select {
	case line := <-ready:
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "peers="); ok {
				sc.peers = v
			}
			if v, ok := strings.CutPrefix(f, "socket="); ok {
				sc.socket = v
			}
			if v, ok := strings.CutPrefix(f, "pprof="); ok {
				sc.pprof = v
			}
		}
		return sc, nil
	case err := <-sc.exited:
		return nil, fmt.Errorf("sidecar %s exited before it was ready (%v); its log:\n%s", name, err, tail(logPath, 20))
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("sidecar %s not ready after 15s; its log:\n%s", name, tail(logPath, 20))
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		return nil, ctx.Err()
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (sc *sidecar) stop() error {
	_ = sc.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-sc.exited:
		if err != nil {
			return fmt.Errorf("sidecar %s exited with %v; its log:\n%s", sc.name, err, tail(sc.log, 20))
		}
		return nil
	case <-time.After(20 * time.Second):
		_ = sc.cmd.Process.Kill()
		return fmt.Errorf("sidecar %s did not exit within 20s of SIGTERM", sc.name)
	}
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// sidecarYAML is a config for a local sidecar, on top of the embedded default.
// transport is the route's transport (auto, tcp, ipc, shm).
func sidecarYAML(name, socket string, dev engineDevice, slot string, slots int, route, peer string, stripes int, transport string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "node:\n  name: %s\nlisten: 127.0.0.1:0\ncontrol_socket: %s\n", name, socket)
	fmt.Fprintf(&b, "device:\n  kind: %s\n  ordinal: %d\n", dev.kind, dev.ordinal)
	fmt.Fprintf(&b, "staging:\n  slot_size: %s\n  slots: %d\n  window: %d\n", slot, slots, slots/2)
	fmt.Fprintf(&b, "log:\n  level: info\n")
	if route != "" {
		fmt.Fprintf(&b, "routes:\n  - name: %s\n    peers: [%q]\n    stripes: %d\n    transport: %s\n", route, peer, stripes, transport)
	}
	return b.String()
}

// throwawayTLS makes a CA and a certificate for each of the two sidecars
// in dir, and returns the security.tls YAML of each.
func throwawayTLS(dir string) (decode, prefill string, err error) {
	set, err := certgen.WriteSet(dir, "decode", "prefill")
	if err != nil {
		return "", "", err
	}
	yaml := func(name string) string {
		f := set.Leaves[name]
		return fmt.Sprintf("security:\n  tls:\n    cert_file: %q\n    key_file: %q\n    ca_file: %q\n", f.Cert, f.Key, set.CA)
	}
	return yaml("decode"), yaml("prefill"), nil
}
