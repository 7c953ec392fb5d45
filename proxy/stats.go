package proxy

import (
	"fmt"
	"os"
	"runtime"
	"sort"
	"syscall"
	"time"

	"github.com/stage-kv/stage/wire"
)

// Stats, LinkStats, RouteInfo and PeerInfo are the query documents.
type (
	Stats     = wire.Stats
	LinkStats = wire.LinkStats
	RouteInfo = wire.RouteInfo
	PeerInfo  = wire.PeerInfo
)

// Snapshot returns the current figures.
func (s *Server) Snapshot() Stats {
	regions, maps := s.regions.Count()
	st := Stats{Node: s.cfg.Node.Name, Device: s.dev.String(), Listen: s.PeerAddr(), UptimeS: time.Since(s.start).Seconds(),
		SlotSize: s.sender.pool.SlotSize(), SendSlots: s.sender.pool.Cap(), SendInUse: int(s.sender.inUse.Load()),
		RecvSlots: s.recvPool.Cap(), RecvInUse: s.recvPool.InUse(), Regions: regions, Mappings: maps, Links: []LinkStats{},
		Goroutines: runtime.NumGoroutine(), FDs: countFDs(), RSSBytes: rssBytes(), CPUSeconds: cpuSeconds(),
		KVAccepts: s.metrics.kvAccepts.Load(), KVAcceptNanos: s.metrics.kvAcceptN.Load()}
	live := s.sessions.liveList()
	st.Sessions = len(live)
	up := map[string]int{}
	var inbound []*session
	for _, ss := range live {
		st.PeerMappings += ss.node.Mappings()
		up[ss.linkName]++
		if ss.route == nil {
			inbound = append(inbound, ss)
		}
	}
	st.Transfers = s.xfers.running(nil)
	s.links.each(func(name string, c *counters) {
		st.Links = append(st.Links, LinkStats{Name: name, Up: up[name], BytesOut: c.BytesOut.Load(), BytesIn: c.BytesIn.Load(),
			ChunksOut: c.ChunksOut.Load(), ChunksIn: c.ChunksIn.Load(), XfersOK: c.XfersOK.Load(), XfersFailed: c.XfersFailed.Load(),
			XfersInline: c.XfersInline.Load(), XfersIPC: c.XfersIPC.Load(), XfersShm: c.XfersShm.Load(), Fallbacks: c.fallbackCounts(),
			Redials: c.Redials.Load(), Resends: c.Resends.Load(), ChecksumErrors: c.ChecksumErrors.Load(), Duplicates: c.Duplicates.Load()})
	})
	sort.Slice(st.Links, func(i, j int) bool { return st.Links[i].Name < st.Links[j].Name })
	st.Inbound = inboundPeers(inbound)
	return st
}

// inboundPeers describes the sessions peers dialed in.
func inboundPeers(ss []*session) []wire.InboundPeer {
	out := make([]wire.InboundPeer, 0, len(ss))
	for _, x := range ss {
		out = append(out, wire.InboundPeer{Node: x.peerName, Addr: x.addr, SameHost: x.sameHost(), Stripes: x.streams.count(),
			StreamsUp: x.streams.up(), InFlight: routeHost{x.s}.Busy(x)})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Node != out[j].Node {
			return out[i].Node < out[j].Node
		}
		return out[i].Addr < out[j].Addr
	})
	return out
}

// Routes describes configured routes and their peers.
func (s *Server) Routes() []RouteInfo {
	rs := s.routes.List()
	out := make([]RouteInfo, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.Info(func(ss *session, pi *PeerInfo) {
			pi.SameHost, pi.Stripes, pi.Chunk = ss.sameHost(), ss.streams.count(), ss.chunkSize
			pi.StreamsUp = ss.streams.up()
			pi.Transport = ss.node.TransportOf(r.Conf().Transport)
		}))
	}
	return out
}

// countFDs counts this process's open file descriptors (-1 if unknown).
func countFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents) - 1 // the directory being read
}

// rssBytes is this process's resident set size (0 if unknown).
func rssBytes() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	var size, rss uint64
	if _, err := fmt.Sscan(string(b), &size, &rss); err != nil {
		return 0
	}
	return rss * uint64(os.Getpagesize())
}

// cpuSeconds is the user + system CPU time this process used so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
