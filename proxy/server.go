package proxy

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"go.uber.org/zap"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/engine"
	"github.com/stage-kv/stage/proxy/node"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/rawconn"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// Server is one sidecar.
type Server struct {
	cfg    *config.Config
	log    *zap.Logger
	dev    device.Device
	token  []byte
	tls    *peerTLS // nil: peer connections in plaintext
	hostID string
	start  time.Time

	sendPool *staging.Pool
	recvPool *staging.Pool
	// splice: data-stream writers send payloads with vmsplice+splice
	// (staging.splice_send, plaintext only); spliceRefused: vmsplice
	// refused a slot once and that was logged.
	splice        bool
	spliceRefused atomic.Bool
	// spliceProbe replaces the start-up probe in tests (nil: the real one).
	spliceProbe func(size int) (rawconn.SpliceProbe, error)
	copiers     []*staging.Copier
	nextCp      atomic.Uint32

	// The latency path (inline.go): small slots and synchronous copies.
	inlinePool *staging.Pool // nil: our pushes never take the path
	lane       *staging.Lane

	regions *region.Table
	kv      kvTable              // KV caches and peers' shapes (kv.go)
	mapq    chan staging.CopyCmd // mapped chunks to map and gather (loop.go, startMappers)

	peerLn  net.Listener
	engines *engine.Listener // the control socket
	gcli    *gnet.Client

	nodes *node.Room // same-node paths: our node socket and its connections

	metrics    *metrics
	metricsLn  net.Listener
	metricsSrv *http.Server

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// Sessions closed on goroutines of their own (closeLater): Close
	// waits for them after gnet's loops stopped, the last that start one.
	closersMu   sync.Mutex
	closers     sync.WaitGroup
	closersDone bool // Close waited: no more start

	// sender loop
	mbox      *mailbox
	core      *staging.Sender
	sendInUse atomic.Int64

	mu       sync.Mutex
	sessions map[uint64]*session
	// setup holds sessions we accepted whose Welcome is out but whose
	// control connection is not live yet (acceptSession): only acceptData
	// looks here, so their data streams attach while nothing else (stats,
	// heartbeats, routes) sees a session without a control connection.
	setup    map[uint64]*session
	preauth  *preauth // peer connections before their handshake ends (preauth.go)
	routes   map[string]*route
	outs     map[staging.Key]*outXfer // core key -> outgoing transfer
	xfers    map[uint64]*localXfer    // engine-facing transfers by id
	finished []uint64                 // finished transfer ids, oldest first (bounded history)
	links    map[string]*counters

	seq      atomic.Uint64 // transfer ids, session ids
	dialing  dialing       // route sessions being dialed (limits.max_sessions, max_streams)
	closing  atomic.Bool
	draining atomic.Bool // no new transfers from engines; in-flight ones may finish
}

