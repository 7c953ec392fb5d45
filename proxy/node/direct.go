package node

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

// Transport is how one transfer moves.
type Transport uint8

const (
	TCP Transport = iota // staging over the data streams
	IPC                  // device to device through the peer's imported regions
	Shm                  // through a memfd ring both sidecars mapped and pinned
)

func (t Transport) String() string {
	return [...]string{"tcp", "ipc", "shm"}[t]
}

// Fallback reasons: the label values of stage_transport_fallbacks_total and
// the keys of a link's "fallbacks" in stats.
const (
	fbNoNodeSocket    = "no_node_socket"   // we serve no node socket (node.socket_dir unusable)
	fbPeerNoSocket    = "peer_no_socket"   // the peer serves none, or sent no NodeInfo
	fbPeerUnreachable = "peer_unreachable" // dialing or talking to its node socket failed
	fbDeviceMismatch  = "device_mismatch"  // transport ipc between different device kinds
	fbNoPeerCopy      = "no_peer_copy"     // our backend cannot copy device to device
	fbNotExportable   = "not_exportable"   // a region's memory cannot be handed out
	fbImportFailed    = "import_failed"    // importing the peer's handle failed
	fbShmSetup        = "shm_setup_failed" // the shared ring could not be set up
	fbShmPull         = "shm_pull_unsupported"
	// FallbackKV: KV transfers convert layouts on the TCP path only.
	FallbackKV = "kv_layout"
)

// fallbackError says the same-node path could not start; the transfer
// moves over TCP instead, untouched so far.
type fallbackError struct {
	reason string
	err    error
}

func (e *fallbackError) Error() string { return e.reason + ": " + e.err.Error() }
func (e *fallbackError) Unwrap() error { return e.err }

// Fallback is the error of a transfer that could not take a same-node
// path for reason (one of the reasons above), with its cause.
func Fallback(reason string, err error) error { return &fallbackError{reason: reason, err: err} }

// nodeInfoWait is how long a transfer waits for a same-node peer's
// NodeInfo (sent right after the session comes up) before it goes by TCP.
const nodeInfoWait = time.Second

// Choose picks the transport of a transfer on the session for a route
// that asks for want (auto, tcp, ipc, shm). A reason is returned when a
// same-node path was possible in principle (the peer shares our node) but
// cannot be used.
func (p *Peer) Choose(want string, dir wire.Direction) (Transport, error) {
	id := p.s.Ident()
	if want == "tcp" || !id.SameHost {
		return TCP, nil // not on one node: TCP is the path, not a fallback
	}
	dev := p.r.o.Dev
	if p.r.ln == nil {
		return TCP, Fallback(fbNoNodeSocket, fmt.Errorf("this sidecar serves no node socket in %s", p.r.o.Dir))
	}
	if !p.waitInfo(nodeInfoWait) || p.peerSock == "" {
		return TCP, Fallback(fbPeerNoSocket, fmt.Errorf("peer %s on this node offers no node socket; check its node.socket_dir and log", id.Name))
	}
	p.mu.Lock()
	broken := p.broken
	p.mu.Unlock()
	if broken != "" {
		return TCP, Fallback(broken, errors.New("an earlier transfer of this session could not use the same-node path"))
	}
	same := p.peerKind() == dev.Kind()
	t := IPC
	switch {
	case want == "shm" || (want == "auto" && !same):
		t = Shm
	case !same:
		return TCP, Fallback(fbDeviceMismatch, fmt.Errorf("transport ipc between %s and the peer's %s: device kinds differ; use shm or auto", dev, p.peerDev))
	}
	if t == Shm && dir == wire.Pull {
		return TCP, Fallback(fbShmPull, errors.New("pulls over the shared ring are not built; pull over TCP"))
	}
	if t == Shm {
		if _, ok := dev.(device.HostRegisterer); !ok {
			return TCP, Fallback(fbShmSetup, fmt.Errorf("%s cannot pin a shared ring (no RegisterHost)", dev))
		}
	}
	return t, nil
}

// NoteFallback counts a fallback (err made by Fallback; any other error
// is not one) on the session's link and in metrics, logs it once per
// session and reason, and reports whether err was one: the transfer then
// goes over TCP, which the caller starts.
func (p *Peer) NoteFallback(err error) bool {
	var fb *fallbackError
	if !errors.As(err, &fb) {
		return false
	}
	p.s.Fallback(fb.reason)
	p.r.h.Fallback(fb.reason)
	if p.LogOnce(fb.reason) {
		id := p.s.Ident()
		p.r.o.Log.Warn("same-node path unavailable; using TCP (logged once per session)", zap.String("peer", id.Name),
			zap.String("link", id.Link), zap.String("reason", fb.reason), zap.Error(fb.err))
	}
	if fb.reason == fbImportFailed || fb.reason == fbNotExportable || fb.reason == fbShmSetup {
		// It would fail the same way for the next transfer: stop trying.
		p.mu.Lock()
		p.broken = fb.reason
		p.mu.Unlock()
	}
	return true
}

