package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	stagecl "github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	_ "github.com/stage-kv/stage/device/hostmem"
	"github.com/stage-kv/stage/internal/certgen"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// noLeaks checks, after the test's other cleanups (the sidecars' Close),
// that no goroutine it started is left.
func noLeaks(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
}

// pki is a CA written to disk with leaves issued on demand.
type pki struct {
	t   *testing.T
	dir string
	ca  *certgen.CA
	crt string // the CA's file
}

func newPKI(t *testing.T, name string) *pki {
	t.Helper()
	ca, err := certgen.NewCA(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{t: t, dir: t.TempDir(), ca: ca}
	p.crt = filepath.Join(p.dir, "ca.crt")
	if err := ca.WriteCA(p.crt); err != nil {
		t.Fatal(err)
	}
	return p
}

// conf issues a leaf for 127.0.0.1 and returns security.tls for it.
func (p *pki) conf(l certgen.Leaf) config.TLS {
	p.t.Helper()
	l.Hosts = append(l.Hosts, "127.0.0.1")
	f, err := p.ca.WriteLeaf(p.dir, l)
	if err != nil {
		p.t.Fatal(err)
	}
	return config.TLS{CertFile: f.Cert, KeyFile: f.Key, CAFile: p.crt}
}

// testSidecar is an in-process sidecar whose log the test reads.
type testSidecar struct {
	*Server
	logs *observer.ObservedLogs
}

// startTestSidecar runs a hostmem sidecar with tls (zero: plaintext) and,
// when peer is set, route "r" to it.
func startTestSidecar(t *testing.T, name string, tlsConf config.TLS, peer string) *testSidecar {
	t.Helper()
	dir := t.TempDir()
	c := config.Default()
	c.Node.Name, c.Node.HostID, c.Node.SocketDir = name, "tls-test-"+name, filepath.Join(dir, "node")
	c.Listen, c.ControlSocket = "127.0.0.1:0", filepath.Join(dir, name+".sock")
	c.Staging.SlotSize, c.Staging.Slots, c.Staging.Window = 256*config.KiB, 8, 4
	c.Security.Token = "tls-test-token"
	c.Security.TLS = tlsConf
	if peer != "" {
		c.Routes = []config.Route{{Name: "r", Peers: []string{peer}, Stripes: 2, Transport: "tcp",
			ConnectTimeout: 2 * time.Second, ProgressTimeout: 10 * time.Second}}
	}
	// Not config.Validate: it refuses an expired certificate, and a test
	// needs one that expired while the sidecar ran.
	core, logs := observer.New(zapcore.InfoLevel)
	s, err := New(c, zap.New(core).Named(name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := s.Start(context.Background()); err != nil {
		_ = s.Close()
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("%s: close: %v", name, err)
		}
	})
	return &testSidecar{s, logs}
}

// waitLog waits for a log entry whose message and fields contain want.
func (ts *testSidecar) waitLog(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, e := range ts.logs.All() {
			if strings.Contains(entryText(e), want) {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	var all []string
	for _, e := range ts.logs.All() {
		all = append(all, entryText(e))
	}
	t.Fatalf("no log entry with %q; the log:\n%s", want, strings.Join(all, "\n"))
}

func entryText(e observer.LoggedEntry) string {
	b := strings.Builder{}
	b.WriteString(e.Message)
	for k, v := range e.ContextMap() {
		fmt.Fprintf(&b, " %s=%v", k, v)
	}
	return b.String()
}

// waitRouteErr waits until route r's last dial error contains want.
func (ts *testSidecar) waitRouteErr(t *testing.T, want string) {
	t.Helper()
	r, err := ts.routes.Lookup("r")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	var got string
	for time.Now().Before(deadline) {
		if got = r.ErrSummary(); strings.Contains(got, want) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("route error %q, want it to contain %q", got, want)
}

// TestTLSMovesBytes: pushes (pipeline and latency path) and pulls between
// two sidecars on mutual TLS land byte-exact, and nothing leaks.
func TestTLSMovesBytes(t *testing.T) {
	noLeaks(t)
	p := newPKI(t, "stage test CA")
	dec := startTestSidecar(t, "dec", p.conf(certgen.Leaf{Name: "dec"}), "")
	pre := startTestSidecar(t, "pre", p.conf(certgen.Leaf{Name: "pre"}), dec.PeerAddr())
	ctx := context.Background()
	pcl, err := stagecl.Dial(pre.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer pcl.Close()
	dcl, err := stagecl.Dial(dec.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer dcl.Close()
	for _, tc := range []struct {
		name       string
		dir        wire.Direction
		layerBytes uint64
		moves      func(c *kvsim.Cache) []kvsim.Move
	}{
		{"push 4MiB scattered", wire.Push, 2 << 20, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Blocks(c, 16<<10, 3) }},
		{"push 32KiB (latency path)", wire.Push, 32 << 10, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Ranges(c, 32<<10) }},
		{"pull 4MiB ranges", wire.Pull, 2 << 20, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Ranges(c, 1<<20) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, dst := pcl, dcl
			if tc.dir == wire.Pull {
				src, dst = dcl, pcl
			}
			S, D := tlsCaches(t, src, dst, tc.layerBytes)
			ms := tc.moves(S)
			local, remote := S, D
			if tc.dir == wire.Pull {
				local, remote = D, S
			}
			for l, lm := range kvsim.ByLayer(S, ms) {
				id, err := pcl.Submit(ctx, kvsim.Transfer("r", tc.dir, fmt.Sprint(l), local, remote, lm))
				if err != nil {
					t.Fatalf("submit layer %d: %v", l, err)
				}
				st, err := pcl.Wait(ctx, id, 20*time.Second)
				if err != nil || st.State != wire.StateDone {
					t.Fatalf("layer %d: %v, %+v", l, err, st)
				}
			}
			if err := kvsim.Verify(S, D, ms, 0xAB); err != nil {
				t.Fatal(err)
			}
		})
	}
	pre.waitLog(t, "tls_peer=dec")
	dec.waitLog(t, "tls_peer=pre")
	for _, s := range []*testSidecar{pre, dec} {
		deadline := time.Now().Add(5 * time.Second)
		for s.Leaks() != "" && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if l := s.Leaks(); l != "" {
			t.Errorf("%s leaked: %s", s.cfg.Node.Name, l)
		}
	}
}

func tlsCaches(t *testing.T, src, dst *stagecl.Client, layerBytes uint64) (S, D *kvsim.Cache) {
	t.Helper()
	ctx := context.Background()
	var err error
	if S, err = kvsim.New("src-kv", 2, layerBytes, 4096); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { S.Close() })
	if D, err = kvsim.New("dst-kv", 2, layerBytes, 4096); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { D.Close() })
	if err := S.Fill(uint64(time.Now().UnixNano())); err != nil {
		t.Fatal(err)
	}
	if err := D.Poison(0xAB); err != nil {
		t.Fatal(err)
	}
	if err := S.Register(ctx, src, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	if err := D.Register(ctx, dst, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = S.Unregister(context.Background(), src)
		_ = D.Unregister(context.Background(), dst)
	})
	return S, D
}

// TestTLSRefusals: each mismatch is refused before any stage frame is
// read, with an error on the dialer and a log line on the acceptor that
// say what is wrong.
func TestTLSRefusals(t *testing.T) {
	noLeaks(t)
	good := newPKI(t, "stage test CA")
	other := newPKI(t, "another CA")
	for _, tc := range []struct {
		name        string
		acceptor    config.TLS
		dialer      config.TLS
		dialerErr   string // in the dialer's route error
		acceptorLog string // in the acceptor's log
	}{
		{"wrong CA", good.conf(certgen.Leaf{Name: "acc"}), other.conf(certgen.Leaf{Name: "dial"}),
			"certificate of peer 127.0.0.1", "refused peer connection"},
		{"expired certificate", good.conf(certgen.Leaf{Name: "acc"}),
			good.conf(certgen.Leaf{Name: "old", NotBefore: time.Now().Add(-48 * time.Hour), ValidFor: time.Hour}),
			"refused our TLS certificate", "certificate has expired"},
		{"plaintext dialer", good.conf(certgen.Leaf{Name: "acc"}), config.TLS{},
			"this peer requires mutual TLS", "opened in plaintext"},
		{"plaintext acceptor", config.TLS{}, good.conf(certgen.Leaf{Name: "dial"}),
			"answered in plaintext", "security.tls is not set here"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acc := startTestSidecar(t, "acc", tc.acceptor, "")
			dial := startTestSidecar(t, "dial", tc.dialer, acc.PeerAddr())
			dial.waitRouteErr(t, tc.dialerErr)
			acc.waitLog(t, tc.acceptorLog)
			if n := acc.Snapshot().Sessions; n != 0 {
				t.Errorf("acceptor has %d sessions, want 0", n)
			}
		})
	}
	t.Run("wrong CA, acceptor side", func(t *testing.T) {
		// The dialer trusts the acceptor but holds a certificate of
		// another CA: the acceptor refuses it.
		c := other.conf(certgen.Leaf{Name: "dial"})
		c.CAFile = good.crt
		acc := startTestSidecar(t, "acc", good.conf(certgen.Leaf{Name: "acc"}), "")
		dial := startTestSidecar(t, "dial", c, acc.PeerAddr())
		dial.waitRouteErr(t, "refused our TLS certificate")
		acc.waitLog(t, "sent no TLS certificate")
	})
	t.Run("client without certificate", func(t *testing.T) {
		acc := startTestSidecar(t, "acc", good.conf(certgen.Leaf{Name: "acc"}), "")
		pool := x509.NewCertPool()
		pool.AddCert(good.ca.Cert)
		c, err := tls.Dial("tcp", acc.PeerAddr(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13})
		if err != nil {
			t.Fatalf("handshake: %v (TLS 1.3 reports a refused client certificate on the first read)", err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		if err == nil || !strings.Contains(err.Error(), "certificate required") {
			t.Errorf("got %v, want the acceptor's certificate-required alert", err)
		}
		acc.waitLog(t, "sent no TLS certificate")
	})
	t.Run("plaintext Hello gets an Error frame", func(t *testing.T) {
		acc := startTestSidecar(t, "acc", good.conf(certgen.Leaf{Name: "acc"}), "")
		c, err := net.Dial("tcp", acc.PeerAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if err := writeMsg(c, &wire.Hello{VersionMin: wire.VersionMin, VersionMax: wire.VersionMax, NodeName: "x", SlotSize: 1 << 20, Window: 1}); err != nil {
			t.Fatal(err)
		}
		_, err = expect[*wire.Challenge](c, "challenge")
		if errCode(err) != wire.CodeAuthFailed || !strings.Contains(err.Error(), "requires mutual TLS") {
			t.Errorf("got %v, want CodeAuthFailed saying TLS is required", err)
		}
	})
}

// TestTLSRotation: a certificate replaced on disk (a renewed Secret) is
// used for the next handshake without a restart. The dialer starts with a
// leaf the acceptor does not trust and is refused; once its files hold a
// leaf of the trusted CA, its route comes up and a push lands.
func TestTLSRotation(t *testing.T) {
	noLeaks(t)
	good := newPKI(t, "stage test CA")
	other := newPKI(t, "another CA")
	c := other.conf(certgen.Leaf{Name: "dial"})
	c.CAFile = good.crt // the dialer trusts the acceptor from the start
	acc := startTestSidecar(t, "acc", good.conf(certgen.Leaf{Name: "acc"}), "")
	dial := startTestSidecar(t, "dial", c, acc.PeerAddr())
	dial.waitRouteErr(t, "refused our TLS certificate")
	if n := acc.Snapshot().Sessions; n != 0 {
		t.Fatalf("acceptor has %d sessions before the rotation, want 0", n)
	}
	// Rotate: the same two files, now a leaf of the CA the acceptor trusts.
	if _, err := good.ca.WriteLeaf(other.dir, certgen.Leaf{Name: "dial", Hosts: []string{"127.0.0.1"}}); err != nil {
		t.Fatal(err)
	}
	dial.waitLog(t, "security.tls files reloaded")
	deadline := time.Now().Add(10 * time.Second)
	for acc.Snapshot().Sessions == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no session 10 s after the dialer's certificate was rotated")
		}
		time.Sleep(20 * time.Millisecond)
	}
	ctx := context.Background()
	dcl, err := stagecl.Dial(dial.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer dcl.Close()
	acl, err := stagecl.Dial(acc.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer acl.Close()
	S, D := tlsCaches(t, dcl, acl, 1<<20)
	ms := kvsim.Ranges(S, 256<<10)
	for l, lm := range kvsim.ByLayer(S, ms) {
		id, err := dcl.Submit(ctx, kvsim.Transfer("r", wire.Push, fmt.Sprint(l), S, D, lm))
		if err != nil {
			t.Fatalf("submit layer %d: %v", l, err)
		}
		if st, err := dcl.Wait(ctx, id, 20*time.Second); err != nil || st.State != wire.StateDone {
			t.Fatalf("layer %d after the rotation: %v, %+v", l, err, st)
		}
	}
	if err := kvsim.Verify(S, D, ms, 0xAB); err != nil {
		t.Fatal(err)
	}
	acc.waitLog(t, "tls_peer=dial")
}