// New opens the device, allocates the pinned pools and binds the listeners.
// Nothing runs until Start.
func New(cfg *config.Config, log *zap.Logger) (_ *Server, err error) {
	token, err := cfg.ResolveToken()
	if err != nil {
		return nil, err
	}
	dev, err := device.Open(device.Kind(cfg.Device.Kind), cfg.Device.Ordinal, cfg.Device.Options())
	if err != nil {
		return nil, fmt.Errorf("open device %s:%d: %w", cfg.Device.Kind, cfg.Device.Ordinal, err)
	}
	s := &Server{cfg: cfg, log: log, dev: dev, token: []byte(token), start: time.Now(), mbox: newMailbox(),
		sessions: map[uint64]*session{}, setup: map[uint64]*session{}, routes: map[string]*route{}, outs: map[staging.Key]*outXfer{},
		xfers: map[uint64]*localXfer{},
		links: map[string]*counters{}}
	s.regions = region.NewTable(dev, s.revokeRegion)
	s.kv.init()
	s.preauth = newPreauth(cfg.Limits.MaxHandshakes, cfg.Limits.MaxHandshakesPerAddr, log)
	s.metrics = newMetrics(s)
	if cfg.Security.TLS.Enabled() {
		if s.tls, err = loadPeerTLS(cfg.Security.TLS, log); err != nil {
			_ = dev.Close()
			return nil, err
		}
	}
	s.hostID = cfg.Node.HostID
	if s.hostID == "" {
		s.hostID = hostIdentity()
	}
	defer func() {
		if err != nil {
			s.closeResources()
		}
	}()
	slot := int(cfg.Staging.SlotSize)
	sendSlots := cfg.Staging.Slots / 2
	recvSlots := cfg.Staging.Slots - sendSlots
	if s.sendPool, err = s.newSendPool(slot, sendSlots); err != nil {
		return nil, err
	}
	if s.recvPool, err = staging.NewPool(dev, slot, recvSlots); err != nil {
		return nil, err
	}
	// After newSendPool: an auto depth follows whether chunks go by splice.
	s.core = staging.NewSenderDepth(sendSlots, cfg.Staging.StreamDepth.Resolve(s.splice))
	// The lane also lands peers' inline pushes, so it exists even when
	// our own pushes never take the latency path.
	if s.lane, err = staging.NewLane(dev); err != nil {
		return nil, err
	}
	if cfg.Staging.InlineMax > 0 {
		if s.inlinePool, err = staging.NewPool(dev, int(cfg.Staging.InlineMax), inlineSlots); err != nil {
			return nil, err
		}
	}
	for i := 0; i < cfg.Staging.CopyStreams; i++ {
		c, err := staging.NewCopier(dev, cfg.Staging.Slots)
		if err != nil {
			return nil, err
		}
		s.copiers = append(s.copiers, c)
	}
	if s.peerLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen for peers on %s: %w; is another staged running? set listen", cfg.Listen, err)
	}
	if s.engines, err = engine.Listen(cfg.SocketPath(), engineHost{s}, log,
		engine.Options{MaxClients: cfg.Limits.MaxClients, ReadSpin: cfg.Staging.ReadSpin}); err != nil {
		return nil, err
	}
	s.nodes = node.Listen(nodeHost{s}, node.Options{Dev: dev, Regions: s.regions, Log: log, Dir: cfg.NodeSocketDir(),
		HandshakeTimeout: cfg.Limits.HandshakeTimeout, FaultImport: cfg.Knobs.FaultIPCImport, WG: &s.wg})
	if cfg.Metrics.Listen != "" {
		if err = s.serveMetrics(cfg.Metrics.Listen); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// PeerAddr is the address peers dial.
func (s *Server) PeerAddr() string { return s.peerLn.Addr().String() }

// SocketPath is the control socket's path.
func (s *Server) SocketPath() string { return s.cfg.SocketPath() }

// Start runs the sidecar until ctx ends or Close is called.
func (s *Server) Start(ctx context.Context) error {
	s.ctx, s.cancel = context.WithCancel(ctx)
	cli, err := gnet.NewClient(&ctrlHandler{s: s}, gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithLockOSThread(false), gnet.WithMulticore(true), gnet.WithLogger(newGnetLogger(s.log, &s.closing)))
	if err != nil {
		return fmt.Errorf("start control event loop: %w", err)
	}
	if err := cli.Start(); err != nil {
		return fmt.Errorf("start control event loop: %w", err)
	}
	s.gcli = cli
	s.wg.Add(2)
	go s.loop()
	go s.acceptPeers()
	s.engines.Serve()
	s.nodes.Serve(s.ctx)
	for i := range s.cfg.Routes {
		s.addRoute(s.cfg.Routes[i])
	}
	s.log.Info("staged started", zap.String("node", s.cfg.Node.Name), zap.String("peers", s.PeerAddr()),
		zap.String("socket", s.SocketPath()), zap.String("device", s.dev.String()),
		zap.Int("slots", s.cfg.Staging.Slots), zap.Stringer("slot_size", s.cfg.Staging.SlotSize),
		zap.Bool("splice_send", s.splice), zap.Int("stream_depth", s.cfg.Staging.StreamDepth.Resolve(s.splice)))
	return nil
}

// Drain stops taking new transfers from local engines and waits, at most
// until ctx ends, for the ones in flight (sent or received) to finish. It
// returns how many were still running when it gave up; Close fails those.
// Peers' transfers into this sidecar keep landing meanwhile.
func (s *Server) Drain(ctx context.Context) int {
	s.draining.Store(true)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		n := s.Snapshot().Transfers
		if n == 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			return n
		case <-t.C:
		}
	}
}

