package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Problem is one thing wrong with a configuration.
type Problem struct {
	Key string // path of the key: "staging.slot_size", "routes[1].peers[0]"
	Msg string // what is wrong (got <value>); what to do
}

func (p Problem) String() string { return p.Key + ": " + p.Msg }

// ValidationError lists every problem found in a configuration, one per
// line. File, when set, is the config file and prefixes each line.
type ValidationError struct {
	File     string
	Problems []Problem
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		if e.File != "" {
			b.WriteString(e.File)
			b.WriteString(": ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// Has reports whether a problem names key exactly.
func (e *ValidationError) Has(key string) bool {
	for _, p := range e.Problems {
		if p.Key == key {
			return true
		}
	}
	return false
}

// Limits enforced by Validate.
const (
	MinSlotSize    = 64 * KiB
	MaxSlotSize    = 256 * MiB
	MaxPoolSize    = 64 * GiB
	MinSlots       = 2
	MaxCopyStreams = 16
	MaxInline      = 1 * MiB
	MaxReadSpin    = 10 * time.Millisecond
	// MaxNodeCopyStreams bounds node.copy_streams: more streams than a
	// GPU has copy engines only queue.
	MaxNodeCopyStreams = 8
	// MinNodeIdle and MaxNodeIdle bound node.idle_conn_timeout: below a
	// second connections churn between an engine's transfers; an idle one
	// costs an fd and a goroutine on each side, so not for ever.
	MinNodeIdle    = time.Second
	MaxNodeIdle    = 10 * time.Minute
	MinStall       = 500 * time.Millisecond
	MaxStall       = 10 * time.Minute
	MaxStreamDepth = 64
	MinTailChunk   = 4 * KiB
	MaxStripes     = 64
	MinDNSInterval = 100 * time.Millisecond
	// Bounds of the peer timing limits.
	MinHandshakeTimeout = 100 * time.Millisecond
	MaxHandshakeTimeout = 5 * time.Minute
	// MinSessionSilence is two heartbeat intervals: a shorter deadline
	// would drop healthy sessions between heartbeats.
	MinSessionSilence = 2 * time.Second
	maxRouteName      = 63
	maxSocketPath     = 107 // sizeof(sun_path) - 1 on Linux
)

// Allowed values, for flag help and messages. Treat as read-only.
var (
	DeviceKinds = []string{"hostmem", "cuda", "acl", "hip"}
	Transports  = []string{"auto", "tcp", "ipc", "shm"}
	Picks       = []string{PickNamed, PickAny}
	LogLevels   = []string{"debug", "info", "warn", "error"}
	LogFormats  = []string{"console", "json"}
)

var (
	routeNameRE = regexp.MustCompile(`^[a-z0-9._-]+$`)
	hostnameRE  = regexp.MustCompile(`^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?\.?$`)
)

// Validate checks c and returns nil or a *ValidationError listing every
// problem, each as "<key.path>: <what is wrong> (got <value>); <what to do>".
// It reads security.token_file to check that it holds a token.
func Validate(c *Config) error {
	if c == nil {
		return errors.New("config: nil Config")
	}
	var v validator

	if strings.TrimSpace(c.Node.Name) == "" {
		v.add("node.name", "empty; set a name for this sidecar (shown to peers and in stats)")
	}
	v.hostPort("listen", c.Listen, false, false, `use e.g. "127.0.0.1:7100" or ":7100" for every interface`)
	if n := len(c.ControlSocket); n > maxSocketPath {
		v.add("control_socket", fmt.Sprintf("path too long for a Unix socket (got %d bytes, at most %d); use a shorter path", n, maxSocketPath))
	}

	if n := len(c.Node.SocketDir) + 1 + NodeSocketName; c.Node.SocketDir != "" && n > maxSocketPath {
		v.add("node.socket_dir", fmt.Sprintf("path too long for the node sockets in it (got %d bytes, at most %d); use a shorter path", len(c.Node.SocketDir), maxSocketPath-1-NodeSocketName))
	}

	if c.Node.CopyStreams < 1 || c.Node.CopyStreams > MaxNodeCopyStreams {
		v.add("node.copy_streams", fmt.Sprintf("must be 1..%d (got %d)", MaxNodeCopyStreams, c.Node.CopyStreams))
	}
	v.oneOf("node.wake_link", c.Node.WakeLink, NodeWakeLinks)
	if t := c.Node.IdleConnTimeout; t < MinNodeIdle || t > MaxNodeIdle {
		v.add("node.idle_conn_timeout", fmt.Sprintf("must be %s..%s (got %s)", MinNodeIdle, MaxNodeIdle, t))
	}

	v.device(c.Device)

	v.staging(c.Staging, c.Routes)

	v.routes(c.Routes)
	v.security(c.Security)
	v.exposure(c)

	if c.Metrics.Listen != "" {
		v.hostPort("metrics.listen", c.Metrics.Listen, false, false, `use e.g. ":9100", or "" to turn metrics off`)
	}
	v.oneOf("log.level", c.Log.Level, LogLevels)
	v.oneOf("log.format", c.Log.Format, LogFormats)

	v.atLeastOne("limits.max_sessions", c.Limits.MaxSessions)
	v.atLeastOne("limits.max_streams", c.Limits.MaxStreams)
	v.atLeastOne("limits.max_transfers_per_peer", c.Limits.MaxTransfersPerPeer)
	v.atLeastOne("limits.max_clients", c.Limits.MaxClients)
	v.limits(c.Limits)
	v.positive("drain_timeout", c.Drain)

	if len(v.problems) == 0 {
		return nil
	}
	return &ValidationError{Problems: v.problems}
}

// staging checks the staging keys; the stall timeout against every
// route's progress timeout.
func (v *validator) staging(s Staging, routes []Route) {
	if s.SlotSize < MinSlotSize || s.SlotSize > MaxSlotSize {
		v.add("staging.slot_size", fmt.Sprintf("must be between %s and %s (got %s)", MinSlotSize, MaxSlotSize, s.SlotSize))
	}
	if s.Slots < MinSlots {
		v.add("staging.slots", fmt.Sprintf("must be >= %d (got %d)", MinSlots, s.Slots))
	} else if s.SlotSize > 0 && uint64(s.Slots) > uint64(MaxPoolSize/s.SlotSize) {
		v.add("staging.slots", fmt.Sprintf("pool of slots * slot_size must be at most %s (got %d * %s = %s); lower staging.slots or staging.slot_size",
			MaxPoolSize, s.Slots, s.SlotSize, approxSize(float64(s.Slots)*float64(s.SlotSize))))
	}
	if s.Window < 1 || (s.Slots >= MinSlots && s.Window > s.Slots) {
		v.add("staging.window", fmt.Sprintf("must be 1..staging.slots (%d) (got %d)", s.Slots, s.Window))
	}
	if s.CopyStreams < 1 || s.CopyStreams > MaxCopyStreams {
		v.add("staging.copy_streams", fmt.Sprintf("must be 1..%d (got %d)", MaxCopyStreams, s.CopyStreams))
	}
	if (s.StreamDepth < 0 && s.StreamDepth != DepthAuto) || s.StreamDepth > MaxStreamDepth {
		v.add("staging.stream_depth", fmt.Sprintf("must be auto or 0..%d (got %d); 0: as slots and credits allow", MaxStreamDepth, s.StreamDepth))
	}
	if s.SocketBuffer > 1<<30 {
		v.add("staging.socket_buffer", fmt.Sprintf("must be at most 1GiB (got %s); 0: the kernel's autotuning", s.SocketBuffer))
	}
	if s.TailChunk != 0 && (s.TailChunk < MinTailChunk || s.TailChunk > MaxSlotSize/2) {
		v.add("staging.tail_chunk", fmt.Sprintf("must be 0 (off) or %s..%s (got %s); it cuts nothing above half of staging.slot_size", MinTailChunk, MaxSlotSize/2, s.TailChunk))
	}
	if s.StreamQueue < 0 || s.StreamQueue > MaxStreamDepth {
		v.add("staging.stream_queue", fmt.Sprintf("must be 0..%d (got %d); 0: no limit", MaxStreamDepth, s.StreamQueue))
	}
	if !s.ReadSpin.Valid() {
		v.add("staging.read_spin", fmt.Sprintf("must be auto, adaptive or 0..%s (got %s)", MaxReadSpin, s.ReadSpin))
	}
	if s.StallTimeout != 0 && (s.StallTimeout < MinStall || s.StallTimeout > MaxStall) {
		v.add("staging.stall_timeout", fmt.Sprintf("must be 0 (off) or %s..%s (got %s)", MinStall, MaxStall, s.StallTimeout))
	}
	for i, r := range routes {
		if s.StallTimeout > 0 && r.ProgressTimeout > 0 && s.StallTimeout >= r.ProgressTimeout {
			v.add("staging.stall_timeout", fmt.Sprintf("must be below routes[%d].progress_timeout (%s) (got %s): a stalled stream must be dropped before its transfers fail", i, r.ProgressTimeout, s.StallTimeout))
		}
	}
	if s.InlineMax > MaxInline || (s.SlotSize >= MinSlotSize && s.InlineMax > s.SlotSize) {
		v.add("staging.inline_max", fmt.Sprintf("must be 0..%s and at most staging.slot_size (got %s)", MaxInline, s.InlineMax))
	}
}

type validator struct{ problems []Problem }

func (v *validator) add(key, msg string) {
	v.problems = append(v.problems, Problem{Key: key, Msg: msg})
}

func (v *validator) oneOf(key, got string, allowed []string) {
	for _, a := range allowed {
		if got == a {
			return
		}
	}
	v.add(key, fmt.Sprintf("must be one of %s (got %q)", strings.Join(allowed, ", "), got))
}

func (v *validator) atLeastOne(key string, got int) {
	if got < 1 {
		v.add(key, fmt.Sprintf("must be >= 1 (got %d)", got))
	}
}

func (v *validator) positive(key string, d time.Duration) {
	if d <= 0 {
		v.add(key, fmt.Sprintf("must be > 0 (got %s); use e.g. 5s", d))
	}
}

// hostPort checks a host:port. needHost: the host may not be empty (a
// peer); needPort: the port may not be 0.
func (v *validator) hostPort(key, got string, needHost, needPort bool, hint string) {
	bad := func(what string) {
		v.add(key, fmt.Sprintf("%s (got %q); %s", what, got, hint))
	}
	host, port, err := net.SplitHostPort(got)
	if err != nil {
		bad("must be host:port")
		return
	}
	if needHost && host == "" {
		bad("host is empty")
		return
	}
	if host != "" && net.ParseIP(host) == nil && !hostnameRE.MatchString(host) {
		bad(fmt.Sprintf("host %q is not an IP address or a host name", host))
		return
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 || (needPort && n == 0) {
		if needPort {
			bad(fmt.Sprintf("port %q must be a number 1..65535", port))
		} else {
			bad(fmt.Sprintf("port %q must be a number 0..65535", port))
		}
	}
}

func (v *validator) routes(routes []Route) {
	seen := map[string]int{}
	for i, r := range routes {
		p := fmt.Sprintf("routes[%d]", i)
		switch {
		case r.Name == "":
			v.add(p+".name", "empty; give every route a name ([a-z0-9._-])")
		case len(r.Name) > maxRouteName || !routeNameRE.MatchString(r.Name):
			v.add(p+".name", fmt.Sprintf("must be 1..%d of a-z, 0-9, '.', '_', '-' (got %q)", maxRouteName, r.Name))
		default:
			if j, dup := seen[r.Name]; dup {
				v.add(p+".name", fmt.Sprintf("duplicate route name %q (also routes[%d].name); route names must be unique", r.Name, j))
			} else {
				seen[r.Name] = i
			}
		}
		if len(r.Peers) == 0 && r.DNS == "" && len(r.Allow) == 0 {
			v.add(p+".peers", "empty; list at least one peer as host:port, or set dns or allow")
		}
		v.discovery(p, r)
		peers := map[string]int{}
		for j, peer := range r.Peers {
			pk := fmt.Sprintf("%s.peers[%d]", p, j)
			if k, dup := peers[peer]; dup {
				v.add(pk, fmt.Sprintf("duplicate peer %q (also %s.peers[%d]); list each peer once", peer, p, k))
				continue
			}
			peers[peer] = j
			v.hostPort(pk, peer, true, true, `use e.g. "decode-0.decode:7100" or "10.0.0.5:7100"`)
		}
		if r.Stripes < 1 || r.Stripes > MaxStripes {
			v.add(p+".stripes", fmt.Sprintf("must be 1..%d (got %d)", MaxStripes, r.Stripes))
		}
		v.oneOf(p+".transport", r.Transport, Transports)
		v.positive(p+".connect_timeout", r.ConnectTimeout)
		v.positive(p+".progress_timeout", r.ProgressTimeout)
	}
}

// discovery checks a route's pick, allow, idle_timeout and dns keys.
func (v *validator) discovery(p string, r Route) {
	if r.Pick != "" { // "": named, for routes built in code
		v.oneOf(p+".pick", r.Pick, Picks)
	}
	for j, a := range r.Allow {
		if !ValidAllow(a) {
			v.add(fmt.Sprintf("%s.allow[%d]", p, j), fmt.Sprintf("must be a CIDR range or a DNS suffix (got %q); use e.g. \"10.0.0.0/8\" or \".decode.svc.cluster.local\"", a))
		}
	}
	if len(r.Allow) > 0 {
		v.positive(p+".idle_timeout", r.IdleTimeout)
	}
	if r.DNS != "" {
		v.hostPort(p+".dns", r.DNS, true, true, `use e.g. "decode.stage.svc.cluster.local:7100"`)
		if r.DNSInterval < MinDNSInterval {
			v.add(p+".dns_interval", fmt.Sprintf("must be >= %s (got %s)", MinDNSInterval, r.DNSInterval))
		}
	}
	if r.DNSServer != "" {
		v.hostPort(p+".dns_server", r.DNSServer, true, true, `use e.g. "10.96.0.10:53", or "" for the system's resolver`)
	}
}

// ValidAllow reports whether a is an allow entry: a CIDR range, or a DNS
// suffix (a host name, with or without a leading dot).
func ValidAllow(a string) bool {
	if _, _, err := net.ParseCIDR(a); err == nil {
		return true
	}
	return a != "." && hostnameRE.MatchString(strings.TrimPrefix(a, "."))
}

// SplicePage is what staging.slot_size must be a multiple of for
// staging.splice_send to apply: slots get fresh pages one slot at a time.
const SplicePage = 4 * KiB

func (v *validator) security(s Security) {
	switch {
	case s.Token != "" && s.TokenFile != "":
		v.add("security.token_file", fmt.Sprintf("set together with security.token (got %q); set only one of them", s.TokenFile))
	case s.TokenFile != "":
		b, err := os.ReadFile(s.TokenFile)
		switch {
		case err != nil:
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			v.add("security.token_file", fmt.Sprintf("cannot read it: %v (got %q); check the path and its permissions", err, s.TokenFile))
		case strings.TrimSpace(string(b)) == "":
			v.add("security.token_file", fmt.Sprintf("file is empty (got %q); put the token in it", s.TokenFile))
		}
	case s.Token != "":
		if strings.TrimSpace(s.Token) != s.Token {
			v.add("security.token", "has leading or trailing white space; remove it")
		}
	case !s.AllowInsecure:
		v.add("security.token", "empty; set security.token or security.token_file (or security.allow_insecure: true for local tests only)")
	}
	if s.TLS.Enabled() {
		v.tls(s.TLS, time.Now())
	}
}

// approxSize writes a size that may not fit a ByteSize exactly.
func approxSize(n float64) string {
	for _, u := range []struct {
		name string
		f    float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.f {
			return strings.TrimSuffix(strconv.FormatFloat(n/u.f, 'f', 1, 64), ".0") + u.name
		}
	}
	return strconv.FormatFloat(n, 'f', -1, 64) + "B"
}

// limits checks the pre-authentication bounds and the peer timing limits.
func (v *validator) limits(l Limits) {
	v.atLeastOne("limits.max_handshakes", l.MaxHandshakes)
	if l.MaxHandshakesPerAddr < 1 || (l.MaxHandshakes >= 1 && l.MaxHandshakesPerAddr > l.MaxHandshakes) {
		v.add("limits.max_handshakes_per_addr", fmt.Sprintf("must be 1..limits.max_handshakes (%d) (got %d)", l.MaxHandshakes, l.MaxHandshakesPerAddr))
	}
	if l.HandshakeTimeout < MinHandshakeTimeout || l.HandshakeTimeout > MaxHandshakeTimeout {
		v.add("limits.handshake_timeout", fmt.Sprintf("must be %s..%s (got %s)", MinHandshakeTimeout, MaxHandshakeTimeout, l.HandshakeTimeout))
	}
	if l.SessionSilence < MinSessionSilence {
		v.add("limits.session_silence", fmt.Sprintf("must be >= %s (got %s); peers send a heartbeat after 1s of quiet", MinSessionSilence, l.SessionSilence))
	}
	v.positive("limits.peer_progress_timeout", l.PeerProgressTimeout)
}
