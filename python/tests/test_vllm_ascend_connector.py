"""stage_client.vllm inside vllm-ascend 0.23, without an NPU: its caches, specs, settings and events, stood in for.

What vllm-ascend 0.23.0.post1 hands a KV connector (read in its source,
``vllm_ascend/worker/model_runner_v1.py`` and ``attention/``):

* per layer a tuple of NPU tensors: ``(K, V)`` each ``(blocks, block_size,
  heads, head_size)``; MLA ``(latent, rope)`` each ``(blocks, block_size,
  1, width)``; sparse MLA (DSA) 3- or 4-tuples;
* KV-cache groups whose specs are its subclasses of vLLM's classes
  (``AscendMLAAttentionSpec(MLAAttentionSpec)``);
* ``save_kv_layer(name, list(kv_cache), attn_metadata)`` with the forward
  context's metadata, a dict by layer name, whose entry may carry a
  ``reshape_cache_event`` (a ``torch.npu.Event``);
* ``kv_transfer_config.engine_id`` rewritten to ``<engine_id>-<uuid>``.

Here the tensors are CPU tensors behind a thin wrapper that reports device
``npu:<index>``, ``torch.npu`` and ``torch_npu`` are small fakes that record
what is asked of them, the ACL object and ``register_npu_tensor`` record
their calls, and the sidecar is a recording client. vLLM's spec classes are
used where vLLM is installed, else stand-ins with the same names.
"""

from __future__ import annotations

import os
import sys
import threading
import types
import unittest
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchenv import torch, TORCH_WHY as WHY  # noqa: E402

from stage_client.kvcache import HostArena, register_kv_cache  # noqa: E402
from stage_client.vllm import KVConnectorRole, PushChunk, StageConnector, StageConnectorMetadata  # noqa: E402
from test_e2e import HAVE_STAGED, SKIP_WHY, pair, stop_all  # noqa: E402
import vllm_replay  # noqa: E402
from vllm_replay import KVTransferConfig, layer_name  # noqa: E402

try:  # vLLM's own spec classes where it is installed
    from vllm.v1.kv_cache_interface import (  # type: ignore
        FullAttentionSpec, MambaSpec, MLAAttentionSpec, SlidingWindowSpec)
    HAVE_SPECS = True
except Exception:  # noqa: BLE001 - stand-ins with the same names and hierarchy
    HAVE_SPECS = False

    class FullAttentionSpec:  # type: ignore[no-redef]
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    class MLAAttentionSpec(FullAttentionSpec):  # type: ignore[no-redef]
        pass

    class HiddenStateCacheSpec(MLAAttentionSpec):  # type: ignore[no-redef]
        pass

    class SlidingWindowSpec:  # type: ignore[no-redef]
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    class MambaSpec:  # type: ignore[no-redef]
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)


def spec(cls: Any, **kw: Any) -> Any:
    """An instance of ``cls`` (vLLM's frozen dataclasses want these fields, the stand-ins take anything)."""
    if not HAVE_SPECS:
        return cls(**kw)
    base = dict(block_size=128, num_kv_heads=kw.pop("num_kv_heads", 1), head_size=kw.pop("head_size", 576),
                dtype=torch.bfloat16)
    if cls is MambaSpec:
        return cls(block_size=128, shapes=((4, 4),), dtypes=(torch.bfloat16,))
    if cls is SlidingWindowSpec:
        return cls(sliding_window=4096, **base)
    return cls(**base)


if HAVE_SPECS:
    from dataclasses import dataclass as _dc

    import vllm.v1.kv_cache_interface as _kvi  # type: ignore

    @_dc(frozen=True, kw_only=True)
    class AscendMLAAttentionSpec(MLAAttentionSpec):  # vllm_ascend/core/kv_cache_interface.py's shape of it
        sparse_head_dim: Optional[tuple] = None

    if hasattr(_kvi, "HiddenStateCacheSpec"):
        HiddenStateCacheSpec = _kvi.HiddenStateCacheSpec
    else:  # an older vLLM: a class of that name (the connector then asks the names)
        @_dc(frozen=True, kw_only=True)
        class HiddenStateCacheSpec(MLAAttentionSpec):  # type: ignore[no-redef]
            pass
