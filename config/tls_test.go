package config

import (
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/internal/certgen"
)

func TestValidateTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := certgen.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := ca.WriteCA(caFile); err != nil {
		t.Fatal(err)
	}
	leaf := func(l certgen.Leaf) certgen.Files {
		f, err := ca.WriteLeaf(dir, l)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	good := leaf(certgen.Leaf{Name: "good"})
	other := leaf(certgen.Leaf{Name: "other"})
	expired := leaf(certgen.Leaf{Name: "expired", NotBefore: time.Now().Add(-48 * time.Hour), ValidFor: time.Hour})
	future := leaf(certgen.Leaf{Name: "future", NotBefore: time.Now().Add(time.Hour)})
	serverOnly := leaf(certgen.Leaf{Name: "server-only", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	on := func(f certgen.Files) TLS { return TLS{CertFile: f.Cert, KeyFile: f.Key, CAFile: caFile} }
	tests := []struct {
		name string
		tls  TLS
		key  string // "" : valid
		want string
	}{
		{"valid", on(good), "", ""},
		{"valid with server name", TLS{CertFile: good.Cert, KeyFile: good.Key, CAFile: caFile, ServerName: "stage"}, "", ""},
		{"no key", TLS{CertFile: good.Cert, CAFile: caFile}, "security.tls.key_file", "empty; mutual TLS needs cert_file, key_file and ca_file together"},
		{"no ca", TLS{CertFile: good.Cert, KeyFile: good.Key}, "security.tls.ca_file", "empty"},
		{"no cert", TLS{KeyFile: good.Key, CAFile: caFile}, "security.tls.cert_file", "empty"},
		{"cert missing", TLS{CertFile: filepath.Join(dir, "nope.crt"), KeyFile: good.Key, CAFile: caFile}, "security.tls.cert_file", "no such file or directory"},
		{"key of another cert", TLS{CertFile: good.Cert, KeyFile: other.Key, CAFile: caFile}, "security.tls.cert_file", "key_file is not the key of this certificate"},
		{"key not PEM", TLS{CertFile: good.Cert, KeyFile: notPEM, CAFile: caFile}, "security.tls.cert_file", "must be PEM"},
		{"expired", on(expired), "security.tls.cert_file", "certificate expired at"},
		{"not yet valid", on(future), "security.tls.cert_file", "not valid before"},
		{"server usage only", on(serverOnly), "security.tls.cert_file", "lacks extended key usage serverAuth or clientAuth"},
		{"ca missing", TLS{CertFile: good.Cert, KeyFile: good.Key, CAFile: filepath.Join(dir, "nope.crt")}, "security.tls.ca_file", "cannot read it"},
		{"ca not PEM", TLS{CertFile: good.Cert, KeyFile: good.Key, CAFile: notPEM}, "security.tls.ca_file", "holds no PEM CERTIFICATE block"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			c.Security.TLS = tt.tls
			err := Validate(c)
			if tt.key == "" {
				if err != nil {
					t.Fatalf("got %v, want valid", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("got %v, want a *ValidationError", err)
			}
			if len(ve.Problems) != 1 {
				t.Fatalf("got %d problems (%v), want 1", len(ve.Problems), err)
			}
			if p := ve.Problems[0]; p.Key != tt.key || !strings.Contains(p.Msg, tt.want) {
				t.Errorf("got %q, want key %s with %q", p, tt.key, tt.want)
			}
		})
	}
}

// TestTLSFromEnv: the tls keys come from STAGE_SECURITY_TLS_* like any key,
// and a file's tls paths show in problems (they are not secrets).
func TestTLSFromEnv(t *testing.T) {
	dir := t.TempDir()
	set, err := certgen.WriteSet(dir, "a")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("STAGE_SECURITY_TLS_CERT_FILE", set.Leaves["a"].Cert)
	t.Setenv("STAGE_SECURITY_TLS_KEY_FILE", set.Leaves["a"].Key)
	t.Setenv("STAGE_SECURITY_TLS_CA_FILE", set.CA)
	t.Setenv("STAGE_SECURITY_TOKEN", "x")
	c, err := Load("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Security.TLS.Enabled() || c.Security.TLS.CAFile != set.CA {
		t.Errorf("got tls %+v, want the env's files", c.Security.TLS)
	}
	t.Setenv("STAGE_SECURITY_TLS_CA_FILE", "")
	p := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(p, []byte("security:\n  tls:\n    ca_file: [x]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(p, nil)
	if err == nil || !strings.Contains(err.Error(), `security.tls.ca_file: must be a string; quote it (got [x])`) {
		t.Errorf("got %v, want the ca_file's value shown", err)
	}
}
