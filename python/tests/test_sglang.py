"""stage_client.sglang driven as SGLang's disaggregation drives a backend, with two real sidecars.

A prefill of two tensor-parallel ranks (two kv heads each) and a decode of
one rank (all four), SGLang token pools (per layer K and V buffers of
(tokens, heads, head_dim), 16-token pages), random rows. Per request, as
SGLang does: the decode's KVReceiver ``init`` + ``send_metadata(pages)``;
the prefill's KVSender polls until WaitingForInput, ``init(num_pages)``,
``send`` once per chunk (two chunks), polls until Success; the decode's
receiver polls until Success. Every row moved must equal the prefill's
(compared in canonical order with the reference mapper), rows not moved
must be untouched; a receiver whose prefill never sends is Failed at its
deadline. With aux (metadata) buffers on both sides, as SGLang gives them:
the prefill's slot lands in the decode's slot, byte for byte, before the
receiver says Success, and no other slot changes; aux buffers that differ
between the sides, or missing on the prefill, fail the room.
"""

from __future__ import annotations

import os
import random
import sys
import time
import unittest
from unittest import mock
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

try:
    import torch

    WHY = ""
except ImportError:
    torch = None
    WHY = "torch is not installed"

from test_e2e import HAVE_STAGED, SKIP_WHY, pair, stop_all  # noqa: E402
from stage_client import HostArena, sides  # noqa: E402
if torch is not None:  # kvmap needs torch; without it the tests skip, saying so
    from stage_client.kvmap import gather_tensor  # noqa: E402
from stage_client.rendezvous import RendezvousServer  # noqa: E402
from stage_client.sglang import KVPoll, StageKVManager, StageKVReceiver, StageKVSender  # noqa: E402
from stage_client.engines import plan  # noqa: E402
from stage_client.client import Client  # noqa: E402
from stage_client.errors import StageError  # noqa: E402
from stage_client.protocol.tickets import TICKET_AUX, TICKET_PUSH  # noqa: E402
from stage_client.sglang import auxmeta  # noqa: E402

LAYERS, HEADS, D, PAGE, PAGES = 3, 4, 32, 16, 40
AUX_SLOTS = 24


def poll_until(obj: Any, want: int, limit: float = 30.0) -> None:
    t0 = time.monotonic()
    while True:
        st = obj.poll()
        if st == want:
            return
        if st == KVPoll.Failed and want != KVPoll.Failed:
            obj.failure_exception()
        if time.monotonic() - t0 > limit:
            raise AssertionError("poll %s after %ss, want %s" % (st, limit, want))
        time.sleep(0.01)


def token_pool(arena: Any, layers: int, rows: int, held: int, head_dim: int, seed: int,
               dtype: Any = None) -> tuple:
    """SGLang token-pool buffers in ``arena``: per layer K and V of (rows, held heads, head_dim), random."""
    g = torch.Generator().manual_seed(seed)
    ks, vs = [], []
    for _ in range(layers):
        for out in (ks, vs):
            t = arena.empty((rows, held, head_dim), dtype or torch.float32)
            t.copy_(torch.randn(t.shape, generator=g))
            out.append(t)
    return ks, vs


class SidecarPairCase(unittest.TestCase):
    """Two sidecars (prefill, decode) and a HostArena for the class's tests."""

    arena_bytes, arena_name = 48 << 20, "sglang"

    @classmethod
    def setUpClass(cls) -> None:
        cls.pre, cls.dec = pair()
        cls.arena = HostArena(cls.arena_bytes, cls.arena_name)

    @classmethod
    def tearDownClass(cls) -> None:
        why = stop_all([cls.pre, cls.dec])
        cls.arena.close()
        if why:
            raise AssertionError(why)