else:
    class AscendMLAAttentionSpec(MLAAttentionSpec):  # type: ignore[no-redef]
        sparse_head_dim: Optional[tuple] = None


# ----------------------------------------------------------------------------------------------------------
# NPU tensors, torch.npu, torch_npu, ACL, and the sidecar, stood in for

class FakeDevice:
    def __init__(self, index: int) -> None:
        self.type, self.index = "npu", index

    def __eq__(self, o: object) -> bool:
        return isinstance(o, FakeDevice) and o.index == self.index

    def __repr__(self) -> str:
        return "npu:%d" % self.index


class NPUTensor:
    """A CPU tensor that says it lives on ``npu:<index>``; torch results of its methods are wrapped alike."""

    is_cuda = False

    def __init__(self, t: Any, index: int) -> None:
        self.t, self.device = t, FakeDevice(index)

    def _wrap(self, r: Any) -> Any:
        return NPUTensor(r, self.device.index) if isinstance(r, torch.Tensor) else r

    def __getattr__(self, name: str) -> Any:
        a = getattr(self.t, name)
        if not callable(a):
            return a
        return lambda *args, **kw: self._wrap(a(*[x.t if isinstance(x, NPUTensor) else x for x in args], **kw))

    def __getitem__(self, k: Any) -> Any:
        return self._wrap(self.t[k])


LOG: List[tuple] = []  # what the fakes were asked, in order (events, submits)
LOG_LOCK = threading.Lock()


def note(*what: Any) -> None:
    with LOG_LOCK:
        LOG.append(what)


class FakeEvent:
    """torch.npu.Event: record() and synchronize() are logged with the event's id."""

    made = 0

    def __init__(self) -> None:
        FakeEvent.made += 1
        self.id = FakeEvent.made

    def record(self, stream: Any = None) -> None:
        note("record", self.id)

    def synchronize(self) -> None:
        note("synchronize", self.id)


FAKE_TORCH_NPU = types.SimpleNamespace(Event=FakeEvent, is_available=lambda: True,
                                       set_device=lambda d: note("set_device", d, threading.current_thread().name))


class FakeACL:
    """stage_client.ascend.ACL: records how it was made and whether it was closed."""

    made: List["FakeACL"] = []

    def __init__(self, path: Optional[str] = None, device: int = 0) -> None:
        if path == "/missing/libascendcl.so":
            from stage_client.errors import StageError
            from stage_client.wire import Code
            raise StageError(Code.UNSUPPORTED, "acl: load %s: cannot open shared object file" % path)
        self.path, self.device, self.closed = path, device, False
        FakeACL.made.append(self)

    def close(self) -> None:
        note("acl-close", self.device)
        self.closed = True


class Sub:
    def __init__(self) -> None:
        self.closed = threading.Event()

    def get(self, timeout: float) -> Any:
        from stage_client.errors import SidecarConnectionError
        if self.closed.wait(min(timeout, 0.05)):
            raise SidecarConnectionError("closed")
        return None

    def close(self) -> None:
        self.closed.set()


