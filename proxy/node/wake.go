package node

import (
	"errors"
	"fmt"
	"sync"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

// The link wake. Two GPUs of one node idle their link within a millisecond
// of its last use, and the next copy across it runs slower while it wakes:
// a 4 GiB GPU0 -> GPU1 copy takes 11.0 ms after 300 ms idle against 10.8
// back to back on 2 x H200 (bench/peercopy, case C). A 1 MiB copy across
// the link 200 us before takes that back (case L); local copies on either
// GPU do not (case M). A direct push has that lead time: the handles' round
// trip to the peer's sidecar. So before its HandleRequest an ipc push
// enqueues a short copy into the peer sidecar's wake buffer (device memory
// of the peer sidecar's own, which it hands out for this alone,
// write-only: no engine's memory is touched before its grant), on the
// stream that then runs the push's copy.
//
// What a wake copy writes is zeros: it reads our own wake buffer, zeroed
// when made, into which honest peers only ever copy theirs. (Copying the
// push's source instead would leave an engine's bytes where any other
// sidecar of the node that asks for the same buffer could read them.)

// WakeBytes is the size of a wake buffer and the most a wake copy moves.
const WakeBytes = 1 << 20

// WakeBuffer is this sidecar's wake buffer: Addr is its first byte on our
// device (zeros when made; our own wake copies read it), Handle shares it
// (FD -1 for the handle kinds that travel in bytes, else an fd the buffer
// owns), Free lets it go.
type WakeBuffer struct {
	Addr   device.Addr
	Handle device.Handle
	Free   func() error
}

// deviceMemory is what a device needs to offer a wake buffer.
type deviceMemory interface {
	AllocDevice(n uint64) (device.Addr, error)
	FreeDevice(a device.Addr) error
	CopyHtoD(dst device.Addr, src []byte) error
}

// DeviceWake returns Options.NewWake for dev: a WakeBytes allocation of
// dev's memory, zeroed and exported; nil when dev cannot allocate, fill
// or export memory.
func DeviceWake(dev device.Device) func() (*WakeBuffer, error) {
	mem, ok := dev.(deviceMemory)
	exp, ok2 := dev.(device.Exporter)
	if !ok || !ok2 {
		return nil
	}
	return func() (*WakeBuffer, error) {
		a, err := mem.AllocDevice(WakeBytes)
		if err != nil {
			return nil, fmt.Errorf("wake buffer: allocate %d B on %s: %w", WakeBytes, dev, err)
		}
		if err := mem.CopyHtoD(a, make([]byte, WakeBytes)); err != nil {
			return nil, errors.Join(fmt.Errorf("wake buffer: zero it on %s: %w", dev, err), mem.FreeDevice(a))
		}
		e, err := exp.Export(a)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("wake buffer: export it on %s: %w", dev, err), mem.FreeDevice(a))
		}
		if e.Offset != 0 || e.Handle.Size < WakeBytes {
			return nil, errors.Join(fmt.Errorf("wake buffer: %s exported it at offset %d of a %d B allocation", dev, e.Offset, e.Handle.Size), mem.FreeDevice(a))
		}
		return &WakeBuffer{Addr: a, Handle: e.Handle, Free: func() error {
			unixsock.CloseFD(e.Handle.FD)
			return mem.FreeDevice(a)
		}}, nil
	}
}

// wakeBuf is the exporter's side: the buffer, made on the first LinkWake.
type wakeBuf struct {
	mu  sync.Mutex
	buf *WakeBuffer
	err error // why there is none (after a failed try: not tried again)
}

// wakeHandle is the RegionHandle of our wake buffer (made on first use),
// and the fd to send with it (-1 for none; the buffer keeps it).
func (r *Room) wakeHandle() (*wire.RegionHandle, int, error) {
	b, err := r.wakeBuffer()
	if err != nil {
		return nil, -1, status.Errorf(wire.CodeUnsupported, "no wake buffer here: %v", err)
	}
	h := b.Handle
	return &wire.RegionHandle{RegionID: 0, Kind: uint8(h.Kind), Access: wire.AccessRemoteWrite, AllocKey: "wake",
		AllocSize: h.Size, Offset: 0, Length: WakeBytes, Device: r.o.Dev.String(), Raw: h.Bytes}, h.FD, nil
}

// wakeBuffer is our wake buffer, made on first use (one try).
func (r *Room) wakeBuffer() (*WakeBuffer, error) {
	if r.o.NewWake == nil {
		return nil, fmt.Errorf("node.wake_link is off, or %s cannot share memory of its own", r.o.Dev)
	}
	w := &r.wake
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf == nil && w.err == nil && !r.closing.Load() {
		w.buf, w.err = r.o.NewWake()
		if w.err != nil {
			r.o.Log.Warn("no link wake on same-node pushes to or from this sidecar", zap.Error(w.err))
		}
	}
	if w.buf == nil {
		if w.err == nil {
			return nil, errors.New("the sidecar is closing")
		}
		return nil, w.err
	}
	return w.buf, nil
}

