"""A large Submit in pieces (PROTOCOL.md 9.5b): SubmitHead and SubmitMore byte for byte, their
decoders on damaged and random bodies, and the client's choice of one frame or pieces."""

from __future__ import annotations

import json
import os
import random
import sys
import unittest
from typing import Any, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fakesidecar import FakeSidecar, fail  # noqa: E402
from stage_client import Client  # noqa: E402
from stage_client.protocol import wire  # noqa: E402
from stage_client.protocol.messages import decode_body, decode_frame  # noqa: E402
from stage_client.protocol.pieces import SubmitHead, SubmitMore, head_of  # noqa: E402
from stage_client.protocol.wire import Code, LocalOp, ProtocolError  # noqa: E402

OP = LocalOp(0, 1, 0x10, 0x20, 0x30)
SUBMIT = wire.Submit(req=5, route="r", direction=1, checksum=1, tag="t", local_names=["a"], remote_names=["b", "c"],
                     ops=[OP])


def hx(s: str) -> bytes:
    return bytes.fromhex(s.replace("\n", " "))


class TestPiecesWire(unittest.TestCase):
    def test_submit_more_golden(self) -> None:
        # PROTOCOL.md 9.5b, the SubmitMore example; wire/local_pieces_test.go has the same bytes.
        want = hx("53 47 01 a0 00 00 00 00 2d 00 00 00 00 00 00 00 05 00 00 00 00 00 00 00 01 01 00 00 00"
                  " 00 00 00 00 01 00 00 00 10 00 00 00 00 00 00 00 20 00 00 00 00 00 00 00 30 00 00 00 00 00 00 00")
        m = SubmitMore(req=5, end=True, ops=[OP])
        self.assertEqual(wire.encode_frame(m), want)
        self.assertEqual(decode_frame(want)[1], m)

    def test_submit_head_golden(self) -> None:
        h = SubmitHead(submit=SUBMIT, total=0x1000, ends=[0, 0x2000])
        f = wire.encode_frame(h)
        want = hx("53 47 01 a1 00 00 00 00 62 00 00 00 00 00 00 00 05 00 00 00 00 00 00 00 00"
                  " 00 10 00 00 00 00 00 00 02 00 00 00 00 00 00 00 00 00 00 00 00 20 00 00 00 00 00 00")
        self.assertEqual(f[:len(want)], want)
        self.assertEqual(f[len(want):], wire.Submit.encode(SUBMIT)[8:])
        self.assertEqual(decode_frame(f)[1], h)

    def test_refused(self) -> None:
        good = SubmitHead(submit=SUBMIT, total=0x1000, ends=[0, 0x2000]).encode()
        more = SubmitMore(req=1, ops=[OP]).encode()
        for name, t, body, field in [
            ("wait not boolean", wire.FrameType.SUBMIT_HEAD, good[:8] + b"\x02" + good[9:], "Wait"),
            ("ends count", wire.FrameType.SUBMIT_HEAD, good[:17] + b"\x01\x00\x00\x00" + good[21:29] + good[37:], "Ends"),
            ("zero total", wire.FrameType.SUBMIT_HEAD, good[:9] + bytes(8) + good[17:], "Total"),
            ("end not boolean", wire.FrameType.SUBMIT_MORE, more[:8] + b"\x07" + more[9:], "End"),
            ("zero length", wire.FrameType.SUBMIT_MORE, SubmitMore(req=1).encode()[:9] + b"\x01\x00\x00\x00" + bytes(32), "Len"),
            ("trailing", wire.FrameType.SUBMIT_MORE, more + b"\x00", "trailing"),
        ]:
            with self.subTest(name):
                with self.assertRaises(ProtocolError) as cm:
                    decode_body(t, body)
                self.assertIn(field, str(cm.exception))
        with self.assertRaises(ValueError):
            SubmitHead(submit=SUBMIT, total=0, ends=[0, 0]).encode()
        with self.assertRaises(ValueError):
            SubmitHead(submit=SUBMIT, total=1, ends=[0]).encode()

    def test_random_bodies(self) -> None:
        # A fuzz of the two decoders: a body either decodes to a message that encodes back to it, or
        # raises ProtocolError; nothing else escapes.
        rnd = random.Random(37)
        seeds = [SubmitHead(submit=SUBMIT, total=0x1000, ends=[0, 0x2000]).encode(), SubmitMore(req=5, end=True, ops=[OP] * 3).encode()]
        for i in range(4000):
            t = (wire.FrameType.SUBMIT_HEAD, wire.FrameType.SUBMIT_MORE)[i % 2]
            b = bytearray(seeds[i % 2])
            for _ in range(rnd.randint(1, 4)):
                op = rnd.randint(0, 2)
                if op == 0 and b:
                    b[rnd.randrange(len(b))] = rnd.randrange(256)
                elif op == 1 and b:
                    del b[rnd.randrange(len(b)):]
                else:
                    b += bytes([rnd.randrange(256)])
            try:
                m = decode_body(t, bytes(b))
            except ProtocolError:
                continue
            self.assertEqual(m.encode(), bytes(b))

    def test_head_of(self) -> None:
        s = wire.Submit(req=1, route="r", local_names=["a"], remote_names=["x", "y", "z"],
                        ops=[LocalOp(0, 2, 0, 100, 5), LocalOp(0, 0, 0, 0, 1), LocalOp(0, 2, 0, 10, 5)])
        h = head_of(s)
        self.assertEqual((h.total, h.ends), (11, [1, 0, 105]))
        with self.assertRaises(ValueError):
            head_of(wire.Submit(remote_names=["x"], ops=[LocalOp(0, 1, 0, 0, 1)]))


