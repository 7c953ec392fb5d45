package proxy

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/proxy/engine"
	"github.com/stage-kv/stage/proxy/node"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// localXfer is a transfer a local engine submitted.
type localXfer struct {
	id      uint64
	wireID  uint64
	route   string
	dir     wire.Direction
	tag     string
	total   uint64
	ss      *session
	timeout time.Duration
	group   string // the owner's group: who may check, wait for and cancel it (owner.go)

	mu      sync.Mutex
	state   wire.State
	err     error
	started time.Time
	ended   time.Time
	done    chan struct{}
	onDone  []func()    // run once when it finishes (SubmitWait answers)
	inline  atomic.Bool // sent on the latency path (set before it is sent)
	// collecting: sent in pieces and not started until its End
	// (send_pieces.go): a cancel ends it here, nothing else holds it.
	collecting atomic.Bool
	// doneB is XferStatus.Done: bytes acked (push) or landed (pull) so
	// far. It only grows, and is written as acks arrive (the sender loop)
	// or chunks land (a stream's scatter callback), so it takes no lock.
	doneB atomic.Uint64
}

// whenDone runs f once the transfer has finished: at once if it has.
func (lx *localXfer) whenDone(f func()) {
	lx.mu.Lock()
	if lx.state != wire.StateDone && lx.state != wire.StateFailed {
		lx.onDone = append(lx.onDone, f)
		lx.mu.Unlock()
		return
	}
	lx.mu.Unlock()
	f()
}

// addDone raises the progress count to n; a smaller n (an older report
// that lost a race) changes nothing.
func (lx *localXfer) addDone(n uint64) {
	for {
		old := lx.doneB.Load()
		if n <= old || lx.doneB.CompareAndSwap(old, n) {
			return
		}
	}
}

func (lx *localXfer) status(req uint64) *wire.XferStatus {
	lx.mu.Lock()
	defer lx.mu.Unlock()
	st := &wire.XferStatus{Req: req, Transfer: lx.id, State: lx.state, Done: lx.doneB.Load(), Total: lx.total}
	if lx.err != nil {
		st.Code, st.Message = errCode(lx.err), lx.err.Error()
	}
	return st
}

// outXfer is what the sender loop needs of a transfer whose chunks leave
// here: our push, or a pull we serve. It holds references to the source
// regions until the core retires the transfer.
type outXfer struct {
	key      staging.Key
	wireID   uint64
	ss       *session
	checksum bool
	end      outEnd // whom its progress and end concern: ourPush or servedPull (send_loop.go)
	regions  []*region.Region
	timeout  time.Duration
	tag      string
	use      *grantUse // a KV pull served under a transfer key: ended at retire (kvfence.go)

	// The chunk plan is made when the push goes to the sender core: a
	// same-node push copies ops as they are and never needs one. Its
	// chunks are cut as the core starts them (staging.NewPlan), so the
	// first chunk of a push of many blocks moves before the rest are cut.
	ops   []staging.PlanOp
	chunk int
	// growTotal, when not 0, is the declared length of a push sent in
	// pieces (send_pieces.go): its plan grows as the pieces come.
	growTotal uint64
	planOnce  sync.Once
	plan      *staging.Plan
	planErr   error
}

// getPlan cuts the push into chunks, once.
func (ox *outXfer) getPlan() (*staging.Plan, error) {
	ox.planOnce.Do(func() {
		if ox.growTotal > 0 {
			ox.plan, ox.planErr = staging.NewGrowingPlan(ox.growTotal, ox.chunk, ox.ops)
		} else {
			ox.plan, ox.planErr = staging.NewPlan(ox.ops, ox.chunk)
		}
		if ox.planErr != nil {
			ox.planErr = codeErr(wire.CodeBadRequest, "%w", ox.planErr)
		}
	})
	return ox.plan, ox.planErr
}

// submit validates and starts an engine's transfer. Nothing moves and no
// state changes unless every check passes. With wait false it does not
// wait for a session to the peer: routing.ErrNoSession says it would have.
func (h engineHost) submit(ctx context.Context, group string, m *wire.Submit, wait bool) (*localXfer, error) {
	sub, err := h.admit(ctx, group, m, wait)
	if err != nil {
		return nil, err
	}
	if m.Dir == wire.Push {
		h.push(sub)
	} else {
		h.pull(sub)
	}
	return sub.lx, nil
}

// submitted is an engine's transfer that passed every check and was
// recorded, with what starting it needs. It holds its regions.
type submitted struct {
	m        *wire.Submit
	lx       *localXfer
	r        *route
	regions  []*region.Region
	chk      *region.Checked
	checksum bool
}

