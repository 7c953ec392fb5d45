"""stage_client.connector_core: the connectors' bookkeeping, fed events by hand, no sidecar, no torch.

Tables of cases in the style of the sidecar's receive core: each case is a
short script of events (a step's instructions, notifications, vLLM's
finished requests, the time) and what the core must answer. Runs with
the pyenv python3 (no torch) and with /usr/bin/python3 alike.
"""

from __future__ import annotations

import os
import sys
import unittest
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stage_client import connector_core  # noqa: E402
from stage_client.connector_core import (DISCONNECTED, LiveGrants, PushDest, Receive, Receives,  # noqa: E402
                                         WorkerCore, code_text)
from stage_client.engines import Tag, make_tag, parse_tag  # noqa: E402
from stage_client.kvpresets import MLA_WIDTHS, PRESETS, is_mla  # noqa: E402
from stage_client.wire import Code  # noqa: E402

TIMEOUT = 10.0


def note(xfer: str, side: str, rank: int, tp: int, layers: Sequence[int] = (0,), first: int = 0, tokens: int = 16,
         code: int = Code.OK, message: str = "") -> Tuple[Tag, Any]:
    """A notification as the sidecar delivers it, and its parsed tag."""
    tag = make_tag(xfer, side, rank, tp)
    t = parse_tag(tag)
    assert t is not None
    return t, SimpleNamespace(tag=tag, kv="kv-tp0", code=code, message=message, layers=list(layers), first=first,
                              tokens=tokens)


def progress(table: Dict[str, Tuple[bool, Optional[BaseException]]]) -> Any:
    """The mover's answer per request: (idle, first error); a request not in ``table`` is idle, unfailed."""
    return lambda rid: table.get(rid, (True, None))


class TestTag(unittest.TestCase):
    def test_fields_by_name(self) -> None:
        t = parse_tag(make_tag("x|y", "d", 3, 4))
        self.assertEqual((t.key, t.side, t.rank, t.tp), ("x|y", "d", 3, 4))
        self.assertEqual(t, ("x|y", "d", 3, 4))


class TestMLAPresets(unittest.TestCase):
    def test_is_mla(self) -> None:
        want = {"vllm-mla", "ascend-mla", "sglang-mla"}
        for name in PRESETS:
            with self.subTest(name):
                self.assertEqual(is_mla(name), name in want, "got is_mla %s" % is_mla(name))
        self.assertEqual(set(MLA_WIDTHS), want)
        self.assertFalse(is_mla("no-such-preset"))


class TestLiveGrants(unittest.TestCase):
    """The grants a rank made and did not end, to make again on a restarted sidecar: each with the time it has
    left, the expired and the ended gone, and no more than the limit kept (the oldest go)."""

    def test_cases(self) -> None:
        cases: List[Tuple[str, List[Tuple[str, Any]], float, List[Tuple[bytes, bool, float]]]] = [
            ("made, time left", [("made", (b"a", [1, 2], False, 30.0, 0.0))], 10.0, [(b"a", False, 20.0)]),
            ("ended", [("made", (b"a", [1], False, 30.0, 0.0)), ("ended", b"a")], 1.0, []),
            ("expired", [("made", (b"a", [1], True, 5.0, 0.0)), ("made", (b"b", [2], True, 50.0, 0.0))], 5.0,
             [(b"b", True, 45.0)]),
            ("made again: the later one", [("made", (b"a", [1], False, 5.0, 0.0)), ("made", (b"a", [1], True, 9.0, 2.0))],
             3.0, [(b"a", True, 8.0)]),
            ("past the limit of 2", [("made", (b"a", [1], False, 9.0, 0.0)), ("made", (b"b", [1], False, 9.0, 0.0)),
                                     ("made", (b"c", [1], False, 9.0, 0.0))], 1.0, [(b"b", False, 8.0), (b"c", False, 8.0)]),
        ]
        for name, events, now, want in cases:
            with self.subTest(name):
                g = LiveGrants(limit=2)
                for ev, arg in events:
                    if ev == "made":
                        key, blocks, write, ttl, at = arg
                        g.made(key, blocks, write, ttl, 4, at)
                    else:
                        g.ended(arg)
                got = [(x.key, x.write, x.ttl) for x in g.live(now)]
                self.assertEqual(got, want)
                self.assertEqual(len(g), len(want), "the expired are dropped")


