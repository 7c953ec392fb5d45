package acl

import (
	"errors"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/devicetest"
)

// These tests drive the whole Go and C path against testdata/fakeacl.c, an
// emulation of libascendcl over host memory. They run in CI.

var allModes = []CopyMode{CopyBatch, CopyPack, CopyPerCopy}

func TestFakeOpen(t *testing.T) {
	so := buildFake(t)
	l := openFakeSO(t, so, true)
	if !l.HasBatchCopy() || !l.HasIPC() || len(l.Absent()) != 0 {
		t.Errorf("batch %v ipc %v absent %v, want everything", l.HasBatchCopy(), l.HasIPC(), l.Absent())
	}
	var log logSink
	d := openDev(t, l, Config{Logf: log.logf})
	if m, why := d.CopyMode(); m != CopyBatch || why != "batch (auto)" {
		t.Errorf("copy mode %q (%s), want batch (auto)", m, why)
	}
	if !strings.Contains(log.String(), "acl: acl:0 ("+so+"): copy mode batch (auto)") {
		t.Errorf("open log %q does not state the copy mode", log.String())
	}
	if d.String() != "acl:0" || d.Kind() != device.KindACL || d.Ordinal() != 0 {
		t.Errorf("device %s kind %s ordinal %d", d, d.Kind(), d.Ordinal())
	}
	if _, err := l.OpenDevice(1, Config{Logf: t.Logf}); err == nil || !strings.Contains(err.Error(), "this process sees 1 NPUs") {
		t.Errorf("ordinal 1: got %v", err)
	}
	// A second Library over the same file shares the loaded runtime: its
	// aclInit answers ACL_ERROR_REPEAT_INITIALIZE, which is success.
	l2 := openFakeSO(t, so, false)
	d2 := openDev(t, l2, Config{})
	if !l2.initRepeat || counter(t, l, "fakeacl_init_calls") != 2 {
		t.Errorf("second library: repeat %v, aclInit calls %d; want the repeat tolerated", l2.initRepeat, counter(t, l, "fakeacl_init_calls"))
	}
	// aclrtSetDevice is reference counted: once per open device, never per call.
	s, err := d2.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n, refs := counter(t, l, "fakeacl_setdevice_calls"), counter(t, l, "fakeacl_device_refs"); n != 2 || refs != 2 {
		t.Errorf("aclrtSetDevice called %d times (device refs %d), want 2 for 2 open devices", n, refs)
	}
	if pid, err := l.BareTgid(); err != nil || int(pid) != os.Getpid() {
		t.Errorf("BareTgid = %d, %v; want %d", pid, err, os.Getpid())
	}
}

func TestFakeInitError(t *testing.T) {
	t.Setenv("FAKEACL_INIT_ERR", "500000")
	l := fakeLibrary(t)
	_, err := l.OpenDevice(0, Config{Logf: t.Logf})
	want := "acl: aclInit(NULL): ACL_ERROR_INTERNAL_ERROR: fakeacl: aclInit failed as FAKEACL_INIT_ERR asked"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}

// TestFakeNoBatchPicksPack: a runtime without aclrtMemcpyBatchAsync (probed
// with dlsym) gets pack mode, and the log says why.
func TestFakeNoBatchPicksPack(t *testing.T) {
	so := buildFake(t, "-DFAKEACL_NO_BATCH")
	l := openFakeSO(t, so, true)
	if l.HasBatchCopy() {
		t.Fatal("library without aclrtMemcpyBatchAsync reports batched copies")
	}
	if why := l.Absent()["aclrtMemcpyBatchAsync"]; !strings.Contains(why, "CANN older than 8.3") {
		t.Errorf("Absent()[aclrtMemcpyBatchAsync] = %q", why)
	}
	var log logSink
	d := openDev(t, l, Config{Logf: log.logf})
	m, why := d.CopyMode()
	wantWhy := "pack (auto; batch unavailable: aclrtMemcpyBatchAsync not exported by " + so + " (CANN older than 8.3))"
	if m != CopyPack || why != wantWhy {
		t.Errorf("copy mode %q (%s), want pack (%s)", m, why, wantWhy)
	}
	if !strings.Contains(log.String(), "copy mode "+wantWhy) || !strings.Contains(log.String(), "optional exports absent: aclrtMemcpyBatchAsync: ") {
		t.Errorf("log %q does not give the reason", log.String())
	}
	if _, err := l.OpenDevice(0, Config{CopyMode: CopyBatch, Logf: t.Logf}); !errors.Is(err, device.ErrNotSupported) {
		t.Errorf("batch requested without the symbol: got %v, want ErrNotSupported", err)
	}
	cfg := Config{CopyMode: CopyPerCopy}
	d2 := openDev(t, l, cfg)
	if m, _ := d2.CopyMode(); m != CopyPerCopy {
		t.Errorf("copy_mode percopy: mode %q", m)
	}
}

