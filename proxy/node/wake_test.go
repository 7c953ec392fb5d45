package node

import (
	"bytes"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/hostmem"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

// memfdWake is a NewWake over a sealed memfd (hostmem has no device memory
// of its own to export): it counts the buffers made and freed, and keeps
// the last one's bytes for the test to read. A fill other than 0 marks
// the buffer's bytes (DeviceWake's are zeros), so that a test sees what a
// wake copy of it moved.
type memfdWake struct {
	fill        byte
	made, freed atomic.Int32
	last        atomic.Pointer[hostmem.Shared]
}

func (w *memfdWake) newWake() (*WakeBuffer, error) {
	sh, err := hostmem.NewShared("wake", WakeBytes)
	if err != nil {
		return nil, err
	}
	b := sh.Bytes()
	for i := range b {
		b[i] = w.fill
	}
	w.made.Add(1)
	w.last.Store(sh)
	return &WakeBuffer{Addr: device.Addr(uintptr(unsafe.Pointer(&b[0]))), Handle: device.Handle{Kind: device.HandleMemfd, FD: sh.FD(), Size: WakeBytes}, Free: func() error {
		w.freed.Add(1)
		return sh.Close()
	}}, nil
}

// helloConn dials r's node socket and passes NodeHello as session 1.
func helloConn(t *testing.T, dir string, r *Room) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: filepath.Join(dir, r.Name()), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := unixsock.WriteFrame(c, &wire.NodeHello{SessionID: [wire.SessionIDSize]byte{1}, Proof: (&fakeSession{}).Proof()}, -1); err != nil {
		t.Fatal(err)
	}
	if _, m, fd, _, err := unixsock.ReadFrame(c, nil); err != nil || m.Type() != wire.TypeOK {
		unixsock.CloseFD(fd)
		t.Fatalf("NodeHello answered %v, %v", m, err)
	}
	return c
}

// askRaw sends LinkWake on c and returns the answer (and its fd, closed at
// the test's end).
func askRaw(t *testing.T, c *net.UnixConn) wire.Msg {
	t.Helper()
	if err := unixsock.WriteFrame(c, &wire.LinkWake{}, -1); err != nil {
		t.Fatal(err)
	}
	_, m, fd, _, err := unixsock.ReadFrame(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unixsock.CloseFD(fd) })
	return m
}

// askWakeOnce runs askWake on a pooled connection of p, as a push ends.
func askWakeOnce(t *testing.T, p *Peer) {
	t.Helper()
	nc, _, err := p.getConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.askWake(nc); err != nil {
		t.Fatal(err)
	}
	p.putConn(nc, true)
}

// A sidecar offers one wake buffer, write-only, made on the first
// LinkWake and shared by every later one; without one (node.wake_link
// off, or a device that cannot share memory of its own) it answers
// Unsupported, and after ReleaseWake it offers none.
func TestLinkWakeOffer(t *testing.T) {
	t.Run("offered", func(t *testing.T) {
		dir := t.TempDir()
		w := &memfdWake{}
		r, _, _ := roomWith(t, dir, true, func(o *Options) { o.NewWake = w.newWake })
		for i := 0; i < 2; i++ {
			m := askRaw(t, helloConn(t, dir, r))
			h, ok := m.(*wire.RegionHandle)
			if !ok {
				t.Fatalf("LinkWake %d answered %s, want RegionHandle", i, m.Type())
			}
			if h.RegionID != 0 || h.Transfer != 0 || h.Access != wire.AccessRemoteWrite || h.Offset != 0 || h.Length != WakeBytes ||
				h.Kind != uint8(device.HandleMemfd) || h.AllocSize != WakeBytes {
				t.Fatalf("wake handle %+v: want region 0, write-only, %d B at offset 0 of a memfd", h, WakeBytes)
			}
		}
		if n := w.made.Load(); n != 1 {
			t.Fatalf("made %d wake buffers for two asks, want 1", n)
		}
		if err := r.ReleaseWake(); err != nil {
			t.Fatal(err)
		}
		if n := w.freed.Load(); n != 1 {
			t.Fatalf("freed %d wake buffers, want 1", n)
		}
		if f, ok := askRaw(t, helloConn(t, dir, r)).(*wire.Fail); !ok || f.Code != wire.CodeUnsupported {
			t.Fatalf("LinkWake after ReleaseWake answered %v, want Fail Unsupported", f)
		}
		if n := w.made.Load(); n != 1 {
			t.Fatalf("made a wake buffer again after ReleaseWake (%d in all)", n)
		}
	})
	t.Run("none", func(t *testing.T) {
		dir := t.TempDir()
		r, _, _ := room(t, dir, true)
		f, ok := askRaw(t, helloConn(t, dir, r)).(*wire.Fail)
		if !ok || f.Code != wire.CodeUnsupported {
			t.Fatalf("LinkWake without a wake buffer answered %v, want Fail Unsupported", f)
		}
	})
}

