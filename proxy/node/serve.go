package node

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/internal/spin"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

// exporter serves one authenticated node connection: the peer asks for
// handles of this sidecar's regions, reports direct copies, and lands
// chunks through a shared ring (shm.go).
type exporter struct {
	r    *Room
	p    *Peer
	id   Ident
	c    *net.UnixConn
	wmu  sync.Mutex // writes come from the loop and from scatter callbacks
	ring *shmRing   // set by ShmRing
	busy sync.WaitGroup
	pull []uint64 // pulls served through this connection (released when it ends)
	due  dueClock // when the DirectDone of the push handed last should come
	// waited is how the reader waited for the frame it handles (for the
	// DirectDone debug line).
	waited waited
}

type waited struct {
	start       time.Time
	sleep, poll time.Duration
}

func (r *Room) serve(c *net.UnixConn) error {
	p, err := r.hello(c)
	if err != nil {
		return err
	}
	if !p.track(c) {
		return nil // the session closed meanwhile
	}
	defer p.untrack(c)
	e := &exporter{r: r, p: p, id: p.s.Ident(), c: c}
	defer e.closeRing()
	defer func() {
		for _, id := range e.pull {
			p.abandonServed(id)
		}
	}()
	var buf []byte
	for {
		var m wire.Msg
		var fd int
		// The next frame usually follows within microseconds (the
		// HandleRequest after the Announce, the next push's Announce);
		// a DirectDone comes when the peer's copy ends (due.go).
		tw := time.Now()
		sleep, sp := e.due.due().Plan(tw)
		if sp > 0 {
			spin.AwaitDue(c, sleep, sp)
		} else {
			spin.Readable(c, answerSpin)
		}
		e.waited = waited{start: tw, sleep: sleep, poll: sp}
		_, m, fd, buf, err = unixsock.ReadFrame(c, buf)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("node connection of %s: %w", e.id.Name, err)
		}
		if err := e.handle(m, fd); err != nil {
			return fmt.Errorf("node connection of %s: %w", e.id.Name, err)
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
		e.p.s.AcceptPush(m)
		return nil
	case *wire.HandleRequest:
		unixsock.CloseFD(fd)
		return e.handles(m)
	case *wire.DirectDone:
		unixsock.CloseFD(fd)
		e.due.done(time.Now(), m.Bytes)
		e.pull = slices.DeleteFunc(e.pull, func(id uint64) bool { return id == m.Transfer })
		t0 := time.Now()
		err := e.p.directDone(m)
		if err != nil {
			return e.write(&wire.Fail{Req: m.Transfer, Code: status.Code(err), Message: err.Error()}, -1)
		}
		err = e.write(&wire.OK{Req: m.Transfer}, -1)
		// How the DirectDone was waited for (asleep, then polling, when it
		// was due) and answered; docs/BENCHMARKS.md profiles the ipc row.
		if ce := e.r.o.Log.Check(zap.DebugLevel, "direct done served"); ce != nil {
			w := e.waited
			ce.Write(zap.Uint64("transfer", m.Transfer), zap.Duration("waited", t0.Sub(w.start)), zap.Duration("planned_sleep", w.sleep),
				zap.Duration("planned_poll", w.poll), zap.Duration("answer", time.Since(t0)))
		}
		return err
	case *wire.ShmRing:
		err := e.openRing(m, fd)
		unixsock.CloseFD(fd)
		if err != nil {
			_ = e.write(&wire.Fail{Code: status.Code(err), Message: err.Error()}, -1)
			return err
		}
		return e.write(&wire.OK{}, -1)
	case *wire.ShmChunk:
		unixsock.CloseFD(fd)
		return e.shmChunk(m)
	case *wire.LinkWake:
		unixsock.CloseFD(fd)
		return e.linkWake()
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
	regions, total, release, err := e.p.directRegions(m)
	if err != nil {
		return e.write(&wire.Fail{Req: m.Transfer, Code: status.Code(err), Message: err.Error()}, -1)
	}
	defer release()
	if m.Dir == wire.Pull {
		e.pull = append(e.pull, m.Transfer)
	}
	hs := make([]*wire.RegionHandle, len(regions))
	fds := make([]int, len(regions))
	for i, r := range regions {
		if hs[i], fds[i], err = region.HandleFor(r, e.r.o.Dev.String(), m.Transfer, i); err != nil {
			e.p.abandonServed(m.Transfer)
			return e.write(&wire.Fail{Req: m.Transfer, Code: status.Code(err), Message: err.Error()}, -1)
		}
	}
	for i, h := range hs {
		e.p.handed(h.RegionID)
		if err := e.write(h, fds[i]); err != nil {
			return err
		}
	}
	if m.Dir == wire.Push {
		e.due.handed(time.Now(), total)
	}
	return nil
}

// directRegions finds the regions a HandleRequest names, with a reference
// held until release: for a push, the destination regions the transfer's
// Announce named (checked and held by the incoming transfer); for a pull,
// the source regions, which must grant remote read and stay held (served)
// until DirectDone or the session ends.
func (p *Peer) directRegions(m *wire.HandleRequest) (_ []*region.Region, total uint64, release func(), _ error) {
	if p.s.Ident().ours(m.Transfer) {
		return nil, 0, nil, status.Errorf(wire.CodeMalformed, "transfer id %d has our parity", m.Transfer)
	}
	if m.Dir == wire.Pull {
		rs, err := p.r.o.Regions.AcquireAll(m.Regions, wire.AccessRemoteRead)
		if err != nil {
			return nil, 0, nil, err
		}
		if !p.serve(m.Transfer, m.Tag, rs) {
			region.ReleaseAll(rs)
			return nil, 0, nil, status.Errorf(wire.CodeExists, "transfer %d already in progress", m.Transfer)
		}
		return rs, 0, func() {}, nil
	}
	x := p.s.IncomingPush(m.Transfer, true)
	if x == nil {
		return nil, 0, nil, status.Errorf(wire.CodeUnknownTransfer, "push %d is unknown here: refused (see its Nack), finished, or never announced", m.Transfer)
	}
	regions := x.Regions()
	if len(m.Regions) != len(regions) {
		return nil, 0, nil, status.Errorf(wire.CodeBadRequest, "push %d announced %d regions, the handle request names %d", m.Transfer, len(regions), len(m.Regions))
	}
	for i, r := range regions {
		if r.Name != m.Regions[i] {
			return nil, 0, nil, status.Errorf(wire.CodeBadRequest, "push %d: region #%d is %q, the handle request names %q", m.Transfer, i, r.Name, m.Regions[i])
		}
		if r.Access&wire.AccessRemoteWrite == 0 {
			return nil, 0, nil, status.Errorf(wire.CodeAccessDenied, "region %q does not grant remote-write", r.Name)
		}
	}
	for _, r := range regions {
		r.Ref()
	}
	x.Touch()
	return regions, x.Total(), func() { region.ReleaseAll(regions) }, nil
}

// directDone ends a transfer whose bytes the peer copied directly. Bytes 0
// means the peer gave up on the direct path (it falls back to TCP): a pull's
// regions are let go, a push waits for its chunks.
func (p *Peer) directDone(m *wire.DirectDone) error {
	if sv := p.unserve(m.Transfer); sv != nil {
		defer region.ReleaseAll(sv.regions)
		if m.Bytes == 0 {
			return nil
		}
		p.s.ServedPull(m.Transfer, sv.tag, m.Bytes, sv.regions) // its Notify goes to the regions' owners
		return nil
	}
	if m.Bytes == 0 {
		return nil
	}
	x := p.s.IncomingPush(m.Transfer, false)
	if x == nil {
		return status.Errorf(wire.CodeUnknownTransfer, "transfer %d is unknown here (finished, failed or never announced)", m.Transfer)
	}
	if err := x.LandedDirect(m.Bytes); err != nil {
		x.Fail(err, false)
		return err
	}
	return nil
}

// abandonServed lets go of a pull's regions when its handles could not be sent.
func (p *Peer) abandonServed(id uint64) {
	if sv := p.unserve(id); sv != nil {
		region.ReleaseAll(sv.regions)
	}
}

func (e *exporter) logf(msg string, err error) {
	e.r.o.Log.Warn(msg, zap.String("peer", e.id.Name), zap.Error(err))
}
