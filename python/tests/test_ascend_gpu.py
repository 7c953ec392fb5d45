"""An "Ascend" prefill to a CUDA decode, with torch tensors in the engines' own shapes.

The prefill's sidecar runs the acl backend over fakeacl_cuda (ACL emulated
over the CUDA runtime; no NPU is involved). Its engine is two
tensor-parallel ranks in vllm-ascend's layout: K and V as separate
``(blocks, 128, kv_heads / 2, head_size)`` tensors per layer, written by
torch into memory from ``aclrtMalloc`` and registered by ACL export key.
The decode's sidecar runs the cuda backend; its engine holds all kv heads
in vLLM's layouts with 16-token blocks (HND: an NHD-ordered view of HND
memory; packed: K and V side by side in one row), torch CUDA tensors
registered by CUDA IPC handle. 64 requests of random lengths with random
block tables on both sides move with one KV transfer per prefill rank; then
every row of every request must equal its source (compared through the
reference mapper, kvmap.gather_tensor), and every decode block no request
used must be untouched. MLA: one rank, vllm-ascend's latent (512) and rope
(64) tensors into vLLM's one 576-wide row.

Skipped without CUDA or without STAGE_TEST_ACL_LIBRARY (fakeacl_cuda built as
libascendcl.so). On the GPU machine::

    nvcc -shared -Xcompiler -fPIC -o /tmp/libascendcl.so acl/testdata/fakeacl_cuda.c -lpthread -lcuda
    cd python && STAGE_TEST_ACL_LIBRARY=/tmp/libascendcl.so STAGED=$PWD/../bin/staged \\
        python3 -m unittest -v tests.test_ascend_gpu
"""

from __future__ import annotations

import os
import random
import sys
import unittest
from typing import Any, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchenv import CUDA_WHY as WHY, HAVE_CUDA, torch  # noqa: E402

from test_e2e import HAVE_STAGED, SKIP_WHY, Staged, pair, stop_all  # noqa: E402

if HAVE_CUDA:
    from fakeacl import LIBRARY, ACLArena, VMMArena, open_acl, sidecar_config  # noqa: E402
else:
    LIBRARY = ""

from stage_client import register_kv_cache  # noqa: E402
from stage_client.kvmap import gather_tensor  # noqa: E402
from stage_client.layout import sides  # noqa: E402

GPU = int(os.environ.get("STAGE_GPU", "0"))
LAYERS, HEADS, HEAD_SIZE = 2, 8, 128
PRE_BS, DEC_BS = 128, 16
REQUESTS, MAX_TOKENS = 64, 700