// admit checks an engine's transfer (route, regions, rights, bounds), picks
// its session and records it (xferTable); on any error nothing is kept.
func (h engineHost) admit(ctx context.Context, group string, m *wire.Submit, wait bool) (*submitted, error) {
	s := h.s
	r, err := h.openRoute(m.Route)
	if err != nil {
		return nil, err
	}
	if len(m.Ops) == 0 {
		return nil, codeErr(wire.CodeBadRequest, "transfer has no ops")
	}
	want := wire.AccessLocalRead
	if m.Dir == wire.Pull {
		want = wire.AccessLocalWrite
	}
	regions, err := s.regions.AcquireOwn(group, m.LocalNames, want)
	if err != nil {
		return nil, err
	}
	keep := false
	defer func() {
		if !keep {
			region.ReleaseAll(regions)
		}
	}()
	chk, err := region.CheckOps(m, regions, m.Dir == wire.Push)
	if err != nil {
		return nil, err
	}
	var ss *session
	if wait {
		ss, err = r.Pick(ctx, m.Peer)
	} else {
		ss, err = r.PickNow(m.Peer)
	}
	if err != nil {
		return nil, err
	}
	id := s.newID()
	lx := &localXfer{id: id, wireID: ss.wireID(id), route: m.Route, dir: m.Dir, tag: m.Tag, total: chk.Total, ss: ss, group: group,
		timeout: r.Conf().ProgressTimeout, state: wire.StateQueued, started: time.Now(), done: make(chan struct{})}
	s.xfers.add(lx)
	keep = true
	return &submitted{m: m, lx: lx, r: r, regions: regions, chk: chk, checksum: checksumFor(r, m.Checksum)}, nil
}

// push starts our push: on the latency path when it takes it
// (send_inline.go), else through the sender core or a same-node path
// (startPush, send_start.go).
func (h engineHost) push(sub *submitted) {
	s, m, lx := h.s, sub.m, sub.lx
	ss := lx.ss
	if s.inline.send(ss, lx, sub.regions, m, sub.chk, sub.checksum) {
		return
	}
	ox := &outXfer{key: staging.Key(lx.id), wireID: lx.wireID, ss: ss, checksum: sub.checksum, end: ourPush{lx}, regions: sub.regions,
		ops: sub.chk.Plan, chunk: ss.chunkSize, timeout: lx.timeout, tag: m.Tag}
	s.outs.put(ox)
	ss.out.expect(lx.wireID, corePush(ox.key))
	// The chunks follow the Announce at once, without waiting for Accept:
	// the receiver checks the whole transfer when the Announce arrives
	// and holds any chunk that overtook it until then, so nothing lands
	// unchecked, and a refusal (Nack) fails the transfer here. The core
	// hears of the transfer first: a Nack that came back before it did
	// would find nothing to fail, and the transfer would wait out its
	// deadline.
	lx.setState(wire.StateRunning)
	announce := node.NewAnnouncer(ss.send, &wire.Announce{Transfer: lx.wireID, Tag: m.Tag, Total: lx.total, Regions: m.RemoteNames, Ends: sub.chk.Ends})
	ox.startPush(lx, sub.r, m.RemoteNames, announce)
}

// pull starts our pull: our regions receive, into an incoming transfer
// opened in the receive core before the request goes out (startPull,
// send_start.go).
func (h engineHost) pull(sub *submitted) {
	s, m, lx := h.s, sub.m, sub.lx
	// The inXfer holds its own references so they outlive any scatter
	// still in flight when the transfer ends.
	for _, rg := range sub.regions {
		rg.Ref()
	}
	x := &inXfer{s: s, ss: lx.ss, wireID: lx.wireID, tag: m.Tag, regions: sub.regions, total: lx.total,
		end: ourPull{lx}, timeout: lx.timeout}
	x.dest = bytesInto(x)
	ops := make([]wire.Op, len(m.Ops))
	for i, op := range m.Ops {
		ops[i] = wire.Op{Src: op.Remote, Dst: op.Local, SrcOff: op.RemoteOff, DstOff: op.LocalOff, Len: op.Len}
	}
	ok := s.expectPull(x)
	region.ReleaseAll(sub.regions) // the localXfer's own references; x holds its own
	if !ok {
		return
	}
	lx.setState(wire.StateRunning)
	x.startPull(sub.r, m, &wire.PullRequest{Transfer: lx.wireID, Tag: m.Tag, SrcRegions: m.RemoteNames, Ops: ops})
}

// openRoute is the route an engine's transfer names, while the sidecar
// takes transfers.
func (h engineHost) openRoute(name string) (*route, error) {
	s := h.s
	if s.closing.Load() || s.draining.Load() {
		return nil, codeErr(wire.CodeShutdown, "sidecar is shutting down (draining): submit to another sidecar or retry after it restarts")
	}
	return s.routes.Lookup(name)
}

// checksumFor is whether a transfer on r carries CRC32Cs: as the engine
// chose, else as the route says.
func checksumFor(r *route, choice uint8) bool {
	switch choice {
	case wire.ChecksumOn:
		return true
	case wire.ChecksumOff:
		return false
	}
	return r.Conf().Checksum
}

