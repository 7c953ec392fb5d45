// Package certgen makes throwaway certificates for mutual TLS between
// sidecars: a self-signed CA and leaf certificates it signs, written as PEM
// files. Tests use it, and `stagectl bench --spawn --tls`. It is not a
// certificate authority for production: keys are ECDSA P-256 made fresh on
// every call, and nothing is ever revoked.
package certgen

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority held in memory.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	DER  []byte
}

// NewCA makes a self-signed CA valid from an hour ago for validFor.
func NewCA(name string, validFor time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certgen: CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("certgen: sign CA %q: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certgen: parse CA %q: %w", name, err)
	}
	return &CA{Cert: cert, Key: key, DER: der}, nil
}

// Leaf says what a leaf certificate holds.
type Leaf struct {
	Name      string        // common name, also a DNS name in the SAN
	Hosts     []string      // more SAN entries: IP addresses or DNS names
	NotBefore time.Time     // zero: an hour ago
	ValidFor  time.Duration // from NotBefore; zero: 24 hours
	// Usages are the extended key usages; nil: serverAuth and clientAuth,
	// as a sidecar both accepts and dials.
	Usages []x509.ExtKeyUsage
}

// Files are the paths of a written certificate and key.
type Files struct{ Cert, Key string }

// Issue signs a leaf certificate for l and returns its DER and key.
func (ca *CA) Issue(l Leaf) ([]byte, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("certgen: leaf key: %w", err)
	}
	nb := l.NotBefore
	if nb.IsZero() {
		nb = time.Now().Add(-time.Hour)
	}
	valid := l.ValidFor
	if valid == 0 {
		valid = 24 * time.Hour
	}
	usages := l.Usages
	if usages == nil {
		usages = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: l.Name},
		DNSNames:     []string{l.Name},
		NotBefore:    nb,
		NotAfter:     nb.Add(valid),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usages,
	}
	for _, h := range l.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("certgen: sign %q: %w", l.Name, err)
	}
	return der, key, nil
}

// WriteCA writes the CA certificate as PEM to path.
func (ca *CA) WriteCA(path string) error {
	return writePEM(path, "CERTIFICATE", ca.DER, 0o644)
}

// WriteLeaf issues a leaf for l and writes dir/<name>.crt and
// dir/<name>.key (the key 0600).
func (ca *CA) WriteLeaf(dir string, l Leaf) (Files, error) {
	der, key, err := ca.Issue(l)
	if err != nil {
		return Files{}, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Files{}, fmt.Errorf("certgen: marshal key of %q: %w", l.Name, err)
	}
	f := Files{Cert: filepath.Join(dir, l.Name+".crt"), Key: filepath.Join(dir, l.Name+".key")}
	if err := writePEM(f.Cert, "CERTIFICATE", der, 0o644); err != nil {
		return Files{}, err
	}
	if err := writePEM(f.Key, "EC PRIVATE KEY", kder, 0o600); err != nil {
		return Files{}, err
	}
	return f, nil
}

// Set is a CA written to dir/ca.crt with one leaf per name, each valid
// for 127.0.0.1, ::1 and localhost: what local sidecars need.
type Set struct {
	CA     string
	Leaves map[string]Files
}

// WriteSet makes a fresh CA and a leaf for each name in dir.
func WriteSet(dir string, names ...string) (*Set, error) {
	ca, err := NewCA("stage throwaway CA", 24*time.Hour)
	if err != nil {
		return nil, err
	}
	s := &Set{CA: filepath.Join(dir, "ca.crt"), Leaves: map[string]Files{}}
	if err := ca.WriteCA(s.CA); err != nil {
		return nil, err
	}
	for _, n := range names {
		f, err := ca.WriteLeaf(dir, Leaf{Name: n, Hosts: []string{"127.0.0.1", "::1", "localhost"}})
		if err != nil {
			return nil, err
		}
		s.Leaves[n] = f
	}
	return s, nil
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	b := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, b, mode); err != nil {
		return fmt.Errorf("certgen: write %s: %w", path, err)
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic("certgen: crypto/rand failed: " + err.Error())
	}
	return n
}