// TestFakeConformance runs the device conformance suite in every mode,
// then grows the pack ring, and checks through the fake's counters that
// the mode did what it says and that every copy was asynchronous from
// pinned memory (a copy given the device view of a pinned slot fails;
// pageable memory would run synchronously and be counted).
func TestFakeConformance(t *testing.T) {
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			l := fakeLibrary(t)
			d := openDev(t, l, Config{CopyMode: mode})
			batches, d2d := counter(t, l, "fakeacl_batch_calls"), counter(t, l, "fakeacl_d2d_copies")
			devicetest.Run(t, d, d, devicetest.Options{})
			const poolSize = 8 << 20
			pool, data := devicetest.Pool(t, d, poolSize, 1)
			rng := rand.New(rand.NewPCG(2, uint64(len(mode))))
			t.Run("growing-chunks", func(t *testing.T) { // pack: the ring grows
				for i, n := range []int{4, 64, 512} {
					devicetest.CheckGatherScatter(t, d, d, pool, data, devicetest.BlockSegs(rng, pool, poolSize, n, 8<<10), uint64(10+i))
				}
			})
			nb, nd := counter(t, l, "fakeacl_batch_calls")-batches, counter(t, l, "fakeacl_d2d_copies")-d2d
			switch mode {
			case CopyBatch:
				if nb == 0 || nd != 0 {
					t.Errorf("batch mode: %d batch calls, %d D2D copies", nb, nd)
				}
			case CopyPack:
				if nb != 0 || nd == 0 {
					t.Errorf("pack mode: %d batch calls, %d D2D copies", nb, nd)
				}
			case CopyPerCopy:
				if nb != 0 || nd != 0 {
					t.Errorf("percopy mode: %d batch calls, %d D2D copies", nb, nd)
				}
			}
			if n := counter(t, l, "fakeacl_sync_copies"); n != 0 {
				t.Errorf("%d copies ran synchronously (pageable host memory)", n)
			}
		})
	}
}

// TestFakeBatchRefusedFallsBack: the library exports aclrtMemcpyBatchAsync
// but the runtime refuses it (207000): the chunk moves anyway, in pack mode
// from then on, and the log says so.
func TestFakeBatchRefusedFallsBack(t *testing.T) {
	t.Setenv("FAKEACL_BATCH_UNSUPPORTED", "1")
	l := fakeLibrary(t)
	var log logSink
	d := openDev(t, l, Config{Logf: log.logf})
	if m, _ := d.CopyMode(); m != CopyBatch {
		t.Fatalf("mode %q at open, want batch", m)
	}
	pool, data := devicetest.Pool(t, d, 1<<20, 3)
	rng := rand.New(rand.NewPCG(4, 5))
	devicetest.CheckGatherScatter(t, d, d, pool, data, devicetest.BlockSegs(rng, pool, 1<<20, 20, 4096), 6)
	m, why := d.CopyMode()
	if m != CopyPack || !strings.Contains(why, "refused at run time") {
		t.Errorf("after the refusal: mode %q (%s), want pack", m, why)
	}
	if got := log.String(); !strings.Contains(got, "batched copies refused, copy mode pack from now on") || !strings.Contains(got, "ACL_ERROR_RT_FEATURE_NOT_SUPPORT") {
		t.Errorf("log %q does not report the fallback with the runtime's error", got)
	}
	if n := counter(t, l, "fakeacl_batch_calls"); n != 1 {
		t.Errorf("%d batch calls, want 1 (then pack)", n)
	}
}

