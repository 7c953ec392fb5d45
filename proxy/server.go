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
	"github.com/stage-kv/stage/proxy/routing"
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

	sender   sender // the send side: core, mailbox, send slots, splice (send_loop.go)
	recvPool *staging.Pool
	copiers  copierSet

	inline inlinePath // the latency path: small slots and synchronous copies (send_inline.go)

	regions *region.Table
	kv      kvTable    // KV caches and peers' shapes (kv.go)
	inboxes inboxTable // engines' inboxes of peers' tickets (tickets.go)
	// ticketMemo: tickets peers queued lately, sent again after a
	// peer's restart (tickets_resend.go)
	ticketMemo ticketMemo

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

	closers closerGroup // sessions closed on goroutines of their own (session.closeLater)

	// The tables, each behind its own lock (no lock is held while
	// another table's is taken).
	sessions sessionTable             // peer sessions (sessions.go)
	preauth  *preauth                 // peer connections before their handshake ends (preauth.go)
	routes   *routing.Table[*session] // routes and their peers (proxy/routing)
	outs     outTable                 // transfers whose chunks leave here, by core key (xfertable.go)
	xfers    xferTable                // engine-facing transfers by id (xfertable.go)
	links    linkTable                // counters by link name (links.go)

	seq      atomic.Uint64 // transfer ids, session ids
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
	s := newServer(cfg, log, dev, token)
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
	if err = s.openStaging(); err != nil {
		return nil, err
	}
	if err = s.listen(); err != nil {
		return nil, err
	}
	return s, nil
}

// newServer builds the sidecar's tables around dev: nothing in them holds
// a resource that closeResources would have to free.
func newServer(cfg *config.Config, log *zap.Logger, dev device.Device, token string) *Server {
	s := &Server{cfg: cfg, log: log, dev: dev, token: []byte(token), start: time.Now(), sender: sender{mbox: newMailbox()},
		outs: newOutTable(), xfers: newXferTable(), links: newLinkTable()}
	s.sender.s, s.inline.s = s, s
	s.sessions = newSessionTable(cfg.Limits, coreUp)
	s.routes = routing.New[*session](routeHost{s}, log, &s.wg)
	s.regions = region.NewTable(dev, s.sessions.revokeRegion)
	s.kv.init(s.regions, dev.Kind(), s.newID, cfg.Security.RequireGrants)
	s.preauth = newPreauth(cfg.Limits.MaxHandshakes, cfg.Limits.MaxHandshakesPerAddr, log)
	s.metrics = newMetrics(s)
	return s
}

// openStaging allocates what moves the bytes: the pinned send and receive
// pools, the send core, the latency path's lane and pool, the copy
// streams. On error, what it opened is left for closeResources.
func (s *Server) openStaging() (err error) {
	cfg, dev := s.cfg, s.dev
	slot := int(cfg.Staging.SlotSize)
	sendSlots := cfg.Staging.Slots / 2
	recvSlots := cfg.Staging.Slots - sendSlots
	if s.sender.pool, err = s.sender.openPool(slot, sendSlots); err != nil {
		return err
	}
	if s.recvPool, err = staging.NewPool(dev, slot, recvSlots); err != nil {
		return err
	}
	s.sender.gather = gatherer{pool: s.sender.pool, copiers: &s.copiers, mbox: s.sender.mbox, nanos: &s.metrics.copyNanos[copyGather]}
	// After openPool: an auto depth follows whether chunks go by splice.
	s.sender.core = staging.NewSenderDepth(sendSlots, cfg.Staging.StreamDepth.Resolve(s.sender.splice))
	s.sender.core.SetStreamQueue(cfg.Staging.StreamQueue)
	if cfg.Staging.BalanceSockets {
		s.sender.core.SetSocketProbe(s.sender.socketBytes)
	}
	s.sender.core.SetTailChunk(uint32(cfg.Staging.TailChunk))
	// The lane also lands peers' inline pushes, so it exists even when
	// our own pushes never take the latency path.
	if s.inline.lane, err = staging.NewLane(dev); err != nil {
		return err
	}
	if cfg.Staging.InlineMax > 0 {
		if s.inline.pool, err = staging.NewPool(dev, int(cfg.Staging.InlineMax), inlineSlots); err != nil {
			return err
		}
	}
	for i := 0; i < cfg.Staging.CopyStreams; i++ {
		c, err := staging.NewCopier(dev, cfg.Staging.Slots)
		if err != nil {
			return err
		}
		s.copiers.all = append(s.copiers.all, c)
	}
	return nil
}

