package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoad feeds arbitrary files to Load: it must return an error or a
// config that validates, and never panic.
func FuzzLoad(f *testing.F) {
	f.Add(DefaultYAML())
	f.Add([]byte("staging:\n  slot_size: 4MiB\n  slots: 8\n"))
	f.Add([]byte("routes:\n  - name: d\n    peers: [\"h:1\"]\n    stripes: 2\n"))
	f.Add([]byte("staging: 5\n"))
	f.Add([]byte("routes: {a: b}\n"))
	f.Add([]byte("node:\n  name: [1, 2]\nlisten: 7\n"))
	f.Add([]byte("\x00\xff: :\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("STAGE_SECURITY_TOKEN", "fuzz")
		t.Setenv("STAGE_CONTROL_SOCKET", filepath.Join(dir, "s.sock"))
		c, err := Load(p, nil)
		if err != nil {
			if c != nil {
				t.Fatalf("Load returned a config with error %v", err)
			}
			return
		}
		if err := Validate(c); err != nil {
			t.Fatalf("Load accepted a config that does not validate: %v", err)
		}
	})
}