// expectPull registers our pull's incoming transfer x on its session
// before the request goes out; when the session closed meanwhile, it
// fails the engine's transfer and reports false.
func (s *Server) expectPull(x *inXfer) bool {
	if x.ss.in.open(x) == nil {
		return true
	}
	region.ReleaseAll(x.regions)
	x.end.finish(x, 0, codeErr(wire.CodePeerUnavailable, "session with %s closed", x.ss.peerName))
	return false
}

func (lx *localXfer) setState(st wire.State) {
	lx.mu.Lock()
	if lx.state == wire.StateQueued || lx.state == wire.StateRunning {
		lx.state = st
	}
	lx.mu.Unlock()
}

// retire forgets an outgoing transfer and lets go of its regions.
func (s *Server) retire(key staging.Key) {
	ox := s.outs.take(key)
	if ox == nil {
		return
	}
	region.ReleaseAll(ox.regions)
	ox.use.end()
	ox.end.retired(ox)
}

// finishLocal ends an engine's transfer once.
func (s *Server) finishLocal(lx *localXfer, err error) {
	lx.mu.Lock()
	if lx.state == wire.StateDone || lx.state == wire.StateFailed {
		lx.mu.Unlock()
		return
	}
	if err == nil {
		lx.state = wire.StateDone
		lx.addDone(lx.total)
	} else {
		lx.state, lx.err = wire.StateFailed, err
	}
	lx.ended = time.Now()
	cbs := lx.onDone
	lx.onDone = nil
	lx.mu.Unlock()
	// Counted before the engine can hear of the end (Wait, SubmitWait),
	// so stats and metrics read after that answer include this transfer.
	if lx.ss != nil {
		if err == nil {
			lx.ss.link.XfersOK.Add(1)
		} else {
			lx.ss.link.XfersFailed.Add(1)
		}
	}
	s.metrics.transferDone(lx.dir, lx.started, err)
	close(lx.done)
	for _, f := range cbs {
		f()
	}
	if err != nil {
		s.log.Info("transfer failed", zap.Uint64("transfer", lx.id), zap.String("route", lx.route), zap.Stringer("dir", lx.dir), zap.String("tag", lx.tag), zap.Error(err))
	}
	s.xfers.finish(lx.id)
}

// Cancel cancels an engine's transfer of group g.
func (h engineHost) Cancel(o engine.Owner, id uint64) error {
	lx, err := h.lookup(o.Group, id)
	if err != nil {
		return err
	}
	h.s.abortLocal(lx, codeErr(wire.CodeCancelled, "cancelled by the engine"), "cancelled by the peer's engine", true)
	return nil
}

// abortLocal ends an engine's transfer with err and tells the peer why
// (peerMsg); cancel: the sender core ends a push as cancelled, else with
// err.
func (s *Server) abortLocal(lx *localXfer, err error, peerMsg string, cancel bool) {
	if lx.collecting.Load() {
		s.finishLocal(lx, err) // its Grower lets go of its regions at its next piece
		return
	}
	ss := lx.ss
	ss.send(&wire.Nack{Transfer: lx.wireID, Code: errCode(err), Message: peerMsg})
	if lx.dir == wire.Pull {
		if x := ss.in.lookup(lx.wireID); x != nil {
			x.fail(err, false)
		}
		return
	}
	if ss.out.takeInline(lx.wireID) != nil {
		s.finishLocal(lx, err)
		return
	}
	if ss.node.Nack(lx.wireID, err) { // a direct push stops at its next step
		return
	}
	ev := staging.Event{Kind: staging.EvNack, Session: ss.id, Transfer: staging.Key(lx.id), Err: err, Now: time.Now()}
	if cancel {
		ev = staging.Event{Kind: staging.EvCancel, Transfer: staging.Key(lx.id), Now: time.Now()}
	}
	s.sender.post(ev)
}

// failAllLocal fails every unfinished engine transfer (shutdown).
func (s *Server) failAllLocal(err error) {
	for _, lx := range s.xfers.all() {
		s.finishLocal(lx, err)
	}
	for _, ox := range s.outs.takeAll() {
		region.ReleaseAll(ox.regions)
		ox.use.end()
	}
}

// lookup is the transfer id of an engine of group g.
func (h engineHost) lookup(g string, id uint64) (*localXfer, error) {
	lx := h.s.xfers.get(id)
	if lx == nil {
		return nil, codeErr(wire.CodeUnknownTransfer, "transfer %d is unknown (finished long ago, or never submitted here)", id)
	}
	if lx.group != g {
		return nil, codeErr(wire.CodeAccessDenied, "transfer %d belongs to another engine connection; a connection may check, wait for and cancel only its own transfers and those of its group (Join, PROTOCOL.md 9.18)", id)
	}
	return lx, nil
}

var _ = fmt.Sprintf
