"""An unregistered CUDA tensor's memory goes back to torch (real torch, a
CUDA staged); skipped without torch, CUDA or a staged binary.

``register_tensor`` exports through ``_share_cuda_``, which arms torch's
producer-side IPC counter; a freed storage whose counter is above 0 stays
in torch's "limbo" and never goes back to the caching allocator. The client
gives the counter back after a confirmed unregister (stage_client/cuda.py,
"Lifetime"); these tests check on a GPU that ``torch.cuda.memory_reserved()``
then comes back to what it was before the allocation, for a tensor
registered as one region and as two views of one allocation, and show,
beside them, that a tensor unregistered the old way (no counter given back)
stays held.

GPU: STAGE_GPU_SRC (default 0). Run:
``cd python && STAGED=$PWD/../bin/staged python3 -m unittest -v tests.test_torch_limbo``
(and ``python3 examples/torch_ipc_counter_probe.py`` for torch's counters
themselves).
"""

from __future__ import annotations

import os
import sys
import unittest
from typing import Any, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchenv import CUDA_WHY as WHY, HAVE_CUDA, torch  # noqa: E402

from test_e2e import HAVE_STAGED, SKIP_WHY, Staged  # noqa: E402
from stage_client import Access, wire  # noqa: E402
from stage_client.cuda import IpcRef, export_tensor, ipc_counter_value  # noqa: E402

GPU = int(os.environ.get("STAGE_GPU_SRC", "0"))
SIZE = 256 << 20  # in a segment of its own: the caching allocator rounds large requests to 2 MiB
SLACK = 2 << 20  # what memory_reserved may differ by afterwards


def counter(ref: Optional[IpcRef]) -> Optional[int]:
    """torch's counter for ref, or None when its file cannot be read here."""
    if ref is None:
        return None
    try:
        return ipc_counter_value(ref)
    except (OSError, ValueError):
        return None


@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
@unittest.skipUnless(HAVE_CUDA, WHY)
class TorchLimbo(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.dev = torch.device("cuda", GPU)
        torch.cuda.init()
        cls.staged = Staged("limbo", extra="device: {kind: cuda, ordinal: %d}\n" % GPU)
        cls.c = cls.staged.client

    @classmethod
    def tearDownClass(cls) -> None:
        cls.staged.stop()  # closes the client too

    def reserved(self) -> int:
        torch.cuda.synchronize(self.dev)
        torch.cuda.ipc_collect()
        torch.cuda.empty_cache()
        return int(torch.cuda.memory_reserved(self.dev))

    def allocate(self) -> Any:
        t = torch.empty(SIZE, dtype=torch.uint8, device=self.dev)
        t.fill_(0x5A)
        return t

    def check_returned(self, base: int, what: str) -> None:
        after = self.reserved()
        print("\n%s: memory_reserved %d MiB before the allocation, %d MiB after it was unregistered and freed"
              % (what, base >> 20, after >> 20), file=sys.stderr)
        self.assertLessEqual(after, base + SLACK, "%s: %d MiB still reserved by torch after unregister, del, "
                                                  "ipc_collect, empty_cache (%d MiB before)"
                             % (what, (after - base) >> 20, base >> 20))

    def mappings(self) -> int:
        return int(self.c.stats()["mappings"])

    def test_one_region(self) -> None:
        base = self.reserved()
        t = self.allocate()
        self.assertGreaterEqual(self.reserved() - base, SIZE)
        ex = self.c.register_tensor("limbo/one", t, Access.ALL, ordinal=GPU)
        if ex.exact_alloc_size:
            self.assertEqual(ex.alloc_size, SIZE, "the tensor is not alone in its segment")
        self.assertIsNotNone(ex.ipc_ref, "torch's _share_cuda_ armed no IPC counter")
        self.assertIn(counter(ex.ipc_ref), (1, None))
        self.assertEqual(self.mappings(), 1)
        self.c.unregister("limbo/one")
        self.assertEqual(self.mappings(), 0)
        self.assertIn(counter(ex.ipc_ref), (0, None))
        del t
        self.check_returned(base, "one region")

    def test_two_views_of_one_allocation(self) -> None:
        base = self.reserved()
        t = self.allocate()
        views = [t[: SIZE // 2], t[SIZE // 2:]]
        exs = [self.c.register_tensor("limbo/view%d" % i, v, Access.ALL, ordinal=GPU) for i, v in enumerate(views)]
        refs: List[Optional[IpcRef]] = [ex.ipc_ref for ex in exs]
        self.assertNotEqual((refs[0].handle, refs[0].offset), (refs[1].handle, refs[1].offset),
                            "two _share_cuda_ calls gave one counter")
        self.assertEqual(self.mappings(), 1)  # one import for both
        self.c.unregister("limbo/view0")
        self.assertEqual(self.mappings(), 1)  # view1 still uses it
        self.assertIn(counter(refs[0]), (0, None))
        self.assertIn(counter(refs[1]), (1, None))
        self.c.unregister("limbo/view1")
        self.assertEqual(self.mappings(), 0)
        self.assertIn(counter(refs[1]), (0, None))
        del views, t
        self.check_returned(base, "two views")

    def test_zz_unregistered_the_old_way_stays_held(self) -> None:
        # The control: registered by handle and unregistered without giving
        # the counter back (what register_tensor did before). Its 256 MiB
        # stay in torch's limbo for the rest of this process; it runs last.
        base = self.reserved()
        t = self.allocate()
        ex = export_tensor(t)
        self.c.register_cuda_ipc("limbo/old", ex.handle, ex.alloc_size, ex.offset, ex.length, Access.ALL, ordinal=GPU)
        self.c._call(lambda r: wire.Unregister(req=r, name="limbo/old"))
        self.assertIn(counter(ex.ipc_ref), (1, None))
        del t
        held = self.reserved() - base
        print("\nthe old way: %d MiB still reserved after unregister, del, ipc_collect, empty_cache" % (held >> 20),
              file=sys.stderr)
        self.assertGreaterEqual(held, SIZE, "torch gave the memory back without its IPC counter: the fix is moot")


if __name__ == "__main__":
    unittest.main()
