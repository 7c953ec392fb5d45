package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBadConfig: staged refuses a config with an unknown key or a bad
// value, naming the key path, and exits non-zero.
func TestBadConfig(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown key", "staging:\n  slotz: 3\n", "staging.slotz"},
		{"bad value", "staging:\n  slot_size: 1KiB\n", "staging.slot_size"},
		{"bad route", "routes:\n  - name: r\n    peers: [\"nohost\"]\n", "routes[0].peers[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".yaml")
			if err := os.WriteFile(p, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(stagedBin, "--config", p)
			cmd.Env = append(os.Environ(), "STAGE_SECURITY_TOKEN=x", "STAGE_CONTROL_SOCKET="+filepath.Join(dir, "s.sock"))
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("staged accepted the config; output:\n%s", out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("output does not name %q:\n%s", tc.want, out)
			}
		})
	}
}

// TestStartupErrors: a sidecar that cannot start says why and exits
// non-zero (no panic): its peer port is taken, or its socket is served.
func TestStartupErrors(t *testing.T) {
	first := startNode(t, "first", nodeOpts{})
	dir := t.TempDir()
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"peer port taken", fmt.Sprintf("listen: %s\ncontrol_socket: %s/s/a.sock\n", first.peers, dir), "listen for peers on " + first.peers},
		{"socket served", fmt.Sprintf("listen: 127.0.0.1:0\ncontrol_socket: %s\n", first.socket), "another staged is serving it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".yaml")
			if err := os.WriteFile(p, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(stagedBin, "--config", p)
			cmd.Env = append(os.Environ(), "STAGE_SECURITY_TOKEN=x")
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("staged started; output:\n%s", out)
			}
			if strings.Contains(string(out), "panic") || !strings.Contains(string(out), tc.want) {
				t.Fatalf("output does not say %q (or panicked):\n%s", tc.want, out)
			}
		})
	}
}
