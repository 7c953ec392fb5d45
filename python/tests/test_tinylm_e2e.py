"""The tiny model decodes the same tokens after its KV cache moved through two real sidecars.

examples/tinylm.py prefills six prompts with its cache laid out as
vllm-ascend lays it out (K and V apart, 128-token blocks) over two
tensor-parallel "ranks" holding two of the four kv heads each; each rank's
cache is registered with sidecar "prefill" (register_kv_cache) as its own
KV cache. The decode cache is vLLM HND (16-token blocks, one rank with all
four heads) registered with sidecar "decode". Each request's rows move by
block table with submit_kv: two transfers per request (one per prefill
rank, each moving the heads it holds), random block ids on both sides.
Then 64 greedy tokens decoded on the decode cache must equal those of one
process that prefilled and decoded without moving anything, and every
transfer must have been announced to the receiving (push) or serving
(pull) engine by a Notify naming its KV cache, layers and tokens.

* push: the prefill's engine pushes into the decode's cache;
* pull: the decode's engine pulls from the prefill's caches (its sidecar
  gets a route to the prefill's);
* refusals: what the sidecars refuse before any byte moves.

CPU: hostmem sidecars, the caches are CPU tensors inside HostArena memfds
(float32). CUDA (skipped without a GPU): cuda sidecars, the caches are torch
CUDA tensors registered by IPC handle (bfloat16). Run only the CUDA one::

    cd python && STAGED=$PWD/../bin/staged python3 -m unittest -v tests.test_tinylm_e2e.TestTinyLMSidecarsCUDA

(STAGE_GPU picks the GPU, default 0: the test uses it and writes it into both
sidecars' configs; test_e2e.sidecar_env keeps it out of their environment,
where staged would warn about a STAGE_* variable that sets no key.)
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import unittest
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchenv import CUDA_WHY, HAVE_CUDA, tinylm, torch, TORCH_WHY as WHY  # noqa: E402

from test_e2e import HAVE_STAGED, SKIP_WHY, Staged, pair, stop_all  # noqa: E402
from test_tinylm import STEPS, prompts  # noqa: E402
from stage_client import Code, Direction, HostArena, StageError, register_kv_cache  # noqa: E402

GPU = int(os.environ.get("STAGE_GPU", "0"))
PREFILL = ("ascend", 128, 2)  # preset, block size, ranks
DECODE = ("vllm-hnd", 16, 1)


@unittest.skipIf(torch is None, WHY)
@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestTinyLMSidecars(unittest.TestCase):
    device: Any = "cpu"
    dtype: Any = None
    sidecar = ""  # extra staged config: the device
    pre_sidecar = ""  # the prefill's, where it differs
    acl: Any = None  # the prefill's caches are NPU memory registered by ACL export key

    @classmethod
    def setUpClass(cls) -> None:
        torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
        cls.dtype = cls.dtype or torch.float32
        cls.cfg = tinylm.Config()
        cls.model = tinylm.TinyLM(cls.cfg, seed=7, dtype=cls.dtype, device=cls.device)
        cls.prompts = prompts(11)
        ref = cls.cache(DECODE, seed=1)
        cls.ref_logits = cls.model.prefill(cls.prompts, ref)
        cls.ref_tokens, _ = cls.model.decode(ref, cls.ref_logits, STEPS)
        cls.arenas: List[HostArena] = []
        cls.nodes: List[Staged] = []
        try:
            cls.start()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def start(cls) -> None:
        cls.pre, cls.dec = pair(cls.sidecar, cls.pre_sidecar or cls.sidecar, pulls=True)
        cls.nodes += [cls.dec, cls.pre]
        # The prefill: two ranks, each its own KV cache on the prefill's sidecar.
        cls.src = cls.cache(PREFILL, seed=2, alloc=cls.alloc(cls.pre))
        cls.logits = cls.model.prefill(cls.prompts, cls.src)
        cls.sync()
        cls.src_kv = [register_kv_cache(cls.pre.client, "pre-r%d" % r, rc.tensors, PREFILL[0], heads=cls.cfg.kv_heads,
                                        head_lo=rc.head_lo, head_hi=rc.head_hi, acl=cls.acl, access="prefill")
                      for r, rc in enumerate(cls.src.ranks)]

    @classmethod
    def tearDownClass(cls) -> None:
        why = stop_all(cls.nodes)
        for a in cls.arenas:  # after the sidecars let go of them
            a.close()
        if why:
            raise AssertionError(why)

    @classmethod
    def alloc(cls, node: Staged) -> Any:
        """Where a cache registered with ``node`` lives: a memfd the hostmem sidecar maps."""
        a = HostArena(96 << 20, "tinylm-" + node.name)
        cls.arenas.append(a)
        return a.empty

    @classmethod
    def sync(cls) -> None:
        """Rows the engine wrote are in memory before a sidecar copies them."""

    @classmethod
    def cache(cls, kind: tuple, seed: int, alloc: Optional[Any] = None) -> "tinylm.Cache":
        preset, bs, ranks = kind
        blocks = sum(-(-(len(p) + STEPS) // bs) for p in cls.prompts) + 8
        return tinylm.Cache(cls.cfg, preset, bs, blocks, ranks, cls.dtype, cls.device, seed, alloc)

    def decode_cache(self, name: str, seed: int) -> tuple:
        """A fresh decode cache registered with the decode's sidecar, blocks reserved for every prompt."""
        dst = self.cache(DECODE, seed, self.alloc(self.dec))
        self.sync()
        kv = register_kv_cache(self.dec.client, name, dst.ranks[0].tensors, DECODE[0], heads=self.cfg.kv_heads,
                               access="decode")
        self.addCleanup(kv.close)
        for s, n in enumerate(self.src.lens):
            dst.reserve(s, n)
            dst.lens[s] = n
        return dst, kv

    def row_bytes(self) -> int:
        """Canonical bytes of one token of every layer, for the two heads one prefill rank holds."""
        return self.cfg.layers * 2 * 2 * self.cfg.head_size * torch.tensor([], dtype=self.dtype).element_size()

    def notes(self, sub: Any, n: int) -> Dict[str, Any]:
        """``n`` notifications by tag (30 s at most)."""
        got: Dict[str, Any] = {}
        deadline = time.monotonic() + 30
        while len(got) < n:
            m = sub.get(max(0.0, deadline - time.monotonic()))
            self.assertIsNotNone(m, "%d of %d notifications after 30s: %s" % (len(got), n, sorted(got)))
            self.assertNotIn(m.tag, got, "two notifications for %s" % m.tag)
            got[m.tag] = m
        return got

    def move_and_decode(self, direction: int) -> None:
        name = "dec-%s" % direction.name.lower()
        dst, dkv = self.decode_cache(name, seed=3 + int(direction))
        watcher = self.dec if direction == Direction.PUSH else self.pre
        sub = watcher.client.subscribe()
        self.addCleanup(sub.close)
        ids, want, sts = [], {}, []
        for s, n in enumerate(self.src.lens):
            for r, skv in enumerate(self.src_kv):
                tag = "%s/req-%d/r%d" % (name, s, r)
                if direction == Direction.PUSH and s == r == 0:  # one through the asyncio form
                    sts.append(asyncio.run(skv.client.submit_kv_async(
                        "decode", skv.name, name, range(self.cfg.layers), self.src.tables[r][s], dst.tables[0][s], n,
                        tag=tag, timeout=60)))
                    want[tag] = (name, n)
                elif direction == Direction.PUSH:
                    ids.append(skv.push("decode", name, self.src.tables[r][s], dst.tables[0][s], n, tag=tag))
                    want[tag] = (name, n)
                else:
                    ids.append(dkv.pull("prefill", skv.name, dst.tables[0][s], self.src.tables[r][s], n, tag=tag))
                    want[tag] = (skv.name, n)
        client = self.pre.client if direction == Direction.PUSH else self.dec.client
        sts += client.wait_all(ids, timeout=60)
        self.assertEqual(sum(st.total for st in sts), len(self.src_kv) * sum(self.src.lens) * self.row_bytes())
        self.assertTrue(all(st.ok and st.done == st.total for st in sts), sts)
        # The engine that did not ask hears of every transfer, naming its own KV cache and what moved.
        for tag, m in self.notes(sub, len(want)).items():
            kv, n = want[tag]
            self.assertEqual((m.code, m.direction, m.kv, m.layers, m.first, m.tokens, m.bytes),
                             (Code.OK, direction, kv, list(range(self.cfg.layers)), 0, n, n * self.row_bytes()), tag)
        # the tables really differ: random ids, other block sizes
        self.assertNotEqual(self.src.tables[0][0][:2], dst.tables[0][0][:2])
        tokens, _ = self.model.decode(dst, self.logits, STEPS)
        self.assertTrue(torch.equal(tokens, self.ref_tokens),
                        "%s: tokens differ from the unmoved run\n%s\n%s" % (name, tokens, self.ref_tokens))

    def test_prefill_matches_reference(self) -> None:
        self.assertTrue(torch.equal(self.logits, self.ref_logits))
        distinct = [len(set(row.tolist())) for row in self.ref_tokens]
        self.assertGreaterEqual(sum(distinct) / len(distinct), 8, "a model that repeats itself proves nothing")

    def test_push(self) -> None:
        self.move_and_decode(Direction.PUSH)

    def test_pull(self) -> None:
        self.move_and_decode(Direction.PULL)

    def test_refusals(self) -> None:
        # Refused before any byte moves: the decode cache stays as it was.
        dst, dkv = self.decode_cache("dec-refuse", seed=9)
        before = dst.ranks[0].alloc.clone()
        r0, n = self.src_kv[0], self.src.lens[0]
        table, dtable = self.src.tables[0][0], dst.tables[0][0]
        cases = {
            "heads rank 0 does not hold": dict(heads=(2, 4)),
            "a block id past the decode cache": dict(remote_blocks=[dst.ranks[0].blocks] + dtable[1:]),
            "more tokens than the tables hold": dict(tokens=len(table) * PREFILL[1] + 1),
            "a layer the model does not have": dict(layers=[self.cfg.layers]),
            "a KV cache the peer does not have": dict(remote="nope"),
        }
        for why, kw in cases.items():
            with self.subTest(why=why):
                args = dict(remote="dec-refuse", local_blocks=table, remote_blocks=dtable, tokens=n)
                args.update(kw)
                with self.assertRaises(StageError) as cm:
                    tid = r0.push("decode", args.pop("remote"), args.pop("local_blocks"), args.pop("remote_blocks"),
                                  args.pop("tokens"), **args)
                    self.pre.client.wait(tid, timeout=30)
                self.assertNotEqual(cm.exception.code, Code.OK)
        self.assertTrue(torch.equal(dst.ranks[0].alloc, before), "a refused transfer wrote into the decode cache")


