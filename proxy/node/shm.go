package node

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

// The shared ring of transport shm: a memfd both sidecars map and pin with
// their own runtimes (device.HostRegisterer). The sender gathers a chunk
// from its device into a slot (D2H), the receiver scatters it from there to
// its device (H2D): no socket carries the payload.

const (
	shmSlots    = 4       // slots per ring (one ring per node connection)
	maxShmSlots = 64      // the most a receiver maps
	maxShmBytes = 1 << 30 // the largest ring a receiver maps
)

type shmRing struct {
	dev      device.HostRegisterer
	mem      []byte
	pin      device.Pinned
	slots    int
	slotSize int
}

// newRing creates a ring of slots slots of slotSize bytes; it returns the
// memfd to hand to the peer (the caller closes it).
func newRing(dev device.HostRegisterer, slots, slotSize int) (*shmRing, int, error) {
	fd, err := unix.MemfdCreate("stage-shm-ring", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, -1, fmt.Errorf("memfd_create(stage-shm-ring): %w", err)
	}
	size := slots * slotSize
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unixsock.CloseFD(fd)
		return nil, -1, fmt.Errorf("ftruncate(ring memfd, %d): %w", size, err)
	}
	// The peer maps only a ring that cannot shrink under its copies.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		unixsock.CloseFD(fd)
		return nil, -1, fmt.Errorf("seal ring memfd (F_SEAL_SHRINK|F_SEAL_GROW): %w", err)
	}
	r, err := mapRing(dev, fd, slots, slotSize)
	if err != nil {
		unixsock.CloseFD(fd)
		return nil, -1, err
	}
	return r, fd, nil
}

