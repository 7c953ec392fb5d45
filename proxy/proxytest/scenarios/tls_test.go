package scenarios_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/internal/certgen"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// pki is a throwaway CA with leaves for decode and prefill.
type pki struct{ *certgen.Set }

func testPKI(t *testing.T) pki {
	t.Helper()
	set, err := certgen.WriteSet(t.TempDir(), "decode", "prefill")
	if err != nil {
		t.Fatal(err)
	}
	return pki{set}
}

// of is security.tls for the named sidecar.
func (p pki) of(name string) config.TLS {
	f := p.Leaves[name]
	return config.TLS{CertFile: f.Cert, KeyFile: f.Key, CAFile: p.CA}
}

// withTLS is o with security.tls of each sidecar from tls (none where it
// has no entry).
func withTLS(o proxytest.Options, tls map[string]config.TLS) proxytest.Options {
	prev := o.Configure
	o.Configure = func(name string, c *config.Config) {
		if prev != nil {
			prev(name, c)
		}
		c.Security.TLS = tls[name]
	}
	return o
}

// TestTLSMoves pushes and pulls between two sidecars on mutual TLS,
// byte-exact, and leaves nothing behind.
func TestTLSMoves(t *testing.T) {
	y := testPKI(t)
	o := peerOpts()
	pre, dec := proxytest.Pair(t, withTLS(o, map[string]config.TLS{"prefill": y.of("prefill"), "decode": y.of("decode")}))
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
				run(t, pre.Client, wire.Push, "tls", S, D, ms)
			} else {
				run(t, pre.Client, wire.Pull, "tls", D, S, ms)
			}
			if err := kvsim.Verify(S, D, ms, guard); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, sc := range []*proxytest.Sidecar{pre, dec} {
		if !strings.Contains(sc.LogText(), "tls_peer") {
			t.Errorf("%s never logged a TLS session:\n%s", sc.Name, sc.LogText())
		}
	}
}

// TestTLSRefused: mismatched peers never get a session; the dialer's
// routes say why and the acceptor logs why.
func TestTLSRefused(t *testing.T) {
	y, o := testPKI(t), testPKI(t)
	for _, tc := range []struct {
		name             string
		tls              map[string]config.TLS
		routeErr, decLog string
	}{
		{"plaintext dialer, TLS acceptor", map[string]config.TLS{"decode": y.of("decode")}, "requires mutual TLS", "opened in plaintext"},
		{"TLS dialer, plaintext acceptor", map[string]config.TLS{"prefill": y.of("prefill")}, "answered in plaintext", "security.tls is not set here"},
		{"certificates of another CA", map[string]config.TLS{"prefill": o.of("prefill"), "decode": y.of("decode")}, "does not verify", "refused peer connection"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proxytest.NoLeaks(t)
			opts := withTLS(e2eOpts(), tc.tls)
			dec := proxytest.Start(t, "decode", "", opts)
			pre := proxytest.Start(t, "prefill", dec.PeerAddr(), opts)
			deadline := time.Now().Add(10 * time.Second)
			for {
				rs, err := pre.Client.Routes(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if len(rs) == 1 && rs[0].Peers[0].State == "down" && strings.Contains(rs[0].Peers[0].Error, tc.routeErr) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("routes say %+v, want the peer down with %q\n%s", rs, tc.routeErr, pre.LogText())
				}
				time.Sleep(50 * time.Millisecond)
			}
			waitLogged(t, dec, tc.decLog)
			if st := dec.Snapshot(); st.Sessions != 0 {
				t.Fatalf("decode has %d sessions with a mismatched peer", st.Sessions)
			}
		})
	}
}
