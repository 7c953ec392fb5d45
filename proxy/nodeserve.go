package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/internal/spin"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

// exporter serves one authenticated node connection: the peer asks for
// handles of this sidecar's regions, reports direct copies, and lands
// chunks through a shared ring (shm.go).
type exporter struct {
	s    *Server
	ss   *session
	c    *net.UnixConn
	wmu  sync.Mutex // writes come from the loop and from scatter callbacks
	ring *shmRing   // set by ShmRing
	busy sync.WaitGroup
	pull []uint64 // pulls served through this connection (released when it ends)
}

func (s *Server) serveNode(c *net.UnixConn) error {
	ss, err := s.nodeHello(c)
	if err != nil {
		return err
	}
	if !ss.node.track(c) {
		return nil // the session closed meanwhile
	}
	defer ss.node.untrack(c)
	e := &exporter{s: s, ss: ss, c: c}
	defer e.closeRing()
	defer func() {
		for _, id := range e.pull {
			s.abandonServed(ss, id)
		}
	}()
	var buf []byte
	for {
		var m wire.Msg
		var fd int
		// The next frame usually follows within microseconds (the
		// HandleRequest after the Announce, the next push's Announce).
		spin.Readable(c, answerSpin)
		_, m, fd, buf, err = unixsock.ReadFrame(c, buf)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("node connection of %s: %w", ss.peerName, err)
		}
		if err := e.handle(m, fd); err != nil {
			return fmt.Errorf("node connection of %s: %w", ss.peerName, err)
		}
	}
}

// handle answers one frame; an error ends the connection.
func (e *exporter) handle(m wire.Msg, fd int) error {
	switch m := m.(type) {
	case *wire.Announce:
		// An ipc push announced here rather than on the control session,
		// just before its HandleRequest: admitted (or refused, with a Nack
		// on the control session) exactly as there.
		unixsock.CloseFD(fd)
		e.s.acceptPush(e.ss, m)
		return nil
	case *wire.HandleRequest:
		unixsock.CloseFD(fd)
		return e.handles(m)
	case *wire.DirectDone:
		unixsock.CloseFD(fd)
		e.pull = slices.DeleteFunc(e.pull, func(id uint64) bool { return id == m.Transfer })
		err := e.s.directDone(e.ss, m)
		if err != nil {
			return e.write(&wire.Fail{Req: m.Transfer, Code: errCode(err), Message: err.Error()}, -1)
		}
		return e.write(&wire.OK{Req: m.Transfer}, -1)
	case *wire.ShmRing:
		err := e.openRing(m, fd)
		unixsock.CloseFD(fd)
		if err != nil {
			_ = e.write(&wire.Fail{Code: errCode(err), Message: err.Error()}, -1)
			return err
		}
		return e.write(&wire.OK{}, -1)
	case *wire.ShmChunk:
		unixsock.CloseFD(fd)
		return e.shmChunk(m)
	}
	unixsock.CloseFD(fd)
	return fmt.Errorf("unexpected %s frame", m.Type())
}

func (e *exporter) write(m wire.Msg, fd int) error {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	return unixsock.WriteFrame(e.c, m, fd)
}

// handles answers a HandleRequest: one RegionHandle per region, or a Fail.
func (e *exporter) handles(m *wire.HandleRequest) error {
	regions, release, err := e.s.directRegions(e.ss, m)
	if err != nil {
		return e.write(&wire.Fail{Req: m.Transfer, Code: errCode(err), Message: err.Error()}, -1)
	}
	defer release()
	if m.Dir == wire.Pull {
		e.pull = append(e.pull, m.Transfer)
	}
	hs := make([]*wire.RegionHandle, len(regions))
	fds := make([]int, len(regions))
	for i, r := range regions {
		if hs[i], fds[i], err = region.HandleFor(r, e.s.dev.String(), m.Transfer, i); err != nil {
			e.s.abandonServed(e.ss, m.Transfer)
			return e.write(&wire.Fail{Req: m.Transfer, Code: errCode(err), Message: err.Error()}, -1)
		}
	}
	for i, h := range hs {
		e.ss.node.handed(h.RegionID)
		if err := e.write(h, fds[i]); err != nil {
			return err
		}
	}
	return nil
}