@unittest.skipUnless(HAVE_CUDA, CUDA_WHY)
class TestTinyLMSidecarsCUDA(TestTinyLMSidecars):
    """The same on the GPU: torch CUDA tensors, cuda sidecars, bfloat16."""

    device = "cuda:%d" % GPU
    sidecar = "device: {kind: cuda, ordinal: %d}\n" % GPU

    @classmethod
    def setUpClass(cls) -> None:
        cls.dtype = torch.bfloat16
        super().setUpClass()

    @classmethod
    def alloc(cls, node: Staged) -> Any:
        return None  # torch.empty on the GPU: registered by IPC handle

    @classmethod
    def sync(cls) -> None:
        torch.cuda.synchronize(cls.device)


@unittest.skipUnless(HAVE_CUDA, CUDA_WHY)
@unittest.skipUnless(os.environ.get("STAGE_TEST_ACL_LIBRARY"), "STAGE_TEST_ACL_LIBRARY (fakeacl_cuda built as libascendcl.so) is not set")
class TestTinyLMSidecarsAscend(TestTinyLMSidecarsCUDA):
    """The prefill's sidecar is an "Ascend" one: the acl backend over fakeacl_cuda (no NPU involved).

    The prefill's caches (vllm-ascend's layout) are torch tensors over
    memory from fakeacl's aclrtMalloc, written by the model and registered
    by ACL export key; the decode's are torch CUDA tensors on a cuda
    sidecar.
    """

    @classmethod
    def setUpClass(cls) -> None:
        from fakeacl import open_acl, sidecar_config

        cls.acl = open_acl(GPU)
        cls.pre_sidecar = sidecar_config(GPU)
        super().setUpClass()

    @classmethod
    def alloc(cls, node: Staged) -> Any:
        if node is not cls.pre:
            return None
        from fakeacl import ACLArena

        a = ACLArena(cls.acl, 96 << 20, cls.device)
        cls.arenas.append(a)
        return a.empty


if __name__ == "__main__":
    unittest.main()