class TestReceivesIndex(unittest.TestCase):
    def test_by_request_and_transfer(self) -> None:
        rs = Receives(8, 1, 0, layers=2)
        a = rs.add(Receive("r1", "x1", 0, 16))
        self.assertIs(rs.get("r1"), a)
        self.assertIs(rs.by_xfer("x1"), a)
        b = rs.add(Receive("r1", "x2", 0, 16))  # the same request again, another transfer key
        self.assertIs(rs.by_xfer("x2"), b)
        self.assertIsNone(rs.by_xfer("x1"), "the replaced receive's transfer key still finds the request")
        self.assertEqual(len(rs), 1)
        self.assertIs(rs.pop_xfer("x2"), b)
        self.assertEqual((len(rs), rs.get("r1"), rs.pop_xfer("x2"), rs.pop("r1")), (0, None, None, None))

    def test_limit_drops_oldest(self) -> None:
        rs = Receives(8, 1, 0, limit=3)
        for i in range(5):
            rs.add(Receive("r%d" % i, "x%d" % i, 0, 1))
        self.assertEqual([r.req for r in rs], ["r2", "r3", "r4"])
        self.assertEqual([rs.by_xfer("x%d" % i) is None for i in range(5)], [True, True, False, False, False])

    def test_fail_keeps_first_error(self) -> None:
        rs = Receives(8, 1, 0)
        r = rs.add(Receive("r", "x", 0, 1))
        rs.fail("r", "first")
        rs.fail("r", "second")
        rs.fail("unknown", "nothing")
        self.assertEqual(r.error, "first")

    def test_disconnected(self) -> None:
        # the sidecar restarted: nothing fails (the sender pushes again, the mover pulls again); a push still
        # arriving says so if it times out
        cases = [  # name, pull, error before, complete, want error after, want cut
            ("push arriving", False, "", False, "", DISCONNECTED),
            ("push complete", False, "", True, "", ""),
            ("push failed already", False, "boom", False, "boom", ""),
            ("pull in flight", True, "", False, "", ""),
        ]
        for name, pull, err, complete, want, cut in cases:
            with self.subTest(name):
                rs = Receives(1, 1, 0, layers=1)
                r = rs.add(Receive("r", "x", 0, 16, pull=pull, error=err))
                if complete:
                    t, n = note("x", "p", 0, 1)
                    rs.file_note(r, t, n)
                    self.assertTrue(r.cov.complete())
                rs.disconnected()
                self.assertEqual((r.error, r.cut), (want, cut))


class TestReceivesFile(unittest.TestCase):
    """What push notifications make of a receive into decode rank ``rank`` of ``tp`` (2 layers, 16 tokens)."""

    cases: List[Tuple[str, int, int, int, List[Tuple[int, int, List[int], int, int, int]], bool, str]] = [
        # name, heads, tp, rank, notes (src rank, src tp, layers, first, tokens, code), complete, error contains
        ("one rank, both layers at once", 8, 1, 0, [(0, 1, [0, 1], 0, 16, Code.OK)], True, ""),
        ("layer by layer", 8, 1, 0, [(0, 1, [0], 0, 16, Code.OK), (0, 1, [1], 0, 16, Code.OK)], True, ""),
        ("one layer missing", 8, 1, 0, [(0, 1, [0], 0, 16, Code.OK)], False, ""),
        ("in chunks", 8, 1, 0, [(0, 1, [0, 1], 0, 8, Code.OK), (0, 1, [0, 1], 8, 8, Code.OK)], True, ""),
        ("a hole", 8, 1, 0, [(0, 1, [0, 1], 0, 7, Code.OK), (0, 1, [0, 1], 8, 8, Code.OK)], False, ""),
        ("two prefill ranks, one came", 8, 1, 0, [(0, 2, [0, 1], 0, 16, Code.OK)], False, ""),
        ("two prefill ranks", 8, 1, 0, [(1, 2, [0, 1], 0, 16, Code.OK), (0, 2, [0, 1], 0, 16, Code.OK)], True, ""),
        ("a replicated head's second holder sends nothing", 2, 1, 0,
         [(0, 4, [0, 1], 0, 16, Code.OK), (2, 4, [0, 1], 0, 16, Code.OK)], True, ""),
        ("failed", 8, 1, 0, [(0, 1, [0, 1], 0, 16, Code.UNKNOWN_ROUTE)], False,
         "prefill rank 0 failed: why (UNKNOWN_ROUTE)"),
        ("a code this client does not know", 8, 1, 0, [(0, 1, [0], 0, 16, 4242)], False, "(code(4242))"),
        ("a failure after it arrived", 8, 1, 0, [(0, 1, [0, 1], 0, 16, Code.OK), (0, 1, [0], 0, 16, Code.INTERNAL)],
         True, "failed: why (INTERNAL)"),
        ("a split of the heads this side cannot make", 8, 1, 0, [(0, 3, [0, 1], 0, 16, Code.OK)], False,
         "a push from prefill rank 0 of 3: 8 kv heads do not split over 3 ranks"),
        # a sidecar went away under the push: its sender pushes again, so nothing fails
        ("cut short by the peer's session closing", 8, 1, 0, [(0, 1, [0, 1], 0, 16, Code.PEER_UNAVAILABLE)], False,
         ""),
        ("cut short, then pushed again", 8, 1, 0,
         [(0, 1, [0, 1], 0, 8, Code.OK), (0, 1, [0, 1], 8, 8, Code.SHUTDOWN), (0, 1, [0, 1], 0, 16, Code.OK)],
         True, ""),
    ]

    def test_table(self) -> None:
        for name, heads, tp, rank, notes, complete, err in self.cases:
            with self.subTest(name):
                rs = Receives(heads, tp, rank, layers=2)
                r = rs.add(Receive("r", "x", 0, 16))
                for src, src_tp, layers, first, tokens, code in notes:
                    t, n = note("x", "p", src, src_tp, layers, first, tokens, code, "why")
                    rs.file_note(r, t, n)
                self.assertEqual(r.cov.complete(), complete, "got complete %s" % r.cov.complete())
                if err:
                    self.assertIn(err, r.error)
                else:
                    self.assertEqual(r.error, "")

    def test_code_text(self) -> None:
        self.assertEqual((code_text(Code.OK), code_text(Code.UNKNOWN_ROUTE), code_text(60000)),
                         ("OK", "UNKNOWN_ROUTE", "code(60000)"))


