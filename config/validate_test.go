package config

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// validConfig is the default with a token and two good routes.
func validConfig() *Config {
	c := Default()
	c.Security.Token = "t0ken"
	route := func(name string, peers ...string) Route {
		return Route{Name: name, Peers: peers, Stripes: DefaultRouteStripes, Transport: DefaultRouteTransport,
			ConnectTimeout: DefaultRouteConnectTimeout, ProgressTimeout: DefaultRouteProgressTimeout,
			Pick: DefaultRoutePick, IdleTimeout: DefaultRouteIdleTimeout, DNSInterval: DefaultRouteDNSInterval}
	}
	c.Routes = []Route{
		route("decode", "decode-0.decode:7100", "10.0.0.5:7100"),
		route("prefill.v2", "[fd00::1]:7100"),
	}
	return c
}

func TestValidateAcceptsGoodConfigs(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		mutate func(c *Config)
	}{
		{"as is", func(c *Config) {}},
		{"token file", func(c *Config) { c.Security.Token = ""; c.Security.TokenFile = tokenFile }},
		{"insecure, no token", func(c *Config) { c.Security.Token = ""; c.Security.AllowInsecure = true }},
		{"listen all interfaces", func(c *Config) { c.Listen = ":7100" }},
		{"listen ephemeral port", func(c *Config) { c.Listen = "127.0.0.1:0" }},
		{"listen by name", func(c *Config) { c.Listen = "localhost:7100" }},
		{"metrics on", func(c *Config) { c.Metrics.Listen = ":9100" }},
		{"smallest slots", func(c *Config) { c.Staging.SlotSize = MinSlotSize }},
		{"largest slots", func(c *Config) { c.Staging.SlotSize = MaxSlotSize; c.Staging.Slots = 256 }},
		{"window = slots", func(c *Config) { c.Staging.Slots = 2; c.Staging.Window = 2 }},
		{"16 copy streams", func(c *Config) { c.Staging.CopyStreams = 16 }},
		{"cuda device 7", func(c *Config) { c.Device.Kind = "cuda"; c.Device.Ordinal = 7 }},
		{"json debug log", func(c *Config) { c.Log.Level = "debug"; c.Log.Format = "json" }},
		{"64 stripes shm", func(c *Config) { c.Routes[0].Stripes = 64; c.Routes[0].Transport = "shm" }},
		{"splice send on hostmem", func(c *Config) { c.Staging.SpliceSend = true }},
		{"splice send on cuda", func(c *Config) { c.Staging.SpliceSend = true; c.Device.Kind = "cuda" }},
		// Where it cannot apply, the sidecar sends with writev (proxy).
		{"splice send on hip", func(c *Config) { c.Staging.SpliceSend = true; c.Device.Kind = "hip" }},
		{"splice send with odd slots", func(c *Config) { c.Staging.SpliceSend = true; c.Staging.SlotSize = 100*KiB + 1 }},
		{"one handshake at a time", func(c *Config) { c.Limits.MaxHandshakes = 1; c.Limits.MaxHandshakesPerAddr = 1 }},
		{"shortest peer timings", func(c *Config) {
			c.Limits.HandshakeTimeout = MinHandshakeTimeout
			c.Limits.SessionSilence = MinSessionSilence
			c.Limits.PeerProgressTimeout = time.Millisecond
		}},
		{"longest handshake timeout", func(c *Config) { c.Limits.HandshakeTimeout = MaxHandshakeTimeout }},
		{"pick any", func(c *Config) { c.Routes[0].Pick = PickAny }},
		{"allow only", func(c *Config) {
			c.Routes[0].Peers = nil
			c.Routes[0].Allow = []string{"10.0.0.0/8", "fd00::/8", ".decode.svc.cluster.local", "decode.local"}
			c.Routes[0].IdleTimeout = time.Minute
		}},
		{"dns only", func(c *Config) {
			c.Routes[0].Peers = nil
			c.Routes[0].DNS = "decode.stage.svc.cluster.local:7100"
			c.Routes[0].DNSInterval = MinDNSInterval
			c.Routes[0].DNSServer = "127.0.0.1:5353"
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.mutate(c)
			if err := Validate(c); err != nil {
				t.Errorf("got %v, want nil", err)
			}
		})
	}
}

