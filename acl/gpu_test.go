//go:build gpu

package acl

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stage-kv/stage/cuda"
	"github.com/stage-kv/stage/device/devicetest"
	"github.com/stage-kv/stage/kvsim"
)

// GPU tests: build with -tags gpu; run where $STAGE_TEST_ACL_LIBRARY names
// testdata/fakeacl_cuda.c built into a shared library (the acl backend over
// real GPU memory and CUDA streams) and STAGED_BIN a staged binary. They
// skip without them. No Ascend hardware is involved.

func gpuFakeLibrary(t *testing.T) (string, *Library) {
	t.Helper()
	so := os.Getenv(testLibraryEnv)
	if so == "" {
		t.Skipf("%s unset: build testdata/fakeacl_cuda.c and point it there", testLibraryEnv)
	}
	l, err := OpenLibrary(so)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if n, err := l.Call("fakeacl_live"); err != nil || n != 0 {
			t.Errorf("fakeacl_cuda: %d resources still live after the test (%v)", n, err)
		}
	})
	return so, l
}

// openCUDA0 opens CUDA device 0 for the test (skipping without one) and
// closes it at the end.
func openCUDA0(t *testing.T) *cuda.Device {
	t.Helper()
	cd, err := cuda.OpenDevice(0, cuda.Config{})
	if err != nil {
		t.Skipf("no CUDA device 0: %v", err)
	}
	t.Cleanup(func() {
		if err := cd.Close(); err != nil {
			t.Errorf("cuda:0: %v", err)
		}
	})
	return cd
}

// TestGPUFakeConformance: every copy mode passes the device conformance
// suite over real GPU memory, through pinned slots, with async copies and
// events.
func TestGPUFakeConformance(t *testing.T) {
	_, l := gpuFakeLibrary(t)
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			d := openDev(t, l, Config{CopyMode: mode})
			devicetest.Run(t, d, d, devicetest.Options{PoolSize: 64 << 20})
			if n := counter(t, l, "fakeacl_legacy_queries"); n != 0 {
				t.Errorf("legacy aclrtQueryEvent called %d times", n)
			}
		})
	}
}

// TestGPUHeteroE2E: an "Ascend" sidecar (the acl backend over fakeacl_cuda
// on GPU 0) and a CUDA sidecar (the cuda backend, GPU 0) move a paged KV
// cache of 1 GiB each way, as 1 MiB ranges and as 16 KiB blocks, in batch
// and pack mode, byte-exact. The acl side's cache is registered by export
// key at an odd offset inside a larger allocation (whitelisted for the acl
// sidecar's pid); the CUDA side's by legacy IPC handle, also at an offset.
func TestGPUHeteroE2E(t *testing.T) {
	so, l := gpuFakeLibrary(t)
	cd := openCUDA0(t)
	bin := stagedBinary(t)
	const layers, layerBytes, guard = 4, 256 << 20, 12288
	for _, mode := range []string{"batch", "pack"} {
		t.Run(mode, func(t *testing.T) {
			dec := startNode(t, bin, "decode", nodeOpts{stripes: 8, slots: 32, slot: "4MiB",
				extra: "device:\n  kind: cuda\n  ordinal: 0\n"})
			pre := startNode(t, bin, "ascend", nodeOpts{route: "decode", peer: dec.peers, stripes: 8, slots: 32, slot: "4MiB",
				extra: "device:\n  kind: acl\n  ordinal: 0\n", env: stagedEnv(so, CopyMode(mode))})
			pre.settle(1)
			dec.settle(1)
			if want := fmt.Sprintf("copy mode %s (requested)", mode); !pre.logHas(want) {
				t.Fatalf("the acl sidecar's log lacks %q:\n%s", want, pre.tail())
			}
			d := openDev(t, l, Config{})
			pid := int32(pre.cmd.Process.Pid)
			npu := func(name string) *kvsim.Cache {
				m, err := newACLMemory(d, 2*guard+layers*layerBytes, pid)
				if err != nil {
					t.Fatal(err)
				}
				c, err := kvsim.NewOn(m, "npu-"+name, layers, layerBytes, guard)
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			gpu := func(name string) *kvsim.Cache {
				m, err := kvsim.NewCUDAMemory(cd, 2*guard+layers*layerBytes)
				if err != nil {
					t.Fatal(err)
				}
				c, err := kvsim.NewOn(m, "gpu-"+name, layers, layerBytes, guard)
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			for _, sh := range shapes(51) {
				t.Run(sh.name, func(t *testing.T) {
					el := moveCache(t, pre, dec, sh, npu, gpu)
					t.Logf("%s ascend(fakeacl_cuda, %s) <-> cuda: 1 GiB in %v (%.2f GB/s), byte-exact", sh.name, mode,
						el.Round(time.Millisecond), float64(layers*layerBytes)/el.Seconds()/1e9)
				})
			}
			pre.checkIdle()
			dec.checkIdle()
		})
	}
}

// TestGPUVMMImport: VMM memory over CUDA's VMM driver API (cuMemCreate,
// cuMemExportToShareableHandle as a POSIX fd, cuMemAddressReserve,
// cuMemMap, cuMemSetAccess): the engine here, the importing sidecar a child
// process, chunks of the driver's granularity; as TestVMMImport.
func TestGPUVMMImport(t *testing.T) {
	so, l := gpuFakeLibrary(t)
	vmmImportCase(t, so, l)
}
