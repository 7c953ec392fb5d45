"""PagedKV's block arithmetic (no sidecar needed)."""

from __future__ import annotations

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stage_client import PagedKV, coalesce, wire  # noqa: E402
from stage_client.wire import LocalOp  # noqa: E402


class TestCoalesce(unittest.TestCase):
    def test_runs(self) -> None:
        self.assertEqual(coalesce([], []), [])
        self.assertEqual(coalesce([5], [9]), [(5, 9, 1)])
        self.assertEqual(coalesce([0, 1, 2, 3], [10, 11, 12, 13]), [(0, 10, 4)])
        # A break on either side ends the run.
        self.assertEqual(coalesce([0, 1, 2, 5, 6], [10, 11, 20, 21, 22]), [(0, 10, 2), (2, 20, 1), (5, 21, 2)])
        # Order is kept: descending ids never merge.
        self.assertEqual(coalesce([3, 2, 1], [3, 2, 1]), [(3, 3, 1), (2, 2, 1), (1, 1, 1)])
        # Repeats do not merge.
        self.assertEqual(coalesce([1, 1], [2, 3]), [(1, 2, 1), (1, 3, 1)])
        with self.assertRaises(ValueError):
            coalesce([1, 2], [1])


class FakeClient:
    """Records submits instead of talking to a sidecar."""

    def __init__(self) -> None:
        self.subs: list = []

    def submit(self, route, direction, ops, local, remote, tag, checksum, peer=""):  # type: ignore[no-untyped-def]
        self.subs.append((route, direction, list(ops), list(local), list(remote), tag, checksum))
        return len(self.subs)


class TestPlan(unittest.TestCase):
    def kv(self, regions: int = 3, blocks: int = 16, bb: int = 1024) -> PagedKV:
        return PagedKV(FakeClient(), "prefill-kv", regions, blocks, bb)  # type: ignore[arg-type]

    def test_plan(self) -> None:
        kv = self.kv()
        plan = kv.plan([0, 1, 2, 7], [4, 5, 6, 0])
        self.assertEqual(len(plan), 1)
        sel, ops = plan[0]
        self.assertEqual(sel, [0, 1, 2])
        self.assertEqual(ops, [LocalOp(0, 0, 0, 4096, 3072), LocalOp(0, 0, 7168, 0, 1024),
                               LocalOp(1, 1, 0, 4096, 3072), LocalOp(1, 1, 7168, 0, 1024),
                               LocalOp(2, 2, 0, 4096, 3072), LocalOp(2, 2, 7168, 0, 1024)])

    def test_plan_split(self) -> None:
        kv = self.kv()
        plan = kv.plan([0, 2, 4], [0, 2, 4], layers=[2, 0], max_ops=4)
        self.assertEqual([(sel, len(ops)) for sel, ops in plan], [([2, 0], 4), ([0], 2)])
        # Indices point into each transfer's own region list.
        self.assertEqual(plan[0][1][3], LocalOp(1, 1, 0, 0, 1024))
        self.assertEqual(plan[1][1][0], LocalOp(0, 0, 2048, 2048, 1024))
        total = sum(op.length for _, ops in plan for op in ops)
        self.assertEqual(total, 2 * 3 * 1024)

    def test_bad_blocks(self) -> None:
        kv = self.kv()
        with self.assertRaises(ValueError):
            kv.plan([16], [0])
        with self.assertRaises(ValueError):
            kv.plan([0], [-1])
        with self.assertRaises(ValueError):
            kv.plan([0], [0], layers=[3])

    def test_push_pull_names(self) -> None:
        kv = self.kv(regions=2)
        c = kv.client
        ids = kv.push_blocks("decode", [1, 2], [5, 6], "req-1", remote="decode-kv")
        self.assertEqual(ids, [1])
        route, d, ops, local, remote, tag, ck = c.subs[-1]
        self.assertEqual((route, d, local, remote, tag, ck),
                         ("decode", wire.Direction.PUSH, ["prefill-kv/0", "prefill-kv/1"],
                          ["decode-kv/0", "decode-kv/1"], "req-1", None))
        self.assertEqual(ops[0], LocalOp(0, 0, 1024, 5120, 2048))
        # Pull: src are the peer's blocks, dst are local ones; ops are (local=dst, remote=src).
        kv.pull_blocks("decode", [5, 6], [1, 2], "req-2", remote="decode-kv", layers=[1])
        route, d, ops, local, remote, tag, ck = c.subs[-1]
        self.assertEqual((d, local, remote), (wire.Direction.PULL, ["prefill-kv/1"], ["decode-kv/1"]))
        self.assertEqual(ops, [LocalOp(0, 0, 1024, 5120, 2048)])


if __name__ == "__main__":
    unittest.main()