class FakeClient:
    """The sidecar's client: records registrations and submits; every transfer ends at once."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        self.kv: Dict[str, Any] = {}
        self.unregistered: List[str] = []
        self.next = 0

    def subscribe(self) -> Sub:
        return Sub()

    def register_kv(self, name: str, layout: Any, regions: Any) -> None:
        self.kv[name] = (layout, regions)

    def guard_kv(self, name: str) -> None:
        self.guarded = name

    def grant(self, *a: Any, **kw: Any) -> None:
        pass

    def revoke_grant(self, *a: Any, **kw: Any) -> None:
        pass

    def unregister(self, name: str, wait: Optional[float] = None) -> None:
        note("unregister", name)
        self.unregistered.append(name)

    def submit_kv(self, route: str, name: str, remote: str, layers: Any, *a: Any, **kw: Any) -> int:
        note("submit", tuple(layers))
        self.next += 1
        return self.next

    def wait_future(self, tid: int, timeout: float) -> Future:
        f: Future = Future()
        f.set_result(None)
        return f

    def cancel(self, tid: int) -> None:
        pass

    def close(self) -> None:
        pass


REGISTERED: List[tuple] = []


def fake_register_npu_tensor(client: Any, acl: Any, name: str, tensor: Any, access: int, *,
                             ordinal: Optional[int] = None, **kw: Any) -> None:
    REGISTERED.append((acl, name, tensor.device.type, ordinal))


# ----------------------------------------------------------------------------------------------------------
# vllm-ascend's config and caches

class ModelConfig(vllm_replay.ModelConfig):
    def __init__(self, kv_heads: int, use_mla: bool = False) -> None:
        super().__init__(kv_heads)
        self.use_mla = use_mla  # vLLM's ModelConfig.use_mla


@dataclass
class Config:
    kv_transfer_config: KVTransferConfig
    model_config: ModelConfig
    parallel_config: Any = field(default_factory=lambda: types.SimpleNamespace(tensor_parallel_size=1))
    cache_config: Any = field(default_factory=lambda: types.SimpleNamespace(block_size=128))
    additional_config: Dict[str, Any] = field(default_factory=dict)
    quant_config: Any = None


LAYERS, BLOCKS, BS = 3, 6, 128


def config(extra: Optional[Dict[str, Any]] = None, heads: int = 4, mla: bool = False, tp: int = 1,
           engine_id: str = "prefill-0", patched: bool = False, role: str = "kv_producer", **kw: Any) -> Config:
    e = dict(socket="/nonexistent/staged.sock", kv_name="pre", tp_size=tp)
    e.update(extra or {})
    e = {k: v for k, v in e.items() if v is not None}  # None: the key not given
    ktc = KVTransferConfig(e, role, engine_id=engine_id)
    if patched:  # what vllm_ascend/platform.py does to it
        ktc.engine_id = engine_id + "-0123456789abcdef0123456789abcdef"
        ktc._engine_id_patched = True  # type: ignore[attr-defined]
    return Config(ktc, ModelConfig(heads, mla), **kw)


def mha_caches(heads: int = 4, hd: int = 16, index: int = 0) -> Dict[str, Any]:
    """(K, V) per layer, each (blocks, block_size, heads, head_size), as _reshape_kv_cache_tensors views them."""
    out = {}
    for i in range(LAYERS):
        k = torch.zeros((BLOCKS, BS, heads, hd), dtype=torch.bfloat16)
        v = torch.zeros((BLOCKS, BS, heads, hd), dtype=torch.bfloat16)
        out[layer_name(i)] = (NPUTensor(k, index), NPUTensor(v, index))
    return out


def mla_caches(index: int = 0, extra: int = 0) -> Dict[str, Any]:
    """(latent, rope) per layer, (blocks, block_size, 1, 512) and (blocks, block_size, 1, 64); ``extra`` indexer
    tensors make it sparse MLA (DSA)."""
    out = {}
    for i in range(LAYERS):
        ts = [torch.zeros((BLOCKS, BS, 1, 512), dtype=torch.bfloat16),
              torch.zeros((BLOCKS, BS, 1, 64), dtype=torch.bfloat16)]
        ts += [torch.zeros((BLOCKS, BS, 1, 128), dtype=torch.bfloat16) for _ in range(extra)]
        out[layer_name(i)] = tuple(NPUTensor(t, index) for t in ts)
    return out


def groups(*specs: Any) -> Any:
    return types.SimpleNamespace(kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=s, layer_names=[])
                                                  for s in specs])


@unittest.skipIf(torch is None, WHY)
class TestVLLMAscend(unittest.TestCase):
    def setUp(self) -> None:
        FakeACL.made.clear()
        REGISTERED.clear()
        del LOG[:]
        for target, new in (("stage_client.vllm.worker.Client", FakeClient),
                            ("stage_client.ascend.ACL", FakeACL),
                            ("stage_client.ascend.register_npu_tensor", fake_register_npu_tensor)):
            p = mock.patch(target, new)
            p.start()
            self.addCleanup(p.stop)
        p = mock.patch.object(torch, "npu", FAKE_TORCH_NPU, create=True)
        p.start()
        self.addCleanup(p.stop)

    def worker(self, cfg: Config, kv_cache_config: Any = None) -> StageConnector:
        c = StageConnector(cfg, KVConnectorRole.WORKER, kv_cache_config)
        self.addCleanup(c.shutdown)
        return c

    def test_npu_caches_register_through_acl(self) -> None:
        w = self.worker(config(), groups(spec(FullAttentionSpec, num_kv_heads=4, head_size=16)))
        w.register_kv_caches(mha_caches(index=3))
        self.assertEqual(len(FakeACL.made), 1, "one ACL object per worker")
        acl = FakeACL.made[0]
        self.assertEqual((acl.path, acl.device), ("libascendcl.so", 3))
        self.assertEqual(len(REGISTERED), 2 * LAYERS)  # K and V of every layer
        self.assertTrue(all(r[0] is acl and r[2] == "npu" for r in REGISTERED), REGISTERED)
        layout, regions = w.worker.client.kv["pre-tp0"]
        self.assertEqual((layout.block_size, layout.heads, [p.name for p in layout.parts]), (BS, 4, ["k", "v"]))
        w.shutdown()
        self.assertTrue(acl.closed)
        # the key is closed after the sidecar let go of the regions
        self.assertLess(max(i for i, e in enumerate(LOG) if e[0] == "unregister"),
                        LOG.index(("acl-close", 3)))

    def test_acl_library_setting(self) -> None:
        w = self.worker(config({"acl_library": "/usr/local/Ascend/lib64/libascendcl.so"}))
        w.register_kv_caches(mha_caches())
        self.assertEqual(FakeACL.made[0].path, "/usr/local/Ascend/lib64/libascendcl.so")

    def test_acl_library_missing(self) -> None:
        from stage_client.errors import StageError
        w = self.worker(config({"acl_library": "/missing/libascendcl.so"}))
        with self.assertRaisesRegex(StageError, "acl_library"):
            w.register_kv_caches(mha_caches())
        self.assertEqual(REGISTERED, [])

    def test_mla_one_head_ascend_mla(self) -> None:
        from stage_client.kvderive import preset
        cfg = config(heads=128, mla=True, tp=2, extra={"tp_rank": 1})
        w = self.worker(cfg, groups(spec(AscendMLAAttentionSpec)))
        self.assertEqual(w.cfg.kv_heads, 1, "MLA keeps one latent row per token, not the model's 128 kv heads")
        w.register_kv_caches(mla_caches())
        layout, _ = w.worker.client.kv["pre-tp1"]
        self.assertEqual(layout, preset("ascend-mla", dtype="bf16", blocks=BLOCKS, block_size=BS))
        self.assertEqual((layout.heads, layout.head_lo, layout.head_hi), (1, 0, 1))

    def test_mla_heads_set_other_than_one_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "kv_heads"):
            StageConnector(config({"kv_heads": 128}, mla=True), KVConnectorRole.SCHEDULER, None)

    def test_nz_settings_refused(self) -> None:
        cases = [
            (dict(additional_config={"enable_kv_nz": True}), "enable_kv_nz"),
            (dict(quant_config=types.SimpleNamespace(quant_description={"kv_cache_type": "C8"})), "C8"),
            (dict(quant_config=types.SimpleNamespace(enable_c8_quant=True, quant_description={})), "C8"),
        ]
        for kw, want in cases:
            with self.subTest(want=want):
                w = self.worker(config(mla=False, **kw))
                with self.assertRaisesRegex(ValueError, want):
                    w.register_kv_caches(mha_caches())
                self.assertEqual(REGISTERED, [], "refused before any region is registered")

    def test_nz_format_refused(self) -> None:
        formats = {"fmt": 29}
        fake = types.SimpleNamespace(get_npu_format=lambda t: formats["fmt"])
        with mock.patch.dict(sys.modules, {"torch_npu": fake}):
            w = self.worker(config())
            with self.assertRaisesRegex(ValueError, "FRACTAL_NZ"):
                w.register_kv_caches(mha_caches())
            formats["fmt"] = 2  # ACL_FORMAT_ND
            w.register_kv_caches(mha_caches())
        self.assertEqual(len(REGISTERED), 2 * LAYERS)

    def test_sparse_mla_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "sparse MLA"):
            StageConnector(config(mla=True), KVConnectorRole.SCHEDULER,
                           groups(spec_sparse()))
        for extra in (1, 2):  # (latent, rope, indexer k) and (..., indexer scale)
            with self.subTest(tensors=2 + extra):
                w = self.worker(config(mla=True))
                with self.assertRaisesRegex(ValueError, "sparse MLA"):
                    w.register_kv_caches(mla_caches(extra=extra))

    def test_sparse_model_refused_at_start(self) -> None:
        cfg = config(mla=True)
        cfg.model_config.hf_text_config = types.SimpleNamespace(index_topk=2048)  # DeepSeek-V3.2's indexer
        for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
            with self.subTest(role=role), self.assertRaisesRegex(ValueError, "sparse MLA"):
                StageConnector(cfg, role, groups(spec(AscendMLAAttentionSpec)))

    def test_other_mla_caches_refused(self) -> None:
        v4 = spec(AscendMLAAttentionSpec)
        object.__setattr__(v4, "compress_ratio", 4)
        for s, want in ((v4, "compressed MLA"), (spec(HiddenStateCacheSpec), "hidden-state cache")):
            with self.subTest(want=want), self.assertRaisesRegex(ValueError, want):
                StageConnector(config(mla=True), KVConnectorRole.SCHEDULER, groups(s))

    def test_hybrid_and_mamba_refused(self) -> None:
        full = spec(FullAttentionSpec, num_kv_heads=4, head_size=16)
        for specs, want in (((full, spec(SlidingWindowSpec, num_kv_heads=4, head_size=16)),
                             "hybrid model .*sliding-window attention.*kernel blocks of 128"),
                            ((full, spec(MambaSpec)), "attention\\+Mamba model"),
                            ((spec(MambaSpec),), "attention\\+Mamba model")):
            for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
                with self.subTest(want=want, role=role):
                    with self.assertRaisesRegex(ValueError, want):
                        StageConnector(config(), role, groups(*specs))

    def test_kv_name_under_vllm_ascend(self) -> None:
        extra = {"kv_name": None}
        with self.assertLogs("stage_client" if not _have_vllm() else "vllm", "WARNING") as cm:
            c = StageConnector(config(extra, patched=True), KVConnectorRole.SCHEDULER, None)
        c.shutdown()
        self.assertTrue(any("kv_name" in m and "engine_id" in m for m in cm.output), cm.output)
        self.assertTrue(c.cfg.kv_name.startswith("prefill-0-"))
        # kv_name given: no warning
        with mock.patch("stage_client.vllm.config.log") as log:
            c = StageConnector(config({"kv_name": "pre"}, patched=True), KVConnectorRole.SCHEDULER, None)
            c.shutdown()
        log.warning.assert_not_called()

    def push_step(self, attn_metadata: Any) -> StageConnector:
        w = self.worker(config(role="kv_producer"))
        caches = mha_caches(index=2)
        w.register_kv_caches(caches)
        meta = StageConnectorMetadata()
        meta.push.append(PushChunk("r1", "x1", [0, 1], 0, 200,
                                   {"peer": "", "kv": "dec", "tp": 1, "block_ids": [4, 5], "first": 0,
                                    "tokens": 200}))
        w.bind_connector_metadata(meta)
        name = layer_name(1)
        del LOG[:]
        w.save_kv_layer(name, list(caches[name]), attn_metadata)  # as vllm_ascend/attention/utils.py calls it
        self.assertTrue(w.worker.mover.drain(5))
        return w

    def waited(self) -> List[tuple]:
        """LOG with the mover thread's binding to the NPU checked and taken out."""
        binds = [e for e in LOG if e[0] == "set_device"]
        self.assertEqual(len(binds), 1, LOG)
        self.assertEqual(binds[0][1], 2, "the mover thread is bound to the cache's NPU")
        self.assertTrue(binds[0][2].startswith("stage-mover"), binds)
        self.assertLess(LOG.index(binds[0]), [e[0] for e in LOG].index("synchronize"))
        return [e for e in LOG if e[0] != "set_device"]

    def test_layerwise_push_waits_for_npu_event(self) -> None:
        self.push_step({layer_name(1): types.SimpleNamespace(reshape_cache_event=None)})
        ev = FakeEvent.made
        self.assertEqual(self.waited(), [("record", ev), ("synchronize", ev), ("submit", (1,))])

    def test_layerwise_push_waits_for_reshape_cache_event(self) -> None:
        ev = FakeEvent()
        before = FakeEvent.made
        self.push_step({layer_name(1): types.SimpleNamespace(reshape_cache_event=ev)})
        self.assertEqual(FakeEvent.made, before, "vllm-ascend's own event is used, no new one")
        self.assertEqual(self.waited(), [("synchronize", ev.id), ("submit", (1,))])


