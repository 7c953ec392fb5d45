package config

import (
	"time"

	"github.com/stage-kv/stage/internal/knobs"
)

// Config is the whole sidecar configuration. Every key can come from the
// YAML file, from STAGE_<PATH> environment variables (STAGE_STAGING_SLOTS,
// STAGE_SECURITY_TOKEN, ...) and from flags; flags win over env over file
// over the embedded default.
type Config struct {
	Node          Node          `mapstructure:"node"`
	Listen        string        `mapstructure:"listen"`         // host:port for peer sessions (control and data)
	ControlSocket string        `mapstructure:"control_socket"` // local Unix socket for engines
	Device        Device        `mapstructure:"device"`
	Staging       Staging       `mapstructure:"staging"`
	Routes        []Route       `mapstructure:"routes"`
	Security      Security      `mapstructure:"security"`
	Metrics       Metrics       `mapstructure:"metrics"`
	Log           Log           `mapstructure:"log"`
	Limits        Limits        `mapstructure:"limits"`
	Drain         time.Duration `mapstructure:"drain_timeout"`

	// Knobs are the test fault switches (STAGE_TEST_*), no config keys:
	// Load reads them once from the environment (internal/knobs) and they
	// go down from here; a Config built by hand has them all off. Set them
	// with SetKnobs, which also hands the device's to the device section.
	Knobs knobs.Values `mapstructure:"-"`
}

// SetKnobs sets the test fault switches, here and where the device
// section's Options reads them.
func (c *Config) SetKnobs(k knobs.Values) {
	c.Knobs = k
	c.Device.knobs = k
}

// Node identifies this sidecar.
type Node struct {
	Name   string `mapstructure:"name"`    // shown to peers and in stats
	HostID string `mapstructure:"host_id"` // same-node identity; empty: from boot id and machine id
	// SocketDir holds the node sockets of the same-node paths; sidecars of
	// one node (or pods mounting one directory) find each other there.
	// Empty: beside the default control socket directory ("node" in it).
	SocketDir string `mapstructure:"socket_dir"`
	// CopyStreams is how many device streams one large same-node copy
	// (ipc) is split across: each stream's copies go to a copy engine of
	// their own, where one alone leaves the link short of its rate.
	CopyStreams int `mapstructure:"copy_streams"`
	// IdleConnTimeout is how long an unused node connection to a peer
	// on this node is kept for the next same-node transfer; one that
	// holds a shared ring goes after at most 2 s.
	IdleConnTimeout time.Duration `mapstructure:"idle_conn_timeout"`
	// WakeLink: an ipc push first copies up to 1 MiB of zeros into a
	// buffer the peer sidecar offers for it, so that the link between
	// the devices is awake when the push's copy starts (auto: on CUDA
	// devices; on; off). It also says whether we offer such a buffer.
	WakeLink string `mapstructure:"wake_link"`
}

// Device selects the backend and holds each backend's settings (device.go).
type Device struct {
	Kind    string     `mapstructure:"kind"` // hostmem | cuda | acl | hip
	Ordinal int        `mapstructure:"ordinal"`
	Hostmem Hostmem    `mapstructure:"hostmem"`
	CUDA    DeviceCUDA `mapstructure:"cuda"`
	ACL     DeviceACL  `mapstructure:"acl"`
	HIP     DeviceHIP  `mapstructure:"hip"`

	knobs knobs.Values // the hostmem fault switch for Options (Config.SetKnobs)
}

// Hostmem models an emulated device's copy engine.
type Hostmem struct {
	BandwidthGBps float64       `mapstructure:"bandwidth_gbps"` // 0: as fast as memmove
	Latency       time.Duration `mapstructure:"latency"`        // added per copy
}

