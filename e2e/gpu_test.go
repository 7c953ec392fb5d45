//go:build gpu

package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/cuda"
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// GPU ordinals of the two sides: STAGE_GPU_SRC and STAGE_GPU_DST (default 0
// and 0: one GPU plays both pods).
func gpuOrdinals(t *testing.T) (src, dst int) {
	get := func(k string) int {
		v := os.Getenv(k)
		if v == "" {
			return 0
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", k, v, err)
		}
		return n
	}
	return get("STAGE_GPU_SRC"), get("STAGE_GPU_DST")
}

func openGPU(t *testing.T, ord int) *cuda.Device {
	t.Helper()
	d, err := cuda.OpenDevice(ord, cuda.Config{})
	if err != nil {
		t.Skipf("no CUDA device %d: %v", ord, err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("cuda:%d: %v", ord, err)
		}
	})
	return d
}

func gpuCache(t *testing.T, d *cuda.Device, name string, layers int, layerBytes uint64) *kvsim.Cache {
	t.Helper()
	m, err := kvsim.NewCUDAMemory(d, 2*12288+uint64(layers)*layerBytes)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kvsim.NewOn(m, name, layers, layerBytes, 12288)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestGPUMoveGiB: two CUDA sidecars move 1 GiB of device memory in both
// shapes and both directions over TCP staging, byte-exact, between regions
// at odd offsets inside larger device allocations (legacy IPC handles).
func TestGPUMoveGiB(t *testing.T) {
	so, do := gpuOrdinals(t)
	sd, dd := openGPU(t, so), openGPU(t, do)
	const layers = 4
	const size = 1 << 30
	for _, tc := range []struct {
		name  string
		dir   wire.Direction
		moves func(c *kvsim.Cache) []kvsim.Move
	}{
		{"push ranges 1MiB", wire.Push, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Ranges(c, 1<<20) }},
		{"push blocks 16KiB", wire.Push, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Blocks(c, 16<<10, 21) }},
		{"pull ranges 1MiB", wire.Pull, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Ranges(c, 1<<20) }},
		{"pull blocks 16KiB", wire.Pull, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Blocks(c, 16<<10, 22) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pre, dec := pair(t, nodeOpts{stripes: 8, slots: 32, slot: "4MiB",
				extra:    fmt.Sprintf("device:\n  kind: cuda\n  ordinal: %d\n", so),
				decExtra: fmt.Sprintf("device:\n  kind: cuda\n  ordinal: %d\n", do)})
			// The source lives on the sending side's GPU.
			var S, D *kvsim.Cache
			var sn, dn *node
			if tc.dir == wire.Push {
				S, D, sn, dn = gpuCache(t, sd, "src", layers, size/layers), gpuCache(t, dd, "dst", layers, size/layers), pre, dec
			} else {
				S, D, sn, dn = gpuCache(t, dd, "src", layers, size/layers), gpuCache(t, sd, "dst", layers, size/layers), dec, pre
			}
			if err := S.Fill(uint64(time.Now().UnixNano())); err != nil {
				t.Fatal(err)
			}
			if err := D.Poison(guard); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := S.Register(ctx, sn.cl, wire.AccessAll); err != nil {
				t.Fatal(err)
			}
			if err := D.Register(ctx, dn.cl, wire.AccessAll); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = S.Unregister(ctx, sn.cl); _ = D.Unregister(ctx, dn.cl) })
			ms := tc.moves(S)
			start := time.Now()
			if tc.dir == wire.Push {
				run(t, pre.cl, wire.Push, "gpu", S, D, ms)
			} else {
				run(t, pre.cl, wire.Pull, "gpu", D, S, ms)
			}
			el := time.Since(start)
			if err := kvsim.Verify(S, D, ms, guard); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s cuda:%d -> cuda:%d: 1 GiB in %v (%.2f GB/s), byte-exact", tc.name, so, do, el.Round(time.Millisecond), float64(size)/el.Seconds()/1e9)
		})
	}
}

// TestGPUPosixFDRegion: a VMM allocation exported as a POSIX fd (FABRIC
// tried first, POSIX fd when the driver refuses) registered through the
// control socket with SCM_RIGHTS, at a non-zero offset, receives a push.
func TestGPUPosixFDRegion(t *testing.T) {
	so, do := gpuOrdinals(t)
	sd, dd := openGPU(t, so), openGPU(t, do)
	pre, dec := pair(t, nodeOpts{stripes: 4, slots: 16, slot: "4MiB",
		extra:    fmt.Sprintf("device:\n  kind: cuda\n  ordinal: %d\n", so),
		decExtra: fmt.Sprintf("device:\n  kind: cuda\n  ordinal: %d\n", do)})
	ctx := context.Background()
	S := gpuCache(t, sd, "src", 1, 64<<20)
	if err := S.Fill(7); err != nil {
		t.Fatal(err)
	}
	if err := S.Register(ctx, pre.cl, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = S.Unregister(ctx, pre.cl) })
	v, err := dd.VMMAlloc(128 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Free()
	t.Logf("VMM allocation handle types: %s (fabric: %v)", v.HandleTypesString(), v.FabricErr())
	fd, err := v.ExportFD()
	if err != nil {
		t.Fatal(err)
	}
	defer closeFD(fd)
	const off = 3<<20 + 4096
	if err := dd.CopyHtoD(v.Addr(), make([]byte, v.Size())); err != nil {
		t.Fatal(err)
	}
	err = dec.cl.Register(ctx, client.Region{Name: "vmm/0", Handle: uint8(device.HandlePosixFD), Access: wire.AccessAll,
		Ordinal: uint32(do), AllocSize: v.Size(), Offset: off, Length: 64 << 20, FD: fd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dec.cl.Unregister(ctx, "vmm/0") })
	tr := client.Transfer{Route: "decode", Dir: wire.Push, Tag: "vmm", LocalNames: S.Regions(), RemoteNames: []string{"vmm/0"},
		Ops: []wire.LocalOp{{Local: 0, Remote: 0, LocalOff: 0, RemoteOff: 0, Len: 64 << 20}}}
	if _, err := pre.cl.Do(ctx, tr); err != nil {
		t.Fatal(err)
	}
	want, err := S.ReadLayer(0)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, v.Size())
	if err := dd.CopyDtoH(got, v.Addr()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < off; i++ {
		if got[i] != 0 {
			t.Fatalf("byte %d before the region changed", i)
		}
	}
	if string(got[off:off+64<<20]) != string(want) {
		t.Fatal("the VMM region does not hold the pushed bytes")
	}
	for i := off + 64<<20; i < len(got); i++ {
		if got[i] != 0 {
			t.Fatalf("byte %d after the region changed", i)
		}
	}
}

func closeFD(fd int) { _ = os.NewFile(uintptr(fd), "fd").Close() }
