"""stage_client.engines: the head plan, tags (hostile ones too), arrival tracking and the mover's threads
(stage_client.mover), which start a transfer a sidecar's restart cut short again.

No sidecar: the mover runs against a fake client whose submits and waits
the test controls.
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
import threading
import time
import unittest
from typing import Any, Callable, Dict, List
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stage_client.engines import (MAX_TP, Coverage, Ledger, Mover, head_slice, layer_index,  # noqa: E402
                                  make_tag, parse_tag, plan, primary)
from stage_client import mover  # noqa: E402
from stage_client.errors import SidecarConnectionError, StageError  # noqa: E402
from stage_client.protocol.wire import Code  # noqa: E402
from stage_client.wire import MAX_TAG  # noqa: E402


def until(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Whether ``cond`` came true within ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


class TestHeadPlan(unittest.TestCase):
    def test_head_slice(self) -> None:
        cases = [  # heads, tp, rank, want
            (8, 1, 0, (0, 8)), (8, 2, 1, (4, 8)), (8, 8, 7, (7, 8)),
            (2, 4, 0, (0, 1)), (2, 4, 1, (0, 1)), (2, 4, 2, (1, 2)), (2, 4, 3, (1, 2)),  # GQA: replicated
            (1, 4, 3, (0, 1)),
        ]
        for heads, tp, rank, want in cases:
            self.assertEqual(head_slice(heads, tp, rank), want, (heads, tp, rank))

    def test_head_slice_refuses(self) -> None:
        for heads, tp, rank in [(8, 3, 0), (3, 4, 0), (8, 2, 2), (8, 2, -1), (0, 1, 0), (6, 4, 0)]:
            with self.assertRaises(ValueError, msg=(heads, tp, rank)):
                head_slice(heads, tp, rank)

    def test_primary(self) -> None:
        self.assertEqual([primary(2, 4, r) for r in range(4)], [(0, 1), None, (1, 2), None])
        self.assertEqual([primary(8, 2, r) for r in range(2)], [(0, 4), (4, 8)])

    def test_plan_moves_each_held_head_once(self) -> None:
        # every destination rank gets each head it holds exactly once, from that head's first holder
        for heads in (1, 2, 4, 8):
            for src_tp in (1, 2, 4, 8):
                for dst_tp in (1, 2, 4, 8):
                    try:
                        p = plan(heads, src_tp, dst_tp)
                    except ValueError:
                        continue
                    for d in range(dst_tp):
                        got: List[int] = []
                        for s, dd, lo, hi in p:
                            if dd != d:
                                continue
                            self.assertEqual(primary(heads, src_tp, s)[0] <= lo, True)
                            slo, shi = head_slice(heads, src_tp, s)
                            self.assertTrue(slo <= lo < hi <= shi, (heads, src_tp, dst_tp, s, d))
                            got.extend(range(lo, hi))
                        self.assertEqual(sorted(got), list(range(*head_slice(heads, dst_tp, d))),
                                         (heads, src_tp, dst_tp, d))

    def test_plan_gqa_senders(self) -> None:
        # 2 kv heads over 4 prefill ranks: only ranks 0 and 2 send; each of 4 decode ranks gets its one head
        self.assertEqual(plan(2, 4, 4), [(0, 0, 0, 1), (0, 1, 0, 1), (2, 2, 1, 2), (2, 3, 1, 2)])
        self.assertEqual(plan(4, 2, 1), [(0, 0, 0, 2), (1, 0, 2, 4)])

    def test_layer_index(self) -> None:
        for name, order, want in [("model.layers.7.self_attn.attn", 0, 7), ("layers_12_attn", 0, 12),
                                  ("decoder.3.x.9", 0, 3), ("attn", 5, 5)]:
            self.assertEqual(layer_index(name, order), want, name)


class TestTags(unittest.TestCase):
    def test_round_trip(self) -> None:
        for key in ["x", "req-1", "a|b|c", "ключ", "|", "p0/1", "k|d1/2"]:
            for side, r, tp in [("p", 0, 1), ("d", 3, 4), ("a", 1, 2), ("p", MAX_TP - 1, MAX_TP)]:
                self.assertEqual(parse_tag(make_tag(key, side, r, tp)), (key, side, r, tp), key)

    def test_make_refuses(self) -> None:
        for key, side, r, tp in [("x", "q", 0, 1), ("x", "p", 1, 1), ("x", "p", -1, 2), ("x", "d", 0, MAX_TP + 1),
                                 ("k" * MAX_TAG, "p", 0, 1)]:
            with self.assertRaises(ValueError, msg=(key[:8], side, r, tp)):
                make_tag(key, side, r, tp)

    def test_hostile(self) -> None:
        # tags come from the other side's sidecar: anything not of make_tag's form is None, never an exception
        bad = ["", "|", "x", "x|", "x|p", "x|p0", "x|p0/", "x|p/1", "x|p0/0", "x|p1/1", "x|p2/1", "x|p-1/2",
               "x|q0/1", "x|P0/1", "x|p 0/1", "x|p0/1 ", "x|p0/1\n", "x|p\u00b2/3", "x|p\u0661/\u0662",
               "x|p0x1/2", "x|p0/1/2", "x|p00000/1", "x|p0/99999", "x|p0/%d" % (MAX_TP + 1),
               "x|p0/" + "9" * 5000, "x|d+1/2", "x|p0/1.0", "x|p0\x00/1", b"x|p0/1", None]
        for tag in bad:
            self.assertIsNone(parse_tag(tag), repr(tag)[:40])  # type: ignore[arg-type]

    def test_last_bar_splits(self) -> None:
        self.assertEqual(parse_tag("a|p0/1|d1/2"), ("a|p0/1", "d", 1, 2))


class TestCoverage(unittest.TestCase):
    def test_complete(self) -> None:
        c = Coverage(16, 32)
        self.assertFalse(c.complete())  # expect not known yet
        c.expect = {(0, 0), (0, 1)}
        c.add(0, 0, 16, 48)
        self.assertFalse(c.complete())
        c.add(0, 1, 16, 30)
        c.add(0, 1, 40, 48)
        self.assertFalse(c.complete(), "a gap [30, 40)")
        c.add(0, 1, 30, 40)  # adjacent ranges merge
        self.assertTrue(c.complete())
        self.assertEqual(c.got[(0, 1)], [(16, 48)])

    def test_overlap_and_order(self) -> None:
        c = Coverage(0, 100, {(1, 0)})
        for lo, hi in [(50, 100), (0, 20), (10, 60)]:  # out of order, overlapping (a push sent again)
            c.add(1, 0, lo, hi)
        self.assertEqual(c.got[(1, 0)], [(0, 100)])
        self.assertTrue(c.complete())

    def test_other_pairs_do_not_count(self) -> None:
        c = Coverage(0, 10, {(0, 0), (1, 0)})
        c.add(0, 0, 0, 10)
        c.add(2, 0, 0, 10)  # a rank nobody expects
        c.add(1, 1, 0, 10)  # the wrong layer
        self.assertFalse(c.complete())
        c.add(1, 0, 0, 10)
        self.assertTrue(c.complete())

    def test_range_beyond_is_enough(self) -> None:
        c = Coverage(32, 16, {(0, 0)})
        c.add(0, 0, 0, 64)
        self.assertTrue(c.complete())
        self.assertTrue(Coverage(0, 0, {(0, 0)}).complete(), "nothing to receive")


class TestLedger(unittest.TestCase):
    def test_lifecycle(self) -> None:
        led = Ledger()
        self.assertTrue(led.idle("r"))
        led.queued("r")
        self.assertFalse(led.idle("r"))
        led.submitted("r", [4, 5], None)
        self.assertEqual(led.transfers("r"), [4, 5])
        led.ended("r", 4, None)
        err = RuntimeError("boom")
        led.ended("r", 5, err)
        led.ended("r", 6, RuntimeError("later"))  # the first failure is kept
        self.assertTrue(led.idle("r"))
        self.assertIs(led.error("r"), err)
        led.forget("r")
        self.assertIsNone(led.error("r"))


class FakeClient:
    """submit_kv-free: the mover only calls wait_future and cancel; jobs' fns stand in for submits."""

    def __init__(self, restores: bool = True) -> None:
        self.futures: Dict[int, concurrent.futures.Future] = {}
        self.cancelled: List[int] = []
        self.fails: Dict[int, BaseException] = {}  # transfers that end with this failure
        self.restores = restores  # a reconnecting client's (Client.restores)
        self.waits: List[Any] = []  # (transfer id, the timeout it was awaited with)

    def wait_future(self, tid: int, timeout: float) -> Any:
        f: concurrent.futures.Future = concurrent.futures.Future()
        self.futures[tid] = f
        self.waits.append((tid, timeout))
        if tid in self.fails:
            f.set_exception(self.fails[tid])
        elif tid < 100:
            f.set_result("ok")  # a live peer's transfer ends at once
        return f

    def cancel(self, tid: int) -> None:
        self.cancelled.append(tid)


