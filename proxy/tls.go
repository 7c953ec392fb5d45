package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/wire"
)

// Mutual TLS on peer connections (security.tls). Every peer connection,
// control and data, dialed and accepted, runs a TLS 1.3 handshake in which
// both sides present a certificate and verify the other's against the CA
// file; the stage handshake (Hello ... Welcome, DataHello/DataAccept, with
// the token proofs) then runs inside it. Data streams go through tlsconn,
// control sessions through tlsControl (gnet takes raw sockets only).

// peerTLS holds this sidecar's certificate and the CA pool, and reads them
// again when their files change on disk (certificate rotation).
type peerTLS struct {
	conf config.TLS
	log  *zap.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	pool    *x509.CertPool
	stamps  [3]fileStamp // cert, key, ca at the last load
	checked time.Time    // last look at the files
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// tlsRecheck is how often, at most, a handshake looks at the files again.
const tlsRecheck = time.Second

func loadPeerTLS(c config.TLS, log *zap.Logger) (*peerTLS, error) {
	p := &peerTLS{conf: c, log: log}
	if err := p.load(); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *peerTLS) files() [3]string { return [3]string{p.conf.CertFile, p.conf.KeyFile, p.conf.CAFile} }

func (p *peerTLS) stat() ([3]fileStamp, error) {
	var st [3]fileStamp
	for i, f := range p.files() {
		fi, err := os.Stat(f)
		if err != nil {
			return st, fmt.Errorf("security.tls: %w", err)
		}
		st[i] = fileStamp{fi.ModTime(), fi.Size()}
	}
	return st, nil
}

// load reads the three files (p.mu held, or p not shared yet).
func (p *peerTLS) load() error {
	st, err := p.stat()
	if err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(p.conf.CertFile, p.conf.KeyFile)
	if err != nil {
		return fmt.Errorf("security.tls: load cert_file %s with key_file %s: %w", p.conf.CertFile, p.conf.KeyFile, err)
	}
	pool, err := config.LoadCAPool(p.conf.CAFile)
	if err != nil {
		return fmt.Errorf("security.tls.ca_file %s: %w", p.conf.CAFile, err)
	}
	p.cert, p.pool, p.stamps, p.checked = &cert, pool, st, time.Now()
	return nil
}

// current returns the certificate and pool, reloading them first when a
// file changed; a file that fails to load is logged and the old ones kept.
func (p *peerTLS) current() (*tls.Certificate, *x509.CertPool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now := time.Now(); now.Sub(p.checked) >= tlsRecheck {
		p.checked = now
		if st, err := p.stat(); err != nil || st != p.stamps {
			if err == nil {
				err = p.load()
			}
			if err != nil {
				p.stamps = st // report a broken file once, not at every handshake
				p.log.Warn("security.tls files changed but do not load; keeping the certificates in use", zap.Error(err))
			} else {
				p.log.Info("security.tls files reloaded", zap.String("cert_file", p.conf.CertFile), zap.String("ca_file", p.conf.CAFile))
			}
		}
	}
	return p.cert, p.pool
}

func (p *peerTLS) serverConfig() *tls.Config {
	cert, pool := p.current()
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
}

// clientConfig verifies the acceptor's certificate for server_name, or for
// the host of addr.
func (p *peerTLS) clientConfig(addr string) *tls.Config {
	cert, pool := p.current()
	name := p.conf.ServerName
	if name == "" {
		name = addr
		if h, _, err := net.SplitHostPort(addr); err == nil {
			name = h
		}
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*cert}, RootCAs: pool, ServerName: name}
}

// The handshakes below take a nil *peerTLS for plaintext (no
// security.tls): they hand the connection back as it is.

// dial runs the dialer's TLS handshake on c, within timeout
// (limits.handshake_timeout). On error the caller closes c.
func (p *peerTLS) dial(ctx context.Context, c net.Conn, addr string, timeout time.Duration) (net.Conn, error) {
	if p == nil {
		return c, nil
	}
	tc := tls.Client(c, p.clientConfig(addr))
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		return nil, p.dialErr(addr, err)
	}
	return tc, nil
}

