package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// cleanEnv blanks every STAGE_* variable for the test (viper ignores empty
// values), so the caller's environment cannot leak in.
func cleanEnv(t *testing.T) {
	t.Helper()
	for _, k := range LeafKeys() {
		t.Setenv(envName(k), "")
	}
	t.Setenv("STAGE_ROUTES", "")
}

func envName(key string) string { return EnvName(key) }

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "stage.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// problems returns the keys of a *ValidationError, failing the test for any
// other error.
func problemKeys(t *testing.T, err error) []string {
	t.Helper()
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("got error %v (%T), want *ValidationError", err, err)
	}
	var keys []string
	for _, p := range ve.Problems {
		keys = append(keys, p.Key)
	}
	return keys
}

func TestDefaultLoadsAndValidates(t *testing.T) {
	cleanEnv(t)
	t.Setenv("STAGE_SECURITY_TOKEN", "t0ken")
	c, err := Load("", nil)
	if err != nil {
		t.Fatalf("Load: got error %v, want nil", err)
	}
	tests := []struct {
		name string
		got  any
		want any
	}{
		{"node.name", c.Node.Name, "stage"},
		{"node.host_id", c.Node.HostID, ""},
		{"listen", c.Listen, "127.0.0.1:7100"},
		{"control_socket", c.ControlSocket, ""},
		{"device.kind", c.Device.Kind, "hostmem"},
		{"device.ordinal", c.Device.Ordinal, 0},
		{"device.hostmem.bandwidth_gbps", c.Device.Hostmem.BandwidthGBps, 0.0},
		{"device.hostmem.latency", c.Device.Hostmem.Latency, time.Duration(0)},
		{"staging.slot_size", c.Staging.SlotSize, 4 * MiB},
		{"staging.slots", c.Staging.Slots, 64},
		{"staging.window", c.Staging.Window, 32},
		{"staging.copy_streams", c.Staging.CopyStreams, 2},
		{"node.copy_streams", c.Node.CopyStreams, 1},
		{"node.idle_conn_timeout", c.Node.IdleConnTimeout, 30 * time.Second},
		{"routes", len(c.Routes), 0},
		{"security.token", c.Security.Token, "t0ken"},
		{"security.token_file", c.Security.TokenFile, ""},
		{"security.allow_insecure", c.Security.AllowInsecure, false},
		{"metrics.listen", c.Metrics.Listen, ""},
		{"log.level", c.Log.Level, "info"},
		{"log.format", c.Log.Format, "console"},
		{"limits.max_sessions", c.Limits.MaxSessions, 64},
		{"limits.max_transfers_per_peer", c.Limits.MaxTransfersPerPeer, 4096},
		{"limits.max_clients", c.Limits.MaxClients, 64},
		{"limits.max_handshakes", c.Limits.MaxHandshakes, 256},
		{"limits.max_handshakes_per_addr", c.Limits.MaxHandshakesPerAddr, 32},
		{"limits.handshake_timeout", c.Limits.HandshakeTimeout, 10 * time.Second},
		{"limits.session_silence", c.Limits.SessionSilence, 5 * time.Second},
		{"limits.peer_progress_timeout", c.Limits.PeerProgressTimeout, 30 * time.Second},
		{"drain_timeout", c.Drain, 30 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !reflect.DeepEqual(tt.got, tt.want) {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
}

func TestDefaultWithoutTokenFails(t *testing.T) {
	cleanEnv(t)
	_, err := Load("", nil)
	keys := problemKeys(t, err)
	if !reflect.DeepEqual(keys, []string{"security.token"}) {
		t.Errorf("got problems %v, want [security.token]", keys)
	}
	if want := "security.token: empty; set security.token or security.token_file (or security.allow_insecure: true for local tests only)"; err.Error() != want {
		t.Errorf("got %q, want %q", err.Error(), want)
	}
}

// The embedded default must hold every key of Config and nothing else.
func TestDefaultYAMLIsComplete(t *testing.T) {
	v := viper.New()
	v.SetConfigType("yaml")
	if err := v.ReadConfig(strings.NewReader(string(DefaultYAML()))); err != nil {
		t.Fatal(err)
	}
	got := v.AllKeys()
	sort.Strings(got)
	want := append(LeafKeys(), "routes")
	sort.Strings(want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got keys %v, want %v", got, want)
	}
	d := Default()
	d.Security.Token = "x"
	if err := Validate(d); err != nil {
		t.Errorf("Default() with a token: got %v, want valid", err)
	}
}

func TestFileOverridesDefault(t *testing.T) {
	cleanEnv(t)
	p := writeFile(t, `
staging:
  slot_size: 8MiB
  window: 16
security:
  token: abc
log:
  format: json
`)
	c, err := Load(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		got, want any
	}{
		{"slot_size from file", c.Staging.SlotSize, 8 * MiB},
		{"window from file", c.Staging.Window, 16},
		{"slots kept from default", c.Staging.Slots, 64},
		{"log.format from file", c.Log.Format, "json"},
		{"log.level kept from default", c.Log.Level, "info"},
		{"listen kept from default", c.Listen, "127.0.0.1:7100"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !reflect.DeepEqual(tt.got, tt.want) {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
}

func TestPrecedence(t *testing.T) {
	file := `
listen: 10.0.0.1:7100
security:
  token: from-file
`
	tests := []struct {
		name  string
		env   map[string]string
		flags []string
		check func(c *Config) (got, want any)
	}{
		{"file over default", nil, nil,
			func(c *Config) (any, any) { return c.Listen, "10.0.0.1:7100" }},
		{"env over file", map[string]string{"STAGE_LISTEN": "10.0.0.2:7100"}, nil,
			func(c *Config) (any, any) { return c.Listen, "10.0.0.2:7100" }},
		{"flag over env", map[string]string{"STAGE_LISTEN": "10.0.0.2:7100"}, []string{"--listen", "10.0.0.3:7100"},
			func(c *Config) (any, any) { return c.Listen, "10.0.0.3:7100" }},
		{"unset flag does not override env", map[string]string{"STAGE_LISTEN": "10.0.0.2:7100"}, []string{"--log-level", "debug"},
			func(c *Config) (any, any) { return c.Listen, "10.0.0.2:7100" }},
		{"env for a key absent from the file", map[string]string{"STAGE_STAGING_SLOTS": "8", "STAGE_STAGING_WINDOW": "4"}, nil,
			func(c *Config) (any, any) { return []int{c.Staging.Slots, c.Staging.Window}, []int{8, 4} }},
		{"env token over file token", map[string]string{"STAGE_SECURITY_TOKEN": "from-env"}, nil,
			func(c *Config) (any, any) { return c.Security.Token, "from-env" }},
		{"flag token over env token", map[string]string{"STAGE_SECURITY_TOKEN": "from-env"}, []string{"--token", "from-flag"},
			func(c *Config) (any, any) { return c.Security.Token, "from-flag" }},
		{"env size", map[string]string{"STAGE_STAGING_SLOT_SIZE": "1MiB"}, nil,
			func(c *Config) (any, any) { return c.Staging.SlotSize, 1 * MiB }},
		{"env duration", map[string]string{"STAGE_DRAIN_TIMEOUT": "2m"}, nil,
			func(c *Config) (any, any) { return c.Drain, 2 * time.Minute }},
		{"env peer limits", map[string]string{"STAGE_LIMITS_HANDSHAKE_TIMEOUT": "2s", "STAGE_LIMITS_SESSION_SILENCE": "3s",
			"STAGE_LIMITS_PEER_PROGRESS_TIMEOUT": "1m", "STAGE_LIMITS_MAX_HANDSHAKES": "16", "STAGE_LIMITS_MAX_HANDSHAKES_PER_ADDR": "4"}, nil,
			func(c *Config) (any, any) {
				l := c.Limits
				return []any{l.HandshakeTimeout, l.SessionSilence, l.PeerProgressTimeout, l.MaxHandshakes, l.MaxHandshakesPerAddr},
					[]any{2 * time.Second, 3 * time.Second, time.Minute, 16, 4}
			}},
		{"env bool and float", map[string]string{"STAGE_SECURITY_ALLOW_INSECURE": "true", "STAGE_DEVICE_HOSTMEM_BANDWIDTH_GBPS": "12.5"}, nil,
			func(c *Config) (any, any) {
				return []any{c.Security.AllowInsecure, c.Device.Hostmem.BandwidthGBps}, []any{true, 12.5}
			}},
		{"flag int", map[string]string{"STAGE_DEVICE_ORDINAL": "1"}, []string{"--device-ordinal", "3"},
			func(c *Config) (any, any) { return c.Device.Ordinal, 3 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cleanEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			fs := pflag.NewFlagSet("staged", pflag.ContinueOnError)
			RegisterFlags(fs)
			if err := fs.Parse(tt.flags); err != nil {
				t.Fatal(err)
			}
			c, err := Load(writeFile(t, file), fs)
			if err != nil {
				t.Fatalf("Load: got error %v, want nil", err)
			}
			if got, want := tt.check(c); !reflect.DeepEqual(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
		})
	}
}

func TestEveryFlag(t *testing.T) {
	cleanEnv(t)
	fs := pflag.NewFlagSet("staged", pflag.ContinueOnError)
	RegisterFlags(fs)
	args := []string{
		"--config", "/etc/stage/stage.yaml",
		"--listen", ":7200",
		"--control-socket", "/run/x.sock",
		"--node-name", "n1",
		"--device", "cuda",
		"--device-ordinal", "2",
		"--log-level", "warn",
		"--metrics-listen", ":9100",
		"--token", "tok",
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if got, want := ConfigPath(fs), "/etc/stage/stage.yaml"; got != want {
		t.Errorf("ConfigPath: got %q, want %q", got, want)
	}
	c, err := Load("", fs)
	if err != nil {
		t.Fatal(err)
	}
	got := []any{c.Listen, c.ControlSocket, c.Node.Name, c.Device.Kind, c.Device.Ordinal, c.Log.Level, c.Metrics.Listen, c.Security.Token}
	want := []any{":7200", "/run/x.sock", "n1", "cuda", 2, "warn", ":9100", "tok"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got := ConfigPath(nil); got != "" {
		t.Errorf("ConfigPath(nil): got %q, want \"\"", got)
	}
}

func TestUnknownKeys(t *testing.T) {
	tests := []struct {
		name, file string
		wantKey    string
		wantMsg    string
	}{
		{"nested typo", "staging:\n  slotz: 5\n", "staging.slotz", "did you mean staging.slots?"},
		{"top-level typo", "listn: :7100\n", "listn", "did you mean listen?"},
		{"unrelated key", "frobnicate: 1\n", "frobnicate", "known keys here:"},
		{"key in a route", "routes:\n  - name: a\n    peers: [h:1]\n    stripe: 2\n", "routes[0].stripe", "did you mean routes[0].stripes?"},
		{"key in the second route", "routes:\n  - name: a\n    peers: [h:1]\n  - name: b\n    peer: [h:1]\n", "routes[1].peer", "did you mean routes[1].peers?"},
		{"deep key", "device:\n  hostmem:\n    latncy: 1ms\n", "device.hostmem.latncy", "did you mean device.hostmem.latency?"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cleanEnv(t)
			t.Setenv("STAGE_SECURITY_TOKEN", "x")
			_, err := Load(writeFile(t, tt.file), nil)
			if err == nil {
				t.Fatalf("got nil error, want one naming %s", tt.wantKey)
			}
			keys := problemKeys(t, err)
			if !contains(keys, tt.wantKey) {
				t.Errorf("got problems %v, want %s among them", keys, tt.wantKey)
			}
			if !strings.Contains(err.Error(), tt.wantKey+": unknown key") || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("got %q, want it to say %q and %q", err, tt.wantKey+": unknown key", tt.wantMsg)
			}
		})
	}
}

func TestBadTypes(t *testing.T) {
	tests := []struct {
		name, file string
		env        map[string]string
		wantKey    string
	}{
		{"int from text", "staging:\n  slots: many\n", nil, "staging.slots"},
		{"int from fraction", "staging:\n  slots: 2.5\n", nil, "staging.slots"},
		{"int from env", "", map[string]string{"STAGE_STAGING_SLOTS": "lots"}, "staging.slots"},
		{"section as scalar", "staging: 5\n", nil, "staging"},
		{"negative size", "staging:\n  slot_size: -1\n", nil, "staging.slot_size"},
		{"size with bad unit", "staging:\n  slot_size: 4QB\n", nil, "staging.slot_size"},
		{"duration without unit", "drain_timeout: 5\n", nil, "drain_timeout"},
		{"duration from env", "", map[string]string{"STAGE_DRAIN_TIMEOUT": "soon"}, "drain_timeout"},
		{"bool from text", "routes:\n  - name: a\n    peers: [h:1]\n    checksum: maybe\n", nil, "routes[0].checksum"},
		{"string from number", "node:\n  name: 12\n", nil, "node.name"},
		{"routes not a list", "routes: {name: a}\n", nil, "routes"},
		{"route not a mapping", "routes:\n  - a\n", nil, "routes[0]"},
		{"peers not a list", "routes:\n  - name: a\n    peers: {h: 1}\n", nil, "routes[0].peers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cleanEnv(t)
			t.Setenv("STAGE_SECURITY_TOKEN", "x")
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			_, err := Load(writeFile(t, tt.file), nil)
			keys := problemKeys(t, err)
			if n := count(keys, tt.wantKey); n != 1 {
				t.Errorf("got problems %v, want %s exactly once", keys, tt.wantKey)
			}
			// A bad value is reported once, not again by validation of
			// what replaced it.
			for _, k := range keys {
				if k != tt.wantKey && strings.HasPrefix(k, tt.wantKey) {
					t.Errorf("got extra problem %s under %s: %v", k, tt.wantKey, err)
				}
			}
			if !strings.Contains(err.Error(), "(got ") {
				t.Errorf("got %q, want the bad value shown", err)
			}
		})
	}
}

func TestEveryProblemAtOnce(t *testing.T) {
	cleanEnv(t)
	p := writeFile(t, `
listen: nowhere
staging:
  slot_size: 1KiB
  slotz: 3
  copy_streams: many
routes:
  - name: decode
    peers: [nohost]
    transport: udp
  - name: decode
    peers: [h:1]
    stripes: 0
`)
	_, err := Load(p, nil)
	want := []string{"staging.copy_streams", "staging.slotz", "listen", "staging.slot_size",
		"routes[0].peers[0]", "routes[0].transport", "routes[1].name", "routes[1].stripes", "security.token"}
	got := problemKeys(t, err)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got problems %v, want %v", got, want)
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Errorf("got %d lines, want %d:\n%s", len(lines), len(want), err)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, p+": ") {
			t.Errorf("got line %q, want it prefixed with %q", l, p+": ")
		}
	}
}

func TestRouteDefaults(t *testing.T) {
	cleanEnv(t)
	p := writeFile(t, `
security: {token: x}
routes:
  - name: decode
    peers: ["decode-0.decode:7100", "10.0.0.5:7100"]
  - name: prefill
    peers: ["[::1]:7101"]
    stripes: 8
    transport: tcp
    checksum: true
    connect_timeout: 1s
    progress_timeout: 2m
`)
	c, err := Load(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		want Route
	}{
		{"decode", Route{Name: "decode", Peers: []string{"decode-0.decode:7100", "10.0.0.5:7100"},
			Stripes: 4, Transport: "auto", Checksum: false, ConnectTimeout: 5 * time.Second, ProgressTimeout: 30 * time.Second,
			Pick: PickNamed, IdleTimeout: 5 * time.Minute, DNSInterval: 5 * time.Second}},
		{"prefill", Route{Name: "prefill", Peers: []string{"[::1]:7101"},
			Stripes: 8, Transport: "tcp", Checksum: true, ConnectTimeout: time.Second, ProgressTimeout: 2 * time.Minute,
			Pick: PickNamed, IdleTimeout: 5 * time.Minute, DNSInterval: 5 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := c.Route(tt.name)
			if !ok {
				t.Fatalf("Route(%q): got not found, want found", tt.name)
			}
			if !reflect.DeepEqual(*got, tt.want) {
				t.Errorf("got %+v, want %+v", *got, tt.want)
			}
		})
	}
	if _, ok := c.Route("nope"); ok {
		t.Errorf("Route(nope): got found, want not found")
	}
}

func TestExplicitZeroIsNotADefault(t *testing.T) {
	cleanEnv(t)
	p := writeFile(t, "security: {token: x}\nroutes:\n  - name: a\n    peers: [h:1]\n    stripes: 0\n    connect_timeout: 0s\n")
	_, err := Load(p, nil)
	got := problemKeys(t, err)
	want := []string{"routes[0].stripes", "routes[0].connect_timeout"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got problems %v, want %v", got, want)
	}
}

func TestCheck(t *testing.T) {
	cleanEnv(t)
	t.Run("missing file", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "nope.yaml")
		_, err := Check(p)
		if err == nil || !strings.Contains(err.Error(), p) {
			t.Fatalf("got %v, want an error naming %s", err, p)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("got %v, want errors.Is(err, fs.ErrNotExist)", err)
		}
	})
	t.Run("bad YAML", func(t *testing.T) {
		p := writeFile(t, "staging: [\n")
		_, err := Check(p)
		if err == nil || !strings.HasPrefix(err.Error(), p+": ") {
			t.Fatalf("got %v, want an error starting with %s", err, p)
		}
	})
	t.Run("invalid", func(t *testing.T) {
		p := writeFile(t, "staging:\n  slot_size: 1KiB\n")
		_, err := Check(p)
		want := p + ": staging.slot_size: must be between 64KiB and 256MiB (got 1KiB)\n" + p + ": security.token: "
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Fatalf("got %v, want it to start with %q", err, want)
		}
	})
	t.Run("valid", func(t *testing.T) {
		p := writeFile(t, "security:\n  allow_insecure: true\n")
		w, err := Check(p)
		if err != nil {
			t.Fatalf("got %v, want nil", err)
		}
		if len(w) != 1 || w[0].Key != "security.allow_insecure" {
			t.Errorf("warnings %v, want one about security.allow_insecure", w)
		}
	})
	t.Run("no path", func(t *testing.T) {
		if _, err := Check(""); err == nil {
			t.Fatal("got nil, want an error")
		}
	})
}

func TestTokenNeverInErrors(t *testing.T) {
	const secret = "s3cr3t-value"
	tests := []struct{ name, file string }{
		{"misspelled token key", "security:\n  tokn: " + secret + "\n"},
		{"token of the wrong type", "security:\n  token: [" + secret + "]\n"},
		{"security not a mapping", "security: " + secret + "\n"},
		{"token key at top level", "token: " + secret + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cleanEnv(t)
			_, err := Load(writeFile(t, tt.file), nil)
			if err == nil {
				t.Fatal("got nil, want an error")
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("got %q, want the token hidden", err)
			}
		})
	}
}