class TestWorkerCoreReceive(unittest.TestCase):
    def core(self) -> WorkerCore:
        c = WorkerCore(8, 1, 0, TIMEOUT)
        c.layers = 1
        return c

    def test_notice_before_its_request(self) -> None:
        c = self.core()
        t, n = note("x", "p", 0, 1)
        self.assertEqual(c.note(t, n), (b"", ""))
        r = Receive("r", "x", 0, 16, deadline=TIMEOUT)
        c.receive(r)
        self.assertTrue(r.cov.complete(), "the early notification was not filed when the receive started")
        fin = c.finish(set(), 1.0, progress({}))
        self.assertEqual((fin.recving, fin.failed_loads), ({"r"}, []))
        self.assertIsNone(c.receives.get("r"))

    def test_early_notices_are_bounded(self) -> None:
        with mock.patch.object(connector_core, "MAX_EARLY", 2):
            c = self.core()
            for i in range(3):
                c.note(*note("x%d" % i, "p", 0, 1))
            got = []
            for i in range(3):
                r = Receive("r%d" % i, "x%d" % i, 0, 16)
                c.receive(r)
                got.append(r.cov.complete())
            self.assertEqual(got, [True, True, False])
            c.note(*note("y", "p", 0, 1))  # taking them made room again
            r = Receive("ry", "y", 0, 16)
            c.receive(r)
            self.assertTrue(r.cov.complete())

    def test_stale_early_notices_make_room(self) -> None:
        """A full store drops the notices no receive took within the timeout (a failed push's notice that came
        after its receive ended), so a notice that overtakes its request later is still kept and filed."""
        with mock.patch.object(connector_core, "MAX_EARLY", 2):
            c = self.core()
            c.note(*note("stale0", "p", 0, 1), now=1.0)
            c.note(*note("stale1", "p", 0, 1), now=2.0)
            c.note(*note("young", "p", 0, 1), now=2.5)  # full, nothing old enough: not kept
            c.note(*note("late", "p", 0, 1), now=1.5 + TIMEOUT)  # stale0 is past the timeout: it goes
            got = {}
            for x in ("stale0", "stale1", "young", "late"):
                r = Receive("r" + x, x, 0, 16)
                c.receive(r)
                got[x] = r.cov.complete()
            self.assertEqual(got, {"stale0": False, "stale1": True, "young": False, "late": True})

    def test_finish(self) -> None:
        boom = OSError("peer gone")
        cases: List[Tuple[str, Dict[str, Any], float, Dict[str, Tuple[bool, Optional[BaseException]]], Set[str],
                          str]] = [
            # name, Receive kwargs, now, mover progress, want recving, want failure (contains)
            ("push still arriving", {}, 1.0, {}, set(), ""),
            ("push past its deadline", {}, TIMEOUT + 0.1, {}, {"r"}, "not complete after 10.0s"),
            ("push cut short, past its deadline", {"cut": "a push was cut short: x"}, TIMEOUT + 0.1, {}, {"r"},
             "not complete after 10.0s (a push was cut short: x, and not pushed again in time)"),
            ("push cut short, within its deadline", {"cut": "a push was cut short: x"}, 1.0, {}, set(), ""),
            ("push failed", {"error": "ticket not posted"}, 1.0, {}, {"r"}, "ticket not posted"),
            ("pull in flight", {"pull": True}, 1.0, {"r": (False, None)}, set(), ""),
            ("pull done", {"pull": True}, 1.0, {"r": (True, None)}, {"r"}, ""),
            ("pull failed", {"pull": True}, 1.0, {"r": (True, boom)}, {"r"}, "peer gone"),
            ("pull in flight past the deadline, within the grace", {"pull": True}, TIMEOUT + 0.5,
             {"r": (False, None)}, set(), ""),
            ("pull in flight past the grace", {"pull": True}, TIMEOUT + 1.5, {"r": (False, None)}, {"r"},
             "not complete"),
        ]
        for name, kw, now, prog, recving, failure in cases:
            with self.subTest(name):
                c = self.core()
                cut = kw.pop("cut", "")
                r = Receive("r", "x", 0, 16, deadline=TIMEOUT, blocks=[4, 5], **kw)
                r.cut = cut
                c.receive(r)
                fin = c.finish(set(), now, progress(prog))
                self.assertEqual(fin.recving, recving)
                self.assertEqual(fin.sending, set())
                if failure:
                    self.assertEqual(len(fin.failed_loads), 1, fin.failed_loads)
                    self.assertIn(failure, fin.failed_loads[0].why)
                    self.assertEqual(c.take_errors(), {4, 5})
                else:
                    self.assertEqual(fin.failed_loads, [])
                    self.assertEqual(c.take_errors(), set())
                self.assertEqual(c.take_errors(), set(), "take_errors twice")
                self.assertEqual(c.receives.get("r") is None, bool(recving))

    def test_granted_receive_revokes_its_key(self) -> None:
        c = self.core()
        r = Receive("r", "x", 0, 16, deadline=TIMEOUT)
        r.key = b"k" * 16
        c.receive(r)
        c.note(*note("x", "p", 0, 1))
        self.assertEqual(c.finish(set(), 1.0, progress({})).revoke, [b"k" * 16])

    def test_fail_from_the_scheduler(self) -> None:
        c = self.core()
        c.receive(Receive("r", "x", 0, 16, deadline=TIMEOUT, blocks=[7]))
        c.fail({"r": "posting the ticket: refused", "other": "ignored"})
        fin = c.finish(set(), 1.0, progress({}))
        self.assertEqual([f.why for f in fin.failed_loads], ["posting the ticket: refused"])
        self.assertEqual(c.take_errors(), {7})