// listen binds what others reach the sidecar by: the peer listener, the
// control socket, the node socket and the metrics endpoint. On error,
// what it bound is left for closeResources.
func (s *Server) listen() (err error) {
	cfg, dev, log := s.cfg, s.dev, s.log
	if s.peerLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("listen for peers on %s: %w; is another staged running? set listen", cfg.Listen, err)
	}
	if s.engines, err = engine.Listen(cfg.SocketPath(), engineHost{s}, log,
		engine.Options{MaxClients: cfg.Limits.MaxClients, ReadSpin: cfg.Staging.ReadSpin.Resolve(),
			FirstRequestTimeout: cfg.Limits.ClientFirstRequestTimeout, TrustSocketParent: cfg.Security.TrustSocketParent}); err != nil {
		return err
	}
	wake := cfg.Node.WakeLink == "on" || (cfg.Node.WakeLink == "auto" && dev.Kind() == device.KindCUDA)
	var newWake func() (*node.WakeBuffer, error)
	if wake {
		newWake = node.DeviceWake(dev)
	}
	s.nodes = node.Listen(nodeHost{s}, node.Options{Dev: dev, Regions: s.regions, Log: log, Dir: cfg.NodeSocketDir(),
		HandshakeTimeout: cfg.Limits.HandshakeTimeout, FaultImport: cfg.Knobs.FaultIPCImport, WG: &s.wg, CopyStreams: cfg.Node.CopyStreams,
		IdleConn: cfg.Node.IdleConnTimeout, TrustSocketParent: cfg.Security.TrustSocketParent, WakeLink: wake, NewWake: newWake})
	if cfg.Metrics.Listen != "" {
		if err = s.serveMetrics(cfg.Metrics.Listen); err != nil {
			return err
		}
	}
	return nil
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
	go s.sender.run()
	go handshaker{s}.acceptLoop()
	s.engines.Serve()
	s.nodes.Serve(s.ctx)
	s.routes.Start(s.ctx, s.cfg.Routes)
	s.log.Info("staged started", zap.String("node", s.cfg.Node.Name), zap.String("peers", s.PeerAddr()),
		zap.String("socket", s.SocketPath()), zap.String("device", s.dev.String()),
		zap.Int("slots", s.cfg.Staging.Slots), zap.Stringer("slot_size", s.cfg.Staging.SlotSize),
		zap.Bool("splice_send", s.sender.splice), zap.Int("stream_depth", s.cfg.Staging.StreamDepth.Resolve(s.sender.splice)), zap.Int("stream_queue", s.cfg.Staging.StreamQueue),
		zap.Bool("balance_sockets", s.cfg.Staging.BalanceSockets), zap.Stringer("tail_chunk", s.cfg.Staging.TailChunk))
	if tc := s.cfg.Staging.TailChunk; tc > s.cfg.Staging.SlotSize/2 {
		s.log.Warn("staging.tail_chunk is above half of staging.slot_size: the ends of transfers are not cut; lower it to cut them",
			zap.Stringer("tail_chunk", tc), zap.Stringer("slot_size", s.cfg.Staging.SlotSize))
	}
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
	for _, ss := range s.sessions.closeAll() {
		ss.close(errShuttingDown)
	}
	s.engines.Close()
	s.wg.Wait() // loop, acceptors, dialers, data streams
	if s.gcli != nil {
		_ = s.gcli.Stop()
	}
	s.closers.wait()
	s.failAllLocal(codeErr(wire.CodeShutdown, "sidecar shutting down"))
	s.regions.CloseAll()
	_ = os.Remove(s.SocketPath())
	return s.closeResources()
}

func (s *Server) closeResources() error {
	var errs []error
	for _, c := range s.copiers.all {
		errs = append(errs, c.Close())
	}
	if s.sender.pool != nil {
		errs = append(errs, s.sender.pool.Close())
	}
	if s.recvPool != nil {
		errs = append(errs, s.recvPool.Close())
	}
	if s.inline.lane != nil {
		errs = append(errs, s.inline.lane.Close())
	}
	if s.inline.pool != nil {
		errs = append(errs, s.inline.pool.Close())
	}
	if s.peerLn != nil {
		_ = s.peerLn.Close()
	}
	if s.engines != nil {
		s.engines.StopAccepting()
	}
	if s.nodes != nil {
		s.nodes.Close()
		errs = append(errs, s.nodes.ReleaseWake())
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
	if n := s.sender.inUse.Load(); n != 0 {
		fmt.Fprintf(&b, "send slots in use: %d; ", n)
	}
	if s.inline.pool != nil && s.inline.pool.InUse() != 0 {
		fmt.Fprintf(&b, "inline slots in use: %d; ", s.inline.pool.InUse())
	}
	if n := s.outs.len(); n != 0 {
		fmt.Fprintf(&b, "outgoing transfers: %d; ", n)
	}
	return b.String()
}

// copierSet is the copy streams (staging.copy_streams), taken in turn.
type copierSet struct {
	all  []*staging.Copier
	next atomic.Uint32
}

func (c *copierSet) take() *staging.Copier { return c.all[int(c.next.Add(1))%len(c.all)] }

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
