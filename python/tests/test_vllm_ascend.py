"""vllm-ascend 0.23.0.post1's own model runner makes the prefill's KV caches; stage moves them into a vLLM decode.

What runs (docs/ENGINES.md, "What ran where"): vllm-ascend's
``NPUModelRunner.initialize_kv_cache_tensors`` (with its
``_allocate_kv_cache_tensors`` and ``_reshape_kv_cache_tensors``) and
vLLM 0.23.0's ``get_kv_cache_config_from_groups`` and ``bind_kv_cache``,
imported from their source and wheel, make two tensor-parallel ranks'
caches (tests/test_vllm_ascend_runner.py) on the emulated Ascend runtime
(acl/testdata/fakeacl.c as libascendcl) through our torch_npu stand-in
(tests/npu_standin), in both of torch_npu's allocator modes:
``expandable_segments:True`` (VMM pages: vllm-ascend's default) and
``False`` (aclrtMalloc segments). A transformers model prefills (MHA, GQA:
Llama; MLA: DeepSeek-V3, tests/test_vllm_ascend_model.py); after each
layer its KV rows are written into both ranks' caches at their block
tables' slots (each rank its kv heads; MLA's latent on both) and the layer
is pushed at once from an ``acl`` sidecar (staged over the same library)
into a vLLM-layout decode cache on a ``hostmem`` sidecar (CPU, block 16:
``vllm-packed``, or ``vllm-mla``). The decode's rows, read back into the
model's cache, must give the greedy tokens of the model run that moved
nothing. No NPU and no GPU run.

Each case runs two ways: ``register``: each rank's caches registered by
``register_kv_cache(..., acl=ACL(...))`` and each layer pushed by
``KVCache.push``; ``connector``: ``StageConnector`` as vLLM drives it
(tests/vllm_replay.py: push mode, decode scheduled first, ``save_kv_layer``
after each layer, the stand-in's ``torch.npu.Event`` ordering the push).
TestStandin checks the stand-in's two allocator modes on their own.

The GPU variant (TestVLLMAscendGPU, skipped unless STAGE_TEST_ACL_CUDA=1):
the library is fakeacl_cuda, so vllm-ascend's caches are CUDA memory from
the emulated runtime (VMM over CUDA's VMM API, or cudaMalloc segments), and
the decode is a cuda sidecar with torch CUDA caches (``vllm-packed`` /
``vllm-mla``, block 16). It needs vllm 0.23.0 and transformers importable
by the GPU machine's python3. From the repository root there::

    nvcc -shared -Xcompiler -fPIC -o .dev/libascendcl.so acl/testdata/fakeacl_cuda.c -lpthread -lcuda
    cd python && STAGED=$PWD/../.dev/staged STAGE_TEST_ACL_LIBRARY=$PWD/../.dev/libascendcl.so \\
    STAGE_TEST_ACL_CUDA=1 STAGE_VLLM_ASCEND_SRC=$PWD/../.dev/vllm_ascend-0.23.0.post1 \\
    python3 -m unittest -v tests.test_vllm_ascend.TestVLLMAscendGPU

Run it as CI does: ``make test-vllm-ascend`` (venv, sdist, fakeacl.so,
then this with STAGE_ENGINES_REQUIRED=1: anything missing fails, not
skips). By hand, from python/::

    STAGED=$PWD/../bin/staged STAGE_TEST_ACL_LIBRARY=/tmp/libascendcl-fake.so \\
    STAGE_VLLM_ASCEND_SRC=$(bash ../scripts/vllm-ascend-src.sh ~/.cache/stage/venvs/src) \\
    ~/.cache/stage/venvs/vllm-0.23/bin/python -m unittest -v tests.test_vllm_ascend
"""

from __future__ import annotations

import ctypes
import os
import random
import sys
import unittest
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import test_vllm_ascend_model as M  # noqa: E402
import test_vllm_ascend_runner as R  # noqa: E402
from test_e2e import HAVE_STAGED, SKIP_WHY, pair, stop_all  # noqa: E402

