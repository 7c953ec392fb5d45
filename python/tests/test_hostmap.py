"""hostmap.share_in_place: an engine's CPU tensors moved into a memfd where they are, nothing else changed."""

from __future__ import annotations

import mmap
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from torchenv import TORCH_WHY, torch  # noqa: E402


@unittest.skipIf(torch is None, TORCH_WHY)
class TestShareInPlace(unittest.TestCase):
    def test_views_keep_working_and_share_the_memfd(self) -> None:
        from stage_client import kvcache
        from stage_client.hostmap import share_in_place

        buf = torch.arange(40 << 18, dtype=torch.int32)  # 40 MiB: malloc's own mapping, not page-aligned
        views = [buf.view(16, -1)[2:5], buf.view(16, -1)[9]]
        before = [v.clone() for v in views]
        shared = share_in_place(views, "test-hostmap")
        self.addCleanup(lambda: [s.close() for s in shared])
        self.assertEqual(len(shared), 1, "two views of one storage: one memfd")
        sp = shared[0]
        self.assertIn(sp, set(kvcache._ARENAS), "register_kv_cache must find the tensors inside it")
        self.assertEqual(sp.base % mmap.PAGESIZE, 0)
        for v, b in zip(views, before):
            self.assertTrue(torch.equal(v, b), "contents changed")
        off = sp.offset_of(buf.data_ptr(), buf.numel() * 4)
        self.assertIsNotNone(off)
        m = mmap.mmap(sp.fd, sp.size)
        self.addCleanup(m.close)
        buf[7] = 123456  # the engine writes: the memfd (what the sidecar maps) sees it
        self.assertEqual(int.from_bytes(m[off + 28:off + 32], "little"), 123456)
        m[off + 32:off + 36] = (654321).to_bytes(4, "little")  # the sidecar writes: the engine's tensor sees it
        self.assertEqual(int(buf[8]), 654321)
        self.assertEqual(share_in_place(views, "again"), [], "pages already shared are left alone")

    def test_separate_storages(self) -> None:
        from stage_client.hostmap import share_in_place

        a, b = torch.ones(40 << 18), torch.zeros(40 << 18)
        shared = share_in_place([a, b], "test-two")
        self.addCleanup(lambda: [s.close() for s in shared])
        self.assertIn(len(shared), (1, 2), "two storages: one memfd each, or one over both where they touch")
        for t in (a, b):
            n = t.numel() * t.element_size()
            self.assertTrue(any(sp.offset_of(t.data_ptr(), n) is not None for sp in shared), "a storage left out")
        self.assertTrue(bool(a.eq(1).all()) and bool(b.eq(0).all()))

    def test_heap_allocation_refused(self) -> None:
        """A small tensor shares heap pages with other allocations: replacing them would corrupt the heap."""
        from stage_client.hostmap import share_in_place

        keep = [torch.ones(1000) for _ in range(64)]  # heap neighbours
        small = torch.ones(2000)
        with self.assertRaisesRegex(ValueError, "cannot be shared in place"):
            share_in_place([small], "test-small")
        self.assertTrue(bool(small.eq(1).all()) and all(bool(k.eq(1).all()) for k in keep))


if __name__ == "__main__":
    unittest.main()
