//go:build gpu

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/cuda"
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// registerBoth fills S, poisons D and registers both; unregistered at the end.
func registerBoth(t *testing.T, S, D *kvsim.Cache, sn, dn *node) {
	t.Helper()
	ctx := context.Background()
	if err := S.Fill(uint64(time.Now().UnixNano())); err != nil {
		t.Fatal(err)
	}
	if err := D.Poison(guard); err != nil {
		t.Fatal(err)
	}
	if err := S.Register(ctx, sn.cl, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	if err := D.Register(ctx, dn.cl, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = S.Unregister(ctx, sn.cl); _ = D.Unregister(ctx, dn.cl) })
}

// TestGPUSameNodeIPC: two CUDA sidecars on one node (STAGE_GPU_SRC ->
// STAGE_GPU_DST, e.g. 0 -> 1) push 4 GiB device to device through legacy
// IPC handles of the receiver's regions (views at odd offsets inside larger
// allocations), byte-exact, then 256 MiB into a VMM region handed over as a
// POSIX fd; no chunk crosses TCP. Reports GB/s.
func TestGPUSameNodeIPC(t *testing.T) {
	so, do := gpuOrdinals(t)
	sd, dd := openGPU(t, so), openGPU(t, do)
	const layers = 4
	const size = 4 << 30
	pre, dec := pair(t, nodeOpts{stripes: 4, slots: 16, slot: "4MiB", nodeDir: oneNode(t), transport: "ipc",
		extra:    fmt.Sprintf("device:\n  kind: cuda\n  ordinal: %d\n", so),
		decExtra: fmt.Sprintf("device:\n  kind: cuda\n  ordinal: %d\n", do)})
	S, D := gpuCache(t, sd, "src", layers, size/layers), gpuCache(t, dd, "dst", layers, size/layers)
	registerBoth(t, S, D, pre, dec)
	ms := kvsim.Ranges(S, 64<<20)
	start := time.Now()
	run(t, pre.cl, wire.Push, "ipc", S, D, ms)
	el := time.Since(start)
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
	t.Logf("ipc push cuda:%d -> cuda:%d: 4 GiB in %v (%.1f GB/s), byte-exact", so, do, el.Round(time.Millisecond), float64(size)/el.Seconds()/1e9)
	blocks := kvsim.Blocks(S, 16<<10, 41)
	start = time.Now()
	run(t, pre.cl, wire.Push, "ipc-blocks", S, D, blocks)
	el = time.Since(start)
	if err := kvsim.Verify(S, D, blocks, guard); err != nil {
		t.Fatal(err)
	}
	t.Logf("ipc push of %d scattered 16 KiB blocks: %v (%.1f GB/s)", len(blocks), el.Round(time.Millisecond), float64(kvsim.Bytes(blocks))/el.Seconds()/1e9)
	gpuVMMPush(t, pre, dec, S, dd, do)
	l := link(t, pre, "decode")
	if l.XfersIPC == 0 || l.ChunksOut != 0 || len(l.Fallbacks) != 0 {
		t.Fatalf("link decode: %d ipc transfers, %d chunks over TCP, fallbacks %v; want ipc only", l.XfersIPC, l.ChunksOut, l.Fallbacks)
	}
}