WHY = R.load() or ("" if HAVE_STAGED else SKIP_WHY)
if os.environ.get("STAGE_ENGINES_REQUIRED") == "1" and WHY:  # make test-vllm-ascend: a skip would hide it
    raise RuntimeError(WHY)

if not WHY:
    import torch
    import torch_npu

    from stage_client import HostArena, register_kv_cache
    from stage_client.ascend import ACL
    from vllm_replay import Engine, NewRequestData, Request, SchedulerOutput

LIB = os.environ.get("STAGE_TEST_ACL_LIBRARY", "")
# torch_npu's allocator modes: vllm-ascend sets the first unless sleep mode is on (platform.py:772-790)
MODES = ("expandable_segments:True", "expandable_segments:False")
LAYERS = 2
PROMPTS, PROMPT_LEN, STEPS = 3, 150, 16
PRE_BLOCK, PRE_BLOCKS, TP = 128, 10, 2  # vllm-ascend's default block size (utils.py:1380-1381); two ranks
DEC_BLOCK, DEC_BLOCKS = 16, 40


def prompts() -> List[List[int]]:
    rng = random.Random(3)
    return [[rng.randrange(4, M.VOCAB) for _ in range(PROMPT_LEN)] for _ in range(PROMPTS)]


def table(blocks: int, need: int, seed: int) -> List[int]:
    """``need`` distinct block ids of ``blocks``, in random order (as a block pool hands them out)."""
    ids = list(range(blocks))
    random.Random(seed).shuffle(ids)
    return ids[:need]