// directRegions finds the regions a HandleRequest names, with a reference
// held until release: for a push, the destination regions the transfer's
// Announce named (checked and held by its inXfer); for a pull, the source
// regions, which must grant remote read and stay held (served) until
// DirectDone or the session ends.
func (s *Server) directRegions(ss *session, m *wire.HandleRequest) ([]*region.Region, func(), error) {
	if ss.ours(m.Transfer) {
		return nil, nil, codeErr(wire.CodeMalformed, "transfer id %d has our parity", m.Transfer)
	}
	if m.Dir == wire.Pull {
		rs, err := s.regions.AcquireAll(m.Regions, wire.AccessRemoteRead)
		if err != nil {
			return nil, nil, err
		}
		if !ss.node.serve(m.Transfer, m.Tag, rs) {
			region.ReleaseAll(rs)
			return nil, nil, codeErr(wire.CodeExists, "transfer %d already in progress", m.Transfer)
		}
		return rs, func() {}, nil
	}
	x := ss.incoming(m.Transfer)
	if x == nil || x.dir != wire.Push {
		return nil, nil, codeErr(wire.CodeUnknownTransfer, "push %d is unknown here: refused (see its Nack), finished, or never announced", m.Transfer)
	}
	if len(m.Regions) != len(x.regions) {
		return nil, nil, codeErr(wire.CodeBadRequest, "push %d announced %d regions, the handle request names %d", m.Transfer, len(x.regions), len(m.Regions))
	}
	for i, r := range x.regions {
		if r.Name != m.Regions[i] {
			return nil, nil, codeErr(wire.CodeBadRequest, "push %d: region #%d is %q, the handle request names %q", m.Transfer, i, r.Name, m.Regions[i])
		}
		if r.Access&wire.AccessRemoteWrite == 0 {
			return nil, nil, codeErr(wire.CodeAccessDenied, "region %q does not grant remote-write", r.Name)
		}
	}
	for _, r := range x.regions {
		r.Ref()
	}
	x.touch()
	return x.regions, func() { region.ReleaseAll(x.regions) }, nil
}

// directDone ends a transfer whose bytes the peer copied directly. Bytes 0
// means the peer gave up on the direct path (it falls back to TCP): a pull's
// regions are let go, a push waits for its chunks.
func (s *Server) directDone(ss *session, m *wire.DirectDone) error {
	if sv := ss.node.unserve(m.Transfer); sv != nil {
		region.ReleaseAll(sv.regions)
		if m.Bytes == 0 {
			return nil
		}
		ss.link.XfersOK.Add(1)
		ss.link.XfersIPC.Add(1)
		ss.link.BytesOut.Add(m.Bytes)
		s.notify(&wire.Notify{Transfer: m.Transfer, Peer: ss.peerName, Route: routeName(ss), Tag: sv.tag, Dir: wire.Pull, Bytes: m.Bytes})
		return nil
	}
	if m.Bytes == 0 {
		return nil
	}
	x := ss.lookupIn(m.Transfer)
	if x == nil || x.dir != wire.Push || x.local != nil {
		return codeErr(wire.CodeUnknownTransfer, "transfer %d is unknown here (finished, failed or never announced)", m.Transfer)
	}
	if err := x.directLanded(m.Bytes); err != nil {
		x.fail(err, false)
		return err
	}
	ss.link.BytesIn.Add(m.Bytes)
	ss.link.XfersIPC.Add(1)
	return nil
}

// abandonServed lets go of a pull's regions when its handles could not be sent.
func (s *Server) abandonServed(ss *session, id uint64) {
	if sv := ss.node.unserve(id); sv != nil {
		region.ReleaseAll(sv.regions)
	}
}

func (e *exporter) logf(msg string, err error) {
	e.s.log.Warn(msg, zap.String("peer", e.ss.peerName), zap.Error(err))
}