// An importer asks for the peer's wake buffer once per session, imports
// it, and a push's wake copy lands there: the bytes of the importer's own
// wake buffer (zeros in a sidecar; a mark here), as many as the push
// moves, at most WakeBytes. Without an offer, or without a buffer of its
// own to copy from, a push goes on unwoken.
func TestLinkWakeCopy(t *testing.T) {
	for _, tc := range []struct {
		name       string
		offer, own bool
		n          uint64 // the push's bytes
		want       bool   // woke
	}{
		{"offered, a 4 KiB push", true, true, 4096, true},
		{"offered, a 3 MiB push (1 MiB copied)", true, true, 3 << 20, true},
		{"not offered", false, true, 4096, false},
		{"no buffer of our own", true, false, 4096, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			theirs, ours := &memfdWake{}, &memfdWake{fill: 0x5a}
			b, _, _ := roomWith(t, dir, true, func(o *Options) {
				if tc.offer {
					o.NewWake = theirs.newWake
				}
			})
			_, ha, _ := roomWith(t, dir, true, func(o *Options) {
				o.WakeLink = true
				if tc.own {
					o.NewWake = ours.newWake
				}
			})
			pa := ha.p
			pa.SetInfo(&wire.NodeInfo{Socket: b.Name(), Device: "hostmem:0"})
			for round := 0; round < 2; round++ {
				askWakeOnce(t, pa)
			}
			if asked := tc.offer && tc.own; asked != (theirs.made.Load() == 1) || theirs.made.Load() > 1 {
				t.Fatalf("the peer made %d wake buffers, want 1 if asked (%v)", theirs.made.Load(), asked)
			}
			st, woke, release, err := pa.wakeStream(tc.n)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Close(); err != nil { // waits for the wake copy
				t.Fatal(err)
			}
			release()
			if woke != tc.want {
				t.Fatalf("woke %v, want %v", woke, tc.want)
			}
			if !tc.offer || !tc.own {
				if pa.Mappings() != 0 {
					t.Fatalf("%d mappings open without a wake, want 0", pa.Mappings())
				}
				return
			}
			got := theirs.last.Load().Bytes()
			n := uint64(0)
			if tc.want {
				n = min(tc.n, WakeBytes)
			}
			if !bytes.Equal(got[:n], bytes.Repeat([]byte{0x5a}, int(n))) || (n < WakeBytes && got[n] != 0) {
				t.Fatalf("the peer's wake buffer holds %x at 0 and %x at %d, want %d B of ours (5a) and zeros after", got[0], got[min(n, WakeBytes-1)], n, n)
			}
			if pa.Mappings() != 1 {
				t.Fatalf("%d mappings open, want the wake buffer's", pa.Mappings())
			}
			// The last idle connection's expiry lets the wake buffer go
			// (an idle session holds no mapping); the next push asks again.
			pa.Expire(time.Now().Add(time.Hour))
			if pa.Mappings() != 0 {
				t.Fatalf("%d mappings open after the connections expired, want 0", pa.Mappings())
			}
			askWakeOnce(t, pa)
			if pa.Mappings() != 1 || theirs.made.Load() != 1 {
				t.Fatalf("after asking again: %d mappings, %d buffers made; want 1 and the same buffer", pa.Mappings(), theirs.made.Load())
			}
			pa.Shut()
			if pa.Mappings() != 0 {
				t.Fatalf("%d mappings open after Shut, want 0", pa.Mappings())
			}
		})
	}
}