def where(tab: List[int], block: int, n: int) -> Tuple[Any, Any]:
    """(block ids, slots) of tokens 0..n-1 through block table ``tab``."""
    pos = torch.arange(n)
    return torch.tensor(tab)[pos // block], pos % block


def fakeacl_held() -> Optional[int]:
    """What the emulated runtime holds (memory, handles, streams, events), less device references: every
    stage_client.ascend.ACL sets its device and keeps it set until the process ends. None where the
    library does not count device references apart (fakeacl_cuda)."""
    lib = torch_npu.standin.runtime().lib
    if not hasattr(lib, "fakeacl_device_refs"):
        return None
    lib.fakeacl_live.restype = lib.fakeacl_device_refs.restype = ctypes.c_long
    return int(lib.fakeacl_live()) - int(lib.fakeacl_device_refs())


@unittest.skipIf(WHY, WHY)
class TestStandin(unittest.TestCase):
    """The torch_npu stand-in gets memory as torch_npu's allocator does, in both modes, and gives all of it back."""

    def setUp(self) -> None:
        if os.environ.get("STAGE_TEST_ACL_CUDA") == "1":
            self.skipTest("over fakeacl_cuda the memory is not host memory")
        torch_npu.standin.close()
        held = fakeacl_held()
        self.addCleanup(lambda: self.assertEqual(fakeacl_held(), held, "the stand-in kept memory after close"))
        self.addCleanup(torch_npu.standin.close)

    def zeros(self, n: int) -> Any:
        with torch_npu.standin.allocating():
            return torch.zeros(n, dtype=torch.int8, device=torch.device("npu:0"))

    def test_segments(self) -> None:
        pool = torch_npu.standin.reset("expandable_segments:False")
        small, small2 = self.zeros(1000), self.zeros(3000)  # both in one 2 MiB segment of the small pool
        mid = self.zeros(3 << 20)  # under 10 MiB: a 20 MiB segment
        also = self.zeros(12 << 20)  # fits the 17 MiB left of the 20 MiB segment: split from it
        big = self.zeros((21 << 20) + 1)  # fits nowhere: a segment of its size rounded up to 2 MiB, 22 MiB
        self.assertEqual([n for _, n, _ in pool.segments], [2 << 20, 20 << 20, 22 << 20])
        self.assertEqual(also.data_ptr(), mid.data_ptr() + (3 << 20))
        self.assertEqual(small2.data_ptr() - small.data_ptr(), 1024)  # blocks are multiples of 512 B
        rt = torch_npu.standin.runtime()
        for t, seg in ((small2, 0), (mid, 1), (big, 2)):
            self.assertEqual(rt.address_range(t.data_ptr()), tuple(pool.segments[seg][:2]))
            self.assertEqual(t.device, torch.device("npu", 0))
            self.assertEqual(int(t.abs().sum()), 0)

    def test_expandable(self) -> None:
        pool = torch_npu.standin.reset("expandable_segments:True")
        a = self.zeros(1 << 20)
        self.assertEqual(len(pool.pages), 1)
        b = self.zeros(5 << 20)  # from 1 MiB to 6 MiB: two more pages, mapped where the range goes on
        self.assertEqual([at - pool.base for at, _ in pool.pages], [0, 2 << 20, 4 << 20])
        self.assertEqual(b.data_ptr(), a.data_ptr() + (1 << 20))
        rt = torch_npu.standin.runtime()
        for at, _ in pool.pages:
            self.assertEqual(rt.address_range(at + 5), (at, 2 << 20))
        view = b[(1 << 20) - 8:(1 << 20) + 8]  # across a page boundary, through a view
        view.copy_(torch.arange(16, dtype=torch.int8))
        self.assertEqual(b[(1 << 20) - 8:(1 << 20) + 8].tolist(), list(range(16)))
        self.assertEqual(view.device, torch.device("npu", 0))


@unittest.skipIf(WHY, WHY)
class TestVLLMAscend(unittest.TestCase):
    """Both allocator modes x MHA, GQA, MLA: TP 2 vllm-ascend prefill -> TP 1 vLLM-layout decode."""

    dec_sidecar = ""  # hostmem
    gpu = False  # TestVLLMAscendGPU: the runtime is fakeacl_cuda, the decode a cuda sidecar

    @classmethod
    def setUpClass(cls) -> None:
        if os.environ.get("STAGE_TEST_ACL_CUDA") == "1" and not cls.gpu:
            raise unittest.SkipTest("the library is fakeacl_cuda: TestVLLMAscendGPU runs over it")
        torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
        cls.prompts = prompts()
        cls.models = {k: M.make(k, seed=11) for k in M.KINDS}
        cls.ref = {}
        for k, m in cls.models.items():  # the single-engine run: prefill and decode, nothing moved
            logits, cache = M.prefill(m, cls.prompts)
            cls.ref[k] = (logits, M.decode(m, logits, cache, STEPS))
        cls.acl = ACL(LIB, 0)
        cls.nodes: List[Any] = []
        cls.addClassCleanup(cls.stop)  # also when a sidecar below fails to start
        pre_cfg = "device: {kind: acl, ordinal: 0, acl: {library: %s}}\n" % LIB
        cls.pre, cls.dec = pair(cls.dec_sidecar, pre_cfg, pulls=True)
        cls.nodes += [cls.dec, cls.pre]

    @classmethod
    def stop(cls) -> None:
        """The sidecars exit cleanly; then the stand-in's memory goes back to the runtime."""
        why = stop_all(cls.nodes)
        torch_npu.standin.close()
        if why:
            raise AssertionError(why)

    def test_reference_is_not_trivial(self) -> None:
        for k, (_, tokens) in self.ref.items():
            distinct = [len(set(row.tolist())) for row in tokens]
            self.assertGreaterEqual(min(distinct), 8, "%s: a model that repeats itself proves nothing" % k)

    # ------------------------------------------------------------------

    def caches(self, kind: str, mode: str) -> List[Dict[str, Any]]:
        """Each prefill rank's caches, made by vllm-ascend's runner in allocator ``mode``; their memory checked."""
        m = self.models[kind]
        heads = M.kv_heads(m)
        per_rank = heads if kind == "mla" else heads // TP  # MLA's one latent head is on every rank
        out = []
        for _ in range(TP):  # each rank its own engine process: its own allocator
            pool = torch_npu.standin.new_process(mode)
            kv, runner = R.make_caches(kind, LAYERS, PRE_BLOCKS, PRE_BLOCK, per_rank, M.head_size(m), torch.float32)
            self.assertEqual(len(runner.kv_caches), LAYERS)  # bind_kv_cache filled the runner's list
            out.append((kv, pool))
        rt = torch_npu.standin.runtime()
        for kv, pool in out:
            for name, (k, v) in kv.items():
                if kind == "mla":  # model_runner_v1.py:4607-4627: 4-D nope and rope caches
                    want = [(PRE_BLOCKS, PRE_BLOCK, 1, R.KV_LORA_RANK), (PRE_BLOCKS, PRE_BLOCK, 1, R.QK_ROPE_HEAD_DIM)]
                else:
                    want = [(PRE_BLOCKS, PRE_BLOCK, per_rank, M.head_size(m))] * 2
                self.assertEqual([tuple(k.shape), tuple(v.shape)], want, name)
                for t in (k, v):
                    self.assertEqual(t.device, torch.device("npu", 0))
                    self.assertEqual(t.data_ptr() % (2 << 20), 0, "vllm-ascend aligns K and V to 2 MiB")
                    base, size = rt.address_range(t.data_ptr())
                    nbytes = t.numel() * t.element_size()
                    if pool.expandable:  # the runtime says: one of the rank's 2 MiB pages, mapped into its range
                        self.assertIn((base, size), [(at, 2 << 20) for at, _ in pool.pages], name)
                        self.assertLessEqual(t.data_ptr() + nbytes, pool.base + len(pool.pages) * (2 << 20), name)
                    else:  # one of the rank's aclrtMalloc segments holds all of it
                        self.assertIn((base, size), [(b, n) for b, n, _ in pool.segments], name)
                        self.assertLessEqual(t.data_ptr() + nbytes, base + size, name)
        return [kv for kv, _ in out]

    def register(self, name: str, kv: Dict[str, Any], kind: str, rank: int) -> Any:
        """Register one prefill rank's caches with the acl sidecar (stage_client.ascend picks how: an aclrtMalloc
        segment by export key, VMM memory by its chunks' shareable handles)."""
        names = sorted(kv, key=lambda n: int(n.split(".")[2]))
        if kind == "mla":
            return register_kv_cache(self.pre.client, name, [list(kv[n]) for n in names], "ascend-mla", heads=1,
                                     acl=self.acl, access="prefill")
        heads = M.kv_heads(self.models[kind])
        lo, hi = rank * heads // TP, (rank + 1) * heads // TP
        return register_kv_cache(self.pre.client, name, [list(kv[n]) for n in names], "ascend", heads=heads,
                                 head_lo=lo, head_hi=hi, acl=self.acl, access="prefill")

    def dec_alloc(self, name: str) -> Tuple[Any, Any]:
        """(empty(shape, dtype) for the decode's caches, the HostArena they live in or None)."""
        arena = HostArena(64 << 20, name)
        self.addCleanup(arena.close)
        return arena.empty, arena

    def sync(self) -> None:
        """The rows written are in memory before a sidecar reads them (torch on the CPU: at once)."""

    def decode_layers(self, empty: Any, kind: str) -> List[Any]:
        """The decode's per-layer caches (vLLM layout, block 16, every head), filled with noise."""
        m = self.models[kind]
        if kind == "mla":
            shape: Tuple[int, ...] = (DEC_BLOCKS, DEC_BLOCK, R.KV_LORA_RANK + R.QK_ROPE_HEAD_DIM)
        else:  # vLLM's (blocks, kv heads, block size, 2 * head size): a token's K then its V
            shape = (DEC_BLOCKS, M.kv_heads(m), DEC_BLOCK, 2 * M.head_size(m))
        # noise: a row the move forgot shows in the tokens
        return [empty(shape, torch.float32).normal_() for _ in range(LAYERS)]

    def decode_cache(self, name: str, kind: str) -> Tuple[List[Any], Any]:
        """The decode's caches in a memfd, registered with the hostmem sidecar."""
        empty, arena = self.dec_alloc(name)
        layers = self.decode_layers(empty, kind)
        preset, heads = ("vllm-mla", 1) if kind == "mla" else ("vllm-packed", M.kv_heads(self.models[kind]))
        kv = register_kv_cache(self.dec.client, name, [[x] for x in layers], preset, heads=heads, arena=arena,
                               access="decode")
        self.addCleanup(kv.close)
        return layers, kv

    def prepare(self, kind: str, mode: str) -> Tuple[str, List[Dict[str, Any]], List[List[int]], List[List[int]]]:
        """(name, each rank's caches from vllm-ascend's runner in ``mode``, prefill and decode block tables)."""
        torch_npu.standin.close()
        held = fakeacl_held()
        self.addCleanup(self.freed, held)  # runs last: after the regions are unregistered and the keys closed
        self.addCleanup(self.acl.close)
        src = self.caches(kind, mode)
        # vLLM's ranks share one block table; the decode has its own
        n_pre, n_dec = -(-PROMPT_LEN // PRE_BLOCK), -(-PROMPT_LEN // DEC_BLOCK)
        ids = table(PRE_BLOCKS, n_pre * PROMPTS, 5)
        pre_tabs = [ids[s * n_pre:(s + 1) * n_pre] for s in range(PROMPTS)]
        ids = table(DEC_BLOCKS, n_dec * PROMPTS, 6)
        dec_tabs = [ids[s * n_dec:(s + 1) * n_dec] for s in range(PROMPTS)]
        return "%s-%s" % (kind, mode.split(":")[1].lower()), src, pre_tabs, dec_tabs

    def freed(self, held: Optional[int]) -> None:
        """Every allocation of the stand-in goes back to the emulated runtime (every free call succeeds)."""
        torch_npu.standin.close()
        if held is not None:
            self.assertEqual(fakeacl_held(), held, "fakeacl resources still held after the caches were freed")

    def write_rows(self, kind: str, src: List[Dict[str, Any]], pre_tabs: List[List[int]], i: int, a: Any,
                   b: Any) -> None:
        """Layer i's rows into every rank's caches at the block table's slots, as vllm-ascend's cache write puts them."""
        heads = M.kv_heads(self.models[kind])
        name = R.layer_name(i)
        for r, kv in enumerate(src):
            kc, vc = kv[name]
            a, b = a.to(torch_npu.standin.real_device(kc)), b.to(torch_npu.standin.real_device(kc))
            lo, hi = r * heads // TP, (r + 1) * heads // TP
            for s in range(PROMPTS):
                blk, slot = where(pre_tabs[s], PRE_BLOCK, PROMPT_LEN)
                if kind == "mla":  # one latent head, on every rank
                    kc[blk, slot, 0] = a[s]
                    vc[blk, slot, 0] = b[s]
                else:
                    kc[blk, slot] = a[s][:, lo:hi]
                    vc[blk, slot] = b[s][:, lo:hi]

    def check_decode(self, kind: str, name: str, logits: Any, dst: List[Any], dec_tabs: List[List[int]]) -> None:
        """The decode reads its rows back through its block tables; greedy tokens must equal the unmoved run's."""
        m = self.models[kind]
        rows = []
        for i in range(LAYERS):
            a, b = [], []
            for s in range(PROMPTS):
                blk, slot = where(dec_tabs[s], DEC_BLOCK, PROMPT_LEN)
                if kind == "mla":
                    x = dst[i][blk, slot]
                    a.append(x[:, :R.KV_LORA_RANK])
                    b.append(x[:, R.KV_LORA_RANK:])
                else:
                    x = dst[i][blk, :, slot]  # (tokens, heads, 2 * head_size): K then V
                    d = M.head_size(m)
                    a.append(x[..., :d])
                    b.append(x[..., d:])
            rows.append((torch.stack(a).cpu().clone(), torch.stack(b).cpu().clone()))
        ref_logits, ref_tokens = self.ref[kind]
        self.assertTrue(torch.equal(logits, ref_logits))
        tokens = M.decode(m, logits, M.rebuild(m, rows), STEPS)
        self.assertTrue(torch.equal(tokens, ref_tokens),
                        "%s: tokens differ from the unmoved run\n%s\n%s" % (name, tokens, ref_tokens))

    def move_by_register(self, kind: str, mode: str) -> None:
        """register_kv_cache(acl=...) per rank; each layer pushed by KVCache.push as soon as it ran."""
        name, src, pre_tabs, dec_tabs = self.prepare(kind, mode)
        kvs = [self.register("pre-%s-r%d" % (name, r), kv, kind, r) for r, kv in enumerate(src)]
        for kv in kvs:
            self.addCleanup(kv.close)
        dst, _ = self.decode_cache("dec-" + name, kind)
        heads = M.kv_heads(self.models[kind])
        tids: List[int] = []

        def on_layer(i: int, a: Any, b: Any) -> None:
            self.write_rows(kind, src, pre_tabs, i, a, b)
            self.sync()  # this layer's rows are written before its pushes read them
            for r, kv in enumerate(kvs):
                if kind == "mla" and r != i % TP:
                    continue  # the latent is on both ranks: layer i comes from rank i % 2
                lo, hi = (0, 1) if kind == "mla" else (r * heads // TP, (r + 1) * heads // TP)
                for s in range(PROMPTS):
                    tids.append(kv.push("decode", "dec-" + name, pre_tabs[s], dec_tabs[s], PROMPT_LEN, layers=[i],
                                        heads=(lo, hi), tag="%s/%d/%d/%d" % (name, i, r, s)))

        logits, _ = M.prefill(self.models[kind], self.prompts, on_layer)
        sts = self.pre.client.wait_all(tids, timeout=60)
        self.assertTrue(all(st.ok and st.done == st.total for st in sts), sts)
        self.check_decode(kind, name, logits, dst, dec_tabs)

    def move_by_connector(self, kind: str, mode: str) -> None:
        """StageConnector: vLLM's calls replayed (tests/vllm_replay.py), push mode, layer by layer, decode first."""
        name, src, pre_tabs, dec_tabs = self.prepare(kind, mode)
        heads = M.kv_heads(self.models[kind])
        dst = self.decode_layers(self.dec_alloc("dec-" + name)[0], kind)
        common = dict(mode="push", kv_heads=heads, timeout_s=30, layerwise=True)
        pe = Engine(self.pre.socket, dict(common, route="decode", peer_name="prefill", acl_library=LIB,
                                          kv_name="%s-pre" % name),
                    heads, src, "%s-pre" % name, "kv_producer")
        self.addCleanup(pe.shutdown)
        de = Engine(self.dec.socket, dict(common, route="prefill", peer_name="decode", kv_name="%s-dec" % name,
                                          kv_layout="vllm-mla" if kind == "mla" else "vllm-packed"),
                    heads, [{R.layer_name(i): t for i, t in enumerate(dst)}], "%s-dec" % name, "kv_consumer")
        self.addCleanup(de.shutdown)
        for e in (pe, de):  # the push tickets travel over the sidecars' link, to the prefill engine's inbox
            self.assertTrue(e.sched.scheduler.link.wait_ready(10))
        preqs = [Request("%s-%d" % (name, s), list(p), {"do_remote_decode": True, "stage_mode": "push",
                                                        "stage_xfer": "%s-x%d" % (name, s)})
                 for s, p in enumerate(self.prompts)]
        dreqs = [Request(r.request_id, r.prompt_token_ids, {"do_remote_prefill": True, "stage_mode": "push",
                                                             "stage_kv": "%s-pre" % name,
                                                             "stage_xfer": "%s-x%d" % (name, s)})
                 for s, r in enumerate(preqs)]
        for s, r in enumerate(dreqs):
            self.assertEqual(de.admit(r, lambda n, s=s: dec_tabs[s]), (PROMPT_LEN, True))
        de.step()
        self.assertTrue(de.sched.scheduler.tickets_posted(10))
        # the step's save_kv_layer must find each push's destination: wait for the decode's tickets (on a
        # loaded machine they can land after the step, and the pushes then start one step later, unordered)
        pe.tickets_in(len(preqs))
        for s, r in enumerate(preqs):
            pe.admit(r, lambda n, s=s: pre_tabs[s])
        so = SchedulerOutput([NewRequestData(r.request_id, r.prompt_token_ids, (pre_tabs[s],), 0)
                              for s, r in enumerate(preqs)],
                             num_scheduled_tokens={r.request_id: PROMPT_LEN for r in preqs})

        def forward(after_layer: Any) -> Any:
            def on_layer(i: int, a: Any, b: Any) -> None:
                self.write_rows(kind, src, pre_tabs, i, a, b)
                after_layer(i)  # the connector's save_kv_layer: this layer's push starts now
            return M.prefill(self.models[kind], self.prompts, on_layer)[0]

        ev = torch_npu.npu.Event
        recorded, waited = ev.recorded, ev.waited
        logits = pe.step(so, forward)
        # save_kv_layer ordered each layer's pushes after the cache write by an NPU event, per rank
        self.assertGreaterEqual(ev.recorded - recorded, LAYERS * TP)
        for s, r in enumerate(preqs):
            self.assertEqual(pe.finish(r, pre_tabs[s]), (True, None))
        pe.until(lambda: len(pe.sent) == len(preqs), 30)
        de.until(lambda: len(de.recvd) == len(dreqs), 30)
        self.assertEqual(de.load_errors, set())
        self.assertGreater(ev.waited - waited, 0, "no push waited on its layer's NPU event")
        self.check_decode(kind, name, logits, dst, dec_tabs)


@unittest.skipIf(WHY, WHY)
@unittest.skipUnless(os.environ.get("STAGE_TEST_ACL_CUDA") == "1", "STAGE_TEST_ACL_CUDA=1 (the library is "
                     "fakeacl_cuda, on a GPU machine) is not set")
@unittest.skipUnless(not WHY and torch.cuda.is_available(), "CUDA is not available to torch")
class TestVLLMAscendGPU(TestVLLMAscend):
    """The same over fakeacl_cuda on GPU 0: vllm-ascend's caches in CUDA memory from the emulated runtime (VMM over
    CUDA's VMM API, or cudaMalloc segments), the acl sidecar over the same library, the decode a cuda sidecar with
    torch CUDA caches (vllm-packed / vllm-mla, block 16) registered by IPC handle. The model runs on the CPU."""

    dec_sidecar = "device: {kind: cuda, ordinal: 0}\n"
    gpu = True

    @classmethod
    def setUpClass(cls) -> None:
        torch_npu.standin.over_cuda(0)
        super().setUpClass()

    def dec_alloc(self, name: str) -> Tuple[Any, Any]:
        return (lambda shape, dtype: torch.empty(shape, dtype=dtype, device="cuda:0")), None

    def sync(self) -> None:
        torch.cuda.synchronize(0)


def _case(kind: str, mode: str, via: str) -> Any:
    def test(self: TestVLLMAscend) -> None:
        getattr(self, "move_by_" + via)(kind, mode)
    test.__doc__ = "%s, %s, through %s: tokens equal the unmoved run" % (kind, mode, via)
    return test


for _kind in M.KINDS:
    for _mode, _m in zip(MODES, ("vmm", "segments")):
        for _via in ("register", "connector"):
            setattr(TestVLLMAscend, "test_%s_%s_%s" % (_kind, _m, _via), _case(_kind, _mode, _via))


if __name__ == "__main__":
    unittest.main()
