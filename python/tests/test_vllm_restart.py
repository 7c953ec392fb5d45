"""stage_client.vllm when a sidecar restarts under a running engine (issue 33 item 2).

The replay of vLLM's calls (vllm_replay.py) over two real ``staged``, on
caches of random rows. One sidecar is SIGKILLed and started again with
its config (the same control socket and listen address) while both
engines keep running:

* the decode's or the prefill's: its workers' clients reconnect, register
  the KV cache again under the same name and subscribe again; then a pull
  moves the prefill's rows into the decode's blocks, row for row, within
  seconds, and the connector's stats count the reconnect;
* the prefill's, while the decode pulls: the pull goes again once the new
  sidecar is up and gets the rows (stage_client.mover);
* the decode's, while a pushed request's KV is arriving that no prefill
  pushes again: the restart fails nothing (a live prefill would push
  again: test_vllm_faults's ``restarts_mid_request`` cases); the request
  ends at its ``timeout_s``, saying the connection closed, with its blocks
  as load errors, counted in ``get_kv_connector_stats``
  (kv_loads_failed).

Before the fix a restarted sidecar was never used again (pulls failed with
"unknown region" or "the sidecar closed the connection", forever).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import unittest
from typing import Any, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from test_vllm_faults import HEADS, WHY, caches, torch  # noqa: E402
from test_e2e import HAVE_STAGED, SKIP_WHY, Staged, pair  # noqa: E402
from stage_client import HostArena  # noqa: E402
from stage_client.rendezvous import RendezvousServer  # noqa: E402
from vllm_replay import Engine, NewRequestData, Request, SchedulerOutput, layer_name  # noqa: E402
from fakesidecar import FakeSidecar  # noqa: E402
from test_reconnect import answer_all, until  # noqa: E402
from stage_client.vllm.compat import LOGGER  # noqa: E402
from stage_client.vllm.config import StageConfig  # noqa: E402
from stage_client.vllm.worker import StageWorker  # noqa: E402

TIMEOUT = 6.0
BACK_S = 10.0  # the engines use the restarted sidecar within this
PTABLE, DTABLE, TOKENS = [7, 1, 4], [11, 2, 30, 8, 17], 70


@unittest.skipIf(torch is None, WHY)
@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestSidecarRestart(unittest.TestCase):
    def setUp(self) -> None:
        self.pre, self.dec = pair(pulls=True)
        self.nodes: List[Staged] = [self.dec, self.pre]
        self.addCleanup(self._stop)
        self.arena = HostArena(8 << 20, "restart")
        self.addCleanup(self.arena.close)
        self.pc, self.dc = caches(self.arena, 32, 1), caches(self.arena, 16, 2)
        self.pe = Engine(self.pre.socket, dict(mode="pull", route="decode", kv_heads=HEADS, timeout_s=TIMEOUT,
                                               lease_s=3 * TIMEOUT, peer_name="prefill"), HEADS, [self.pc], "pre")
        self.addCleanup(self.pe.shutdown)
        self.de = Engine(self.dec.socket, dict(mode="pull", route="prefill", kv_heads=HEADS, timeout_s=TIMEOUT),
                         HEADS, [self.dc], "dec")
        self.addCleanup(self.de.shutdown)
        self.n = 0

    def _stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def pull_once(self) -> bool:
        """A prefill request then its decode pull; True when the rows arrived (and equal the prefill's)."""
        return self.pull(*self.prefill())

    def prefill(self) -> tuple:
        """A prefill request finished (its blocks granted to the decode's pull): its id and kv_transfer_params."""
        self.n += 1
        pid = "p%d" % self.n
        pr = Request(pid, list(range(TOKENS)), {"do_remote_decode": True, "stage_xfer": "x%d" % self.n})
        self.pe.admit(pr, lambda n: PTABLE)
        self.pe.step(SchedulerOutput([NewRequestData(pid, pr.prompt_token_ids, (PTABLE,), 0)],
                                     num_scheduled_tokens={pid: TOKENS}))
        _, params = self.pe.finish(pr, PTABLE)
        return pid, params

    def pull(self, pid: str, params: Any) -> bool:
        """The decode pulls prefill request ``pid``; True when the rows arrived (and equal the prefill's)."""
        did = "d" + pid[1:]
        for t in self.dc.values():
            t.zero_()
        self.de.load_errors = set()
        self.assertEqual(self.de.admit(Request(did, list(range(TOKENS)), dict(params)), lambda n: DTABLE),
                         (TOKENS, True))
        self.de.step()
        self.de.until(lambda: did in self.de.recvd, 3 * TIMEOUT)
        if self.de.load_errors:
            return False  # (the prefill frees its blocks at the lease)
        self.pe.until(lambda: pid in self.pe.sent, 4 * TIMEOUT)  # the decode's pulls ended: the prefill frees them
        toks = torch.arange(TOKENS)
        for i in range(len(self.pc)):
            src = self.pc[layer_name(i)][:, torch.tensor(PTABLE)[toks // 32], toks % 32]
            dst = self.dc[layer_name(i)][:, torch.tensor(DTABLE)[toks // 16], toks % 16]
            self.assertTrue(torch.equal(src, dst), "layer %d on the decode differs from the prefill's" % i)
        return True

    def worker(self, e: Engine) -> Any:
        return e.workers[0].worker

    def restarted(self, node: Staged, e: Engine) -> None:
        self.assertTrue(self.pull_once(), "no KV moved before the restart")
        node.restart()
        t0 = time.monotonic()
        while not self.pull_once():  # the client reconnects, the link between the sidecars comes back
            self.assertLess(time.monotonic() - t0, BACK_S, "no KV moved %ss after the %s's sidecar restarted"
                            % (BACK_S, node.name))
        client = self.worker(e).client
        self.assertEqual(client.reconnects, 1)
        names = {r["name"] for r in client.regions()}
        self.assertIn(self.worker(e).name + "/0/0", names, "the KV cache is not registered on the new connection")
        st = self.workers_stats(e)
        self.assertEqual(st["sidecar_reconnects"], 1, st)

    def workers_stats(self, e: Engine) -> Any:
        s = e.workers[0].get_kv_connector_stats()
        self.assertIsNotNone(s)
        return s.reduce()

    def test_decode_sidecar_restarted(self) -> None:
        self.restarted(self.dec, self.de)

    def test_prefill_sidecar_restarted(self) -> None:
        self.restarted(self.pre, self.pe)

    def test_granted_before_the_restart(self) -> None:
        # a request the prefill finished before its sidecar restarted: the new sidecar holds no grant, so the
        # prefill's worker makes its live grants again once it registered its cache anew, and the decode's pull,
        # asking the new sidecar, gets the rows instead of "no live grant" and a recompute
        self.assertTrue(self.pull_once(), "no KV moved before the restart")
        pid, params = self.prefill()
        self.pre.restart()
        client = self.worker(self.pe).client
        t0 = time.monotonic()
        while client.reconnects < 1:
            self.assertLess(time.monotonic() - t0, BACK_S, "the prefill's client did not reconnect")
            time.sleep(0.02)
        self.assertTrue(self.pull(pid, params), "the pull of a request granted before the restart failed: "
                        "load errors %s" % sorted(self.de.load_errors))

    def test_pull_while_prefill_sidecar_restarts(self) -> None:
        # the decode pulls while the prefill's sidecar is down for a restart: the pull, refused at once (the
        # peer is down) or cut short, goes again (stage_client.mover) and gets the rows once the new sidecar
        # has the prefill's cache and grants again; before, the load failed and the decode recomputed
        self.assertTrue(self.pull_once(), "no KV moved before the restart")
        pid, params = self.prefill()
        back = threading.Thread(target=self.pre.restart, kwargs={"down": 0.3}, daemon=True)
        back.start()
        t0 = time.monotonic()
        while self.pre.proc.poll() is None:  # SIGKILL sent: pull from here
            self.assertLess(time.monotonic() - t0, 5, "the prefill's sidecar did not die")
            time.sleep(0.005)
        self.assertTrue(self.pull(pid, params), "the pull under the restart failed: load errors %s"
                        % sorted(self.de.load_errors))
        back.join(20)
        self.assertGreaterEqual(self.worker(self.de).mover.retries, 1, "the pull did not go again")
        st = self.workers_stats(self.de)  # vLLM's stats line counts it, and no failed load
        self.assertGreaterEqual(st["kv_transfers_retried"], 1, st)
        self.assertEqual(st["kv_loads_failed"], 0, st)

    def test_push_arriving_waits_for_its_deadline(self) -> None:
        # the decode's sidecar restarts while a push is arriving that no prefill will push again: the receive is
        # not failed by the restart (a live prefill would push again), but at its deadline, saying why
        srv = RendezvousServer("127.0.0.1", 0, insecure=True)  # takes the ticket; no prefill pushes: KV "arriving"
        self.addCleanup(srv.close)
        de = Engine(self.dec.socket, dict(mode="push", route="prefill", kv_heads=HEADS, timeout_s=TIMEOUT),
                    HEADS, [caches(self.arena, 16, 3)], "dec-push")
        self.addCleanup(de.shutdown)
        r = Request("r0", list(range(40)), {"do_remote_prefill": True, "stage_mode": "push", "stage_xfer": "y0",
                                            "stage_rendezvous": srv.address})
        self.assertEqual(de.admit(r, lambda n: [5, 9, 3]), (40, True))
        de.step()
        t0 = time.monotonic()
        self.dec.restart()
        with self.assertLogs(LOGGER, "WARNING") as logs:
            took = de.until(lambda: "r0" in de.recvd, 3 * TIMEOUT)
        self.assertGreater(time.monotonic() - t0, TIMEOUT - 1.0, "the arriving request failed at the restart "
                           "(%.1fs after the step)" % took)
        self.assertEqual(de.load_errors, {5, 9, 3})
        self.assertTrue(any("closed its connection" in o and "not pushed again in time" in o for o in logs.output),
                        logs.output)
        client = self.worker(de).client
        while client.reconnects < 1:
            self.assertLess(time.monotonic() - t0, BACK_S, "the decode's client did not reconnect")
            time.sleep(0.02)
        st = de.workers[0].get_kv_connector_stats().reduce()
        self.assertEqual(st, {"kv_loads_failed": 1, "sidecar_reconnects": 1, "kv_transfers_retried": 0})


@unittest.skipIf(torch is None, WHY)
class TestReRegister(unittest.TestCase):
    """A worker over a fake sidecar that dies and comes back at its socket: the new connection gets the same
    regions and KV cache registered again, then the guard (a Grant of no blocks), then the subscription."""

    def test_same_names_guarded(self) -> None:
        import tempfile

        d = tempfile.TemporaryDirectory(prefix="stage-rereg-")
        self.addCleanup(d.cleanup)
        path = os.path.join(d.name, "s.sock")
        first = FakeSidecar(answer_all, path=path)
        arena = HostArena(4 << 20, "rereg")
        self.addCleanup(arena.close)
        vc = Engine._cfg(dict(socket=path, mode="pull", route="prefill", kv_heads=HEADS, timeout_s=TIMEOUT), HEADS,
                         1, "rr", "kv_both")
        w = StageWorker(StageConfig.from_vllm(vc), vllm_config=vc)
        w.register_kv_caches(caches(arena, 16, 7))
        self.addCleanup(w.shutdown)
        want = [(type(m).__name__, getattr(m, "name", "") or getattr(m, "cache", "")) for _, m, _ in first.got
                if type(m).__name__ in ("Register", "RegisterKV", "Grant")]
        self.assertEqual([t for t, _ in want].count("RegisterKV"), 1, want)
        self.assertEqual(want[-1], ("Grant", w.name), "the first connection's cache is not guarded")
        first.close()
        second = FakeSidecar(answer_all, path=path)
        self.addCleanup(second.close)
        self.assertTrue(until(lambda: w.client.reconnects == 1), "the worker's client did not reconnect")
        got = [(type(m).__name__, getattr(m, "name", "") or getattr(m, "cache", "")) for _, m, _ in second.got]
        self.assertEqual(got[0], ("Subscribe", ""))
        self.assertEqual(got[1:], want, "not the same registrations, guard last, on the new connection")
        self.assertEqual(w.take_stats().reduce(), {"kv_loads_failed": 0, "sidecar_reconnects": 1,
                                                   "kv_transfers_retried": 0})


if __name__ == "__main__":
    unittest.main()
