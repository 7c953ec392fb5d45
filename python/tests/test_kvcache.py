"""register_kv_cache and HostArena without a sidecar: what gets registered, and the refusals.

A recording stand-in for the Client takes the calls; test_tinylm_e2e runs
the same against real sidecars.
"""

from __future__ import annotations

import os
import sys
import unittest
from typing import Any, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import torch

    WHY = ""
except ImportError:
    torch = None
    WHY = "torch is not installed"

from stage_client import Code, Direction, LayoutError, StageError  # noqa: E402
from stage_client.kv import HostArena, register_kv_cache  # noqa: E402


class Recorder:
    """Takes a Client's register calls; ``fail_on`` names a region whose Register fails."""

    def __init__(self, fail_on: str = "") -> None:
        self.calls: List[Tuple[Any, ...]] = []
        self.regions: List[str] = []
        self.fail_on = fail_on

    def register_memfd(self, name: str, fd: int, alloc_size: int, offset: int, length: int, access: int,
                       ordinal: int = 0) -> None:
        if name == self.fail_on:
            raise StageError(Code.OUT_OF_RANGE, "no")
        self.calls.append(("memfd", name, fd, alloc_size, offset, length))
        self.regions.append(name)

    def register_kv(self, name: str, layout: Any, layers: Any) -> None:
        self.calls.append(("kv", name, layout, [list(x) for x in layers]))

    def unregister(self, name: str) -> None:
        self.regions.remove(name)

    def submit_kv(self, *args: Any, **kw: Any) -> int:
        self.calls.append(("submit", args, kw))
        return 7


@unittest.skipIf(torch is None, WHY)
class TestRegisterKVCache(unittest.TestCase):
    def setUp(self) -> None:
        self.arena = HostArena(4 << 20, "test")
        self.addCleanup(self.arena.close)

    def test_ascend_layers(self) -> None:
        # (layers, 2, blocks, block_size, heads, head_size): K and V of each layer are two regions.
        alloc = self.arena.empty((3, 2, 4, 8, 2, 16), torch.float16)
        self.assertEqual(alloc.data_ptr() % 4096, 0)
        rec = Recorder()
        kv = register_kv_cache(rec, "c", [[alloc[i][0], alloc[i][1]] for i in range(3)], "ascend", heads=4,
                               head_lo=2, head_hi=4)
        per = 4 * 8 * 2 * 16 * 2  # bytes of one of K or V of a layer
        memfds = [c for c in rec.calls if c[0] == "memfd"]
        self.assertEqual([c[1] for c in memfds], ["c/%d/%d" % (i, t) for i in range(3) for t in range(2)])
        self.assertEqual([c[4] for c in memfds], [k * per for k in range(6)])  # offsets in the memfd
        self.assertTrue(all(c[2] == self.arena.fd and c[3] == self.arena.size and c[5] == per for c in memfds))
        name, lay, layers = rec.calls[-1][1:]
        self.assertEqual((name, layers), ("c", kv.regions))
        self.assertEqual((lay.dtype.value, lay.block_size, lay.blocks, lay.head_lo, lay.head_hi), ("f16", 8, 4, 2, 4))
        self.assertEqual([(p.name, p.tensor, p.offset) for p in lay.parts], [("k", 0, 0), ("v", 1, 0)])
        # push/pull pass every layer unless told
        self.assertEqual(kv.pull("r", "peer", [1], [2], 5, tag="t"), 7)
        args, kw = rec.calls[-1][1:]
        self.assertEqual(args, ("r", "c", "peer", [0, 1, 2], [1], [2], 5))
        self.assertEqual(kw, {"direction": Direction.PULL, "tag": "t"})
        kv.close()
        self.assertEqual(rec.regions, [])

    def test_permuted_view_registers_what_it_spans(self) -> None:
        # vLLM HND: the engine's tensor is an NHD-ordered view; the region is the whole layer.
        alloc = self.arena.empty((2, 2, 4, 3, 8, 16), torch.float32)  # (layers, kv, blocks, heads, slot, chan)
        rec = Recorder()
        register_kv_cache(rec, "h", [alloc[i].permute(0, 1, 3, 2, 4) for i in range(2)], "vllm-hnd", heads=3)
        lens = [c[5] for c in rec.calls if c[0] == "memfd"]
        self.assertEqual(lens, [alloc[0].numel() * 4] * 2)
        lay = rec.calls[-1][2]
        self.assertEqual((lay.parts[0].slot_stride, lay.parts[0].head_stride), (16 * 4, 8 * 16 * 4))

    def test_refusals(self) -> None:
        alloc = self.arena.empty((2, 2, 4, 8, 2, 16), torch.float16)
        rec = Recorder()
        with self.assertRaises(LayoutError):  # layer 1 is not shaped like layer 0
            register_kv_cache(rec, "c", [[alloc[0][0], alloc[0][1]], [alloc[1][0][:2], alloc[1][1][:2]]], "ascend",
                              heads=2)
        outside = torch.zeros((2, 2, 4, 8, 2, 16), dtype=torch.float16)
        with self.assertRaises(ValueError) as cm:  # a CPU tensor the hostmem sidecar cannot map
            register_kv_cache(rec, "c", [[alloc[0][0], alloc[0][1]], [outside[1][0], outside[1][1]]], "ascend", heads=2)
        self.assertIn("HostArena", str(cm.exception))
        self.assertEqual(rec.regions, [], "what was registered before the failure stays registered")
        rec = Recorder(fail_on="c/1/0")
        with self.assertRaises(StageError):
            register_kv_cache(rec, "c", [[alloc[i][0], alloc[i][1]] for i in range(2)], "ascend", heads=2)
        self.assertEqual(rec.regions, [])

    def test_arena(self) -> None:
        a = self.arena.empty((10,), torch.uint8)
        b = self.arena.empty((3,), torch.float32)
        self.assertEqual((a.data_ptr() - self.arena.base, b.data_ptr() - self.arena.base), (0, 4096))
        b.fill_(1.0)
        self.assertEqual(self.arena.mm[4096:4100], b"\x00\x00\x80\x3f")  # the memfd holds what the tensor holds
        with self.assertRaises(MemoryError):
            self.arena.empty((4 << 20,), torch.uint8)
        self.assertIsNone(self.arena.offset_of(self.arena.base + self.arena.size - 4, 8))
        self.assertEqual(self.arena.offset_of(self.arena.base + 8, 8), 8)


if __name__ == "__main__":
    unittest.main()