// dialErr explains a dialer's failure in or right after the TLS
// handshake (in TLS 1.3 the acceptor's verdict on our certificate arrives
// with its first frame); other errors come back as they are.
func (p *peerTLS) dialErr(addr string, err error) error {
	if p == nil {
		return err
	}
	var rh tls.RecordHeaderError
	var ve *tls.CertificateVerificationError
	var op *net.OpError
	switch {
	case errors.As(err, &rh) && rh.RecordHeader[0] == wire.Magic0 && rh.RecordHeader[1] == wire.Magic1:
		return codeErr(wire.CodeAuthFailed, "peer %s answered in plaintext: it has no security.tls while we require mutual TLS; set security.tls on both sides, or on neither", addr)
	case errors.As(err, &rh):
		return codeErr(wire.CodeAuthFailed, "peer %s does not speak TLS (%w); is it a staged with security.tls set?", addr, err)
	case errors.As(err, &ve):
		return codeErr(wire.CodeAuthFailed, "certificate of peer %s does not verify: %w; it must be signed by our security.tls.ca_file, be valid now, and name %q (or set security.tls.server_name)",
			addr, ve.Err, p.clientConfig(addr).ServerName)
	case errors.As(err, &op) && op.Op == "remote error":
		return codeErr(wire.CodeAuthFailed, "peer %s refused our TLS certificate (%w); it must be signed by the CA in the peer's security.tls.ca_file and be valid now", addr, op.Err)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return codeErr(wire.CodeAuthFailed, "peer %s closed the connection in the TLS handshake: it may not use security.tls, or it refused our certificate (its log says why)", addr)
	}
	return fmt.Errorf("TLS handshake with %s: %w", addr, err)
}

// accept runs the acceptor's TLS handshake on c; c's deadline bounds it.
// A peer that opened in plaintext is told, in plaintext, that TLS is
// required.
func (p *peerTLS) accept(ctx context.Context, c net.Conn) (net.Conn, error) {
	if p == nil {
		return c, nil
	}
	tc := tls.Server(c, p.serverConfig())
	err := tc.HandshakeContext(ctx)
	if err == nil {
		return tc, nil
	}
	var rh tls.RecordHeaderError
	var ve *tls.CertificateVerificationError
	switch {
	case errors.As(err, &rh) && rh.Conn != nil:
		_ = writeMsg(rh.Conn, &wire.Error{Code: wire.CodeAuthFailed, Message: "this peer requires mutual TLS; set security.tls (cert_file, key_file, ca_file) on your side"})
		return nil, fmt.Errorf("peer opened in plaintext (no security.tls on its side?) while we require mutual TLS: %w", err)
	case errors.As(err, &ve):
		return nil, fmt.Errorf("peer's TLS certificate does not verify: %w; it must be signed by our security.tls.ca_file and be valid now", ve.Err)
	case strings.Contains(err.Error(), "didn't provide a certificate"):
		// crypto/tls has no sentinel for it. A Go dialer sends only a
		// certificate of a CA we name, so this is also a wrong CA.
		return nil, fmt.Errorf("peer sent no TLS certificate (%w): it has none, or none signed by a CA in our security.tls.ca_file; give it one that is", err)
	}
	return nil, fmt.Errorf("TLS handshake: %w; does the peer have security.tls set, with a certificate signed by our CA?", err)
}

// looksLikeTLS reports whether the first bytes of a connection are a TLS
// handshake record (what a dialer with security.tls sends first).
func looksLikeTLS(b []byte) bool {
	return len(b) >= 3 && b[0] == 0x16 && b[1] == 0x03 && b[2] <= 0x04
}

// peerCertName is the common name of the certificate a TLS peer presented,
// for logs; "" on plaintext.
func peerCertName(c net.Conn) string {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return ""
	}
	if cs := tc.ConnectionState().PeerCertificates; len(cs) > 0 {
		return cs[0].Subject.CommonName
	}
	return ""
}