// Staging sizes the pinned pool. Pool memory = Slots * SlotSize.
type Staging struct {
	SlotSize     ByteSize `mapstructure:"slot_size"`     // chunk payload size; "4MiB"
	Slots        int      `mapstructure:"slots"`         // pinned slots in the pool
	Window       int      `mapstructure:"window"`        // credits granted to each peer session
	CopyStreams  int      `mapstructure:"copy_streams"`  // device streams for staging copies
	InlineMax    ByteSize `mapstructure:"inline_max"`    // pushes up to this size take the latency path; 0: never
	ReadSpin     Spin     `mapstructure:"read_spin"`     // data-stream and engine-connection readers poll this long before sleeping; auto: adaptive (100us, up to 1ms for a steady pace) on 8+ CPUs, else never; adaptive; 0: never
	StreamDepth  Depth    `mapstructure:"stream_depth"`  // chunks gathered ahead per data stream; auto: by send mode; 0: as slots and credits allow
	StreamQueue  int      `mapstructure:"stream_queue"`  // chunks handed to one data stream, unwritten; 0: no limit
	SocketBuffer ByteSize `mapstructure:"socket_buffer"` // SO_SNDBUF/SO_RCVBUF of data streams; 0: the kernel's autotuning
	// BalanceSockets chooses a chunk's data stream by the bytes its socket
	// holds unacknowledged (SIOCOUTQ) plus its unwritten chunks' bytes;
	// false: by unwritten chunks.
	BalanceSockets bool `mapstructure:"balance_sockets"`
	// TailChunk cuts the last rounds of a transfer's chunks finer, halving
	// round by round down to this size, so its streams end together; 0: off
	// (so is a size above half of SlotSize).
	TailChunk   ByteSize `mapstructure:"tail_chunk"`
	SpliceSend  bool     `mapstructure:"splice_send"`  // send chunks with vmsplice+splice (no kernel copy); slots held until acked
	SpliceProbe bool     `mapstructure:"splice_probe"` // with SpliceSend: keep it only if a start-up loopback probe finds it faster than writev
	// StallTimeout drops a data stream that moved no byte for this long
	// while it had a chunk to write or half read (its peer stopped
	// reading or sending); 0: never.
	StallTimeout time.Duration `mapstructure:"stall_timeout"`
}

// Route is a named destination for transfers.
type Route struct {
	Name            string        `mapstructure:"name"`
	Peers           []string      `mapstructure:"peers"`     // host:port; a DNS name may resolve to many
	Stripes         int           `mapstructure:"stripes"`   // data streams per peer session
	Transport       string        `mapstructure:"transport"` // auto | tcp | ipc | shm
	Checksum        bool          `mapstructure:"checksum"`  // CRC32C per chunk
	ConnectTimeout  time.Duration `mapstructure:"connect_timeout"`
	ProgressTimeout time.Duration `mapstructure:"progress_timeout"` // no progress for this long fails a transfer
	// Pick: "named", a submit to a route with more than one peer must
	// name one; "any", any live peer will do (replicas), round robin.
	Pick string `mapstructure:"pick"`
	// Allow lets a submit name a peer the route does not list, dialed on
	// demand: CIDR ranges ("10.0.0.0/8") its IP must be in, or DNS
	// suffixes (".decode.svc.cluster.local") its host name must end in.
	// A named peer outside them is refused without a dial.
	Allow []string `mapstructure:"allow"`
	// IdleTimeout closes a session dialed on demand that carried no
	// transfer for this long.
	IdleTimeout time.Duration `mapstructure:"idle_timeout"`
	// DNS is a host:port whose host is resolved every DNSInterval: each
	// address becomes a peer (a headless Service's ready pods), and one
	// that vanishes is drained. DNSServer, when set, is the DNS server
	// (host:port) asked instead of the system's.
	DNS         string        `mapstructure:"dns"`
	DNSInterval time.Duration `mapstructure:"dns_interval"`
	DNSServer   string        `mapstructure:"dns_server"`
}

// Pick values of a route.
const (
	PickNamed = "named"
	PickAny   = "any"
)

