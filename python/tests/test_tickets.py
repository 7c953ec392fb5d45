"""Tickets over the sidecars' link (PROTOCOL.md 9.19): the frames, and two real staged processes.

A ticket posted on one sidecar reaches the engine connection that opened
the inbox on the other, that engine's group only; a full inbox refuses the
next ticket at once; 64 posted together all arrive. The binary is $STAGED,
or ../bin/staged (``make build``); those tests skip without it.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from stage_client import Client, Code, StageError, wire  # noqa: E402
from stage_client.protocol import ProtocolError, decode_body  # noqa: E402
from stage_client.protocol.tickets import (MAX_TICKET_BODY, TICKET_FAILURE, TICKET_PUSH, OpenInbox,  # noqa: E402
                                           PostTicket, TakeTickets, TicketItem, Tickets)
from test_e2e import HAVE_STAGED, SKIP_WHY, pair, stop_all  # noqa: E402


class TestTicketFrames(unittest.TestCase):
    def test_golden(self) -> None:
        # the same bytes as wire.TestTicketGolden (Go)
        got = wire.encode_frame(PostTicket(req=5, route="r", peer="", kind=TICKET_FAILURE, to="d", key="k", body=b"no"))
        want = (b"SG\x01\x9b\x00\x00\x00\x00\x1a\x00\x00\x00\x00\x00\x00\x00" + bytes([5, 0, 0, 0, 0, 0, 0, 0])
                + b"\x01\x00r" + b"\x00\x00" + b"\x02" + b"\x01\x00d" + b"\x01\x00k" + b"\x02\x00\x00\x00no")
        self.assertEqual(got, want)

    def test_round_trip(self) -> None:
        for m in (OpenInbox(req=1, name="prefill-0"), TakeTickets(req=2, max=64, wait_ms=500),
                  PostTicket(req=3, route="decode", peer="p", kind=TICKET_PUSH, to="x", key="k", body=b"{}"),
                  Tickets(req=4, items=[TicketItem("decode-0", TICKET_PUSH, "pre", "x1", b'{"a":1}'),
                                        TicketItem("", TICKET_FAILURE, "", "x2", b"")]),
                  Tickets(req=5)):
            self.assertEqual(decode_body(int(m.TYPE), m.encode()), m)

    def test_refused(self) -> None:
        with self.assertRaises(ValueError):
            PostTicket(req=1, route="r", key="k", body=b"x" * (MAX_TICKET_BODY + 1)).encode()
        with self.assertRaises(ValueError):
            PostTicket(req=1, route="r", key="k", kind=4).encode()
        body = bytearray(PostTicket(req=1, route="r", key="k").encode())
        body[8 + 3 + 2] = 9  # Kind
        with self.assertRaisesRegex(ProtocolError, "kind"):
            decode_body(155, bytes(body))
        with self.assertRaises(ProtocolError):
            decode_body(157, bytes(8) + (257).to_bytes(4, "little"))  # more items than allowed

    def test_fuzz(self) -> None:
        """Random bytes and mutations of valid bodies decode or raise ProtocolError, nothing else."""
        rng = random.Random(33)
        seeds = [m.encode() for m in (OpenInbox(req=1, name="n"), TakeTickets(req=2),
                                      PostTicket(req=3, route="r", key="k", body=b"{}"),
                                      Tickets(req=4, items=[TicketItem("a", 1, "b", "c", b"d")]))]
        for i in range(20000):
            t = 154 + i % 4
            b = bytearray(seeds[i % 4] if rng.random() < 0.8 else rng.randbytes(rng.randrange(40)))
            for _ in range(rng.randrange(1, 4)):
                if b:
                    b[rng.randrange(len(b))] = rng.randrange(256)
            if rng.random() < 0.3:
                b = b[:rng.randrange(len(b) + 1)]
            try:
                decode_body(t, bytes(b))
            except ProtocolError:
                pass


@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestTicketsLive(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.pre, cls.dec = pair()

    @classmethod
    def tearDownClass(cls) -> None:
        why = stop_all([cls.pre, cls.dec])
        if why:
            raise AssertionError(why)

    def client(self, node: object) -> Client:
        c = Client(node.socket)  # type: ignore[attr-defined]
        self.addCleanup(c.close)
        return c

    def test_delivered_to_the_owner_only(self) -> None:
        owner, other, poster = self.client(self.dec), self.client(self.dec), self.client(self.pre)
        owner.open_inbox("live-d")
        with self.assertRaises(StageError) as cm:
            other.open_inbox("live-d")
        self.assertEqual(cm.exception.code, Code.EXISTS)
        poster.post_ticket("decode", "k1", b'{"block_ids":[1]}', to="live-d")
        t0 = time.monotonic()
        poster.post_ticket("decode", "k1", b"refused layout", to="live-d", kind=TICKET_FAILURE)
        self.assertEqual(other.take_tickets(wait=0.05), [])
        got = owner.take_tickets(wait=2.0)
        self.assertLess(time.monotonic() - t0, 1.0)
        self.assertEqual(got, [TicketItem("prefill", TICKET_PUSH, "live-d", "k1", b'{"block_ids":[1]}'),
                               TicketItem("prefill", TICKET_FAILURE, "live-d", "k1", b"refused layout")])

    def test_full_inbox_refuses(self) -> None:
        owner, poster = self.client(self.dec), self.client(self.pre)
        owner.open_inbox("live-full")
        big = b"7" * MAX_TICKET_BODY
        for i in range((16 << 20) // MAX_TICKET_BODY):
            poster.post_ticket("decode", "f%d" % i, big, to="live-full")
        with self.assertRaises(StageError) as cm:
            poster.post_ticket("decode", "over", big, to="live-full")
        self.assertEqual(cm.exception.code, Code.BUSY)
        self.assertIn("full", str(cm.exception))

    def test_burst_of_64(self) -> None:
        owner = self.client(self.dec)
        owner.open_inbox("live-burst")
        posters = [self.client(self.pre) for _ in range(8)]
        errs: list = []

        def one(i: int) -> None:
            try:
                posters[i % 8].post_ticket("decode", "b%d" % i, b"{}", to="live-burst")
            except StageError as e:
                errs.append(e)

        ts = [threading.Thread(target=one, args=(i,)) for i in range(64)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        self.assertEqual(errs, [])
        keys = set()
        deadline = time.monotonic() + 10
        while len(keys) < 64 and time.monotonic() < deadline:
            keys |= {it.key for it in owner.take_tickets(wait=0.5)}
        self.assertEqual(len(keys), 64)



@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestTicketLinkRestart(unittest.TestCase):
    """The decode's sidecar restarts under its scheduler's TicketLink (vLLM push mode): a ticket posted right after
    waits for the link's next connection and arrives, instead of failing (the request would recompute)."""

    def test_post_right_after_restart(self) -> None:
        from stage_client.vllm.config import StageConfig
        from stage_client.vllm.tickets import TicketLink

        pre, dec = pair(pulls=True)
        self.addCleanup(stop_all, [pre, dec])
        owner = Client(pre.socket)
        self.addCleanup(owner.close)
        owner.open_inbox("restart-p")
        cfg = StageConfig(socket=dec.socket, route="prefill", kv_name="restart-d", timeout_s=5.0)
        link = TicketLink(cfg, lambda it: None)
        self.addCleanup(link.close)
        self.assertTrue(link.wait_ready(10))
        link.post(TICKET_PUSH, "k0", b"{}", to="restart-p")
        dec.restart()
        t0 = time.monotonic()
        link.post(TICKET_PUSH, "k1", b"{}", to="restart-p", timeout=5.0)
        took = time.monotonic() - t0
        keys = set()
        deadline = time.monotonic() + 10
        while keys != {"k0", "k1"} and time.monotonic() < deadline:
            keys |= {it.key for it in owner.take_tickets(wait=0.5)}
        self.assertEqual(keys, {"k0", "k1"})
        self.assertLess(took, 5.0)


