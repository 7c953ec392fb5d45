"""stage_client.vllm when the KV does not come: load errors within the deadline, never a hang.

The same replay of vLLM's calls as test_vllm_connector.py, on caches of
random rows (no model), with a short ``timeout_s``:

* push, the prefill never pushes (its ticket is never taken): after the
  deadline the decode reports the request finished receiving and every
  block it was to receive in ``get_block_ids_with_load_errors``;
* push, the prefill's (deprecated) rendezvous is not there: the same at once;
* push over the sidecars' link, no prefill engine takes tickets there: the same at once;
* push, the prefill refuses the decode's ticket (a split of the heads it
  cannot make): its failure notice crosses the link and the decode's blocks
  are load errors at once, well under ``timeout_s``;
* pull naming a peer the decode's route does not have: refused, the same at once;
* pull, the prefill's sidecar died after the prefill finished: the pulls
  fail and the blocks come back as load errors within the deadline; the
  prefill side (whose sidecar is gone) still frees its blocks at the lease;
* push layer by layer (4 layers of 2 MiB), a sidecar SIGKILLed mid-request:
  the prefill's forward calls ``save_kv_layer`` layer by layer as the
  replay does; once layer 0 landed on the decode, the next layer is saved
  and the prefill's sidecar (or the decode's) is killed at once, then the
  remaining layers are saved. Either way the decode reports the request
  finished receiving with exactly its blocks as load errors within the
  deadline, and the prefill's forward, ``wait_for_save`` and
  ``get_finished`` return, reporting the request sent (its blocks freed)
  within the deadline; no call into the connector raises.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import unittest
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

try:
    import torch

    WHY = ""
except ImportError:
    torch = None
    WHY = "torch is not installed"

from test_e2e import HAVE_STAGED, SKIP_WHY, Staged, pair  # noqa: E402
from stage_client import HostArena  # noqa: E402
from stage_client.rendezvous import RendezvousServer  # noqa: E402
from vllm_replay import Engine, NewRequestData, Request, SchedulerOutput, layer_name  # noqa: E402

LAYERS, HEADS, D, BLOCKS = 2, 2, 16, 64
TIMEOUT = 2.0
MARGIN = 1.5
#: the engines' timeout_s where a sidecar restarts under a push: the restart, the peers' redial and the push
#: again must fit in it
RESTART_TIMEOUT = 8.0
# push mid-request: 4 layers, 2048 tokens of 2 heads x 64 floats, K and V: 2 MiB a layer
MID_LAYERS, MID_D, MID_TOKENS = 4, 64, 2048


def caches(arena: HostArena, block: int, seed: int, layers: int = LAYERS, d: int = D,
           blocks: int = BLOCKS) -> Dict[str, Any]:
    """One rank's vLLM flash-layout cache of random rows, layer name -> tensor."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(layers):
        t = arena.empty((2, blocks, block, HEADS, d), torch.float32)
        t.copy_(torch.randn(t.shape, generator=g))
        out[layer_name(i)] = t
    return out