// mapRing maps and pins a ring's memfd (fd stays the caller's). The
// memfd must be sealed against shrinking: a ring its maker truncated would
// fault this sidecar's copies.
func mapRing(dev device.HostRegisterer, fd, slots, slotSize int) (*shmRing, error) {
	size := slots * slotSize
	if err := device.CheckNoShrink(fd); err != nil {
		return nil, fmt.Errorf("ring: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat ring fd %d: %w", fd, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < int64(size) {
		return nil, fmt.Errorf("ring fd %d: %d B (mode %#o), want a memfd of at least %d B", fd, st.Size, st.Mode, size)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap ring (%d B): %w", size, err)
	}
	pin, err := dev.RegisterHost(mem)
	if err != nil {
		_ = unix.Munmap(mem)
		return nil, fmt.Errorf("pin ring of %d B: %w", size, err)
	}
	return &shmRing{dev: dev, mem: mem, pin: pin, slots: slots, slotSize: slotSize}, nil
}

// slot is the first n bytes of slot i.
func (r *shmRing) slot(i, n int) device.Pinned { return r.pin.Slice(i*r.slotSize, n) }

// close unpins and unmaps the ring; no copy may be using it.
func (r *shmRing) close() error {
	err := r.dev.UnregisterHost(r.pin)
	if uerr := unix.Munmap(r.mem); uerr != nil {
		err = errors.Join(err, fmt.Errorf("munmap ring: %w", uerr))
	}
	return err
}

// ensureRing sets up the connection's ring (once) with the peer.
func (r *Room) ensureRing(nc *nodeConn, slotSize int) error {
	if nc.ring != nil {
		return nil
	}
	hr, ok := r.o.Dev.(device.HostRegisterer)
	if !ok {
		return Fallback(fbShmSetup, fmt.Errorf("%s cannot pin a shared ring", r.o.Dev))
	}
	ring, fd, err := newRing(hr, shmSlots, slotSize)
	if err != nil {
		return Fallback(fbShmSetup, err)
	}
	err = nc.call(&wire.ShmRing{Slots: shmSlots, SlotSize: uint32(slotSize)}, fd)
	unixsock.CloseFD(fd)
	if err != nil {
		_ = ring.close()
		return Fallback(fbShmSetup, err)
	}
	nc.ring = ring
	return nil
}

// shmPush sends a push's chunks through the ring: gather into a free slot,
// announce it, and take the slot back when the receiver says it landed.
func (p *Peer) shmPush(x *Push) (err error) {
	id := p.s.Ident()
	nc, _, err := p.getConn()
	if err != nil {
		return Fallback(fbPeerUnreachable, err)
	}
	defer func() { p.putConn(nc, err == nil) }()
	if err := p.r.ensureRing(nc, id.ChunkSize); err != nil {
		return err
	}
	free := make([]int, 0, shmSlots)
	for i := shmSlots - 1; i >= 0; i-- {
		free = append(free, i)
	}
	inflight := 0
	wait := func() error {
		m, fd, err := nc.read()
		unixsock.CloseFD(fd)
		if err != nil {
			return status.Errorf(wire.CodePeerUnavailable, "shared ring with %s: %w", id.Name, err)
		}
		l, ok := m.(*wire.ShmLanded)
		if !ok || l.Transfer != x.ID || int(l.Slot) >= shmSlots {
			return status.Errorf(wire.CodeMalformed, "shared ring with %s: unexpected answer %s", id.Name, m.Type())
		}
		if l.Code != wire.CodeOK {
			return status.Errorf(l.Code, "peer %s: chunk %d: %s", id.Name, l.Index, l.Message)
		}
		free = append(free, int(l.Slot))
		inflight--
		return nil
	}
	plan, err := x.Plan()
	if err != nil {
		return err
	}
	count := uint32(plan.Len())
	for i := range plan.Len() {
		c := plan.Chunk(i)
		if len(free) == 0 {
			if err := wait(); err != nil {
				return err
			}
		}
		k := free[len(free)-1]
		free = free[:len(free)-1]
		if err := p.r.gatherSync(nc.ring.slot(k, int(c.Len)), c.Src); err != nil {
			return err
		}
		m := &wire.ShmChunk{Transfer: x.ID, Slot: uint32(k), Index: uint32(i), Count: count, PayloadLen: c.Len, Segs: make([]wire.ChunkSeg, len(c.Dst))}
		for j, d := range c.Dst {
			m.Segs[j] = wire.ChunkSeg{Region: d.Region, Len: d.Len, Offset: d.Off}
		}
		if err := unixsock.WriteFrame(nc.c, m, -1); err != nil {
			return status.Errorf(wire.CodePeerUnavailable, "shared ring with %s: %w", id.Name, err)
		}
		inflight++
	}
	for inflight > 0 {
		if err := wait(); err != nil {
			return err
		}
	}
	return nil
}

// gatherSync copies segs into dst on a copy stream and waits.
func (r *Room) gatherSync(dst device.Pinned, segs []device.Seg) error {
	done := make(chan error, 1)
	if err := r.h.Copier().Gather(dst, segs, func(err error) { done <- err }); err != nil {
		return status.Errorf(wire.CodeDevice, "gather into the shared ring on %s: %w", r.o.Dev, err)
	}
	if err := <-done; err != nil {
		return status.Errorf(wire.CodeDevice, "gather into the shared ring on %s: %w", r.o.Dev, err)
	}
	return nil
}

// openRing maps the ring a sender handed over (ShmRing).
func (e *exporter) openRing(m *wire.ShmRing, fd int) error {
	switch {
	case fd < 0:
		return status.Errorf(wire.CodeBadRequest, "ShmRing came without its memfd")
	case e.ring != nil:
		return status.Errorf(wire.CodeExists, "this connection already has a ring")
	case m.Slots == 0 || m.Slots > maxShmSlots || m.SlotSize == 0 || uint64(m.Slots)*uint64(m.SlotSize) > maxShmBytes:
		return status.Errorf(wire.CodeBadRequest, "ring of %d slots of %d B: want 1..%d slots and at most %d B", m.Slots, m.SlotSize, maxShmSlots, maxShmBytes)
	}
	hr, ok := e.r.o.Dev.(device.HostRegisterer)
	if !ok {
		return status.Errorf(wire.CodeUnsupported, "%s cannot pin a shared ring", e.r.o.Dev)
	}
	r, err := mapRing(hr, fd, int(m.Slots), int(m.SlotSize))
	if err != nil {
		return status.Errorf(wire.CodeDevice, "%w", err)
	}
	e.ring = r
	return nil
}

// shmChunk lands one ring slot: checked like a chunk from a data stream,
// scattered to the device, answered with ShmLanded once there.
func (e *exporter) shmChunk(m *wire.ShmChunk) error {
	if e.ring == nil || int(m.Slot) >= e.ring.slots || m.PayloadLen == 0 || int(m.PayloadLen) > e.ring.slotSize {
		return fmt.Errorf("ShmChunk for slot %d of %d B does not fit the ring", m.Slot, m.PayloadLen)
	}
	reply := func(err error) error {
		return e.write(&wire.ShmLanded{Transfer: m.Transfer, Slot: m.Slot, Index: m.Index, Code: status.Code(err), Message: err.Error()}, -1)
	}
	x := e.p.s.IncomingPush(m.Transfer, true)
	if x == nil {
		return reply(status.Errorf(wire.CodeUnknownTransfer, "push %d is unknown here: refused, finished or never announced", m.Transfer))
	}
	x.ViaRing()
	ch := wire.Chunk{Transfer: m.Transfer, Index: m.Index, Count: m.Count, PayloadLen: m.PayloadLen, Segs: m.Segs}
	segs, err := x.Resolve(&ch, nil)
	if err != nil {
		x.Fail(err, true)
		return reply(err)
	}
	idx, n := m.Index, uint64(m.PayloadLen)
	e.busy.Add(1)
	err = e.r.h.Copier().Scatter(segs, e.ring.slot(int(m.Slot), int(m.PayloadLen)), func(err error) {
		defer e.busy.Done()
		x.Landed(idx, n, err)
		x.Release()
		a := &wire.ShmLanded{Transfer: m.Transfer, Slot: m.Slot, Index: idx}
		if err != nil {
			a.Code, a.Message = wire.CodeDevice, err.Error()
		}
		if werr := e.write(a, -1); werr != nil {
			e.logf("answer a ring chunk", werr)
		}
	})
	if err != nil {
		e.busy.Done()
		err = status.Errorf(wire.CodeDevice, "scatter ring chunk %d to %s: %w", idx, e.r.o.Dev, err)
		x.Fail(err, true)
		x.Release()
		return reply(err)
	}
	return nil
}

// closeRing unmaps the ring once no scatter uses it.
func (e *exporter) closeRing() {
	e.busy.Wait()
	if e.ring != nil {
		if err := e.ring.close(); err != nil {
			e.logf("close shared ring", err)
		}
		e.ring = nil
	}
}
