package cuda

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/devicetest"
)

// TestFakeCopyDtoDBatch: a batch of scattered short copies, long ones and
// empty ones, in every copy mode, lands exactly where it should and
// nothing else changes; kernel mode launches the kernel for the short
// runs; an overflowing copy is refused before anything is enqueued.
func TestFakeCopyDtoDBatch(t *testing.T) {
	for _, mode := range []CopyMode{CopyKernel, CopyBatch, CopyPerCopy} {
		t.Run(string(mode), func(t *testing.T) {
			l := fakeLibrary(t)
			d := openFake(t, l, Config{CopyMode: mode, PTX: fakePTX})
			const size = 8 << 20
			src, err := d.AllocDevice(size)
			if err != nil {
				t.Fatal(err)
			}
			defer d.FreeDevice(src)
			dst, err := d.AllocDevice(size)
			if err != nil {
				t.Fatal(err)
			}
			defer d.FreeDevice(dst)
			data := devicetest.RandBytes(3, size)
			if err := d.CopyHtoD(src, data); err != nil {
				t.Fatal(err)
			}
			old := bytes.Repeat([]byte{0xAB}, size)
			if err := d.CopyHtoD(dst, old); err != nil {
				t.Fatal(err)
			}
			// 16 KiB blocks to a permutation of places, one 3 MiB copy in
			// the middle (the engine's), odd lengths and an empty copy.
			rng := rand.New(rand.NewPCG(4, 5))
			perm := rng.Perm(128)
			var cs []device.Copy
			for i := 0; i < 128; i++ {
				cs = append(cs, device.Copy{Src: src + device.Addr(i*16<<10), Dst: dst + device.Addr(perm[i]*16<<10), Len: 16 << 10})
				if i == 60 {
					cs = append(cs, device.Copy{Src: src + 4<<20, Dst: dst + 4<<20, Len: 3 << 20}, device.Copy{Src: src, Dst: dst, Len: 0})
				}
			}
			cs = append(cs, device.Copy{Src: src + 2<<20 + 1, Dst: dst + 2<<20 + 7, Len: 777}, device.Copy{Src: src + 3<<20, Dst: dst + 3<<20 + 3, Len: 100_000})
			want := append([]byte(nil), old...)
			for _, c := range cs {
				copy(want[c.Dst-dst:], data[c.Src-src:uint64(c.Src-src)+c.Len])
			}
			st, err := d.NewCUDAStream()
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			launches, _ := l.Call("fake_launches")
			if err := st.CopyDtoDBatch(cs); err != nil {
				t.Fatal(err)
			}
			if err := st.Synchronize(); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, size)
			if err := d.CopyDtoH(got, dst); err != nil {
				t.Fatal(err)
			}
			if i := devicetest.Mismatch(got, want); i >= 0 {
				t.Fatalf("byte %d: got %#02x, want %#02x", i, got[i], want[i])
			}
			if n, _ := l.Call("fake_launches"); mode == CopyKernel && n == launches {
				t.Error("kernel mode launched no kernel for the short copies")
			}
			bad := []device.Copy{{Src: src, Dst: dst, Len: 1}, {Src: ^device.Addr(0) - 10, Dst: dst, Len: 100}}
			if err := st.CopyDtoDBatch(bad); err == nil {
				t.Fatal("an overflowing copy was accepted")
			}
		})
	}
}