@unittest.skipIf(torch is None, WHY)
@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestAscendMLAThroughSidecars(unittest.TestCase):
    """vllm-ascend's MLA pair, 4-D (blocks, 128, 1, 512) + (blocks, 128, 1, 64), pushed by two real hostmem
    sidecars into vLLM's (blocks, 16, 576): every token's latent|rope row lands where the decode's table says."""

    def test_ascend_mla_to_vllm_mla(self) -> None:
        pre, dec = pair()
        self.addCleanup(lambda: self.assertIsNone(stop_all([pre, dec])))
        layers, n = 2, 200
        ptab, dtab = [2, 0], [17, 3, 9, 0, 12, 5, 14, 1, 8, 11, 2, 16, 6]  # 2 blocks of 128, 13 of 16
        pa, da = HostArena(8 << 20, "mla-pre"), HostArena(8 << 20, "mla-dec")
        self.addCleanup(pa.close)
        self.addCleanup(da.close)
        g = torch.Generator().manual_seed(5)
        lat, rope = pa.empty((layers, 3, 128, 1, 512), torch.float16), pa.empty((layers, 3, 128, 1, 64), torch.float16)
        lat.copy_(torch.randn(lat.shape, generator=g))
        rope.copy_(torch.randn(rope.shape, generator=g))
        out = da.empty((layers, 18, 16, 576), torch.float16)
        out.zero_()
        src = register_kv_cache(pre.client, "mla-pre", [[lat[i], rope[i]] for i in range(layers)], "ascend-mla",
                                heads=1, arena=pa, access="prefill")
        self.addCleanup(src.close)
        dst = register_kv_cache(dec.client, "mla-dec", [[out[i]] for i in range(layers)], "vllm-mla", heads=1,
                                arena=da, access="decode")
        self.addCleanup(dst.close)
        st = pre.client.wait(src.push("decode", "mla-dec", ptab, dtab, n), timeout=60)
        self.assertTrue(st.ok, st)
        t = torch.arange(n)
        want = torch.cat([lat[:, torch.tensor(ptab)[t // 128], t % 128, 0],
                          rope[:, torch.tensor(ptab)[t // 128], t % 128, 0]], -1)
        self.assertTrue(torch.equal(out[:, torch.tensor(dtab)[t // 16], t % 16], want))


def spec_sparse() -> Any:
    s = spec(AscendMLAAttentionSpec)
    object.__setattr__(s, "sparse_head_dim", (512, 64, 128))
    return s


def _have_vllm() -> bool:
    from stage_client.vllm import HAVE_VLLM
    return HAVE_VLLM


if __name__ == "__main__":
    unittest.main()
