//go:build gpu

package acl

import (
	"testing"

	"github.com/stage-kv/stage/kvsim"
)

// TestGPUKVFromAscend: the heterogeneous proof on one GPU. Two
// "Ascend" ranks (the acl backend over fakeacl_cuda, vllm-ascend layout,
// block 128, half the kv heads each) push 64 requests of random lengths
// and random block tables into a CUDA sidecar's cache holding all heads,
// in vLLM's HND and packed layouts, block 16; every row equal, nothing
// else touched. No Ascend hardware is involved.
func TestGPUKVFromAscend(t *testing.T) {
	so, l := gpuFakeLibrary(t)
	cd := openCUDA0(t)
	bin := stagedBinary(t)
	dec := startNode(t, bin, "decode", nodeOpts{stripes: 8, slots: 32, slot: "4MiB",
		extra: "device:\n  kind: cuda\n  ordinal: 0\n"})
	pre := startNode(t, bin, "ascend", nodeOpts{route: "decode", peer: dec.peers, stripes: 8, slots: 32, slot: "4MiB",
		extra: "device:\n  kind: acl\n  ordinal: 0\n", env: stagedEnv(so, CopyAuto)})
	pre.settle(1)
	dec.settle(1)
	npu := npuMemory(t, openDev(t, l, Config{}), int32(pre.cmd.Process.Pid))
	gpu := func(size uint64) kvsim.Memory {
		m, err := kvsim.NewCUDAMemory(cd, size)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, preset := range []string{"vllm-hnd", "vllm-packed"} {
		t.Run(preset, func(t *testing.T) { kvRequests(t, pre, dec, preset, 16, 64, npu, gpu) })
	}
	pre.checkIdle()
	dec.checkIdle()
}