// Security: peers authenticate with a shared token before naming any region,
// and optionally with certificates (mutual TLS) below that.
type Security struct {
	Token         string `mapstructure:"token"`
	TokenFile     string `mapstructure:"token_file"`
	AllowInsecure bool   `mapstructure:"allow_insecure"` // no token at all (tests only)
	// RequireGrants: every peer KVPull and KVAnnounce must name a live
	// grant, on every KV cache; off, only caches whose engine made a
	// grant are guarded (PROTOCOL.md 9.20).
	RequireGrants bool `mapstructure:"require_grants"`
	// AllowInsecureRemote lets AllowInsecure stand with a listen address
	// that is not loopback: anyone who reaches it may push and pull the
	// engines' memory. Without it that combination is refused.
	AllowInsecureRemote bool `mapstructure:"allow_insecure_remote"`
	// TrustSocketParent accepts a socket directory (control_socket's,
	// node.socket_dir) inside a directory that group or others may write
	// without the sticky bit, such as a Kubernetes emptyDir that only the
	// pod's containers reach. Without it such a directory is refused: any
	// user who can write it could swap the socket.
	TrustSocketParent bool `mapstructure:"trust_socket_parent"`
	TLS               TLS  `mapstructure:"tls"`
}

// TLS turns on mutual TLS 1.3 for every peer connection (control sessions
// and data streams, both directions) when CertFile is set. Each sidecar's
// certificate serves as its server and its client certificate; both ends
// verify the other's against CAFile. The token challenge still runs inside.
type TLS struct {
	CertFile   string `mapstructure:"cert_file"`   // PEM certificate (chain) of this sidecar
	KeyFile    string `mapstructure:"key_file"`    // PEM private key of CertFile
	CAFile     string `mapstructure:"ca_file"`     // PEM CA certificate(s) peers' certificates must chain to
	ServerName string `mapstructure:"server_name"` // name checked in the acceptor's certificate; empty: the host dialed
}

// Enabled reports whether peer connections use TLS.
func (t TLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" || t.CAFile != "" }

// Metrics serves Prometheus /metrics.
type Metrics struct {
	Listen string `mapstructure:"listen"` // empty: off
}

// Log configures zap.
type Log struct {
	Level  string `mapstructure:"level"`  // debug | info | warn | error
	Format string `mapstructure:"format"` // console | json
}

// Limits protect the sidecar from a hostile or broken peer or engine.
type Limits struct {
	MaxSessions         int `mapstructure:"max_sessions"`           // peer sessions at once
	MaxStreams          int `mapstructure:"max_streams"`            // data streams of all peer sessions at once
	MaxTransfersPerPeer int `mapstructure:"max_transfers_per_peer"` // in flight from one peer
	MaxClients          int `mapstructure:"max_clients"`            // control-socket connections
	// Peer connections that have not finished their handshake, in all and
	// from one source address (like sshd's MaxStartups): the rest are
	// closed the moment they are accepted.
	MaxHandshakes        int `mapstructure:"max_handshakes"`
	MaxHandshakesPerAddr int `mapstructure:"max_handshakes_per_addr"`
	// HandshakeTimeout bounds a peer connection's handshake (dialed or
	// accepted): a control session up to Welcome, a data stream up to
	// DataAccept.
	HandshakeTimeout time.Duration `mapstructure:"handshake_timeout"`
	// SessionSilence: a session whose peer sent nothing (not even a
	// heartbeat; each side sends one after a second of quiet) for this
	// long is closed and its transfers failed.
	SessionSilence time.Duration `mapstructure:"session_silence"`
	// PeerProgressTimeout: a transfer a peer started (its push to us, a
	// pull we serve it) with no progress this long fails, when no route is
	// configured; with routes, the longest routes[].progress_timeout.
	PeerProgressTimeout time.Duration `mapstructure:"peer_progress_timeout"`
	// ClientFirstRequestTimeout: a control-socket connection that sent no
	// request this long after it connected is told why (Fail, Req 0) and
	// closed, so connections that never talk cannot hold every one of
	// MaxClients.
	ClientFirstRequestTimeout time.Duration `mapstructure:"client_first_request_timeout"`
}

// ByteSize is a size in bytes that reads "4MiB", "512KiB", "1GiB" or a plain number.
type ByteSize uint64