@unittest.skipIf(torch is None, WHY)
@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestVLLMFaults(unittest.TestCase):
    def setUp(self) -> None:
        self.pre, self.dec = pair(pulls=True)
        self.nodes: List[Staged] = [self.dec, self.pre]
        self.arena = HostArena(8 << 20, "faults")
        self.addCleanup(self.arena.close)
        self.addCleanup(self._stop)

    def _stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def engine(self, node: Staged, name: str, mode: str, route: str, block: int, seed: int, **extra: Any) -> Engine:
        e = Engine(node.socket, dict(dict(mode=mode, route=route, kv_heads=HEADS, timeout_s=TIMEOUT), **extra), HEADS,
                   [caches(self.arena, block, seed)], name)
        self.addCleanup(e.shutdown)
        return e

    def decode_push(self, rendezvous: str, **extra: Any) -> tuple:
        de = self.engine(self.dec, "dec", "push", "prefill", 16, 2, **extra)
        self.assertTrue(de.sched.scheduler.link.wait_ready(10))
        p = {"do_remote_prefill": True, "stage_mode": "push", "stage_xfer": "x0"}
        if rendezvous:
            p["stage_rendezvous"] = rendezvous
        r = Request("r0", list(range(40)), p)
        self.assertEqual(de.admit(r, lambda n: [5, 9, 3]), (40, True))
        t0 = time.monotonic()
        de.step()
        took = de.until(lambda: "r0" in de.recvd, 3 * TIMEOUT)
        self.assertEqual(de.load_errors, {5, 9, 3})
        return time.monotonic() - t0, took

    def test_push_never_comes(self) -> None:
        srv = RendezvousServer("127.0.0.1", 0, insecure=True)  # takes the ticket; no prefill ever reads it (deprecated path)
        self.addCleanup(srv.close)
        took, _ = self.decode_push(srv.address)
        self.assertEqual(len(srv), 1)
        self.assertGreaterEqual(took, TIMEOUT)
        self.assertLess(took, TIMEOUT + 1.5)

    def test_push_rendezvous_down(self) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        took, _ = self.decode_push("127.0.0.1:%d" % port)
        self.assertLess(took, 1.5)

    def test_push_no_prefill_engine(self) -> None:
        # over the sidecars' link, no rendezvous: no engine takes tickets behind the prefill's sidecar, so the
        # post is refused once the prefill's sidecar waited 2 s for the inbox to open (an engine reconnecting),
        # a load error, not a wait of timeout_s
        took, _ = self.decode_push("", timeout_s=10.0)
        self.assertGreaterEqual(took, 2.0)
        self.assertLess(took, 2.0 + 1.5)

    def test_push_refused_fails_at_once(self) -> None:
        # the prefill refuses the decode's ticket (its 3 ranks cannot take 2 kv heads evenly) and says so over
        # the link: the decode's blocks are a load error at once, not after timeout_s
        pe = self.engine(self.pre, "pre", "push", "decode", 32, 1, peer_name="prefill", timeout_s=10.0)
        de = self.engine(self.dec, "dec", "push", "prefill", 16, 2, peer_name="decode", timeout_s=10.0)
        for e in (pe, de):
            self.assertTrue(e.sched.scheduler.link.wait_ready(10))
        de.sched.scheduler.cfg.tp_size = 3  # what its ticket says
        prompt = list(range(40))
        dr = Request("r0", prompt, {"do_remote_prefill": True, "stage_mode": "push", "stage_xfer": "x0"})
        self.assertEqual(de.admit(dr, lambda n: [5, 9, 3]), (40, True))
        t0 = time.monotonic()
        de.step()
        self.assertTrue(de.sched.scheduler.tickets_posted(10))
        deadline = time.monotonic() + 5
        while pe.sched.scheduler.rendezvous.get("x0") is None:  # the ticket crossed the link
            self.assertLess(time.monotonic(), deadline, "the decode's ticket never reached the prefill")
            time.sleep(0.005)
        pr = Request("p0", prompt, {"do_remote_decode": True, "stage_mode": "push", "stage_xfer": "x0"})
        pe.admit(pr, lambda n: [1, 2])
        pe.step(SchedulerOutput([NewRequestData("p0", prompt, ([1, 2],), 0)], num_scheduled_tokens={"p0": 40}))
        de.until(lambda: "r0" in de.recvd, 3 * TIMEOUT)
        self.assertLess(time.monotonic() - t0, 1.5)  # timeout_s is 10
        self.assertEqual(de.load_errors, {5, 9, 3})

    def test_push_refused_by_the_decode_sidecar(self) -> None:
        # the decode's ticket names a block its cache does not have: its sidecar refuses the prefill's push; the
        # prefill's worker says so over the link and the decode's blocks are load errors at once
        pe = self.engine(self.pre, "pre", "push", "decode", 32, 1, peer_name="prefill", timeout_s=10.0,
                         layerwise=False)
        de = self.engine(self.dec, "dec", "push", "prefill", 16, 2, peer_name="decode", timeout_s=10.0)
        for e in (pe, de):
            self.assertTrue(e.sched.scheduler.link.wait_ready(10))
        prompt = list(range(40))
        dr = Request("r0", prompt, {"do_remote_prefill": True, "stage_mode": "push", "stage_xfer": "x0"})
        self.assertEqual(de.admit(dr, lambda n: [5, 9, 1 << 20]), (40, True))
        t0 = time.monotonic()
        de.step()
        self.assertTrue(de.sched.scheduler.tickets_posted(10))
        deadline = time.monotonic() + 5
        while pe.sched.scheduler.rendezvous.get("x0") is None:
            self.assertLess(time.monotonic(), deadline, "the decode's ticket never reached the prefill")
            time.sleep(0.005)
        pr = Request("p0", prompt, {"do_remote_decode": True, "stage_mode": "push", "stage_xfer": "x0"})
        pe.admit(pr, lambda n: [1, 2])
        pe.step(SchedulerOutput([NewRequestData("p0", prompt, ([1, 2],), 0)], num_scheduled_tokens={"p0": 40}))
        self.assertEqual(pe.finish(pr, [1, 2]), (True, None))
        done = time.monotonic() + 3 * TIMEOUT
        while "r0" not in de.recvd and time.monotonic() < done:
            pe.step()
            de.step()
            time.sleep(0.01)
        self.assertLess(time.monotonic() - t0, 2.5)  # timeout_s is 10
        self.assertEqual(de.load_errors, {5, 9, 1 << 20})

    def prefill_done(self) -> tuple:
        """A prefill engine whose request p0 finished; its kv_transfer_params for the decode."""
        pe = self.engine(self.pre, "pre", "pull", "decode", 32, 1, lease_s=3 * TIMEOUT, peer_name="prefill")
        pr = Request("p0", list(range(70)), {"do_remote_decode": True, "stage_xfer": "x1"})
        pe.admit(pr, lambda n: [7, 1, 4])
        pe.step(SchedulerOutput([NewRequestData("p0", pr.prompt_token_ids, ([7, 1, 4],), 0)],
                                num_scheduled_tokens={"p0": 70}))
        delay, params = pe.finish(pr, [7, 1, 4])
        self.assertTrue(delay)
        return pe, params

    def test_pull_unknown_peer(self) -> None:
        # the route has no peer of that name: refused at once, a load error, not a wait
        _, params = self.prefill_done()
        params["stage_peer"] = "nobody"
        de = self.engine(self.dec, "dec", "pull", "prefill", 16, 2)
        self.assertEqual(de.admit(Request("d0", list(range(70)), params), lambda n: [3, 4, 5, 6, 7]), (70, True))
        t0 = time.monotonic()
        de.step()
        de.until(lambda: "d0" in de.recvd, 3 * TIMEOUT)
        self.assertLess(time.monotonic() - t0, 1.5)
        self.assertEqual(de.load_errors, {3, 4, 5, 6, 7})

    def test_pull_prefill_sidecar_died(self) -> None:
        pe, params = self.prefill_done()
        self.pre.kill()
        de = self.engine(self.dec, "dec", "pull", "prefill", 16, 2)
        dr = Request("d0", list(range(70)), dict(params))
        table = [11, 2, 30, 8, 17]
        self.assertEqual(de.admit(dr, lambda n: table), (70, True))
        t0 = time.monotonic()
        de.step()
        de.until(lambda: "d0" in de.recvd, 3 * TIMEOUT)
        self.assertLess(time.monotonic() - t0, TIMEOUT + 1.5)
        self.assertEqual(de.load_errors, set(table))
        # the prefill's blocks come back at the lease, though its sidecar is gone
        pe.until(lambda: "p0" in pe.sent, 4 * TIMEOUT)

    def push_mid(self, victim: str, down: float = -1.0) -> None:
        """Push 4 layers layer by layer; kill ``victim``'s sidecar once layer 0 landed, while layer 1 goes. With
        ``down`` >= 0 it starts again that many seconds later (same socket and address), and every layer must
        land, row for row, with no load error: the pushes cut short go again (stage_client.mover)."""
        arena = HostArena(32 << 20, "faults-mid")
        self.addCleanup(arena.close)
        timeout = TIMEOUT if down < 0 else RESTART_TIMEOUT
        common = dict(mode="push", kv_heads=HEADS, timeout_s=timeout)
        pc = caches(arena, 32, 4, MID_LAYERS, MID_D, MID_TOKENS // 32 + 8)
        dc = caches(arena, 16, 5, MID_LAYERS, MID_D, MID_TOKENS // 16 + 8)
        pe = Engine(self.pre.socket, dict(common, route="decode", peer_name="prefill"), HEADS, [pc], "mid-pre")
        self.addCleanup(pe.shutdown)
        de = Engine(self.dec.socket, dict(common, route="prefill", peer_name="decode"), HEADS, [dc], "mid-dec")
        self.addCleanup(de.shutdown)
        ptable = list(range(MID_TOKENS // 32 + 8))[::-1][:MID_TOKENS // 32]
        dtable = [(7 * b) % (MID_TOKENS // 16 + 8) for b in range(MID_TOKENS // 16)]
        prompt = list(range(MID_TOKENS))
        for e in (pe, de):
            self.assertTrue(e.sched.scheduler.link.wait_ready(10))
        dr = Request("r0", prompt, {"do_remote_prefill": True, "stage_mode": "push", "stage_xfer": "m0"})
        self.assertEqual(de.admit(dr, lambda n: dtable), (MID_TOKENS, True))
        t_dec = time.monotonic()
        de.step()  # the decode's worker takes r0; its deadline runs from here
        self.assertTrue(de.sched.scheduler.tickets_posted(10))  # posted off the scheduler's step
        pe.tickets_in(1)  # the forward below waits for layer 0 inside the step: its ticket must be there
        pr = Request("p0", prompt, {"do_remote_decode": True, "stage_mode": "push", "stage_xfer": "m0"})
        pe.admit(pr, lambda n: ptable)
        node = self.pre if victim == "prefill" else self.dec
        killed: List[float] = []
        back = threading.Thread(target=node.restart, kwargs={"down": down}, daemon=True)

        def forward(after_layer: Any) -> None:
            after_layer(0)
            deadline = time.monotonic() + 10
            while not self.landed(de, "r0", 0):
                self.assertLess(time.monotonic(), deadline, "layer 0 never landed on the decode")
                time.sleep(0.005)
            after_layer(1)  # queued on the mover; the sidecar dies under it
            node.kill()
            killed.append(time.monotonic())
            if down >= 0:
                back.start()
            for i in range(2, MID_LAYERS):
                after_layer(i)

        pe.step(SchedulerOutput([NewRequestData("p0", prompt, (ptable,), 0)], num_scheduled_tokens={"p0": MID_TOKENS}),
                forward)
        self.assertLess(time.monotonic() - killed[0], MARGIN, "the prefill's forward waited on the dead sidecar")
        # the layer that landed before the kill is the prefill's, row for row
        toks = torch.arange(MID_TOKENS)
        src = pc[layer_name(0)][:, torch.tensor(ptable)[toks // 32], toks % 32]
        dst = dc[layer_name(0)][:, torch.tensor(dtable)[toks // 16], toks % 16]
        self.assertTrue(torch.equal(src, dst), "layer 0 on the decode differs from the prefill's")
        self.assertEqual(pe.finish(pr, ptable), (True, None))  # max_tokens=1: the prefill request ends now
        # both engines keep stepping, as both vLLMs would; when did each let go of the request?
        done: Dict[str, float] = {}
        while len(done) < 2 and time.monotonic() - killed[0] < 3 * timeout:
            for name, e, got in (("decode", de, de.recvd), ("prefill", pe, pe.sent)):
                if name not in done:
                    e.step()
                    if got:
                        done[name] = time.monotonic()
            time.sleep(0.01)
        self.assertEqual(sorted(done), ["decode", "prefill"], "still waiting after %ss" % (3 * timeout))
        if down >= 0:
            back.join(20)
            self.assertEqual((de.recvd, de.load_errors), ({"r0"}, set()), "the KV did not all arrive")
            self.assertEqual((pe.sent, pe.load_errors), ({"p0"}, set()))
            for i in range(MID_LAYERS):
                src = pc[layer_name(i)][:, torch.tensor(ptable)[toks // 32], toks % 32]
                dst = dc[layer_name(i)][:, torch.tensor(dtable)[toks // 16], toks % 16]
                self.assertTrue(torch.equal(src, dst), "layer %d on the decode differs from the prefill's" % i)
            retried = pe.workers[0].worker.mover.retries
            if victim == "decode":  # pushes to a peer that is down are refused: only a push again lands them
                self.assertGreaterEqual(retried, 1, "no push was started again")
            st = pe.workers[0].get_kv_connector_stats()
            self.assertEqual(0 if st is None else st.reduce()["kv_transfers_retried"], retried, "vLLM's stats")
            # (the prefill's own sidecar: a push under way at the kill goes again; one started after it waits
            # for the client's new connection, so a kill between two pushes needs no push again)
            print("\n%s's sidecar restarted under a push: KV arrived %.2fs after the kill, %d pushes started again"
                  % (victim, done["decode"] - killed[0], retried), file=sys.stderr)
            return
        self.assertEqual((de.recvd, de.load_errors), ({"r0"}, set(dtable)))
        self.assertLess(done["decode"] - t_dec, TIMEOUT + MARGIN)
        self.assertEqual((pe.sent, pe.load_errors), ({"p0"}, set()))
        self.assertLess(done["prefill"] - killed[0], TIMEOUT + MARGIN)
        self.assertFalse(pe.sched.has_pending_push_work())

    @staticmethod
    def landed(e: Engine, rid: str, layer: int) -> bool:
        """Layer ``layer`` of every token of ``rid`` is in the decode's cache (its notification came)."""
        w = e.workers[0].worker
        with w.lock:
            st = w.core.receives.get(rid)
            cov = None if st is None else st.cov
            return cov is not None and any(a <= cov.first and cov.first + cov.tokens <= b
                                           for a, b in cov.got.get((0, layer), ()))

    def test_push_prefill_sidecar_dies_mid_request(self) -> None:
        self.push_mid("prefill")

    def test_push_decode_sidecar_dies_mid_request(self) -> None:
        self.push_mid("decode")

    def test_push_prefill_sidecar_restarts_mid_request(self) -> None:
        self.push_mid("prefill", down=0.3)

    def test_push_decode_sidecar_restarts_mid_request(self) -> None:
        self.push_mid("decode", down=0.3)


if __name__ == "__main__":
    unittest.main()


def mock_worker() -> Tuple[Any, Any]:
    """A StageWorker (2 kv heads, one rank, 16-token blocks, 2 layers) over a mock client, and the client."""
    from unittest import mock

    from stage_client.errors import SidecarConnectionError
    from stage_client.vllm.config import StageConfig
    from stage_client.vllm.worker import StageWorker

    cl = mock.Mock()
    cl.subscribe.return_value.get.side_effect = SidecarConnectionError("no sidecar in this test")
    w = StageWorker(StageConfig(socket="/s/d.sock", route="r", kv_heads=2, tp_size=1), client=cl)
    w.block_tokens = 16
    w.core.layers = 2
    return w, cl


class TestFailedTicketGrantsNothing(unittest.TestCase):
    """A push whose ticket the decode's scheduler could not post fails in the same step its receive starts: the
    worker grants no writes for it (no push can land in blocks vLLM is about to recompute), and reports it
    received with its blocks as load errors; the others of the step are granted as usual."""

    def test_failed_ticket(self) -> None:
        from stage_client.vllm.metadata import RecvReq, StageConnectorMetadata

        w, cl = mock_worker()
        try:
            ka, kb = b"a" * 16, b"b" * 16
            meta = StageConnectorMetadata()
            meta.recv = [RecvReq("a", "xa", "push", [3, 4], 0, 20, key=ka), RecvReq("b", "xb", "push", [5], 0, 10, key=kb)]
            meta.failed = {"a": "posting the push ticket to the prefill: refused"}
            w.start_load_kv(meta)
            self.assertEqual([c.args[1] for c in cl.grant.call_args_list], [kb], "writes granted")
            _, recving = w.get_finished(None, set())
            self.assertEqual(recving, {"a"})
            self.assertEqual(w.take_load_errors(), {3, 4})
        finally:
            w.shutdown()


class TestGrantsAfterRestart(unittest.TestCase):
    """A sidecar that restarted holds no grant: when the worker's client is back (the cache registered again), it
    makes the grants it made and did not revoke again, with the time they have left, so a decode's pull of a
    request the prefill finished before the restart, or a push into this decode's blocks, is admitted instead of
    recomputed. A revoked grant is not made again."""

    def test_grants_again(self) -> None:
        from unittest import mock

        from stage_client.vllm.metadata import RecvReq, StageConnectorMetadata

        w, cl = mock_worker()
        try:
            kr, kw, kgone = b"r" * 16, b"w" * 16, b"g" * 16
            meta = StageConnectorMetadata()
            meta.grant = {"p": (kr, [1, 2]), "q": (kgone, [7])}  # reads of the prefill's finished requests
            meta.recv = [RecvReq("d", "xd", "push", [3, 4], 0, 20, key=kw)]  # writes of a push into us
            w.start_load_kv(meta)
            w._revoke(kgone)
            made = {c.args[1]: c for c in cl.grant.call_args_list}
            self.assertEqual(set(made), {kr, kw, kgone})

            again = mock.Mock()
            w._reg = object()  # a cache was registered: the reconnect registers it again first
            with mock.patch.object(w, "_register", return_value=None) as reg:
                w._reconnected(again)
            reg.assert_called_once_with(again)
            got = {c.args[1]: c for c in again.grant.call_args_list}
            self.assertEqual(set(got), {kr, kw}, "the live grants made again, the revoked one not")
            for key in (kr, kw):
                self.assertEqual(got[key].args[2], made[key].args[2], "same blocks")
                self.assertEqual(got[key].kwargs["write"], made[key].kwargs["write"])
                self.assertLessEqual(got[key].args[3], made[key].args[3], "no more time than was left")
                self.assertGreater(got[key].args[3], made[key].args[3] - 5.0)
        finally:
            w.shutdown()