// TestFakeEventStatus: events complete in stream order, and only when the
// stream reaches them; the status values are aclrtQueryEventStatus's
// (COMPLETE 1), never the legacy aclrtQueryEvent's (COMPLETE 0).
func TestFakeEventStatus(t *testing.T) {
	l := fakeLibrary(t)
	d := openDev(t, l, Config{CopyMode: CopyPerCopy})
	pool, data := devicetest.Pool(t, d, 1<<20, 8)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := d.AllocPinned(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	defer d.FreePinned(p)
	var evs [3]device.Event
	for i := range evs {
		if evs[i], err = d.NewEvent(); err != nil {
			t.Fatal(err)
		}
		defer evs[i].Close()
	}
	if done, err := evs[0].Query(); !done || err != nil {
		t.Errorf("never-recorded event: Query = (%v, %v), want done", done, err)
	}

	l.Call("fakeacl_pause")
	resumed := false
	defer func() {
		if !resumed {
			l.Call("fakeacl_resume")
		}
	}()
	for i := range evs {
		if err := s.Gather(p.Slice(i*4096, 4096), []device.Seg{{Addr: pool + device.Addr(i*8192), Len: 4096}}); err != nil {
			t.Fatal(err)
		}
		if err := s.Record(evs[i]); err != nil {
			t.Fatal(err)
		}
	}
	for i, ev := range evs {
		if done, err := ev.Query(); done || err != nil {
			t.Errorf("event %d while the stream is held: Query = (%v, %v), want (false, nil)", i, done, err)
		}
	}
	l.Call("fakeacl_resume")
	resumed = true
	if err := evs[2].Wait(); err != nil {
		t.Fatal(err)
	}
	for i, ev := range evs {
		if done, err := ev.Query(); !done || err != nil {
			t.Errorf("event %d after the last one completed: Query = (%v, %v), want (true, nil)", i, done, err)
		}
	}
	for i := range evs {
		if string(p.Host()[i*4096:(i+1)*4096]) != string(data[i*8192:i*8192+4096]) {
			t.Errorf("copy %d before event %d did not land", i, i)
		}
	}
	// Re-recording makes an event pending again until the stream gets there.
	l.Call("fakeacl_pause")
	resumed = false
	if err := s.Record(evs[0]); err != nil {
		t.Fatal(err)
	}
	if done, _ := evs[0].Query(); done {
		t.Error("re-recorded event is done before the stream reached it")
	}
	l.Call("fakeacl_resume")
	resumed = true
	if err := evs[0].Wait(); err != nil {
		t.Fatal(err)
	}
	if n := counter(t, l, "fakeacl_legacy_queries"); n != 0 {
		t.Errorf("aclrtQueryEvent (legacy, inverted status) called %d times", n)
	}
}

// TestFakeCopyFailure: a copy that fails on the device (the 3rd, injected)
// fails the event recorded after it, with the runtime's code and text; the
// events before it complete; the stream stays failed.
func TestFakeCopyFailure(t *testing.T) {
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Setenv("FAKEACL_FAIL_COPY", "3")
			l := fakeLibrary(t)
			d := openDev(t, l, Config{CopyMode: mode})
			pool, _ := devicetest.Pool(t, d, 1<<20, 9) // its CopyHtoD is synchronous: not counted
			s, err := d.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			p, err := d.AllocPinned(3 * 8192)
			if err != nil {
				t.Fatal(err)
			}
			defer d.FreePinned(p)
			var evs [3]device.Event
			for i := range evs {
				if evs[i], err = d.NewEvent(); err != nil {
					t.Fatal(err)
				}
				defer evs[i].Close()
			}
			// Chunk 0: one range (async copy 1). Chunk 1: two blocks, so
			// the failing copy 3 is inside it whatever the mode does.
			// Chunk 2: after the failure.
			chunks := [][]device.Seg{
				{{Addr: pool, Len: 8192}},
				{{Addr: pool + 65536, Len: 4096}, {Addr: pool + 16384, Len: 4096}},
				{{Addr: pool + 131072, Len: 8192}},
			}
			for i, segs := range chunks {
				if err := s.Gather(p.Slice(i*8192, 8192), segs); err != nil {
					t.Fatalf("chunk %d: %v", i, err)
				}
				if err := s.Record(evs[i]); err != nil {
					t.Fatal(err)
				}
			}
			if err := evs[0].Wait(); err != nil {
				t.Fatalf("event before the failure: %v", err)
			}
			start := time.Now()
			err = evs[1].Wait()
			var ae *Error
			if !errors.As(err, &ae) || ae.Code != 507013 || !strings.Contains(ae.Msg, "injected by FAKEACL_FAIL_COPY") {
				t.Fatalf("event after the failed copy: Wait = %v, want *Error 507013 with the runtime's text", err)
			}
			t.Logf("failure seen after %v: %v", time.Since(start).Round(time.Millisecond), err)
			if done, qerr := evs[2].Query(); !done || !errors.Is(qerr, ae) {
				t.Errorf("later event: Query = (%v, %v), want the stream's error", done, qerr)
			}
			if err := evs[2].Wait(); !errors.Is(err, ae) {
				t.Errorf("later event: Wait = %v, want the stream's error", err)
			}
			if err := s.Synchronize(); err == nil {
				t.Error("Synchronize of the failed stream succeeded")
			}
			if err := s.Close(); err == nil || !strings.Contains(err.Error(), "ACL_ERROR_RT_SYS_DMA") {
				t.Errorf("Close of the failed stream: %v, want its error", err)
			}
		})
	}
}

