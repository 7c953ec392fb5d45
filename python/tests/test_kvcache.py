"""register_kv_cache and HostArena without a sidecar: what gets registered, and the refusals.

A recording stand-in for the Client takes the calls; test_tinylm_e2e runs
the same against real sidecars. TestKVCacheAccess checks, with two real
sidecars, that a peer's raw byte-range push or pull into a KV cache gets
only what the cache's role grants.
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

from stage_client import Access, Block, Code, Direction, LayoutError, StageError  # noqa: E402
from stage_client.kv import HostArena, register_kv_cache  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_e2e import GUARD, HAVE_STAGED, SKIP_WHY, Mem, pair, stop_all  # noqa: E402

LOCAL = Access.LOCAL_READ | Access.LOCAL_WRITE


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
        self.calls.append(("memfd", name, fd, alloc_size, offset, length, access))
        self.regions.append(name)

    def register_kv(self, name: str, layout: Any, layers: Any) -> None:
        self.calls.append(("kv", name, layout, [list(x) for x in layers]))

    def unregister(self, name: str, wait: Any = None) -> None:
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

    def test_access_by_role(self) -> None:
        # Least privilege: no peer gets in unless the role says so.
        alloc = self.arena.empty((1, 2, 4, 8, 2, 16), torch.float16)
        for access, want in [
            (None, LOCAL),
            ("local", LOCAL),
            ("prefill", LOCAL | Access.REMOTE_READ),
            ("kv_producer", LOCAL | Access.REMOTE_READ),
            ("decode", LOCAL | Access.REMOTE_WRITE),
            ("kv_consumer", LOCAL | Access.REMOTE_WRITE),
            ("kv_both", Access.ALL),
            (Access.LOCAL_READ | Access.REMOTE_READ, Access.LOCAL_READ | Access.REMOTE_READ),
            ("producer", "is no role; give one of local, prefill"),
            (0, "give a role"),
            (0x10, "give a role"),
        ]:
            with self.subTest(access=access):
                rec = Recorder()
                kw = {} if access is None else {"access": access}
                args = (rec, "c", [[alloc[0][0], alloc[0][1]]], "ascend")
                if isinstance(want, str):
                    with self.assertRaises(ValueError) as cm:
                        register_kv_cache(*args, heads=2, **kw)
                    self.assertIn(want, str(cm.exception))
                    self.assertEqual(rec.calls, [], "nothing is registered")
                    continue
                kv = register_kv_cache(*args, heads=2, **kw)
                self.assertEqual([c[6] for c in rec.calls if c[0] == "memfd"], [want, want])
                self.assertEqual(kv.access, want)

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


@unittest.skipIf(torch is None, WHY)
@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestKVCacheAccess(unittest.TestCase):
    """A peer's raw byte-range ops into a KV cache's regions get only what its access grants."""

    def raw(self, direction: int, local: str, remote: str, n: int) -> Code:
        """The code a raw transfer of n bytes between the prefill's ``local`` and the decode's ``remote`` ends with."""
        c = self.pre.client
        try:
            c.wait(c.submit("decode", direction, [Block(0, 0, n)], local, remote), timeout=30)
        except StageError as e:
            return e.code
        return Code.OK

    def stopped(self) -> None:
        why = stop_all([self.pre, self.dec])
        self.assertIsNone(why)

    def test_hostile_raw_ops(self) -> None:
        self.pre, self.dec = pair()
        self.addCleanup(self.stopped)  # last, after the regions below are gone
        arena = HostArena(1 << 20, "victim")
        self.addCleanup(arena.close)
        mem = Mem("attacker", 1 << 16)
        self.addCleanup(mem.close)
        mem.fill(3)
        self.pre.client.register_memfd("attacker", mem.fd, mem.size, GUARD, mem.length, Access.ALL)
        self.addCleanup(self.pre.client.unregister, "attacker")
        denied, ok = Code.ACCESS_DENIED, Code.OK
        # the decode's cache, by the role it is registered for: (push into it, pull from it)
        for i, (access, push, pull) in enumerate([
            (None, denied, denied),  # the default: no peer gets in
            ("prefill", denied, ok),
            ("kv_producer", denied, ok),
            ("decode", ok, denied),
            ("kv_consumer", ok, denied),
            ("kv_both", ok, ok),
        ]):
            with self.subTest(access=access):
                alloc = arena.empty((1, 2, 4, 8, 2, 16), torch.float16)
                alloc.fill_(7.0)
                kw = {} if access is None else {"access": access}
                kv = register_kv_cache(self.dec.client, "victim%d" % i, [[alloc[0][0], alloc[0][1]]], "ascend",
                                       heads=2, arena=arena, **kw)
                self.addCleanup(kv.close)
                region, n = kv.regions[0][0], alloc[0][0].numel() * 2
                before = alloc.clone()
                self.assertEqual(self.raw(Direction.PUSH, "attacker", region, n), push, "raw push into " + region)
                if push != ok:
                    self.assertTrue(torch.equal(alloc, before), "a refused push changed the cache")
                self.assertEqual(self.raw(Direction.PULL, "attacker", region, n), pull, "raw pull from " + region)


if __name__ == "__main__":
    unittest.main()
