"""Every memfd the client makes for a hostmem sidecar is sealed against shrinking (issue 35, item 1).

A sidecar refuses a memfd its owner could truncate: truncating memory the
sidecar copies from would fault its copies. So each place the client makes
one (``PagedKV.hostmem``, ``HostArena``, ``hostmap.SharedPages``) seals it
with F_SEAL_SHRINK and F_SEAL_GROW, and ``ftruncate`` on it fails.
"""

from __future__ import annotations

import fcntl
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from stage_client import PagedKV  # noqa: E402
from torchenv import TORCH_WHY, torch  # noqa: E402

WANT = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


class _Recorder:
    """Takes register_memfd calls and records the fds."""

    def __init__(self) -> None:
        self.fds: list = []

    def register_memfd(self, name, fd, alloc_size, offset, length, access):  # type: ignore[no-untyped-def]
        self.fds.append(fd)

    def unregister(self, name, wait=None):  # type: ignore[no-untyped-def]
        pass


class TestSealed(unittest.TestCase):
    def assertSealed(self, fd: int, size: int) -> None:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        self.assertEqual(seals & WANT, WANT, "seals %#x, want F_SEAL_SHRINK|F_SEAL_GROW" % seals)
        self.assertEqual(os.fstat(fd).st_size, size)
        with self.assertRaises(PermissionError, msg="ftruncate of a sealed memfd must fail"):
            os.ftruncate(fd, 0)

    def test_sealed_memfd(self) -> None:
        from stage_client.kvcache import sealed_memfd

        fd = sealed_memfd("a/b", 1 << 16)
        self.addCleanup(os.close, fd)
        self.assertSealed(fd, 1 << 16)

    def test_paged_kv_hostmem(self) -> None:
        rec = _Recorder()
        kv = PagedKV.hostmem(rec, "seal-kv", 2, 4, 1024)  # type: ignore[arg-type]
        self.addCleanup(kv.close)
        self.assertTrue(rec.fds and all(fd == kv.fd for fd in rec.fds))
        self.assertSealed(kv.fd, 2 * 4096 + 2 * 4 * 1024)

    @unittest.skipIf(torch is None, TORCH_WHY)
    def test_host_arena(self) -> None:
        from stage_client.kvcache import HostArena

        arena = HostArena(1 << 20, "seal-arena")
        self.addCleanup(arena.close)
        self.assertSealed(arena.fd, 1 << 20)

    @unittest.skipIf(torch is None, TORCH_WHY)
    def test_shared_pages(self) -> None:
        from stage_client.hostmap import share_in_place

        buf = torch.zeros(40 << 20, dtype=torch.uint8)  # 40 MiB: above malloc's mmap threshold, however far it rose
        shared = share_in_place([buf], "seal-hostmap")
        self.addCleanup(lambda: [s.close() for s in shared])
        for sp in shared:
            self.assertSealed(sp.fd, sp.size)


if __name__ == "__main__":
    unittest.main()
