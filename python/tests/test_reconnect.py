"""Client(reconnect=...): the sidecar restarts under a client (issue 33 item 2).

A FakeSidecar at one socket path is closed (the sidecar dies) and another
started at that path (it comes back): calls in flight fail once, calls
while away fail at once, the client dials again with backoff, joins its
group, subscribes again and runs its on_reconnect callbacks before other
calls go through; close() joins every thread and leaves no fd.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import unittest
from typing import Any, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fakesidecar import FakeSidecar, ok  # noqa: E402
from stage_client import wire  # noqa: E402
from stage_client.client import Client  # noqa: E402
from stage_client.errors import SidecarConnectionError  # noqa: E402
from stage_client.reconnect import Backoff, RateLimited, failure_kind  # noqa: E402
from stage_client.wire import Code  # noqa: E402

GROUP = "g" * 16


def answer_all(srv: FakeSidecar, h: Any, m: Any, fd: int) -> List[bytes]:
    """OK to every request; a Wait is never answered (a transfer in flight)."""
    return [] if isinstance(m, wire.Wait) else [ok(m.req)]


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def client_threads() -> List[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("stage-client")]


def until(cond: Any, timeout: float = 20.0) -> bool:  # a bound for a loaded CI machine; returns when cond holds
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return bool(cond())


class TestReconnect(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="stage-reconnect-")
        self.path = os.path.join(self.dir.name, "s.sock")
        self.fakes: List[FakeSidecar] = []
        self.fds0 = fds()

    def tearDown(self) -> None:
        for f in self.fakes:
            f.close()
        self.dir.cleanup()

    def sidecar(self) -> FakeSidecar:
        f = FakeSidecar(answer_all, path=self.path)
        self.fakes.append(f)
        return f

    def types(self, f: FakeSidecar) -> List[str]:
        return [type(m).__name__ for _, m, _ in f.got]

    def test_restart(self) -> None:
        first = self.sidecar()
        c = Client(self.path, request_timeout=5, group=GROUP, reconnect=Backoff(0.01, 0.05))
        hooked: List[Client] = []

        def again(cl: Client) -> None:
            hooked.append(cl)
            cl.register("kv/0/0", 3, 3, 4096, 0, 4096)  # the cache registered again under its old name

        c.on_reconnect(again)
        sub = c.subscribe()
        fut = c.wait_future(7)  # a transfer in flight at the restart
        self.assertTrue(until(lambda: len(first.got) == 3))
        first.close()  # the sidecar dies
        with self.assertRaises(SidecarConnectionError):
            fut.result(5)  # fails once
        with self.assertRaises(SidecarConnectionError):
            c.status(1)  # while away: at once, no wait
        self.assertEqual(c.reconnects, 0)
        second = self.sidecar()  # it comes back at the same socket
        self.assertTrue(until(lambda: c.reconnects == 1), "the client did not come back")
        self.assertEqual(self.types(second)[:3], ["Join", "Subscribe", "Register"])
        self.assertEqual(hooked, [c])
        c.cancel(1)  # calls go through again
        second.send(wire.encode_frame(wire.Notify(transfer=9, peer="p", tag="t")))
        n = sub.get(5)  # the old subscription carries on
        self.assertIsNotNone(n)
        assert n is not None
        self.assertEqual(n.transfer, 9)
        c.close()
        self.assertEqual(client_threads(), [])
        with self.assertRaises(SidecarConnectionError):
            sub.get(1)  # ends once the client is closed
        second.close()
        self.fakes.clear()
        self.assertEqual(fds(), self.fds0, "fds leaked")

    def test_reconnect_wait(self) -> None:
        """With reconnect_wait, a call made while the sidecar is away waits for it to come back (and the callbacks
        to run) instead of failing; once that long has passed since the loss, calls fail at once again."""
        first = self.sidecar()
        c = Client(self.path, request_timeout=5, reconnect=Backoff(0.01, 0.05), reconnect_wait=3.0)
        hooked: List[float] = []
        c.on_reconnect(lambda cl: hooked.append(time.monotonic()))
        first.close()
        self.assertTrue(until(lambda: c.closed))
        threading.Timer(0.3, self.sidecar).start()  # back 0.3 s later
        t0 = time.monotonic()
        c.cancel(1)  # waits, then goes through on the new connection
        took = time.monotonic() - t0
        self.assertEqual(len(hooked), 1, "the call went through before the callbacks ran")
        self.assertGreaterEqual(took, 0.2)
        self.assertLess(took, 3.0)
        self.assertEqual(c.reconnects, 1)
        gone = time.monotonic()
        self.fakes[-1].close()  # away again, for good
        self.assertTrue(until(lambda: c.closed))
        with self.assertRaises(SidecarConnectionError):
            c.cancel(2)  # waits until reconnect_wait after the loss (which came after ``gone``), then fails
        self.assertGreaterEqual(time.monotonic() - gone, 3.0)
        t0 = time.monotonic()
        with self.assertRaises(SidecarConnectionError):
            c.cancel(3)  # still away past reconnect_wait: at once
        self.assertLess(time.monotonic() - t0, 0.5)
        c.close()
        self.assertEqual(client_threads(), [])

    def test_backoff_no_busy_loop(self) -> None:
        first = self.sidecar()
        c = Client(self.path, request_timeout=5, reconnect=Backoff(0.02, 0.1))
        dials = []
        real = c._dial

        def dial() -> Any:
            dials.append(time.monotonic())
            return real()

        c._dial = dial  # type: ignore[method-assign]
        first.close()
        self.fakes.clear()
        time.sleep(0.6)  # away: pauses of 10-20, 20-40, 40-80 ms, then 50-100 ms
        n = len(dials)
        self.assertGreaterEqual(n, 3)
        self.assertLessEqual(n, 14, "dials %d times in 0.6 s" % n)
        gaps = [b - a for a, b in zip(dials, dials[1:])]
        self.assertGreaterEqual(min(gaps), 0.009)
        self.sidecar()
        self.assertTrue(until(lambda: c.reconnects == 1))
        t0 = time.monotonic()
        c.close()
        self.assertLess(time.monotonic() - t0, 1.0)
        self.assertEqual(client_threads(), [])

    def test_close_while_away(self) -> None:
        first = self.sidecar()
        c = Client(self.path, request_timeout=5, reconnect=Backoff(0.5, 2.0))
        first.close()
        self.fakes.clear()
        self.assertTrue(until(lambda: c.closed))
        t0 = time.monotonic()
        c.close()  # wakes the reconnect thread out of its pause
        self.assertLess(time.monotonic() - t0, 0.5)
        self.assertEqual(client_threads(), [])
        self.assertEqual(fds(), self.fds0, "fds leaked")

    def test_callback_fails_then_retried(self) -> None:
        first = self.sidecar()
        c = Client(self.path, request_timeout=5, reconnect=Backoff(0.01, 0.05))
        tries: List[int] = []

        def flaky(cl: Client) -> None:
            tries.append(1)
            if len(tries) == 1:
                raise SidecarConnectionError("the name is still taken", Code.ALREADY_EXISTS)

        c.on_reconnect(flaky)
        first.close()
        self.fakes.clear()
        self.sidecar()
        # the first connection is dropped when the callback fails; the listener takes one connection, so start
        # another at the same path once it was dropped
        self.assertTrue(until(lambda: len(tries) == 1))
        self.sidecar()
        self.assertTrue(until(lambda: c.reconnects == 1), "not retried after a failed callback")
        self.assertEqual(len(tries), 2)
        c.close()
        self.assertEqual(client_threads(), [])

    def test_close_while_a_callback_fails(self) -> None:
        # close() while the reconnect thread restores a connection whose callback then fails: close returns
        first = self.sidecar()
        c = Client(self.path, request_timeout=5, reconnect=Backoff(0.01, 0.05))
        closer = threading.Thread(target=c.close)

        def failing(cl: Client) -> None:
            closer.start()
            time.sleep(0.2)  # close() is waiting for this thread now
            raise SidecarConnectionError("registering again failed")

        c.on_reconnect(failing)
        first.close()
        self.fakes.clear()
        self.sidecar()
        closer_started = until(lambda: closer.is_alive() or closer.ident is not None)
        self.assertTrue(closer_started, "never reconnected")
        closer.join(3)
        self.assertFalse(closer.is_alive(), "close() hangs when a reconnect callback fails under it")
        self.assertEqual(client_threads(), [])

    def test_without_reconnect_stays_closed(self) -> None:
        first = self.sidecar()
        c = Client(self.path, request_timeout=5)
        sub = c.subscribe()
        first.close()
        self.fakes.clear()
        with self.assertRaises(SidecarConnectionError):
            sub.get(5)  # the subscription ends
        self.sidecar()
        time.sleep(0.2)
        self.assertEqual(c.reconnects, 0)
        with self.assertRaises(SidecarConnectionError):
            c.status(1)
        c.close()


class TestBackoff(unittest.TestCase):
    def test_grows_capped_jittered(self) -> None:
        b = Backoff(0.1, 1.0, rand=lambda: 1.0)
        self.assertEqual([round(b.next(), 3) for _ in range(6)], [0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
        lo = Backoff(0.1, 1.0, rand=lambda: 0.0)
        self.assertEqual([round(lo.next(), 3) for _ in range(3)], [0.05, 0.1, 0.2])
        b.reset()
        self.assertEqual(round(b.next(), 3), 0.1)
        with self.assertRaises(ValueError):
            Backoff(0, 1)
        with self.assertRaises(ValueError):
            Backoff(2, 1)


class TestRateLimited(unittest.TestCase):
    def test_counts_what_it_held_back(self) -> None:
        now = [0.0]
        lines: List[str] = []

        class L:
            def log(self, level: int, msg: str, *args: Any) -> None:
                lines.append(msg % args)

        r = RateLimited(L(), 10.0, clock=lambda: now[0])  # type: ignore[arg-type]
        self.assertTrue(r(30, "lost %s", "a"))
        self.assertFalse(r(30, "lost %s", "b"))
        self.assertFalse(r(30, "lost %s", "c"))
        now[0] = 11.0
        self.assertTrue(r(30, "lost %s", "d"))
        self.assertEqual(lines, ["lost a", "lost d (and 2 more like it in the last 10s)"])

    def test_kinds_do_not_hide_each_other(self) -> None:
        """A run of one cause's lines does not hold back the first line of another; each kind counts its own."""
        now = [0.0]
        lines: List[str] = []

        class L:
            def log(self, level: int, msg: str, *args: Any) -> None:
                lines.append(msg % args)

        r = RateLimited(L(), 10.0, clock=lambda: now[0], kinds=2)  # type: ignore[arg-type]
        self.assertTrue(r(30, "timed out %s", 1, kind="timeout"))
        self.assertFalse(r(30, "timed out %s", 2, kind="timeout"))
        self.assertTrue(r(30, "refused %s", 3, kind="refused"))
        self.assertFalse(r(30, "refused %s", 4, kind="refused"))
        self.assertTrue(r(30, "gone %s", 5, kind="gone"))  # a third kind: "timeout" (the oldest) is forgotten
        self.assertTrue(r(30, "timed out %s", 6, kind="timeout"))  # and now "refused" is forgotten
        self.assertTrue(r(30, "refused %s", 7, kind="refused"))
        now[0] = 5.0
        self.assertFalse(r(30, "refused %s", 8, kind="refused"))
        now[0] = 11.0
        self.assertTrue(r(30, "refused %s", 9, kind="refused"))
        self.assertEqual(lines, ["timed out 1", "refused 3", "gone 5", "timed out 6", "refused 7",
                                 "refused 9 (and 1 more like it in the last 10s)"])

    def test_failure_kind(self) -> None:
        """Failures of one cause share a kind whatever names, ids and counts they carry; other causes do not."""
        a = failure_kind('peer prefill: pull from KV cache "3cf5-tp0" refused: no live grant (exactly these 2 blocks)')
        b = failure_kind('peer prefill: pull from KV cache "9a1b-tp1" refused: no live grant (exactly these 17 blocks)')
        c = failure_kind("transfer 12 timed out after 8.0 s")
        self.assertEqual(a, b)
        self.assertNotEqual(a, c)
        self.assertEqual(failure_kind("cmpl-92ae1684935a7726-0-a35182ff lost"), failure_kind("cmpl-1-0-2 lost"))


if __name__ == "__main__":
    unittest.main()