@unittest.skipUnless(HAVE_CUDA, WHY)
@unittest.skipUnless(LIBRARY, "STAGE_TEST_ACL_LIBRARY (fakeacl_cuda built as libascendcl.so) is not set")
@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestAscendToCUDA(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.dev = torch.device("cuda", GPU)
        torch.cuda.set_device(cls.dev)
        cls.acl = open_acl(GPU)
        cls.arenas: List[Any] = []
        cls.nodes: List[Staged] = []
        try:
            cls.pre, cls.dec = pair("device: {kind: cuda, ordinal: %d}\n" % GPU, sidecar_config(GPU), slots=32,
                                    pre_name="ascend")
            cls.nodes += [cls.dec, cls.pre]
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        why = stop_all(cls.nodes)
        for a in cls.arenas:  # after the sidecars let go of the keys
            a.close()
        if why:
            raise AssertionError(why)

    def npu(self, nbytes: int, vmm: bool = False) -> Any:
        a = (VMMArena if vmm else ACLArena)(self.acl, nbytes, self.dev)
        self.arenas.append(a)
        return a

    def requests(self, seed: int) -> Tuple[List[int], List[List[int]], List[List[int]], int, int]:
        """Random lengths, and random block tables on both sides (each block used once)."""
        rng = random.Random(seed)
        lens = [rng.randint(1, MAX_TOKENS) for _ in range(REQUESTS)]
        pre_need = [-(-n // PRE_BS) for n in lens]
        dec_need = [-(-n // DEC_BS) for n in lens]
        pre_blocks, dec_blocks = sum(pre_need) + 5, sum(dec_need) + 40
        pids, dids = list(range(pre_blocks)), list(range(dec_blocks))
        rng.shuffle(pids)
        rng.shuffle(dids)
        ptab, dtab = [], []
        for p, d in zip(pre_need, dec_need):
            ptab.append(pids[:p])
            pids = pids[p:]
            dtab.append(dids[:d])
            dids = dids[d:]
        return lens, ptab, dtab, pre_blocks, dec_blocks

    def move(self, name: str, src_kv: List[Any], src_tensors: List[Any], dst_kv: Any, dst_tensors: Any,
             lens: List[int], ptab: List[List[int]], dtab: List[List[int]]) -> None:
        torch.cuda.synchronize(self.dev)
        # The decode's rows hold noise before the move: equality after it is the move's doing.
        a, b = sides(src_kv[0].layout, ptab[0], dst_kv.layout, dtab[0], lens[0])
        self.assertFalse(torch.equal(gather_tensor(b, dst_tensors), gather_tensor(a, src_tensors[0])))
        ids = []
        for s, n in enumerate(lens):
            for r, kv in enumerate(src_kv):
                ids.append(kv.push("decode", dst_kv.name, ptab[s], dtab[s], n, tag="%s/%d/%d" % (name, s, r)))
        sts = self.pre.client.wait_all(ids, timeout=120)
        self.assertTrue(all(st.ok and st.done == st.total for st in sts), [st for st in sts if not st.ok][:3])
        torch.cuda.synchronize(self.dev)
        for s, n in enumerate(lens):
            for r, kv in enumerate(src_kv):
                a, b = sides(kv.layout, ptab[s], dst_kv.layout, dtab[s], n)
                got = gather_tensor(b, dst_tensors)
                want = gather_tensor(a, src_tensors[r])
                self.assertEqual(got.numel(), want.numel())
                if not torch.equal(got, want):
                    bad = int((got != want).nonzero()[0])
                    self.fail("%s: request %d rank %d (%d tokens): canonical byte %d of %d differs"
                              % (name, s, r, n, bad, got.numel()))

    def untouched(self, alloc: Any, before: Any, block_dim: int, dtab: List[List[int]]) -> None:
        used = sorted({b for t in dtab for b in t})
        free = torch.ones(alloc.shape[block_dim], dtype=torch.bool)
        free[used] = False
        idx = free.nonzero().flatten().to(self.dev)
        self.assertGreater(idx.numel(), 0)
        self.assertTrue(torch.equal(alloc.index_select(block_dim, idx), before.index_select(block_dim, idx)),
                        "a decode block no request named was written")

    def gqa(self, preset: str, seed: int, vmm: bool = False) -> None:
        lens, ptab, dtab, pb, db = self.requests(seed)
        g = torch.Generator(device=self.dev).manual_seed(11)
        half = HEADS // 2
        src_kv, src_tensors = [], []
        for r in range(2):  # vllm-ascend: per layer, K and V apart, (blocks, 128, heads held, head_size)
            shape = (LAYERS, 2, pb, PRE_BS, half, HEAD_SIZE)
            arena = self.npu(torch.Size(shape).numel() * 2, vmm)
            cache = arena.empty(shape, torch.bfloat16)
            cache.copy_(torch.randn(shape, generator=g, device=self.dev))
            ts = [[cache[i][0], cache[i][1]] for i in range(LAYERS)]
            kv = register_kv_cache(self.pre.client, "%s-pre-r%d" % (preset, r), ts, "ascend", heads=HEADS,
                                   head_lo=r * half, head_hi=(r + 1) * half, acl=self.acl, access="prefill")
            self.addCleanup(kv.close)
            src_kv.append(kv)
            src_tensors.append(ts)
        if preset == "vllm-hnd":  # HND memory, an NHD-ordered view for the engine
            alloc = torch.randn((LAYERS, 2, db, HEADS, DEC_BS, HEAD_SIZE), generator=g, device=self.dev).to(torch.bfloat16)
            dts = [[alloc[i].permute(0, 1, 3, 2, 4)] for i in range(LAYERS)]
            block_dim = 2
        else:  # packed: (blocks, heads, slots, K then V)
            alloc = torch.randn((LAYERS, db, HEADS, DEC_BS, 2 * HEAD_SIZE), generator=g, device=self.dev).to(torch.bfloat16)
            dts = [[alloc[i]] for i in range(LAYERS)]
            block_dim = 1
        before = alloc.clone()
        dkv = register_kv_cache(self.dec.client, "%s-dec" % preset, dts, preset, heads=HEADS, access="decode")
        self.addCleanup(dkv.close)
        self.move(preset, src_kv, src_tensors, dkv, dts, lens, ptab, dtab)
        self.untouched(alloc, before, block_dim, dtab)

    def test_ascend_to_vllm_hnd(self) -> None:
        self.gqa("vllm-hnd", 3)

    def test_ascend_to_vllm_packed(self) -> None:
        self.gqa("vllm-packed", 4)

    def test_ascend_vmm_to_vllm_packed(self) -> None:
        """The prefill's caches in VMM chunks (expandable segments), registered by chunk list."""
        self.gqa("vllm-packed", 6, vmm=True)

    def test_mla(self) -> None:
        lens, ptab, dtab, pb, db = self.requests(5)
        g = torch.Generator(device=self.dev).manual_seed(12)
        arena = self.npu(LAYERS * pb * PRE_BS * (512 + 64) * 2 + 4096)
        # vllm-ascend's MLA caches: (blocks, block_size, 1, 512) and (blocks, block_size, 1, 64)
        latent = arena.empty((LAYERS, pb, PRE_BS, 1, 512), torch.bfloat16)
        rope = arena.empty((LAYERS, pb, PRE_BS, 1, 64), torch.bfloat16)
        latent.copy_(torch.randn(latent.shape, generator=g, device=self.dev))
        rope.copy_(torch.randn(rope.shape, generator=g, device=self.dev))
        ts = [[latent[i], rope[i]] for i in range(LAYERS)]
        skv = register_kv_cache(self.pre.client, "mla-pre", ts, "ascend-mla", heads=1, acl=self.acl, access="prefill")
        self.addCleanup(skv.close)
        alloc = torch.randn((LAYERS, db, DEC_BS, 576), generator=g, device=self.dev).to(torch.bfloat16)
        before = alloc.clone()
        dts = [[alloc[i]] for i in range(LAYERS)]
        dkv = register_kv_cache(self.dec.client, "mla-dec", dts, "vllm-mla", heads=1, access="decode")
        self.addCleanup(dkv.close)
        self.move("mla", [skv], [ts], dkv, dts, lens, ptab, dtab)
        self.untouched(alloc, before, 1, dtab)


if __name__ == "__main__":
    unittest.main()