func TestSocketPath(t *testing.T) {
	tests := []struct {
		name, socket, xdg, want string
	}{
		{"explicit", "/run/stage.sock", "/run/user/1", "/run/stage.sock"},
		{"xdg", "", "/run/user/1", "/run/user/1/stage/staged.sock"},
		{"tmp", "", "", "/tmp/stage-" + strconv.Itoa(os.Getuid()) + "/staged.sock"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("XDG_RUNTIME_DIR", tt.xdg)
			c := &Config{ControlSocket: tt.socket}
			if got := c.SocketPath(); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestResolveToken(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "token")
	empty := filepath.Join(dir, "empty")
	os.WriteFile(good, []byte("  abc\n"), 0o600)
	os.WriteFile(empty, []byte("\n"), 0o600)
	missing := filepath.Join(dir, "missing")
	tests := []struct {
		name    string
		sec     Security
		want    string
		wantErr string
	}{
		{"token", Security{Token: "t"}, "t", ""},
		{"file trimmed", Security{TokenFile: good}, "abc", ""},
		{"empty file", Security{TokenFile: empty}, "", empty},
		{"missing file", Security{TokenFile: missing}, "", missing},
		{"insecure", Security{AllowInsecure: true}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Config{Security: tt.sec}
			got, err := c.ResolveToken()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got error %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got %q, %v, want %q, nil", got, err, tt.want)
			}
		})
	}
}

func flagSet(t *testing.T, args ...string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("staged", pflag.ContinueOnError)
	RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return fs
}

func contains(list []string, s string) bool { return count(list, s) > 0 }

func count(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}
