package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/internal/certgen"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

func tlsYAML(cert, key, ca string) string {
	return fmt.Sprintf("security:\n  tls:\n    cert_file: %q\n    key_file: %q\n    ca_file: %q\n", cert, key, ca)
}

// setYAML is a throwaway CA with leaves for decode and prefill.
type setYAML struct{ *certgen.Set }

func testPKI(t *testing.T) setYAML {
	t.Helper()
	set, err := certgen.WriteSet(t.TempDir(), "decode", "prefill")
	if err != nil {
		t.Fatal(err)
	}
	return setYAML{set}
}

// of is security.tls for the named sidecar.
func (s setYAML) of(name string) string {
	f := s.Leaves[name]
	return tlsYAML(f.Cert, f.Key, s.CA)
}

// TestTLSMoves pushes and pulls between two staged processes on mutual
// TLS, byte-exact, and leaves nothing behind.
func TestTLSMoves(t *testing.T) {
	y := testPKI(t)
	pre, dec := pair(t, nodeOpts{stripes: 2, slots: 8, extra: y.of("prefill"), decExtra: y.of("decode")})
	for _, tc := range []struct {
		name string
		dir  wire.Direction
	}{{"push", wire.Push}, {"pull", wire.Pull}} {
		t.Run(tc.name, func(t *testing.T) {
			var S, D *kvsim.Cache
			if tc.dir == wire.Push {
				S, D = caches(t, pre, dec, 2, 16<<20)
			} else {
				S, D = caches(t, dec, pre, 2, 16<<20)
			}
			ms := kvsim.Blocks(S, 64<<10, 7)
			if tc.dir == wire.Push {
				run(t, pre.cl, wire.Push, "tls", S, D, ms)
			} else {
				run(t, pre.cl, wire.Pull, "tls", D, S, ms)
			}
			if err := kvsim.Verify(S, D, ms, guard); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, n := range []*node{pre, dec} {
		if !strings.Contains(readLog(n), "tls_peer") {
			t.Errorf("%s never logged a TLS session:\n%s", n.name, n.tail())
		}
	}
}

func readLog(n *node) string {
	b, _ := os.ReadFile(n.log)
	return string(b)
}

// waitLogged waits until n's log contains want.
func waitLogged(t *testing.T, n *node, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(readLog(n), want) {
		if time.Now().After(deadline) {
			t.Fatalf("%s's log never said %q:\n%s", n.name, want, n.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTLSRefused: mismatched peers never get a session; the dialer's
// routes say why and the acceptor logs why.
func TestTLSRefused(t *testing.T) {
	y, o := testPKI(t), testPKI(t)
	for _, tc := range []struct {
		name             string
		preYAML, decYAML string
		routeErr, decLog string
	}{
		{"plaintext dialer, TLS acceptor", "", y.of("decode"), "requires mutual TLS", "opened in plaintext"},
		{"TLS dialer, plaintext acceptor", y.of("prefill"), "", "answered in plaintext", "security.tls is not set here"},
		{"certificates of another CA", o.of("prefill"), y.of("decode"), "does not verify", "refused peer connection"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dec := startNode(t, "decode", nodeOpts{extra: tc.decYAML})
			pre := startNode(t, "prefill", nodeOpts{extra: tc.preYAML, route: "decode", peer: dec.peers})
			deadline := time.Now().Add(10 * time.Second)
			for {
				rs, err := pre.cl.Routes(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if len(rs) == 1 && rs[0].Peers[0].State == "down" && strings.Contains(rs[0].Peers[0].Error, tc.routeErr) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("routes say %+v, want the peer down with %q\n%s", rs, tc.routeErr, pre.tail())
				}
				time.Sleep(50 * time.Millisecond)
			}
			waitLogged(t, dec, tc.decLog)
			if st := dec.stats(); st.Sessions != 0 {
				t.Fatalf("decode has %d sessions with a mismatched peer", st.Sessions)
			}
		})
	}
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