// ReleaseWake frees the wake buffer. Call it after every node connection
// and session ended (a peer may write into it until then) and before the
// device closes.
func (r *Room) ReleaseWake() error {
	w := &r.wake
	w.mu.Lock()
	defer w.mu.Unlock()
	w.err = errors.New("the sidecar is closing")
	if w.buf == nil {
		return nil
	}
	b := w.buf
	w.buf = nil
	if err := b.Free(); err != nil {
		return fmt.Errorf("free the wake buffer: %w", err)
	}
	return nil
}

// linkWake answers a LinkWake: our wake buffer's handle, or a Fail.
func (e *exporter) linkWake() error {
	h, fd, err := e.r.wakeHandle()
	if err != nil {
		return e.write(&wire.Fail{Code: status.Code(err), Message: err.Error()}, -1)
	}
	return e.write(h, fd)
}

// The importer's side: what it knows of the peer's wake buffer.
const (
	wakeUnasked = iota // not asked yet (asked after the session's first ipc push)
	wakeHave           // imported: p.wake
	wakeNone           // the peer has none, or it could not be imported
)

// askWake asks the peer for its wake buffer on nc (once per session, after
// an ipc push ended well) and imports it. A Fail or a handle that cannot be
// imported leaves the session without a wake; an error on the connection
// is returned (the caller drops nc).
func (p *Peer) askWake(nc *nodeConn) error {
	p.mu.Lock()
	ask := p.wakeState == wakeUnasked && p.r.o.WakeLink && p.r.o.NewWake != nil // ours is what a wake copy reads
	if ask {
		p.wakeState = wakeNone // until it is imported; one try per session
	}
	p.mu.Unlock()
	if !ask {
		return nil
	}
	if err := unixsock.WriteFrame(nc.c, &wire.LinkWake{}, -1); err != nil {
		return fmt.Errorf("ask for the peer's wake buffer: %w", err)
	}
	m, fd, err := nc.read()
	if err != nil {
		return fmt.Errorf("the peer's wake buffer: %w", err)
	}
	defer unixsock.CloseFD(fd)
	why := ""
	switch m := m.(type) {
	case *wire.Fail:
		why = m.Message
	case *wire.RegionHandle:
		why = p.importWake(m, fd)
	default:
		return fmt.Errorf("answer to LinkWake is %s", m.Type())
	}
	if why != "" {
		p.r.o.Log.Debug("no link wake for pushes to this peer", zap.String("peer", p.s.Ident().Name), zap.String("why", why))
	}
	return nil
}

// importWake imports the peer's wake buffer; it says why not, or "".
func (p *Peer) importWake(h *wire.RegionHandle, fd int) string {
	if h.RegionID != 0 || h.Access != wire.AccessRemoteWrite || h.Offset != 0 || h.Length == 0 || h.Length > WakeBytes {
		return fmt.Sprintf("a wake handle must be region 0, write-only, at offset 0, 1..%d B (got region %d, access %s, %d B at %d)",
			WakeBytes, h.RegionID, region.AccessString(h.Access), h.Length, h.Offset)
	}
	a, err := p.maps.acquire(h, fd)
	if err != nil {
		return err.Error()
	}
	// The region's reference (id 0) keeps the mapping until the session
	// ends; each push takes one of its own while its wake copy may run.
	if err := p.maps.release(a); err != nil {
		return err.Error()
	}
	p.mu.Lock()
	p.wake, p.wakeLen, p.wakeState = a, h.Length, wakeHave
	p.mu.Unlock()
	return ""
}

// wakeStream makes the stream a push of n bytes will copy on and, when
// the peer has a wake buffer, enqueues a copy of up to n bytes of zeros
// (our own wake buffer) into it. release (never nil) lets go of the
// peer's buffer once the stream's work is done.
func (p *Peer) wakeStream(n uint64) (st device.Stream, woke bool, release func(), err error) {
	release = func() {}
	st, err = p.r.o.Dev.NewStream()
	if err != nil {
		return nil, false, release, status.Errorf(wire.CodeDevice, "direct copy: new stream on %s: %w", p.r.o.Dev, err)
	}
	p.mu.Lock()
	a, size := p.wake, p.wakeLen
	have := p.wakeState == wakeHave
	p.mu.Unlock()
	dd, ok := st.(device.DtoD)
	if !have || !ok || n == 0 {
		return st, false, release, nil
	}
	ours, err := p.r.wakeBuffer()
	if err != nil || p.maps.use(a) != nil {
		return st, false, release, nil
	}
	release = func() {
		if err := p.maps.release(a); err != nil {
			p.r.o.Log.Warn(err.Error())
		}
	}
	if err := dd.CopyDtoD(a.m.Base(), ours.Addr, min(n, size, WakeBytes)); err != nil {
		// The wake is a hint: a push goes on without it.
		p.r.o.Log.Debug("link wake copy failed", zap.Error(err))
		return st, false, release, nil
	}
	return st, true, release, nil
}
