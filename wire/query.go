package wire

// JSON documents carried by QueryReply. They are part of the local control
// protocol: stagectl, the Go client and the Python client read them.

// DeviceInfo answers QueryDevice: the sidecar's device as an engine that
// shares memory with it needs to know it.
type DeviceInfo struct {
	// Device names it ("acl:0"); Kind and Ordinal as in the configuration.
	Device  string `json:"device"`
	Kind    string `json:"kind"`
	Ordinal int    `json:"ordinal"`
	// BareTgid (acl only): the sidecar's process id as the NPU driver
	// knows it (aclrtDeviceGetBareTgid), the one an exporter whitelists
	// (aclrtIpcMemSetImportPid, aclrtMemSetPidToShareableHandle). Absent
	// when the device has none; BareTgidFrom says where it came from, and
	// why it may be wrong.
	BareTgid     *int32 `json:"bare_tgid,omitempty"`
	BareTgidFrom string `json:"bare_tgid_from,omitempty"`
	// PhysicalID (acl only): the NPU's physical id
	// (aclrtGetPhyDevIdByLogicDevId of Ordinal, which counts the devices
	// ASCEND_RT_VISIBLE_DEVICES shows the sidecar); absent when unknown.
	PhysicalID *int32 `json:"physical_id,omitempty"`
}

// Stats answers QueryStats.
type Stats struct {
	Node      string  `json:"node"`
	Device    string  `json:"device"`
	Listen    string  `json:"listen"`
	UptimeS   float64 `json:"uptime_s"`
	SlotSize  int     `json:"slot_size"`
	SendSlots int     `json:"send_slots"`
	SendInUse int     `json:"send_in_use"`
	RecvSlots int     `json:"recv_slots"`
	RecvInUse int     `json:"recv_in_use"`
	Regions   int     `json:"regions"`
	Mappings  int     `json:"mappings"`
	// PeerMappings: allocations of same-node peers imported from the
	// handles they handed over (closed on Revoke or when the session ends).
	PeerMappings int `json:"peer_mappings"`
	Sessions     int `json:"sessions"`
	Transfers    int `json:"transfers_active"`
	// Goroutines and FDs of the sidecar process, for leak checks.
	Goroutines int `json:"goroutines"`
	FDs        int `json:"fds"`
	// RSSBytes and CPUSeconds (user + system) of the sidecar process.
	RSSBytes   uint64  `json:"rss_bytes"`
	CPUSeconds float64 `json:"cpu_seconds"`
	// KVAccepts KV transfers accepted from local engines, and the time
	// the sidecar spent on them from the decoded SubmitKV to the transfer
	// handed to the sender core (push) or its request sent (pull): its
	// work before the first chunk can move.
	KVAccepts     uint64      `json:"kv_accepts"`
	KVAcceptNanos uint64      `json:"kv_accept_ns"`
	Links         []LinkStats `json:"links"`
	// Inbound: each session a peer dialed in, by peer (the per-peer
	// detail that the InboundLink counters and metrics leave out).
	Inbound []InboundPeer `json:"inbound"`
}

// InboundLink names the one link that counts every session peers
// dialed in, together: one series set in the metrics however many peers
// dial (route names cannot hold a colon, so it is no route's).
const InboundLink = "peer:*"

// InboundPeer is one session a peer dialed in.
type InboundPeer struct {
	Node      string `json:"node"`
	Addr      string `json:"addr"` // the peer's ip:port
	SameHost  bool   `json:"same_host"`
	Stripes   int    `json:"stripes"`
	StreamsUp int    `json:"streams_up"`
	InFlight  int    `json:"in_flight"`
}

// LinkStats are the counters of a route, or of every peer that dialed
// us together (InboundLink).
type LinkStats struct {
	Name        string `json:"name"`
	Up          int    `json:"sessions_up"`
	BytesOut    uint64 `json:"bytes_out"`
	BytesIn     uint64 `json:"bytes_in"`
	ChunksOut   uint64 `json:"chunks_out"`
	ChunksIn    uint64 `json:"chunks_in"`
	XfersOK     uint64 `json:"transfers_ok"`
	XfersFailed uint64 `json:"transfers_failed"`
	// XfersInline: of XfersOK, the small pushes sent on the latency path.
	XfersInline uint64 `json:"transfers_inline"`
	// Transfers moved on a same-node path (also counted in XfersOK), and
	// transfers that could not use one and fell back to TCP, by reason.
	XfersIPC  uint64            `json:"transfers_ipc"`
	XfersShm  uint64            `json:"transfers_shm"`
	Fallbacks map[string]uint64 `json:"fallbacks,omitempty"`
	// Recovery. Redials: data streams dialed again after one was lost
	// (dialing side). Resends: chunks sent again because the peer found
	// them damaged. ChecksumErrors: chunks that arrived here damaged
	// (each answered with a Resend, or failing its small push).
	// Duplicates: second copies of chunks that had landed here already
	// (sent again after a stream loss), landed and answered once.
	Redials        uint64 `json:"stream_redials"`
	Resends        uint64 `json:"chunks_resent"`
	ChecksumErrors uint64 `json:"checksum_errors"`
	Duplicates     uint64 `json:"duplicate_chunks"`
}

// RouteInfo is one element of the QueryRoutes answer.
type RouteInfo struct {
	Name      string `json:"name"`
	Transport string `json:"transport"`
	Stripes   int    `json:"stripes"`
	Checksum  bool   `json:"checksum"`
	// Pick: named (a submit names one of several peers) or any. DNS and
	// Allow: where peers beyond the listed ones come from; DNSError: the
	// last DNS lookup's failure, if it failed.
	Pick     string     `json:"pick,omitempty"`
	DNS      string     `json:"dns,omitempty"`
	DNSError string     `json:"dns_error,omitempty"`
	Allow    []string   `json:"allow,omitempty"`
	Peers    []PeerInfo `json:"peers"`
}

// PeerInfo is a route's view of one peer.
type PeerInfo struct {
	Addr  string `json:"addr"`
	State string `json:"state"` // up | connecting | down | draining
	Node  string `json:"node,omitempty"`
	// Found: how the route has it: static (routes[].peers), dns, or
	// dynamic (named by a submit, within routes[].allow).
	Found string `json:"found"`
	// Sessions up to it (0 or 1), and transfers in flight on the session.
	Sessions int  `json:"sessions"`
	InFlight int  `json:"in_flight"`
	SameHost bool `json:"same_host"`
	Stripes  int  `json:"stripes"`
	// StreamsUp: data streams attached and reading now; below Stripes
	// while lost streams are being redialed.
	StreamsUp int `json:"streams_up"`
	Chunk     int `json:"chunk_bytes"`
	// Transport the next transfer to this peer uses, and why not a
	// same-node path when it could have been one.
	Transport string `json:"transport,omitempty"`
	Error     string `json:"error,omitempty"`
}

// QueryRegions and QueryCatalog answer with a JSON array of RegionInfo.