@unittest.skipIf(torch is None, WHY)
@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestSGLangBackend(SidecarPairCase):
    def pool(self, held: int, seed: int) -> tuple:
        return token_pool(self.arena, LAYERS, PAGES * PAGE, held, D, seed)

    def managers(self, name: str, timeout: float = 30.0, pre_aux: Any = None, dec_aux: Any = None) -> tuple:
        boot = RendezvousServer("127.0.0.1", 0, insecure=True)
        pres = []
        for r in range(2):
            ks, vs = self.pool(2, 10 + r)
            pres.append(StageKVManager(self.pre.socket, name + "-p", ks, vs, PAGE, HEADS, "prefill", tp_rank=r,
                                       tp_size=2, route="decode", bootstrap=boot, timeout=timeout,
                                       aux_buffers=pre_aux))
        ks, vs = self.pool(4, 20)
        dec = StageKVManager(self.dec.socket, name + "-d", ks, vs, PAGE, HEADS, "decode", route="prefill",
                             timeout=timeout, aux_buffers=dec_aux)
        for m in pres + [dec]:
            self.addCleanup(m.close)
        self.addCleanup(boot.close)
        return boot, pres, dec

    def test_push_chunks(self) -> None:
        boot, pres, dec = self.managers("sg")
        before = [t.clone() for layer in dec.buffers for t in layer]
        rng = random.Random(5)
        tokens = 7 * PAGE - 5
        npages = -(-tokens // PAGE)
        ppages = rng.sample(range(PAGES), npages)
        dpages = rng.sample(range(PAGES), npages)
        recv = StageKVReceiver(dec, boot.address, bootstrap_room=4242)
        self.assertEqual(recv.poll(), KVPoll.WaitingForInput)
        recv.init(0)  # newer SGLang: a prefill dp rank, then send_metadata
        recv.send_metadata(dpages)
        senders = [StageKVSender(m, boot.address, 4242, dest_tp_ranks=[0]) for m in pres]
        for s in senders:
            poll_until(s, KVPoll.WaitingForInput)
            s.init(npages)
            s.send(ppages[:3])  # chunked prefill: two chunks
        for s in senders:
            s.send(ppages[3:])
            poll_until(s, KVPoll.Success)
        poll_until(recv, KVPoll.Success)
        # every moved row equals the prefill rank's row
        for m in pres:
            a, b = sides(m.kv.layout, ppages, dec.kv.layout, dpages, tokens)
            got = gather_tensor(b, dec.buffers)
            self.assertTrue(torch.equal(gather_tensor(a, m.buffers), got), "rows of prefill rank %d" % m.rank)
        # rows of pages not named stay as they were
        untouched = [p for p in range(PAGES) if p not in dpages]
        for t0, t1 in zip(before, [t for layer in dec.buffers for t in layer]):
            v0, v1 = t0.view(PAGES, -1), t1.view(PAGES, -1)
            self.assertTrue(torch.equal(v0[untouched], v1[untouched]))

    @staticmethod
    def aux_buffers(seed: int, hidden: int = 64, device: str = "cpu") -> list:
        """SGLang-like metadata buffers: output ids, top logprobs, a hidden state per slot."""
        g = torch.Generator().manual_seed(seed)
        return [t.to(device) for t in (torch.randint(0, 1 << 30, (AUX_SLOTS, 16), generator=g, dtype=torch.int32),
                                       torch.randn((AUX_SLOTS, 8), generator=g, dtype=torch.float32),
                                       torch.randn((AUX_SLOTS, hidden), generator=g).to(torch.bfloat16))]

    def test_aux(self) -> None:
        """CPU aux buffers, and CUDA ones where torch has a GPU (the KV stays in host memory); as tickets (sidecars
        that carry kind 3), and into regions (a decode whose sidecar predates them)."""
        for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
            for tickets in (True, False):
                with self.subTest(device=device, tickets=tickets), \
                        mock.patch.object(auxmeta, "takes_aux_tickets", return_value=tickets):
                    self.aux_case("sga-%s-%d" % (device, tickets), device, tickets)

    def aux_case(self, name: str, device: str, tickets: bool) -> None:
        pre_aux, dec_aux = self.aux_buffers(1, device=device), self.aux_buffers(2, device=device)
        boot, pres, dec = self.managers(name, pre_aux=pre_aux, dec_aux=dec_aux)
        exposed = [r["name"] for r in dec.client.regions() if "-aux-" in r["name"]]
        self.assertEqual(exposed, [] if tickets else [name + "-d-aux-tp0-%d" % i for i in range(3)],
                         "the decode's regions peers may write without a grant")
        before = [b.clone() for b in dec_aux]
        pslot, dslot, room = 5, 11, 99
        pages = [3, 9]
        recv = StageKVReceiver(dec, boot.address, bootstrap_room=room)
        recv.init(0)
        recv.send_metadata(pages, aux_index=dslot)
        self.assertEqual(boot.get("%d@0" % room).get("aux_tickets", False), tickets)
        senders = [StageKVSender(m, boot.address, room, dest_tp_ranks=[0]) for m in pres]
        for s in senders:
            poll_until(s, KVPoll.WaitingForInput)
            s.init(len(pages), aux_index=pslot)
            s.send(pages[:1])
        self.assertNotEqual(recv.poll(), KVPoll.Success, "Success before the last chunk and its aux were sent")
        for s in senders:
            s.send(pages[1:])
            poll_until(s, KVPoll.Success)
        poll_until(recv, KVPoll.Success)
        for i, (p, d, b) in enumerate(zip(pre_aux, dec_aux, before)):
            self.assertTrue(torch.equal(d[dslot].view(torch.uint8), p[pslot].view(torch.uint8)), "aux buffer %d" % i)
            others = [j for j in range(AUX_SLOTS) if j != dslot]
            self.assertTrue(torch.equal(d[others], b[others]), "aux buffer %d: another slot changed" % i)
        recv.clear()

    def test_aux_tickets_guarded(self) -> None:
        """An aux ticket lands in a room only under the room's grant key: another engine of the prefill's side
        posting one with another key, for another rank, of the wrong size or of another kind changes nothing,
        and the prefill's own then lands."""
        pre_aux, dec_aux = self.aux_buffers(5), self.aux_buffers(6)
        boot, pres, dec = self.managers("sgt", pre_aux=pre_aux, dec_aux=dec_aux)
        self.assertIsNotNone(dec.aux_inbox, "this staged does not carry aux tickets")
        before = [b.clone() for b in dec_aux]
        recv = StageKVReceiver(dec, boot.address, bootstrap_room=7)
        recv.init(0)
        recv.send_metadata([2], aux_index=4)
        key = bytes.fromhex(boot.get("7@0")["grant"])
        forger = Client(self.pre.socket)
        self.addCleanup(forger.close)
        size = sum(dec.aux_items)
        inbox = auxmeta.inbox_name(dec.cache_name)
        for why, kind, tkey, body in [
            ("another key", TICKET_AUX, "7@0", auxmeta.ticket_body(b"f" * 16, b"\x07" * size)),
            ("another rank", TICKET_AUX, "7@1", auxmeta.ticket_body(key, b"\x07" * size)),
            ("another room", TICKET_AUX, "8@0", auxmeta.ticket_body(key, b"\x07" * size)),
            ("malformed", TICKET_AUX, "7@0", b"\xff"),
            ("a push ticket", TICKET_PUSH, "7@0", auxmeta.ticket_body(key, b"\x07" * size)),
        ]:
            with self.subTest(why), self.assertLogs("stage_client.sglang.core", "WARNING") as logs:
                forger.post_ticket("decode", tkey, body, to=inbox, kind=kind)
                end = time.monotonic() + 5
                while not logs.output and time.monotonic() < end:
                    time.sleep(0.01)
            self.assertIn("is refused", logs.output[0])
            self.assertNotEqual(recv.poll(), KVPoll.Failed, why)
        for i, (d, b) in enumerate(zip(dec_aux, before)):
            self.assertTrue(torch.equal(d, b), "aux buffer %d changed" % i)
        senders = [StageKVSender(m, boot.address, 7, dest_tp_ranks=[0]) for m in pres]
        for s in senders:
            poll_until(s, KVPoll.WaitingForInput)
            s.init(1, aux_index=9)
            s.send([1])
            poll_until(s, KVPoll.Success)
        poll_until(recv, KVPoll.Success)
        for i, (p, d) in enumerate(zip(pre_aux, dec_aux)):
            self.assertTrue(torch.equal(d[4].view(torch.uint8), p[9].view(torch.uint8)), "aux buffer %d" % i)
        # a key of the right room but the wrong size fails the room, saying so
        recv2 = StageKVReceiver(dec, boot.address, bootstrap_room=11)
        recv2.init(0)
        recv2.send_metadata([5], aux_index=6)
        key2 = bytes.fromhex(boot.get("11@0")["grant"])
        with self.assertLogs("stage_client.sglang.core", "WARNING"):
            forger.post_ticket("decode", "11@0", auxmeta.ticket_body(key2, b"\x01" * (size - 1)), to=inbox,
                               kind=TICKET_AUX)
            poll_until(recv2, KVPoll.Failed, 5)
        with self.assertRaisesRegex(RuntimeError, "the aux slot has %d" % size):
            recv2.failure_exception()
        recv2.abort()

    def test_aux_prefill_sidecar_predates_tickets(self) -> None:
        """A decode that takes aux tickets, a prefill whose sidecar does not carry them: the send fails, saying
        to upgrade the prefill's staged."""
        boot, pres, dec = self.managers("sgo", pre_aux=self.aux_buffers(7), dec_aux=self.aux_buffers(8))
        recv = StageKVReceiver(dec, boot.address, bootstrap_room=1)
        recv.send_metadata([0], aux_index=0)
        for m in pres:
            m.aux_tickets = False  # as a manager on an older staged found
        s = StageKVSender(pres[0], boot.address, 1)
        poll_until(s, KVPoll.WaitingForInput)
        s.init(1, aux_index=0)
        s.send([0])
        poll_until(s, KVPoll.Failed, 5)
        with self.assertRaisesRegex(RuntimeError, "upgrade its staged"):
            s.failure_exception()

    def test_aux_mismatch(self) -> None:
        for name, pre_aux, why in [("sgm", self.aux_buffers(3, hidden=32), "aux buffers differ"),
                                   ("sgn", None, "no aux_buffers")]:
            with self.subTest(why):
                boot, pres, dec = self.managers(name, pre_aux=pre_aux, dec_aux=self.aux_buffers(4))
                recv = StageKVReceiver(dec, boot.address, bootstrap_room=1)
                recv.send_metadata([0], aux_index=0)
                s = StageKVSender(pres[0], boot.address, 1)
                poll_until(s, KVPoll.WaitingForInput)
                s.init(1, aux_index=0)
                s.send([0])
                poll_until(s, KVPoll.Failed, 5)
                with self.assertRaisesRegex(RuntimeError, why):
                    s.failure_exception()

    def test_grants(self) -> None:
        """The decode grants the prefill's pushes exactly the room's pages (its ticket names the key, one per
        decode rank): a push without the key, or with it after the room ended (revoked), is refused and writes
        nothing."""
        boot, pres, dec = self.managers("sgg")
        tokens = 3 * PAGE
        ppages, dpages = [1, 5, 2], [6, 0, 3]
        recv = StageKVReceiver(dec, boot.address, bootstrap_room=99)
        recv.send_metadata(dpages)
        t = boot.get("99@0")
        self.assertIsNotNone(t, "the decode rank's ticket is posted under room@rank")
        key = bytes.fromhex(t["grant"])
        senders = [StageKVSender(m, boot.address, 99) for m in pres]
        for s in senders:
            poll_until(s, KVPoll.WaitingForInput)
            s.init(len(ppages))
            s.send(ppages)
        for s in senders:
            poll_until(s, KVPoll.Success)
        poll_until(recv, KVPoll.Success)  # every row landed: the grant is revoked
        before = [t.clone() for layer in dec.buffers for t in layer]
        m = pres[0]
        lo, hi = [(lo, hi) for s_, d, lo, hi in plan(HEADS, 2, 1) if s_ == 0][0]
        for what, k in (("without a key", b""), ("with the room's key after it ended", key)):
            with self.subTest(what):
                xid = m.kv.push(m.route, dec.cache_name, ppages, dpages, tokens, heads=(lo, hi), key=k)
                with self.assertRaisesRegex(StageError, "no live grant"):
                    st = m.client.wait(xid, 10.0)
                    raise AssertionError("the push went through: %s" % (st,))
        for t0, t1 in zip(before, [t for layer in dec.buffers for t in layer]):
            self.assertTrue(torch.equal(t0, t1), "a refused push wrote into the decode's pool")

    def test_receiver_fails_at_deadline(self) -> None:
        boot, pres, dec = self.managers("sgf", timeout=1.0)
        recv = StageKVReceiver(dec, boot.address, bootstrap_room=7)
        recv.send_metadata([1, 2])
        t0 = time.monotonic()
        poll_until(recv, KVPoll.Failed, 5)
        self.assertGreaterEqual(time.monotonic() - t0, 0.9)
        with self.assertRaises(RuntimeError):
            recv.failure_exception()
        s = StageKVSender(pres[0], boot.address, 8)  # no decode ever posts room 8
        poll_until(s, KVPoll.Failed, 5)


@unittest.skipIf(torch is None, WHY)
@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestSGLangSidecarRestart(unittest.TestCase):
    """A sidecar SIGKILLed and started again under running managers (issue 33 item 2): their clients reconnect,
    register the pools again, and pages move again within seconds; a room arriving at the restart fails at once."""

    BACK_S = 10.0
    pool = TestSGLangBackend.pool
    managers = TestSGLangBackend.managers

    def setUp(self) -> None:
        self.pre, self.dec = pair()
        self.addCleanup(stop_all, [self.pre, self.dec])
        self.arena = HostArena(16 << 20, "sglang-restart")
        self.addCleanup(self.arena.close)

    def room(self, boot: Any, pres: Any, dec: Any, room: int) -> int:
        """Pages of one room from both prefill ranks into the decode; the receiver's end state."""
        pages = random.Random(room).sample(range(PAGES), 3)
        recv = StageKVReceiver(dec, boot.address, bootstrap_room=room)
        recv.init(0)
        recv.send_metadata(pages)
        senders = [StageKVSender(m, boot.address, room, dest_tp_ranks=[0]) for m in pres]
        for s in senders:
            poll_until(s, KVPoll.WaitingForInput)
            s.init(len(pages))
            s.send(pages)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            if any(s.poll() == KVPoll.Failed for s in senders):
                return KVPoll.Failed  # (the decode learns it at its timeout: issue 33 item 3)
            if recv.poll() in (KVPoll.Success, KVPoll.Failed):
                break
            time.sleep(0.01)
        return recv.poll()

    def restarted(self, which: str) -> None:
        boot, pres, dec = self.managers("sgr")
        self.assertEqual(self.room(boot, pres, dec, 1), KVPoll.Success)
        node, mgr = (self.pre, pres[0]) if which == "prefill" else (self.dec, dec)
        node.restart()
        t0 = time.monotonic()
        n = 2
        while self.room(boot, pres, dec, n) != KVPoll.Success:
            self.assertLess(time.monotonic() - t0, self.BACK_S, "no pages moved %ss after the %s's sidecar "
                            "restarted" % (self.BACK_S, which))
            n += 1
        self.assertEqual(mgr.client.reconnects, 1)

    def test_decode_sidecar_restarted(self) -> None:
        self.restarted("decode")

    def test_prefill_sidecar_restarted(self) -> None:
        self.restarted("prefill")

    def test_arriving_room_survives_the_restart(self) -> None:
        # the decode's sidecar restarts after the room's pages were granted and posted: nothing fails (its grant
        # is made again on the new sidecar), and the prefill's pushes after it land there
        boot, pres, dec = self.managers("sgq")
        pages = [1, 2, 6]
        recv = StageKVReceiver(dec, boot.address, bootstrap_room=5)
        recv.init(0)
        recv.send_metadata(pages)
        self.dec.restart()
        t0 = time.monotonic()
        while dec.client.reconnects < 1:
            self.assertLess(time.monotonic() - t0, self.BACK_S, "the decode's client did not reconnect")
            time.sleep(0.02)
        self.assertNotEqual(recv.poll(), KVPoll.Failed, "the restart failed the arriving room")
        senders = [StageKVSender(m, boot.address, 5, dest_tp_ranks=[0]) for m in pres]
        for s in senders:
            poll_until(s, KVPoll.WaitingForInput)
            s.init(len(pages))
            s.send(pages)
        poll_until(recv, KVPoll.Success, 10)

    def test_arriving_room_fails_at_its_deadline(self) -> None:
        # no prefill pushes it again: the room fails at the manager's timeout, saying the connection closed
        boot, pres, dec = self.managers("sgq", timeout=2.0)
        recv = StageKVReceiver(dec, boot.address, bootstrap_room=5)
        recv.send_metadata([1, 2])  # no prefill sends: the room is arriving
        self.dec.restart()
        poll_until(recv, KVPoll.Failed, 5)
        with self.assertRaisesRegex(RuntimeError, "closed its connection.*not pushed again in time"):
            recv.failure_exception()


if __name__ == "__main__":
    unittest.main()