func TestValidateRules(t *testing.T) {
	dir := t.TempDir()
	emptyFile := filepath.Join(dir, "empty")
	if err := os.WriteFile(emptyFile, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("abc"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		mutate  func(c *Config)
		wantKey string
		wantMsg string // part of the line
	}{
		{"node name empty", func(c *Config) { c.Node.Name = "" }, "node.name", "empty"},
		{"route without peers", func(c *Config) { c.Routes[0].Peers = nil }, "routes[0].peers", "or set dns or allow"},
		{"pick unknown", func(c *Config) { c.Routes[0].Pick = "random" }, "routes[0].pick", `must be one of named, any (got "random")`},
		{"allow junk", func(c *Config) { c.Routes[0].Allow = []string{"10.0.0.0/33"} }, "routes[0].allow[0]", "CIDR range or a DNS suffix"},
		{"allow dot", func(c *Config) { c.Routes[0].Allow = []string{"."} }, "routes[0].allow[0]", "CIDR range or a DNS suffix"},
		{"allow idle 0", func(c *Config) { c.Routes[0].Allow = []string{"10.0.0.0/8"}; c.Routes[0].IdleTimeout = 0 }, "routes[0].idle_timeout", "> 0"},
		{"dns no port", func(c *Config) { c.Routes[0].DNS = "decode"; c.Routes[0].DNSInterval = time.Second }, "routes[0].dns", "host:port"},
		{"dns interval", func(c *Config) { c.Routes[0].DNS = "decode:7100"; c.Routes[0].DNSInterval = time.Millisecond }, "routes[0].dns_interval", "must be >= 100ms"},
		{"dns server", func(c *Config) { c.Routes[0].DNSServer = "10.0.0.1" }, "routes[0].dns_server", "host:port"},
		{"max streams", func(c *Config) { c.Limits.MaxStreams = 0 }, "limits.max_streams", "(got 0)"},
		{"listen not host:port", func(c *Config) { c.Listen = "7100" }, "listen", `must be host:port (got "7100")`},
		{"listen empty", func(c *Config) { c.Listen = "" }, "listen", "host:port"},
		{"listen bad port", func(c *Config) { c.Listen = ":http" }, "listen", "port"},
		{"listen port too big", func(c *Config) { c.Listen = ":65536" }, "listen", "port"},
		{"control socket too long", func(c *Config) { c.ControlSocket = "/" + strings.Repeat("s", 200) }, "control_socket", "too long"},
		{"device kind", func(c *Config) { c.Device.Kind = "gpu" }, "device.kind", `must be one of hostmem, cuda, acl, hip (got "gpu")`},
		{"device kind case", func(c *Config) { c.Device.Kind = "CUDA" }, "device.kind", "must be one of"},
		{"device ordinal", func(c *Config) { c.Device.Ordinal = -1 }, "device.ordinal", "must be >= 0 (got -1)"},
		{"hostmem bandwidth", func(c *Config) { c.Device.Hostmem.BandwidthGBps = -1 }, "device.hostmem.bandwidth_gbps", ">= 0"},
		{"hostmem bandwidth NaN", func(c *Config) { c.Device.Hostmem.BandwidthGBps = math.NaN() }, "device.hostmem.bandwidth_gbps", "finite"},
		{"hostmem latency", func(c *Config) { c.Device.Hostmem.Latency = -time.Millisecond }, "device.hostmem.latency", ">= 0"},
		{"slot size small", func(c *Config) { c.Staging.SlotSize = KiB }, "staging.slot_size", "must be between 64KiB and 256MiB (got 1KiB)"},
		{"slot size large", func(c *Config) { c.Staging.SlotSize = 512 * MiB }, "staging.slot_size", "(got 512MiB)"},
		{"slots < 2", func(c *Config) { c.Staging.Slots = 1; c.Staging.Window = 1 }, "staging.slots", "must be >= 2 (got 1)"},
		{"pool too big", func(c *Config) { c.Staging.Slots = 64*1024 + 1 }, "staging.slots", "at most 64GiB"},
		{"pool overflow", func(c *Config) { c.Staging.Slots = math.MaxInt; c.Staging.SlotSize = MaxSlotSize }, "staging.slots", "at most 64GiB"},
		{"window 0", func(c *Config) { c.Staging.Window = 0 }, "staging.window", "(got 0)"},
		{"window > slots", func(c *Config) { c.Staging.Window = 65 }, "staging.window", "must be 1..staging.slots (64) (got 65)"},
		{"copy streams 0", func(c *Config) { c.Staging.CopyStreams = 0 }, "staging.copy_streams", "must be 1..16 (got 0)"},
		{"copy streams 17", func(c *Config) { c.Staging.CopyStreams = 17 }, "staging.copy_streams", "(got 17)"},
		{"node idle 500ms", func(c *Config) { c.Node.IdleConnTimeout = 500 * time.Millisecond }, "node.idle_conn_timeout", "must be 1s..10m0s (got 500ms)"},
		{"node idle 1h", func(c *Config) { c.Node.IdleConnTimeout = time.Hour }, "node.idle_conn_timeout", "(got 1h0m0s)"},
		{"route name empty", func(c *Config) { c.Routes[0].Name = "" }, "routes[0].name", "empty"},
		{"route name chars", func(c *Config) { c.Routes[1].Name = "Pre fill" }, "routes[1].name", `(got "Pre fill")`},
		{"route name long", func(c *Config) { c.Routes[1].Name = strings.Repeat("a", 64) }, "routes[1].name", "1..63"},
		{"route name duplicate", func(c *Config) { c.Routes[1].Name = "decode" }, "routes[1].name", `duplicate route name "decode"`},
		{"route without peers", func(c *Config) { c.Routes[0].Peers = nil }, "routes[0].peers", "empty"},
		{"peer not host:port", func(c *Config) { c.Routes[0].Peers[0] = "nohost" }, "routes[0].peers[0]", `must be host:port (got "nohost")`},
		{"peer without host", func(c *Config) { c.Routes[0].Peers[1] = ":7100" }, "routes[0].peers[1]", "host is empty"},
		{"peer port 0", func(c *Config) { c.Routes[0].Peers[1] = "h:0" }, "routes[0].peers[1]", "1..65535"},
		{"peer bad host", func(c *Config) { c.Routes[0].Peers[1] = "a b:1" }, "routes[0].peers[1]", "not an IP address or a host name"},
		{"peer duplicate", func(c *Config) { c.Routes[0].Peers[1] = c.Routes[0].Peers[0] }, "routes[0].peers[1]", "duplicate peer"},
		{"stripes 0", func(c *Config) { c.Routes[0].Stripes = 0 }, "routes[0].stripes", "must be 1..64 (got 0)"},
		{"stripes 65", func(c *Config) { c.Routes[1].Stripes = 65 }, "routes[1].stripes", "(got 65)"},
		{"transport", func(c *Config) { c.Routes[0].Transport = "udp" }, "routes[0].transport", `must be one of auto, tcp, ipc, shm (got "udp")`},
		{"connect timeout", func(c *Config) { c.Routes[0].ConnectTimeout = 0 }, "routes[0].connect_timeout", "must be > 0"},
		{"progress timeout", func(c *Config) { c.Routes[1].ProgressTimeout = -time.Second }, "routes[1].progress_timeout", "must be > 0"},
		{"stall timeout small", func(c *Config) { c.Staging.StallTimeout = 100 * time.Millisecond }, "staging.stall_timeout", "must be 0 (off) or 500ms..10m0s (got 100ms)"},
		{"stall timeout negative", func(c *Config) { c.Staging.StallTimeout = -time.Second }, "staging.stall_timeout", "(got -1s)"},
		{"tail chunk small", func(c *Config) { c.Staging.TailChunk = 100 }, "staging.tail_chunk", "must be 0 (off) or 4KiB..128MiB (got 100B)"},
		{"tail chunk large", func(c *Config) { c.Staging.TailChunk = 128*MiB + 1 }, "staging.tail_chunk", "(got "},
		{"stall timeout past progress", func(c *Config) {
			c.Staging.StallTimeout = 5 * time.Second
			c.Routes[1].ProgressTimeout = 5 * time.Second
		},
			"staging.stall_timeout", "must be below routes[1].progress_timeout (5s)"},
		{"no token", func(c *Config) { c.Security.Token = "" }, "security.token",
			"empty; set security.token or security.token_file (or security.allow_insecure: true for local tests only)"},
		{"no token, no routes", func(c *Config) { c.Security.Token = ""; c.Routes = nil }, "security.token", "empty"},
		{"token with white space", func(c *Config) { c.Security.Token = "abc\n" }, "security.token", "white space"},
		{"token and token file", func(c *Config) { c.Security.TokenFile = tokenFile }, "security.token_file", "only one"},
		{"token file missing", func(c *Config) { c.Security.Token = ""; c.Security.TokenFile = filepath.Join(dir, "nope") }, "security.token_file", "cannot read"},
		{"token file empty", func(c *Config) { c.Security.Token = ""; c.Security.TokenFile = emptyFile }, "security.token_file", "empty"},
		{"metrics listen", func(c *Config) { c.Metrics.Listen = "9100" }, "metrics.listen", "host:port"},
		{"log level", func(c *Config) { c.Log.Level = "verbose" }, "log.level", `must be one of debug, info, warn, error (got "verbose")`},
		{"log format", func(c *Config) { c.Log.Format = "xml" }, "log.format", "must be one of console, json"},
		{"max sessions", func(c *Config) { c.Limits.MaxSessions = 0 }, "limits.max_sessions", ">= 1"},
		{"max transfers per peer", func(c *Config) { c.Limits.MaxTransfersPerPeer = -1 }, "limits.max_transfers_per_peer", ">= 1"},
		{"max clients", func(c *Config) { c.Limits.MaxClients = 0 }, "limits.max_clients", ">= 1"},
		{"drain timeout", func(c *Config) { c.Drain = 0 }, "drain_timeout", "must be > 0 (got 0s)"},
		{"max handshakes", func(c *Config) { c.Limits.MaxHandshakes = 0; c.Limits.MaxHandshakesPerAddr = 1 }, "limits.max_handshakes", ">= 1 (got 0)"},
		{"max handshakes per addr 0", func(c *Config) { c.Limits.MaxHandshakesPerAddr = 0 }, "limits.max_handshakes_per_addr", "must be 1..limits.max_handshakes (256) (got 0)"},
		{"max handshakes per addr > total", func(c *Config) { c.Limits.MaxHandshakes = 8; c.Limits.MaxHandshakesPerAddr = 9 },
			"limits.max_handshakes_per_addr", "(8) (got 9)"},
		{"handshake timeout short", func(c *Config) { c.Limits.HandshakeTimeout = 99 * time.Millisecond }, "limits.handshake_timeout", "must be 100ms..5m0s (got 99ms)"},
		{"handshake timeout long", func(c *Config) { c.Limits.HandshakeTimeout = 6 * time.Minute }, "limits.handshake_timeout", "(got 6m0s)"},
		{"session silence", func(c *Config) { c.Limits.SessionSilence = 1999 * time.Millisecond }, "limits.session_silence", "must be >= 2s (got 1.999s)"},
		{"peer progress timeout", func(c *Config) { c.Limits.PeerProgressTimeout = 0 }, "limits.peer_progress_timeout", "must be > 0 (got 0s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.mutate(c)
			err := Validate(c)
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("got %v, want a *ValidationError", err)
			}
			if len(ve.Problems) != 1 {
				t.Errorf("got %d problems, want 1:\n%v", len(ve.Problems), err)
			}
			if !ve.Has(tt.wantKey) {
				t.Fatalf("got %v, want a problem for %s", err, tt.wantKey)
			}
			if !strings.Contains(err.Error(), tt.wantKey+": ") || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("got %q, want %q and %q", err, tt.wantKey+": ", tt.wantMsg)
			}
		})
	}
}

