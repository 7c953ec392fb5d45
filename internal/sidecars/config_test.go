package sidecars

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stage-kv/stage/config"
)

// TestConfigYAML: every config Config writes loads as staged would load it
// (strict keys, validation), and says what was asked.
func TestConfigYAML(t *testing.T) {
	t.Setenv(TokenEnv, "config-test-token")
	dir := t.TempDir()
	sock := filepath.Join(dir, "x.sock")
	for _, tc := range []struct {
		name  string
		c     Config
		check func(*config.Config) bool
	}{
		{"bare", Config{Name: "a", Socket: sock}, func(c *config.Config) bool {
			return c.Node.Name == "a" && c.ControlSocket == sock && c.Listen == "127.0.0.1:0" && len(c.Routes) == 0
		}},
		{"node and staging", Config{Name: "b", Socket: sock, HostID: "h1", SocketDir: dir, SlotSize: "1MiB", Slots: 16}, func(c *config.Config) bool {
			return c.Node.HostID == "h1" && c.Node.SocketDir == dir && c.Staging.SlotSize == config.MiB && c.Staging.Slots == 16 && c.Staging.Window == 8
		}},
		{"device and log", Config{Name: "c", Socket: sock, DeviceKind: "hostmem", DeviceOrdinal: 1, LogLevel: "debug"}, func(c *config.Config) bool {
			return c.Device.Kind == "hostmem" && c.Device.Ordinal == 1 && c.Log.Level == "debug"
		}},
		{"route", Config{Name: "d", Socket: sock, Route: "decode", Peer: "127.0.0.1:7100", Stripes: 3, Transport: "tcp",
			ConnectTimeout: 2 * time.Second, ProgressTimeout: 10 * time.Second}, func(c *config.Config) bool {
			if len(c.Routes) != 1 {
				return false
			}
			r := c.Routes[0]
			return r.Name == "decode" && len(r.Peers) == 1 && r.Peers[0] == "127.0.0.1:7100" && r.Stripes == 3 && r.Transport == "tcp" &&
				r.ConnectTimeout == 2*time.Second && r.ProgressTimeout == 10*time.Second
		}},
		{"extra", Config{Name: "e", Socket: sock, Extra: "drain_timeout: 7s\n"}, func(c *config.Config) bool { return c.Drain == 7*time.Second }},
		// e2e's reload test adds a route by appending its item to the text.
		{"a route appended as text", Config{Name: "g", Socket: sock, Route: "r", Peer: "127.0.0.1:1", Extra: "  - name: other\n    peers: [\"127.0.0.1:2\"]\n"},
			func(c *config.Config) bool {
				return len(c.Routes) == 2 && c.Routes[1].Name == "other" && c.Routes[1].Peers[0] == "127.0.0.1:2"
			}},
		{"names that YAML must quote", Config{Name: "f", Socket: filepath.Join(dir, "a: b #c.sock"), Route: "r", Peer: "[::1]:7100"}, func(c *config.Config) bool {
			return c.ControlSocket == filepath.Join(dir, "a: b #c.sock") && len(c.Routes) == 1 && c.Routes[0].Peers[0] == "[::1]:7100"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			y := tc.c.YAML()
			path := filepath.Join(dir, tc.name+".yaml")
			if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := config.Load(path, nil)
			if err != nil {
				t.Fatalf("staged would refuse:\n%s\n%v", y, err)
			}
			if !tc.check(c) {
				t.Fatalf("the loaded config does not say what was asked:\n%s\n%+v", y, c)
			}
		})
	}
}
