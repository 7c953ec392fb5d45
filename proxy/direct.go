package proxy

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/wire"
)

// FaultImportEnv names the fault injection of the same-node paths, for
// tests only: set to 1, every import of a peer's handle fails, so ipc
// transfers fall back to TCP (counted as reason import_failed).
const FaultImportEnv = "STAGE_TEST_FAULT_IPC_IMPORT"

// transport is how one transfer moves.
type transport uint8

const (
	viaTCP transport = iota // staging over the data streams
	viaIPC                  // device to device through the peer's imported regions
	viaShm                  // through a memfd ring both sidecars mapped and pinned
)

func (t transport) String() string {
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
	fbKV              = "kv_layout" // KV transfers convert layouts on the TCP path only
)

// fallbackError says the same-node path could not start; the transfer
// moves over TCP instead, untouched so far.
type fallbackError struct {
	reason string
	err    error
}

func (e *fallbackError) Error() string { return e.reason + ": " + e.err.Error() }
func (e *fallbackError) Unwrap() error { return e.err }

func fallback(reason string, err error) error { return &fallbackError{reason: reason, err: err} }

// nodeInfoWait is how long a transfer waits for a same-node peer's
// NodeInfo (sent right after the session comes up) before it goes by TCP.
const nodeInfoWait = time.Second

// choose picks the transport of a transfer on ss for a route that asks for
// want (auto, tcp, ipc, shm). A reason is returned when a same-node path was
// possible in principle (the peer shares our node) but cannot be used.
func (s *Server) choose(want string, ss *session, dir wire.Direction) (transport, error) {
	if want == "tcp" || !ss.sameHost() {
		return viaTCP, nil // not on one node: TCP is the path, not a fallback
	}
	if s.nodeLn == nil {
		return viaTCP, fallback(fbNoNodeSocket, fmt.Errorf("this sidecar serves no node socket in %s", s.cfg.NodeSocketDir()))
	}
	n := ss.node
	if !n.waitInfo(nodeInfoWait) || n.peerSock == "" {
		return viaTCP, fallback(fbPeerNoSocket, fmt.Errorf("peer %s on this node offers no node socket; check its node.socket_dir and log", ss.peerName))
	}
	n.mu.Lock()
	broken := n.broken
	n.mu.Unlock()
	if broken != "" {
		return viaTCP, fallback(broken, errors.New("an earlier transfer of this session could not use the same-node path"))
	}
	same := n.peerKind() == s.dev.Kind()
	t := viaIPC
	switch {
	case want == "shm" || (want == "auto" && !same):
		t = viaShm
	case !same:
		return viaTCP, fallback(fbDeviceMismatch, fmt.Errorf("transport ipc between %s and the peer's %s: device kinds differ; use shm or auto", s.dev, n.peerDev))
	}
	if t == viaShm && dir == wire.Pull {
		return viaTCP, fallback(fbShmPull, errors.New("pulls over the shared ring are not built; pull over TCP"))
	}
	if t == viaShm {
		if _, ok := s.dev.(device.HostRegisterer); !ok {
			return viaTCP, fallback(fbShmSetup, fmt.Errorf("%s cannot pin a shared ring (no RegisterHost)", s.dev))
		}
	}
	return t, nil
}

// noteFallback counts a fallback on the session's link and in metrics, and
// logs it once per session and reason.
func (s *Server) noteFallback(ss *session, err error) {
	var fb *fallbackError
	if !errors.As(err, &fb) {
		return
	}
	ss.link.addFallback(fb.reason)
	s.metrics.fallbacks.WithLabelValues(fb.reason).Inc()
	if ss.node.logOnce(fb.reason) {
		s.log.Warn("same-node path unavailable; using TCP (logged once per session)", zap.String("peer", ss.peerName),
			zap.String("link", ss.linkName), zap.String("reason", fb.reason), zap.Error(fb.err))
	}
	if fb.reason == fbImportFailed || fb.reason == fbNotExportable || fb.reason == fbShmSetup {
		// It would fail the same way for the next transfer: stop trying.
		ss.node.mu.Lock()
		ss.node.broken = fb.reason
		ss.node.mu.Unlock()
	}
}

// direct starts a transfer on a same-node path when the route and the peer
// allow it, running run in its own goroutine; run returns a fallbackError
// when it could not start, and tcp then starts the transfer over TCP. False
// (after tcp ran) when the transfer went to TCP at once.
func (s *Server) direct(r *route, ss *session, dir wire.Direction, run func(transport) error, finish func(transport, error), tcp func()) {
	t, err := s.choose(r.conf().Transport, ss, dir)
	s.noteFallback(ss, err)
	if t == viaTCP {
		tcp()
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := run(t)
		var fb *fallbackError
		if errors.As(err, &fb) {
			s.noteFallback(ss, err)
			tcp()
			return
		}
		finish(t, err)
	}()
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

// copyDirect runs the pieces on a fresh stream of our device and waits:
// as one batch where the stream takes batches (scattered blocks then cost
// a kernel launch per thousand, not a copy each), else one copy each.
func (s *Server) copyDirect(ps []piece) error {
	st, err := s.dev.NewStream()
	if err != nil {
		return codeErr(wire.CodeDevice, "direct copy: new stream on %s: %w", s.dev, err)
	}
	defer func() { _ = st.Close() }()
	dd, ok := st.(device.DtoD)
	if !ok {
		return fallback(fbNoPeerCopy, fmt.Errorf("%s streams cannot copy device to device", s.dev))
	}
	if b, ok := st.(device.DtoDBatch); ok && len(ps) > 1 {
		cs := make([]device.Copy, len(ps))
		for i, p := range ps {
			cs[i] = device.Copy{Dst: p.dst, Src: p.src, Len: p.n}
		}
		if err := b.CopyDtoDBatch(cs); err != nil {
			return codeErr(wire.CodeDevice, "direct copy of %d pieces on %s: %w", len(ps), s.dev, err)
		}
	} else {
		for i, p := range ps {
			if err := dd.CopyDtoD(p.dst, p.src, p.n); err != nil {
				return codeErr(wire.CodeDevice, "direct copy %d of %d (%d B %#x -> %#x) on %s: %w", i, len(ps), p.n, uint64(p.src), uint64(p.dst), s.dev, err)
			}
		}
	}
	if err := st.Synchronize(); err != nil {
		return codeErr(wire.CodeDevice, "direct copy of %d pieces on %s: %w", len(ps), s.dev, err)
	}
	return nil
}