func TestValidateListsEveryProblem(t *testing.T) {
	c := validConfig()
	c.Staging.SlotSize = KiB
	c.Routes[1].Name = "decode"
	c.Routes[0].Peers[0] = "nohost"
	c.Routes[0].Transport = "udp"
	c.Routes[0].Stripes = 0
	c.Security.Token = ""
	err := Validate(c)
	want := strings.Join([]string{
		"staging.slot_size: must be between 64KiB and 256MiB (got 1KiB)",
		`routes[0].peers[0]: must be host:port (got "nohost"); use e.g. "decode-0.decode:7100" or "10.0.0.5:7100"`,
		"routes[0].stripes: must be 1..64 (got 0)",
		`routes[0].transport: must be one of auto, tcp, ipc, shm (got "udp")`,
		`routes[1].name: duplicate route name "decode" (also routes[0].name); route names must be unique`,
		"security.token: empty; set security.token or security.token_file (or security.allow_insecure: true for local tests only)",
	}, "\n")
	if err == nil || err.Error() != want {
		t.Errorf("got\n%v\nwant\n%s", err, want)
	}
	if err := Validate(nil); err == nil {
		t.Error("Validate(nil): got nil, want an error")
	}
}

func TestProblemSource(t *testing.T) {
	tests := []struct {
		name  string
		env   map[string]string
		flags []string
		want  string
	}{
		{"env", map[string]string{"STAGE_STAGING_SLOTS": "1", "STAGE_STAGING_WINDOW": "1"}, nil,
			"staging.slots: must be >= 2 (got 1) [from STAGE_STAGING_SLOTS]"},
		{"env type", map[string]string{"STAGE_STAGING_SLOTS": "x"}, nil,
			`staging.slots: must be an integer (got "x") [from STAGE_STAGING_SLOTS]`},
		{"flag", nil, []string{"--listen", "nowhere"},
			`listen: must be host:port (got "nowhere"); use e.g. "127.0.0.1:7100" or ":7100" for every interface [from --listen]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cleanEnv(t)
			t.Setenv("STAGE_SECURITY_TOKEN", "x")
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			fs := flagSet(t, tt.flags...)
			_, err := Load("", fs)
			if err == nil || err.Error() != tt.want {
				t.Errorf("got %v, want %s", err, tt.want)
			}
		})
	}
}
