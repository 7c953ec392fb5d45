package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/internal/certgen"
)

func tlsYAML(cert, key, ca string) string {
	return fmt.Sprintf("security:\n  tls:\n    cert_file: %q\n    key_file: %q\n    ca_file: %q\n", cert, key, ca)
}

// TestTLSBadConfig: staged refuses to start on TLS files that cannot work,
// and says which key and why.
func TestTLSBadConfig(t *testing.T) {
	dir := t.TempDir()
	ca, err := certgen.NewCA("e2e", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := ca.WriteCA(caFile); err != nil {
		t.Fatal(err)
	}
	a, err := ca.WriteLeaf(dir, certgen.Leaf{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := ca.WriteLeaf(dir, certgen.Leaf{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	old, err := ca.WriteLeaf(dir, certgen.Leaf{Name: "old", NotBefore: time.Now().Add(-72 * time.Hour), ValidFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"key of another certificate", tlsYAML(a.Cert, b.Key, caFile), "security.tls.cert_file: cannot load it with key_file"},
		{"expired certificate", tlsYAML(old.Cert, old.Key, caFile), "security.tls.cert_file: certificate expired at"},
		{"missing CA file", tlsYAML(a.Cert, a.Key, filepath.Join(dir, "nope.crt")), "security.tls.ca_file: cannot read it"},
		{"no key", fmt.Sprintf("security:\n  tls:\n    cert_file: %q\n    ca_file: %q\n", a.Cert, caFile), "security.tls.key_file: empty"},
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
			if strings.Contains(string(out), "panic") || !strings.Contains(string(out), tc.want) {
				t.Fatalf("output does not say %q:\n%s", tc.want, out)
			}
		})
	}
}