class TestWorkerCorePrefill(unittest.TestCase):
    KEY = b"g" * 16

    def test_push_seal(self) -> None:
        dest = PushDest("x", "peer-d", "kv-d")
        boom = OSError("no route")
        cases = [  # name, finished, mover progress, want sending, want failed push
            ("not finished by vLLM", set(), {}, set(), False),
            ("finished, transfers in flight", {"r"}, {"r": (False, None)}, set(), False),
            ("finished, transfers ended", {"r"}, {}, {"r"}, False),
            ("finished, a transfer failed", {"r"}, {"r": (True, boom)}, {"r"}, True),
        ]
        for name, finished, prog, sending, failed in cases:
            with self.subTest(name):
                c = WorkerCore(8, 1, 0, TIMEOUT)
                c.pushing("r", dest)
                c.absorb({"r": "x"}, {}, [], {}, 0.0, False)
                fin = c.finish(finished, 1.0, progress(prog))
                self.assertEqual(fin.sending, sending)
                self.assertEqual(fin.failed_pushes, [("r", "x", boom, dest)] if failed else [])
                self.assertEqual("r" in c.sealed, not sending)

    def test_seal_before_vllm_says_finished(self) -> None:
        c = WorkerCore(8, 1, 0, TIMEOUT)
        self.assertEqual(c.finish({"r"}, 1.0, progress({})).sending, set())  # vLLM's word comes first here
        c.absorb({"r": "x"}, {}, [], {}, 0.0, False)
        self.assertEqual(c.finish(set(), 1.0, progress({})).sending, {"r"})

    def hold(self, c: WorkerCore, replica: bool = False, lease: float = 5.0) -> Any:
        """Grant in one step, hold in the next (as the scheduler sends them)."""
        todo = c.absorb({}, {"r": (self.KEY, [1, 2])}, [], {}, 0.0, replica)
        self.assertEqual(todo.grants, [] if replica else [(self.KEY, [1, 2])])
        return c.absorb({}, {}, [], {"r": ("x", lease)}, 0.0, replica)

    def test_hold_served(self) -> None:
        ok = Code.OK
        cases = [  # name, decode tp, pulls (decode rank, code), want revoke at each, want sending at the end
            ("one decode rank", 1, [(0, ok)], [self.KEY], {"r"}),
            ("two decode ranks", 2, [(1, ok), (0, ok)], [b"", self.KEY], {"r"}),
            ("the same rank twice", 2, [(1, ok), (1, ok)], [b"", b""], set()),
            # a pull cut short by a sidecar going away was not served: the decode pulls again, under the grant
            ("cut short, then pulled again", 1, [(0, Code.PEER_UNAVAILABLE), (0, ok)], [b"", self.KEY], {"r"}),
            ("cut short only", 1, [(0, Code.SHUTDOWN)], [b""], set()),
            ("refused", 1, [(0, Code.ACCESS_DENIED)], [self.KEY], {"r"}),
        ]
        for name, dtp, pulls, revokes, sending in cases:
            with self.subTest(name):
                c = WorkerCore(8, 1, 0, TIMEOUT)
                self.assertEqual(self.hold(c).revoke, [])
                got = [c.note(*note("x", "d", d, dtp, code=code)).revoke for d, code in pulls]
                self.assertEqual(got, revokes)
                fin = c.finish({"r"}, 1.0, progress({}))
                self.assertEqual(fin.sending, sending)
                self.assertEqual(fin.revoke, [], "a key revoked twice")
                self.assertEqual(fin.expired, [])

    def test_hold_lease_runs_out(self) -> None:
        c = WorkerCore(8, 1, 0, TIMEOUT)
        self.hold(c, lease=5.0)
        self.assertEqual(c.finish({"r"}, 4.0, progress({})).sending, set())
        fin = c.finish(set(), 6.0, progress({}))
        self.assertEqual((fin.sending, fin.revoke, fin.expired), ({"r"}, [self.KEY], [("r", "x")]))
        self.assertEqual(c.held, {})

    def test_pull_before_hold(self) -> None:
        for code, revoke in [(Code.OK, [self.KEY]), (Code.PEER_UNAVAILABLE, [])]:
            with self.subTest(code_text(code)):
                c = WorkerCore(8, 1, 0, TIMEOUT)
                c.absorb({}, {"r": (self.KEY, [1])}, [], {}, 0.0, False)
                self.assertEqual(c.note(*note("x", "d", 0, 1, code=code)), (b"", ""))  # before the step holding it
                todo = c.absorb({}, {}, [], {"r": ("x", 5.0)}, 0.0, False)
                self.assertEqual(todo.revoke, revoke, "the early pull's end of the grant")

    def test_replica_expects_no_pull(self) -> None:
        c = WorkerCore(2, 4, 1, TIMEOUT)  # rank 1 of 4 holds head 0 after rank 0: no decode pulls from it
        self.assertEqual(self.hold(c, replica=True).revoke, [])
        self.assertEqual(c.finish({"r"}, 1.0, progress({})).sending, {"r"})

    def test_revoke_before_hold(self) -> None:
        c = WorkerCore(8, 1, 0, TIMEOUT)
        c.absorb({}, {"r": (self.KEY, [1])}, [], {}, 0.0, False)
        todo = c.absorb({}, {}, [("r", self.KEY), ("unknown", b"u" * 16)], {"r": ("x", 5.0)}, 0.0, False)
        self.assertEqual(todo.revoke, [self.KEY], "only a key this rank granted is revoked")
        self.assertEqual(c.held["r"].key, b"", "a revoked grant was held")

    def test_pull_of_a_foreign_split(self) -> None:
        c = WorkerCore(8, 1, 0, TIMEOUT)
        self.hold(c)
        got = c.note(*note("x", "d", 0, 3))
        self.assertEqual(got.revoke, b"")
        self.assertIn("by decode rank 0 of 3 ignored: 8 kv heads do not split over 3 ranks", got.warning)


if __name__ == "__main__":
    unittest.main()