// gpuVMMPush pushes 256 MiB of S's layer 0 into a VMM allocation on the
// receiver's GPU, registered at a non-zero offset with its POSIX fd.
func gpuVMMPush(t *testing.T, pre, dec *node, S *kvsim.Cache, dd *cuda.Device, do int) {
	t.Helper()
	ctx := context.Background()
	const n = 256 << 20
	const off = 3<<20 + 4096
	v, err := dd.VMMAlloc(n + 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Free()
	fd, err := v.ExportFD()
	if err != nil {
		t.Fatal(err)
	}
	defer closeFD(fd)
	if err := dd.CopyHtoD(v.Addr(), make([]byte, v.Size())); err != nil {
		t.Fatal(err)
	}
	if err := dec.cl.Register(ctx, client.Region{Name: "vmm/0", Handle: uint8(device.HandlePosixFD), Access: wire.AccessAll,
		Ordinal: uint32(do), AllocSize: v.Size(), Offset: off, Length: n, FD: fd}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = dec.cl.Unregister(ctx, "vmm/0") }()
	tr := client.Transfer{Route: "decode", Dir: wire.Push, Tag: "vmm", LocalNames: S.Regions()[:1], RemoteNames: []string{"vmm/0"},
		Ops: []wire.LocalOp{{Local: 0, Remote: 0, LocalOff: 0, RemoteOff: 0, Len: n}}}
	start := time.Now()
	if _, err := pre.cl.Do(ctx, tr); err != nil {
		t.Fatal(err)
	}
	el := time.Since(start)
	want, err := S.ReadLayer(0)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, v.Size())
	if err := dd.CopyDtoH(got, v.Addr()); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		inside := i >= off && i < off+n
		if inside && got[i] != want[i-off] || !inside && got[i] != 0 {
			t.Fatalf("VMM allocation byte %d (region at %d, %d B) is %#x, want %s", i, off, n, got[i], map[bool]string{true: "the pushed byte", false: "0 (untouched)"}[inside])
		}
	}
	t.Logf("ipc push into a VMM (POSIX fd, %s) region: 256 MiB in %v (%.1f GB/s), byte-exact", v.HandleTypesString(), el.Round(time.Millisecond), float64(n)/el.Seconds()/1e9)
}

// TestGPUSameNodeShm: a hostmem sidecar and a CUDA sidecar on one node
// (different device kinds, transport auto) push through the shared pinned
// ring both ways round: hostmem -> cuda and cuda -> hostmem, byte-exact.
func TestGPUSameNodeShm(t *testing.T) {
	_, do := gpuOrdinals(t)
	dd := openGPU(t, do)
	const size = 1 << 30
	for _, cudaSide := range []string{"receiver", "sender"} {
		t.Run("cuda "+cudaSide, func(t *testing.T) {
			cudaYAML := fmt.Sprintf("device:\n  kind: cuda\n  ordinal: %d\n", do)
			o := nodeOpts{stripes: 4, slots: 16, slot: "4MiB", nodeDir: oneNode(t), decExtra: cudaYAML}
			if cudaSide == "sender" {
				o.extra, o.decExtra = cudaYAML, ""
			}
			pre, dec := pair(t, o)
			var S, D *kvsim.Cache
			if cudaSide == "sender" {
				S, D = gpuCache(t, dd, "src", 4, size/4), hostCache(t, "dst", 4, size/4)
			} else {
				S, D = hostCache(t, "src", 4, size/4), gpuCache(t, dd, "dst", 4, size/4)
			}
			registerBoth(t, S, D, pre, dec)
			ms := kvsim.Ranges(S, 4<<20)
			start := time.Now()
			run(t, pre.cl, wire.Push, "shm", S, D, ms)
			el := time.Since(start)
			if err := kvsim.Verify(S, D, ms, guard); err != nil {
				t.Fatal(err)
			}
			l := link(t, pre, "decode")
			if l.XfersShm == 0 || l.ChunksOut != 0 {
				t.Fatalf("link decode: %d shm transfers, %d chunks over TCP, fallbacks %v; want shm only", l.XfersShm, l.ChunksOut, l.Fallbacks)
			}
			t.Logf("shm push, cuda:%d as %s: 1 GiB in %v (%.2f GB/s), byte-exact", do, cudaSide, el.Round(time.Millisecond), float64(size)/el.Seconds()/1e9)
		})
	}
}

func hostCache(t *testing.T, name string, layers int, layerBytes uint64) *kvsim.Cache {
	t.Helper()
	c, err := kvsim.New(name, layers, layerBytes, 12288)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
