"""One sidecar per GPU under tensor parallelism (issue 34 item 3): ``{rank}`` in the connector's ``socket`` and
``peer_name`` picks each rank's sidecar, the source (pull) or destination (push) rank's peer, and rank 0's
sidecar for the schedulers' ticket links. First with the worker's movers recorded (no sidecar), then
test_vllm_chunked's splits through one real hostmem sidecar per rank."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
import unittest
from typing import Any, Dict, List
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import test_vllm_chunked as chunked  # noqa: E402

from stage_client.vllm import tickets as tickets_mod  # noqa: E402
from stage_client.vllm.config import StageConfig, for_rank  # noqa: E402
from stage_client.vllm.metadata import PushChunk, RecvReq  # noqa: E402
from stage_client.vllm.worker import StageWorker  # noqa: E402


class FakeKV:
    def __init__(self) -> None:
        self.calls: List[Any] = []

    def pull(self, route: str, remote: str, *a: Any, **kw: Any) -> int:
        self.calls.append(("pull", remote, kw.get("peer")))
        return 0

    def push(self, route: str, remote: str, *a: Any, **kw: Any) -> int:
        self.calls.append(("push", remote, kw.get("peer")))
        return 0


class FakeMover:
    def __init__(self) -> None:
        self.fns: List[Any] = []

    def submit(self, rid: str, fn: Any, event: Any = None) -> None:
        self.fns.append(fn)


def worker(rank: int, tp: int, heads: int) -> Any:
    """A StageWorker with what _puller and _push read, its client and movers fakes."""
    import threading

    cfg = StageConfig(socket="/s/pre-{rank}.sock", route="r", kv_heads=heads, tp_rank=rank, tp_size=tp)
    w = StageWorker(cfg, client=mock.Mock())
    w.kv, w.mover, w.lock = FakeKV(), FakeMover(), threading.Lock()
    return w


class TestForRank(unittest.TestCase):
    def test_substitutes(self) -> None:
        self.assertEqual(for_rank("/run/stage/gpu{rank}.sock", 3), "/run/stage/gpu3.sock")
        self.assertEqual(for_rank("prefill-{rank}", 0), "prefill-0")
        self.assertEqual(for_rank("/run/stage/staged.sock", 5), "/run/stage/staged.sock")
        self.assertEqual(for_rank("", 1), "")


class TestWorkerRanks(unittest.TestCase):
    def test_worker_connects_to_its_ranks_sidecar(self) -> None:
        with mock.patch("stage_client.vllm.worker.Client") as cl:
            StageWorker(StageConfig(socket="/s/dec-{rank}.sock", kv_heads=2, tp_rank=1, tp_size=2))
        self.assertEqual(cl.call_args[0][0], "/s/dec-1.sock")

    def test_pull_names_each_source_ranks_sidecar(self) -> None:
        w = worker(0, 1, 2)  # decode TP 1 pulling from a prefill TP 2: one pull per prefill rank
        rr = RecvReq("q", "x", "pull", [0], 0, 16, peer="prefill-{rank}", remote_kv="pre", remote_tp=2)
        from stage_client.engines import plan

        for s, d, lo, hi in plan(2, 2, 1):
            w._puller(rr, s, lo, hi)()
        self.assertEqual(sorted(w.kv.calls), [("pull", "pre-tp0", "prefill-0"), ("pull", "pre-tp1", "prefill-1")])

    def test_pull_single_peer_unchanged(self) -> None:
        w = worker(0, 1, 2)
        w._puller(RecvReq("q", "x", "pull", [0], 0, 16, peer="prefill", remote_kv="pre", remote_tp=2), 1, 1, 2)()
        self.assertEqual(w.kv.calls, [("pull", "pre-tp1", "prefill")])

    def test_push_names_each_destination_ranks_sidecar(self) -> None:
        for tp_dec, want in ((2, [("push", "dec-tp1", "decode-1")]), (1, [("push", "dec-tp0", "decode-0")])):
            w = worker(1, 2, 2)  # prefill rank 1 of 2
            ticket = {"peer": "decode-{rank}", "kv": "dec", "tp": tp_dec, "block_ids": [0]}
            w._push(PushChunk("q", "x", [0], 0, 16, ticket), [0], None)
            for fn in w.mover.fns:
                fn()
            self.assertEqual(w.kv.calls, want, tp_dec)


class TestTicketLinkRankZero(unittest.TestCase):
    def test_scheduler_link_uses_rank_zeros_sidecar_and_peer(self) -> None:
        cfg = StageConfig(socket="/s/pre-{rank}.sock", route="r", kv_heads=2, tp_size=2)
        got: List[Any] = []

        def client(path: str, **kw: Any) -> Any:
            got.append(path)
            c = mock.Mock(closed=False)
            c.take_tickets.side_effect = lambda wait: time.sleep(0.05) or []
            return c

        with mock.patch.object(tickets_mod, "Client", side_effect=client), \
                mock.patch.object(tickets_mod, "post_on") as post:
            link = tickets_mod.TicketLink(cfg, lambda it: None)
            self.assertTrue(link.wait_ready(5))
            link.post(1, "k", b"{}", peer="decode-{rank}", to="dec")
            link.close()
        self.assertEqual(got[0], "/s/pre-0.sock")
        self.assertEqual(post.call_args[0][5], "decode-0")


class TestPerRankSidecars(chunked.TestChunked):
    """test_vllm_chunked's splits (TP 2 -> 2 chunked push, GQA 4 -> 2 push, 1 -> 4 pull, preemption) with one
    hostmem sidecar per rank, 4 a side: the connector reaches rank r's through ``{rank}`` in socket and
    peer_name, and every route lists all sidecars of the other side (a transfer naming none is refused)."""

    RANKS = 4
    # Push: the decode's ticket goes to the prefill's rank 0 sidecar, which a route of several peers must name:
    # the request carries stage_peer (prefill-{rank}), as a router that knows the prefill would set it.
    name_prefill = True

    @classmethod
    def setUpClass(cls) -> None:
        if not chunked.HAVE_STAGED:
            raise unittest.SkipTest(chunked.SKIP_WHY)
        chunked.torch.set_num_threads(1)
        cls.nodes = []
        cls.links = tempfile.mkdtemp(prefix="stage-ranks-")
        try:
            scs: Dict[str, List[Any]] = {}
            for side in ("prefill", "decode"):
                scs[side] = []
                for r in range(cls.RANKS):
                    n = chunked.Staged("%s-%d" % (side, r))
                    cls.nodes.append(n)
                    scs[side].append(n)
                    os.symlink(n.socket, os.path.join(cls.links, "%s-%d.sock" % (side, r)))
            for side, other, route in (("prefill", "decode", "decode"), ("decode", "prefill", "prefill")):
                for n in scs[side]:
                    add_routes(n, route, [o.peers for o in scs[other]])
            cls.sides = {side: (os.path.join(cls.links, side + "-{rank}.sock"), side + "-{rank}")
                         for side in ("prefill", "decode")}
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.links, ignore_errors=True)
        super().tearDownClass()


def add_routes(n: Any, name: str, peers: List[str], timeout: float = 15) -> None:
    """Route ``name`` of running staged ``n`` to every one of ``peers`` (SIGHUP), waiting until each is up."""
    with open(n.config, "a") as f:
        f.write("routes:\n  - name: %s\n    peers: [%s]\n" % (name, ", ".join('"%s"' % p for p in peers)))
    n.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while True:
        rs = {r["name"]: r for r in n.client.routes()}
        up = [p for p in (rs.get(name) or {}).get("peers") or () if p.get("state") == "up"]
        if len(up) == len(peers):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("%s: route %s: %d of %d peers up after %ss: %s\n%s" % (
                n.name, name, len(up), len(peers), timeout, rs, n.tail()))
        time.sleep(0.05)


if __name__ == "__main__":
    unittest.main()