// TransportOf says what the next transfer on the session would use for a
// route asking for want, for stagectl routes (no waiting, no counting).
func (p *Peer) TransportOf(want string) string {
	if want == "tcp" || !p.s.Ident().SameHost {
		return "tcp"
	}
	select {
	case <-p.info:
	default:
		return "tcp (same node; waiting for the peer's node info)"
	}
	t, err := p.Choose(want, wire.Push)
	if err != nil {
		return "tcp (fallback: " + err.Error() + ")"
	}
	return t.String()
}

// piece is one device-to-device copy.
type piece struct {
	dst, src device.Addr
	n        uint64
}

// appendPiece adds p, merged into the last piece when both sides continue it.
func appendPiece(ps []piece, p piece) []piece {
	if k := len(ps) - 1; k >= 0 && ps[k].dst+device.Addr(ps[k].n) == p.dst && ps[k].src+device.Addr(ps[k].n) == p.src {
		ps[k].n += p.n
		return ps
	}
	return append(ps, p)
}

// splitMin is the smallest copy split across streams: below it a second
// stream's launch and wait cost more than its copy engine gives.
const splitMin = 64 << 20

// splitPieces cuts ps into at most n runs of about equal bytes, in order,
// cutting a piece where a run ends: one run each for node.copy_streams
// streams. Copies under splitMin in all stay one run.
func splitPieces(ps []piece, n int) [][]piece {
	var total uint64
	for _, p := range ps {
		total += p.n
	}
	if n <= 1 || total < splitMin {
		return [][]piece{ps}
	}
	share := (total + uint64(n) - 1) / uint64(n)
	runs := make([][]piece, 0, n)
	var run []piece
	var have uint64
	for _, p := range ps {
		for p.n > 0 {
			take := min(p.n, share-have)
			run = append(run, piece{dst: p.dst, src: p.src, n: take})
			p.dst += device.Addr(take)
			p.src += device.Addr(take)
			p.n -= take
			if have += take; have == share {
				runs, run, have = append(runs, run), nil, 0
			}
		}
	}
	if len(run) > 0 {
		runs = append(runs, run)
	}
	return runs
}

// copyTimes is where a direct copy's time went: making streams and
// enqueueing the copies, then waiting for them (the same-node push debug
// line logs both).
type copyTimes struct {
	setup, wait time.Duration
}

// copyDirect runs the pieces on fresh streams of our device and waits (the
// first on first when it is not nil: a stream the caller made, which
// copyDirect now owns and closes): a
// large copy split across node.copy_streams streams (splitPieces), each
// run as one batch where the stream takes batches (scattered blocks then
// cost a kernel launch per thousand, not a copy each), else one copy each.
// (Keeping the streams for the next copy saved 0-20 us of a 4 GiB push
// on 2 x H200, against the enqueue's 40-50: not worth streams that stay
// open while idle.)
func (r *Room) copyDirect(ps []piece, first device.Stream) (ct copyTimes, err error) {
	t0 := time.Now()
	dev := r.o.Dev
	runs := splitPieces(ps, r.o.CopyStreams)
	streams := make([]device.Stream, 0, len(runs)+1)
	if first != nil {
		streams = append(streams, first)
	}
	defer func() {
		for _, st := range streams {
			_ = st.Close()
		}
	}()
	for k, run := range runs {
		if k == 0 && first != nil {
			if err := enqueueDirect(dev, first, run); err != nil {
				return ct, err
			}
			continue
		}
		st, err := dev.NewStream()
		if err != nil {
			return ct, status.Errorf(wire.CodeDevice, "direct copy: new stream %d of %d on %s: %w", k+1, len(runs), dev, err)
		}
		streams = append(streams, st)
		if err := enqueueDirect(dev, st, run); err != nil {
			return ct, err
		}
	}
	t1 := time.Now()
	ct.setup = t1.Sub(t0)
	for _, st := range streams {
		if err := st.Synchronize(); err != nil {
			return ct, status.Errorf(wire.CodeDevice, "direct copy of %d pieces on %s: %w", len(ps), dev, err)
		}
	}
	ct.wait = time.Since(t1)
	return ct, nil
}

// enqueueDirect queues ps on st, a stream of dev: one batch where st takes batches, else
// one copy each.
func enqueueDirect(dev device.Device, st device.Stream, ps []piece) error {
	dd, ok := st.(device.DtoD)
	if !ok {
		return Fallback(fbNoPeerCopy, fmt.Errorf("%s streams cannot copy device to device", dev))
	}
	if b, ok := st.(device.DtoDBatch); ok && len(ps) > 1 {
		cs := make([]device.Copy, len(ps))
		for i, p := range ps {
			cs[i] = device.Copy{Dst: p.dst, Src: p.src, Len: p.n}
		}
		if err := b.CopyDtoDBatch(cs); err != nil {
			return status.Errorf(wire.CodeDevice, "direct copy of %d pieces on %s: %w", len(ps), dev, err)
		}
		return nil
	}
	for i, p := range ps {
		if err := dd.CopyDtoD(p.dst, p.src, p.n); err != nil {
			return status.Errorf(wire.CodeDevice, "direct copy %d of %d (%d B %#x -> %#x) on %s: %w", i, len(ps), p.n, uint64(p.src), uint64(p.dst), dev, err)
		}
	}
	return nil
}