class TestMover(unittest.TestCase):
    def test_dead_peer_does_not_delay_live(self) -> None:
        m = Mover(FakeClient(), timeout=5.0, name="test-mover")
        stuck = threading.Event()
        self.addCleanup(m.close, 1.0)
        self.addCleanup(stuck.set)

        def dead() -> List[int]:  # a submit whose sidecar waits on a peer that does not answer
            stuck.wait(10)
            return [200]

        m.submit("dead", dead)
        t0 = time.monotonic()
        m.submit("live", lambda: [1])
        while not (m.ledger.idle("live") and m.ledger.transfers("live") == []):
            if time.monotonic() - t0 > 2:
                self.fail("the live request's transfer waited behind the dead peer's submit")
            time.sleep(0.005)
        self.assertLess(time.monotonic() - t0, 1.0)
        self.assertIsNone(m.ledger.error("live"))
        self.assertFalse(m.ledger.idle("dead"))
        self.assertFalse(m.drain(0.05), "drain must report the job still stuck")
        stuck.set()
        self.assertTrue(m.drain(2))

    def test_failures_and_timeouts(self) -> None:
        fc = FakeClient()
        m = Mover(fc, timeout=5.0, name="test-mover")
        self.addCleanup(m.close, 1.0)

        def broken() -> List[int]:
            raise OSError("no route")

        m.submit("a", broken)
        m.submit("b", lambda: [300])  # a transfer that will time out
        self.assertTrue(m.drain(2))
        self.assertIsInstance(m.ledger.error("a"), OSError)
        self.assertTrue(m.ledger.idle("a"))
        self.assertFalse(m.ledger.idle("b"))
        fc.futures[300].set_exception(TimeoutError("deadline"))
        t0 = time.monotonic()
        while 300 not in fc.cancelled:  # cancelled from a thread of its own
            self.assertLess(time.monotonic() - t0, 2)
            time.sleep(0.005)
        self.assertTrue(m.ledger.idle("b"))
        self.assertIsInstance(m.ledger.error("b"), TimeoutError)

    def test_wait(self) -> None:
        fc = FakeClient()
        m = Mover(fc, timeout=5.0, name="test-mover")
        self.addCleanup(m.close, 1.0)
        self.assertTrue(m.wait("nothing", 0), "a request with no transfers is not idle")
        m.submit("r", lambda: [300])  # a transfer that ends when the test says
        t0 = time.monotonic()
        self.assertFalse(m.wait("r", 0.1), "wait returned before the transfer ended")
        self.assertGreaterEqual(time.monotonic() - t0, 0.09)
        threading.Timer(0.05, lambda: fc.futures[300].set_result("ok")).start()
        self.assertTrue(m.wait("r", 2), "wait did not see the transfer end")
        self.assertLess(time.monotonic() - t0, 1.5)
        self.assertIsNone(m.ledger.error("r"))

    def test_cancel(self) -> None:
        fc = FakeClient()
        m = Mover(fc, timeout=5.0, name="test-mover", threads=1)
        self.addCleanup(m.close, 1.0)
        m.cancel(7)
        self.assertEqual(fc.cancelled, [7])

        def refuse(tid: int) -> None:
            raise OSError("the sidecar is gone")

        fc.cancel = refuse  # type: ignore[method-assign]
        with self.assertLogs("stage_client.engines", "INFO") as logs:
            m.cancel(8)  # logged, not raised: the transfer may have ended already
        self.assertIn("cancelling transfer 8: the sidecar is gone", logs.output[0])

    def test_cut_short_runs_again(self) -> None:
        gone = StageError(Code.PEER_UNAVAILABLE, "session with decode closed")
        lost = SidecarConnectionError("the sidecar closed the connection")
        denied = StageError(Code.ACCESS_DENIED, "no live grant")
        # (name, what each run does in turn: an exception its submit raises, or the id of the transfer it starts,
        #  the fake client's failures by transfer id, whether the client redials, the error the request ends
        #  with, the runs again)
        for name, runs, fails, restores, want, again in [
            ("submit refused while the peer restarts, then started", [gone, gone, 1], {}, True, None, 2),
            ("transfer cut when the peer's session closed, then done", [201, 2], {201: gone}, True, None, 1),
            ("shutting down, then done", [StageError(Code.SHUTDOWN, "draining"), 3], {}, True, None, 1),
            ("own sidecar's connection lost, the client redials", [202, 4], {202: lost}, True, None, 1),
            ("own sidecar's connection lost, the client does not redial", [lost, 5], {}, False, lost, 0),
            ("a refusal is not tried again", [denied, 6], {}, True, denied, 0),
            ("a transfer refused is not tried again", [203, 7], {203: denied}, True, denied, 0),
        ]:
            with self.subTest(name):
                fc = FakeClient(restores)
                fc.fails.update(fails)
                m = Mover(fc, timeout=5.0, name="test-mover")
                self.addCleanup(m.close, 1.0)
                calls: List[int] = []

                def fn(runs: List[Any] = runs, calls: List[int] = calls) -> List[int]:
                    r = runs[len(calls)]
                    calls.append(1)
                    if isinstance(r, BaseException):
                        raise r
                    return [r]

                m.submit("r", fn)
                self.assertTrue(until(lambda: m.ledger.idle("r") and m.drain(0)), "the request never ended")
                self.assertIs(m.ledger.error("r"), want)
                self.assertEqual((m.retries, len(calls)), (again, again + 1))

    def test_cut_short_gives_up(self) -> None:
        # a peer that stays away: the job runs again with growing pauses, then fails once its window is spent
        gone = StageError(Code.PEER_UNAVAILABLE, "route decode: peer is down")
        for name, window, timeout in [("the window", 0.5, 5.0), ("the timeout", 5.0, 0.5)]:
            with self.subTest(name), mock.patch.object(mover, "RETRY_WINDOW", window):
                m = Mover(FakeClient(), timeout=timeout, name="test-mover")
                self.addCleanup(m.close, 1.0)
                t0 = time.monotonic()

                def never() -> List[int]:
                    raise gone

                m.submit("r", never)
                self.assertTrue(until(lambda: m.ledger.idle("r") and m.drain(0)), "the request never ended")
                self.assertIs(m.ledger.error("r"), gone)
                self.assertEqual(m.retries, 2, "pauses 0.1 and 0.2 fit in 0.5 s, 0.4 more does not")
                self.assertLess(time.monotonic() - t0, 1.5)

    def test_peer_down_for_good_fails_at_once(self) -> None:
        # transfers cut for longer than the window with none through: a new job fails at once again, until one
        # goes through
        gone = StageError(Code.PEER_UNAVAILABLE, "route decode: peer is down")
        fc = FakeClient()
        m = Mover(fc, timeout=5.0, name="test-mover")
        self.addCleanup(m.close, 1.0)
        with mock.patch.object(mover, "RETRY_WINDOW", 0.5):
            def never() -> List[int]:
                raise gone

            m.submit("a", never)  # retried until its window is spent
            self.assertTrue(until(lambda: m.ledger.idle("a") and m.drain(0)))
            self.assertEqual(m.retries, 2)
            time.sleep(0.3)  # a ends 0.3 s after its first cut; now the peer has been away past the window
            t0 = time.monotonic()
            m.submit("b", never)  # the peer has been away longer than a restart: no retry
            self.assertTrue(until(lambda: m.ledger.idle("b") and m.drain(0)))
            self.assertLess(time.monotonic() - t0, 0.09)
            self.assertEqual((m.retries, m.ledger.error("b")), (2, gone))
            m.submit("c", lambda: [1])  # one goes through: the peer is back
            self.assertTrue(until(lambda: m.ledger.idle("c") and m.drain(0)))
            m.submit("d", never)
            self.assertTrue(until(lambda: m.ledger.idle("d") and m.drain(0)))
            self.assertEqual(m.retries, 4, "after a transfer went through, a cut job is retried again")

    def test_forgotten_request_is_not_run_again(self) -> None:
        # the engine let go of the request (it ended at its deadline, or was preempted) while its retry waited:
        # the blocks may be another request's now, so the retry must not run, nor a late end revive the record
        m = Mover(FakeClient(), timeout=5.0, name="test-mover")
        self.addCleanup(m.close, 1.0)
        calls: List[int] = []

        def cut() -> List[int]:
            calls.append(1)
            raise StageError(Code.PEER_UNAVAILABLE, "session closed")

        with mock.patch.object(mover, "RETRY_PAUSE", 0.3):
            m.submit("r", cut)
            self.assertTrue(until(lambda: m.retries == 1))
            m.ledger.forget("r")
            time.sleep(0.6)
        self.assertEqual(len(calls), 1, "a forgotten request's transfer ran again")
        self.assertTrue(m.drain(1))
        self.assertEqual(m.ledger._reqs, {}, "a forgotten request's record came back")

    def test_retry_keeps_the_first_deadline(self) -> None:
        # a run again is awaited only until the first run's deadline: it never outlives the request's receive
        fc = FakeClient()
        fc.fails[201] = StageError(Code.PEER_UNAVAILABLE, "session closed")
        m = Mover(fc, timeout=2.0, name="test-mover")
        self.addCleanup(m.close, 1.0)
        runs = iter([201, 1])
        m.submit("r", lambda: [next(runs)])
        self.assertTrue(until(lambda: m.ledger.idle("r") and m.drain(0)))
        self.assertIsNone(m.ledger.error("r"))
        (t0, w0), (t1, w1) = fc.waits
        self.assertEqual((t0, t1), (201, 1))
        self.assertGreater(w0, 1.9)
        self.assertLess(w1, w0 - 0.09, "the run again was given a whole timeout of its own")

    def test_close_drops_retries(self) -> None:
        m = Mover(FakeClient(), timeout=5.0, name="test-mover")

        def cut() -> List[int]:
            raise StageError(Code.PEER_UNAVAILABLE, "session closed")

        m.submit("r", cut)
        self.assertTrue(until(lambda: m.retries == 1))
        m.close(2)
        self.assertEqual(m._timers, set(), "a retry's timer outlived close")
        self.assertFalse(any(t.is_alive() for t in m._threads))

    def test_close(self) -> None:
        m = Mover(FakeClient(), timeout=1.0, name="test-mover", threads=2)
        m.close(2)
        self.assertFalse(any(t.is_alive() for t in m._threads))
        with self.assertRaises(RuntimeError):
            m.submit("x", lambda: [1])
        with self.assertRaises(ValueError):
            Mover(FakeClient(), 1.0, threads=0)


if __name__ == "__main__":
    unittest.main()