func TestFakeHostRegisterUnsupported(t *testing.T) {
	t.Setenv("FAKEACL_NO_HOST_REGISTER", "1")
	l := fakeLibrary(t)
	var log logSink
	d := openDev(t, l, Config{Logf: log.logf})
	pool, data := devicetest.Pool(t, d, 1<<20, 10)
	for range 2 {
		p, err := d.AllocPinned(8192)
		if err != nil {
			t.Fatal(err)
		}
		if p.DeviceAddr() != 0 {
			t.Errorf("device view %#x without host registration", p.DeviceAddr())
		}
		if err := d.FreePinned(p); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(log.String(), "pinned slots get no device view"); n != 1 {
		t.Errorf("logged %d times, want once: %q", n, log.String())
	}
	rng := rand.New(rand.NewPCG(1, 1))
	devicetest.CheckGatherScatter(t, d, d, pool, data, devicetest.BlockSegs(rng, pool, 1<<20, 16, 4096), 11)
}

func TestFakePinnedViews(t *testing.T) {
	l := fakeLibrary(t)
	d := openDev(t, l, Config{})
	p, err := d.AllocPinned(3 << 20)
	if err != nil {
		t.Fatal(err)
	}
	host := uintptr(unsafePointer(p.Host()))
	if p.DeviceAddr() == 0 || uint64(p.DeviceAddr()) == uint64(host) {
		t.Errorf("device view %#x of host %#x: want a distinct registered address", p.DeviceAddr(), host)
	}
	if q := p.Slice(4096, 100); q.DeviceAddr() != p.DeviceAddr()+4096 {
		t.Errorf("slice keeps views apart: %#x", q.DeviceAddr())
	}
	if err := d.FreePinned(p.Slice(0, 100)); err == nil || !strings.Contains(err.Error(), "whole buffer") {
		t.Errorf("FreePinned of a slice: %v", err)
	}
	if err := d.FreePinned(p); err != nil { // unregister, then free: the fake refuses the other order
		t.Fatal(err)
	}
	if err := d.FreePinned(p); err == nil || !strings.Contains(err.Error(), "not a buffer of this device") {
		t.Errorf("double FreePinned: %v", err)
	}
}

func TestFakeStreamConfig(t *testing.T) {
	t.Run("fast", func(t *testing.T) {
		l := fakeLibrary(t)
		d := openDev(t, l, Config{})
		s, err := d.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		if n := counter(t, l, "fakeacl_stream_config_calls"); n != 1 {
			t.Errorf("aclrtCreateStreamWithConfig called %d times, want 1", n)
		}
	})
	t.Run("absent", func(t *testing.T) {
		l := fakeLibrary(t, "-DFAKEACL_NO_STREAM_CONFIG")
		if _, ok := l.Absent()["aclrtCreateStreamWithConfig"]; !ok {
			t.Error("aclrtCreateStreamWithConfig not recorded absent")
		}
		d := openDev(t, l, Config{})
		s, err := d.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
	})
	t.Run("refused", func(t *testing.T) {
		t.Setenv("FAKEACL_STREAM_CONFIG_ERR", "207000")
		l := fakeLibrary(t)
		var log logSink
		d := openDev(t, l, Config{Logf: log.logf})
		for range 2 {
			s, err := d.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
		}
		if n := counter(t, l, "fakeacl_stream_config_calls"); n != 1 {
			t.Errorf("aclrtCreateStreamWithConfig tried %d times, want once", n)
		}
		if !strings.Contains(log.String(), "streams without FAST_LAUNCH|FAST_SYNC from now on") {
			t.Errorf("log %q", log.String())
		}
	})
}

// TestFakeThreads: each worker locks its OS thread and never unlocks it, so
// the thread dies with the worker and later calls land on threads that never
// had an ACL context: the trampolines must make it current themselves
// (aclrtSetCurrentContext), without piling up aclrtSetDevice references.
// Events are recorded by a worker and waited on by another goroutine.
func TestFakeThreads(t *testing.T) {
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			l := fakeLibrary(t)
			d := openDev(t, l, Config{CopyMode: mode})
			const poolSize = 4 << 20
			pool, data := devicetest.Pool(t, d, poolSize, 12)
			const workers, iters, blocks, bs = 8, 20, 64, 4096
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					runtime.LockOSThread() // never unlocked: the thread exits with us
					rng := rand.New(rand.NewPCG(uint64(w), 99))
					s, err := d.NewStream()
					if err != nil {
						t.Error(err)
						return
					}
					defer func() {
						if err := s.Close(); err != nil {
							t.Errorf("worker %d: stream Close: %v", w, err)
						}
					}()
					ev, err := d.NewEvent()
					if err != nil {
						t.Error(err)
						return
					}
					defer func() {
						if err := ev.Close(); err != nil {
							t.Errorf("worker %d: event Close: %v", w, err)
						}
					}()
					p, err := d.AllocPinned(blocks * bs)
					if err != nil {
						t.Error(err)
						return
					}
					defer func() {
						if err := d.FreePinned(p); err != nil {
							t.Errorf("worker %d: FreePinned: %v", w, err)
						}
					}()
					for i := range iters {
						segs := devicetest.BlockSegs(rng, pool, poolSize, blocks, bs)
						devicetest.Poison(p.Host(), byte(w))
						if err := s.Gather(p, segs); err != nil {
							t.Errorf("worker %d gather %d: %v", w, i, err)
							return
						}
						if err := s.Record(ev); err != nil {
							t.Error(err)
							return
						}
						waited := make(chan error)
						go func() { waited <- ev.Wait() }()
						if err := <-waited; err != nil {
							t.Errorf("worker %d wait %d: %v", w, i, err)
							return
						}
						if err := devicetest.FirstDiff(p.Host(), devicetest.Gathered(data, pool, segs), segs); err != nil {
							t.Errorf("worker %d gather %d: %v", w, i, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			if n := counter(t, l, "fakeacl_ctx_sets"); n < 2 {
				t.Errorf("context made current %d times across %d fresh threads", n, workers)
			}
			if n := counter(t, l, "fakeacl_setdevice_calls"); n != 1 {
				t.Errorf("aclrtSetDevice called %d times, want once (at open)", n)
			}
		})
	}
}

func TestFakeBadInput(t *testing.T) {
	l := fakeLibrary(t)
	d := openDev(t, l, Config{})
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := d.AllocPinned(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer d.FreePinned(p)
	if err := s.Gather(p, []device.Seg{{Addr: 0x1000, Len: 100}}); err == nil || !strings.Contains(err.Error(), "add up to 100 B, pinned buffer is 4096 B") {
		t.Errorf("short segments: %v", err)
	}
	if err := s.Gather(p.Slice(0, 2), []device.Seg{{Addr: ^device.Addr(0), Len: 2}}); err == nil || !strings.Contains(err.Error(), "overflows") {
		t.Errorf("wrapping segment: %v", err)
	}
	// Host memory named as device memory: the runtime's refusal comes back
	// with its text and the call's values.
	var ae *Error
	err = s.Gather(p.Slice(0, 16), []device.Seg{{Addr: device.Addr(uintptr(unsafePointer(p.Host()))), Len: 8}, {Addr: 0x10, Len: 8}})
	if !errors.As(err, &ae) || ae.Code != 107000 || !strings.Contains(err.Error(), "not device memory") {
		t.Errorf("gather from host memory: %v", err)
	}
	for _, tc := range []struct {
		h    device.Handle
		want error
	}{
		{device.Handle{Kind: device.HandleACLKey, Bytes: []byte(strings.Repeat("k", 65)), Size: 4096}, device.ErrBadHandle},
		{device.Handle{Kind: device.HandleACLKey, Bytes: []byte("k\x00"), Size: 4096}, device.ErrBadHandle},
		{device.Handle{Kind: device.HandleACLKey, Bytes: []byte("k"), Size: 0}, device.ErrBadHandle},
		{device.Handle{Kind: device.HandleMemfd, FD: 3, Size: 4096}, device.ErrNotSupported},
		{device.Handle{Kind: device.HandleCUDAIPC, Bytes: make([]byte, 64), Size: 4096}, device.ErrNotSupported},
	} {
		if _, err := d.Import(tc.h); !errors.Is(err, tc.want) {
			t.Errorf("Import(%s, %q, size %d): got %v, want %v", tc.h.Kind, tc.h.Bytes, tc.h.Size, err, tc.want)
		}
	}
	if _, err := d.Import(device.Handle{Kind: device.HandleACLKey, Bytes: []byte("fakeacl:1:999:0:0:1000"), Size: 4096}); !errors.As(err, &ae) {
		t.Errorf("import of a dead key: %v, want the runtime's error", err)
	}
	d2 := openDev(t, l, Config{})
	ev, err := d2.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	if err := s.Record(ev); err == nil {
		t.Error("Record of another device's event succeeded")
	}
	if _, err := d.Export(0x1234); err == nil || !strings.Contains(err.Error(), "not inside an AllocDevice allocation") {
		t.Errorf("Export of a foreign address: %v", err)
	}
	if err := d.FreeDevice(0x1234); err == nil {
		t.Error("FreeDevice of a foreign address succeeded")
	}
	if _, err := d.AllocDevice(1 << 41); !errors.Is(err, device.ErrOutOfMemory) {
		t.Errorf("AllocDevice(2 TiB): %v, want ErrOutOfMemory", err)
	}
}

func TestFakeCloseReportsLeaks(t *testing.T) {
	l := openFakeSO(t, buildFake(t), false) // the leaked objects stay in the fake
	d, err := l.OpenDevice(0, Config{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := d.NewStream()
	ev, _ := d.NewEvent()
	p, _ := d.AllocPinned(100)
	a, _ := d.AllocDevice(100)
	b, _ := d.AllocDevice(8192)
	if _, err := d.Export(b + 10); err != nil {
		t.Fatal(err)
	}
	err = d.Close()
	want := "acl: acl:0: Close with resources still open: 1 stream, 1 event, 1 pinned buffer, 2 device allocations, 1 exported key"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
	for name, e := range map[string]error{"stream": s.Close(), "event": ev.Close(), "pinned": d.FreePinned(p), "device": d.FreeDevice(a), "close": d.Close()} {
		if !errors.Is(e, device.ErrClosed) {
			t.Errorf("%s after device Close: %v, want ErrClosed", name, e)
		}
	}
	if _, err := d.NewStream(); !errors.Is(err, device.ErrClosed) {
		t.Errorf("NewStream after Close: %v", err)
	}
}
