package config

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// tls checks security.tls: the three files are set, readable and PEM, the
// key matches the certificate, the certificate is valid now and may serve
// as both a server and a client certificate, and the CA file holds at least
// one certificate.
func (v *validator) tls(t TLS, now time.Time) {
	const p = "security.tls."
	missing := false
	for _, f := range []struct{ key, val string }{{"cert_file", t.CertFile}, {"key_file", t.KeyFile}, {"ca_file", t.CAFile}} {
		if f.val == "" {
			v.add(p+f.key, "empty; mutual TLS needs cert_file, key_file and ca_file together (or none of them for no TLS)")
			missing = true
		}
	}
	if t.CAFile != "" {
		if _, err := LoadCAPool(t.CAFile); err != nil {
			v.add(p+"ca_file", fmt.Sprintf("%v (got %q)", err, t.CAFile))
		}
	}
	if missing {
		return
	}
	kp, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		v.add(p+"cert_file", fmt.Sprintf("cannot load it with key_file %q: %v (got %q); %s", t.KeyFile, unwrapPath(err), t.CertFile, keyPairHint(err)))
		return
	}
	leaf := kp.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(kp.Certificate[0]); err != nil {
			v.add(p+"cert_file", fmt.Sprintf("cannot parse the certificate: %v (got %q)", err, t.CertFile))
			return
		}
	}
	switch {
	case now.After(leaf.NotAfter):
		v.add(p+"cert_file", fmt.Sprintf("certificate expired at %s (got %q); renew it", leaf.NotAfter.UTC().Format(time.RFC3339), t.CertFile))
	case now.Before(leaf.NotBefore):
		v.add(p+"cert_file", fmt.Sprintf("certificate not valid before %s (got %q); check the clock, or wait", leaf.NotBefore.UTC().Format(time.RFC3339), t.CertFile))
	}
	if u := leaf.ExtKeyUsage; len(u) > 0 && !slices.Contains(u, x509.ExtKeyUsageAny) &&
		(!slices.Contains(u, x509.ExtKeyUsageServerAuth) || !slices.Contains(u, x509.ExtKeyUsageClientAuth)) {
		v.add(p+"cert_file", fmt.Sprintf("certificate lacks extended key usage serverAuth or clientAuth (got %q); a sidecar both accepts and dials, so issue it with both", t.CertFile))
	}
}

// LoadCAPool reads a PEM file of CA certificates into a pool; an error says
// what is wrong with the file.
func LoadCAPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read it: %v; check the path and its permissions", unwrapPath(err))
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d does not parse: %v", n+1, err)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, errors.New("holds no PEM CERTIFICATE block; put the CA certificate(s) in it")
	}
	return pool, nil
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Path, pe.Err)
	}
	return err
}

func keyPairHint(err error) string {
	var pe *os.PathError
	switch {
	case errors.As(err, &pe):
		return "check the paths and their permissions"
	case strings.Contains(err.Error(), "does not match"):
		return "key_file is not the key of this certificate; pair them correctly"
	}
	return "both must be PEM: the certificate (leaf first) and its private key"
}