def ops(n: int) -> List[LocalOp]:
    return [LocalOp(0, i % 2, 16 * i, 32 * i, 16) for i in range(n)]


class TestClientPieces(unittest.TestCase):
    def start(self, old: bool) -> Client:
        def handler(s: FakeSidecar, h: Any, m: Any, fd: int) -> List[bytes]:
            if isinstance(m, wire.Query):
                if old:
                    return [fail(m.req, Code.BAD_REQUEST, "unknown query 6")]
                js = json.dumps({"submit_pieces": {"max_pieces": 4096, "max_ops": 1 << 20, "rest_ms": 10000, "max_open": 16}})
                return [wire.encode_frame(wire.QueryReply(req=m.req, json=js.encode()))]
            if isinstance(m, wire.Submit):
                return [wire.encode_frame(wire.Submitted(req=m.req, transfer=1))]
            if isinstance(m, SubmitMore) and m.end:
                return [wire.encode_frame(wire.Submitted(req=m.req, transfer=2))]
            return []

        self.fake = FakeSidecar(handler)
        self.addCleanup(self.fake.close)
        c = Client(self.fake.path)
        self.addCleanup(c.close)
        c.pieces_above, c.first_piece, c.piece_ops = 20, 4, 10
        return c

    def kinds(self) -> List[str]:
        out = []
        for _, m, _ in self.fake.got:
            if isinstance(m, SubmitHead):
                out.append("SubmitHead:%d total %d ends %s" % (len(m.submit.ops), m.total, m.ends))
            elif isinstance(m, SubmitMore):
                out.append("SubmitMore:%d %s" % (len(m.ops), m.end))
            else:
                out.append(type(m).__name__ + (":%d" % len(m.ops) if isinstance(m, wire.Submit) else ""))
        return out

    def test_small_one_frame(self) -> None:
        c = self.start(old=False)
        self.assertEqual(c.push("r", "a", ["b", "c"], ops(10)), 1)
        self.assertEqual(self.kinds(), ["Submit:10"])

    def test_old_sidecar_one_frame(self) -> None:
        c = self.start(old=True)
        self.assertEqual(c.push("r", "a", ["b", "c"], ops(25)), 1)
        self.assertEqual(c.push("r", "a", ["b", "c"], ops(25)), 1)
        self.assertEqual(self.kinds(), ["Query", "Submit:25", "Submit:25"])  # asked once

    def test_new_sidecar_pieces(self) -> None:
        c = self.start(old=False)
        self.assertEqual(c.push("r", "a", ["b", "c"], ops(25)), 2)
        self.assertEqual(self.kinds(), ["Query", "SubmitHead:4 total 400 ends [784, 752]", "SubmitMore:10 False",
                                        "SubmitMore:10 False", "SubmitMore:1 True"])
        got = [op for _, m, _ in self.fake.got[1:] for op in (m.submit.ops if isinstance(m, SubmitHead) else m.ops)]
        self.assertEqual(got, ops(25))


if __name__ == "__main__":
    unittest.main()