@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestTicketsSentAgain(unittest.TestCase):
    """The prefill's sidecar dies with a ticket queued in its inbox that its engine has not taken yet: once it is
    back, the decode's sidecar sends the tickets of its last second again, and the engine, its inbox opened again,
    takes it (else the request would wait out its deadline and recompute)."""

    def test_ticket_queued_before_the_restart(self) -> None:
        pre, dec = pair(pulls=True)
        self.addCleanup(stop_all, [pre, dec])
        owner = Client(pre.socket, reconnect=True, reconnect_wait=2.0)
        self.addCleanup(owner.close)
        owner.on_reconnect(lambda c: c.open_inbox("lost-p"))
        owner.open_inbox("lost-p")
        poster = Client(dec.socket)
        self.addCleanup(poster.close)
        poster.post_ticket("prefill", "k0", b'{"block_ids":[1]}', to="lost-p")
        pre.restart()  # k0 was queued there, not taken
        got = []
        deadline = time.monotonic() + 15
        while not got and time.monotonic() < deadline:
            try:
                got = owner.take_tickets(wait=0.5)
            except StageError:  # the connection restored under the call
                time.sleep(0.05)
        self.assertEqual([(it.sender, it.key, it.body) for it in got], [("decode", "k0", b'{"block_ids":[1]}')])
        self.assertIn("tickets sent again", dec.tail(100))


if __name__ == "__main__":
    unittest.main()