// Close stops everything: listeners, sessions, loops; fails what is in
// flight; frees pools and device.
func (s *Server) Close() error {
	if !s.closing.CompareAndSwap(false, true) {
		return nil
	}
	if s.cancel != nil {
		s.cancel()
	}
	_ = s.peerLn.Close()
	s.engines.StopAccepting()
	s.nodes.Close()
	if s.metricsSrv != nil {
		_ = s.metricsSrv.Close()
	}
	s.mu.Lock()
	sess := make([]*session, 0, len(s.sessions)+len(s.setup))
	for _, ss := range s.sessions {
		sess = append(sess, ss)
	}
	for _, ss := range s.setup {
		sess = append(sess, ss)
	}
	s.mu.Unlock()
	for _, ss := range sess {
		ss.close(errors.New("sidecar shutting down"))
	}
	s.engines.Close()
	s.wg.Wait() // loop, acceptors, dialers, data streams
	if s.gcli != nil {
		_ = s.gcli.Stop()
	}
	s.waitClosers()
	s.failAllLocal(codeErr(wire.CodeShutdown, "sidecar shutting down"))
	s.regions.CloseAll()
	_ = os.Remove(s.SocketPath())
	return s.closeResources()
}

// closeLater closes ss on a goroutine of its own, for callers that must
// not wait for it (gnet's event loop, a control connection's writer) or
// may hold locks close takes. Close waits for these goroutines; once it
// has, none starts: Close closed every session before.
func (s *Server) closeLater(ss *session, err error) {
	s.closersMu.Lock()
	defer s.closersMu.Unlock()
	if s.closersDone {
		return
	}
	s.closers.Add(1)
	go func() {
		defer s.closers.Done()
		ss.close(err)
	}()
}

// waitClosers waits for closeLater's goroutines and lets no more start.
func (s *Server) waitClosers() {
	s.closersMu.Lock()
	s.closersDone = true
	s.closersMu.Unlock()
	s.closers.Wait()
}

func (s *Server) closeResources() error {
	var errs []error
	for _, c := range s.copiers {
		errs = append(errs, c.Close())
	}
	if s.sendPool != nil {
		errs = append(errs, s.sendPool.Close())
	}
	if s.recvPool != nil {
		errs = append(errs, s.recvPool.Close())
	}
	if s.lane != nil {
		errs = append(errs, s.lane.Close())
	}
	if s.inlinePool != nil {
		errs = append(errs, s.inlinePool.Close())
	}
	if s.peerLn != nil {
		_ = s.peerLn.Close()
	}
	if s.engines != nil {
		s.engines.StopAccepting()
	}
	if s.nodes != nil {
		s.nodes.Close()
	}
	if s.metricsSrv != nil {
		_ = s.metricsSrv.Close()
	}
	errs = append(errs, s.dev.Close())
	return errors.Join(errs...)
}

// Leaks describes resources still held; empty when idle. Tests use it.
func (s *Server) Leaks() string {
	var b strings.Builder
	if n := s.recvPool.InUse(); n != 0 {
		fmt.Fprintf(&b, "receive slots in use: %d; ", n)
	}
	if n := s.sendInUse.Load(); n != 0 {
		fmt.Fprintf(&b, "send slots in use: %d; ", n)
	}
	if s.inlinePool != nil && s.inlinePool.InUse() != 0 {
		fmt.Fprintf(&b, "inline slots in use: %d; ", s.inlinePool.InUse())
	}
	s.mu.Lock()
	if n := len(s.outs); n != 0 {
		fmt.Fprintf(&b, "outgoing transfers: %d; ", n)
	}
	s.mu.Unlock()
	return b.String()
}

func (s *Server) copier() *staging.Copier {
	return s.copiers[int(s.nextCp.Add(1))%len(s.copiers)]
}

func (s *Server) newID() uint64 { return s.seq.Add(1) }

func randBytes(b []byte) {
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error()) // the platform has no randomness: nothing safe to do
	}
}

// hostIdentity derives the node identity from the boot id and machine id,
// so two sidecars in different containers of one host agree.
func hostIdentity() string {
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	id := read("/etc/machine-id") + "/" + read("/proc/sys/kernel/random/boot_id")
	if id == "/" {
		h, _ := os.Hostname()
		return h
	}
	return id
}

// counters are the figures of one link (a route, or a peer that dialed us).
type counters struct {
	BytesOut, BytesIn, ChunksOut, ChunksIn atomic.Uint64
	XfersOK, XfersFailed, XfersInline      atomic.Uint64
	XfersIPC, XfersShm                     atomic.Uint64 // moved on a same-node path
	// Recovery: data streams redialed after a loss, chunks sent again at
	// the peer's request, chunks that arrived here damaged, second copies
	// of chunks that had landed here already.
	Redials, Resends, ChecksumErrors, Duplicates atomic.Uint64
	fbMu                                         sync.Mutex
	fallbacks                                    map[string]uint64 // same-node path unavailable, by reason
}

func (s *Server) link(name string) *counters {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.links[name]
	if c == nil {
		c = &counters{}
		s.links[name] = c
	}
	return c
}
