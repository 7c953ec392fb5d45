"""Wire format: golden bytes from PROTOCOL.md, round trips, malformed input."""

from __future__ import annotations

import os
import random
import struct
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stage_client import wire  # noqa: E402
from stage_client.protocol.grants import Grant, RevokeGrant  # noqa: E402
from stage_client.wire import (  # noqa: E402
    Access, Checksum, Code, Direction, FrameType, HandleKind, LocalOp, ProtocolError, QueryKind, State)


def hx(s: str) -> bytes:
    """Hex with spaces, newlines and '#' comments allowed."""
    out = []
    for line in s.splitlines():
        out.append(line.split("#", 1)[0])
    return bytes.fromhex("".join(out))


def samples() -> list:
    """One of every message, with every field set to something non-trivial."""
    return [
        wire.Register(req=1, name="kv/0", handle=HandleKind.MEMFD, access=Access.ALL, ordinal=3, alloc_size=1 << 40,
                      offset=4096, length=1 << 20, addr=0, handle_raw=b""),
        wire.Register(req=2, name="t", handle=HandleKind.CUDA_IPC, access=Access.LOCAL_READ | Access.REMOTE_READ,
                      ordinal=1, alloc_size=2 << 30, offset=512, length=4096, addr=7, handle_raw=bytes(range(64))),
        wire.Unregister(req=2**64 - 1, name="r\u00e9gion"),
        wire.Unregister(req=3, name="kv/0", wait_ms=10000),
        wire.Submit(req=5, route="decode", direction=Direction.PULL, checksum=Checksum.OFF, tag="req-1",
                    local_names=["a", "b"], remote_names=["c"],
                    ops=[LocalOp(0, 0, 0, 16384, 16384), LocalOp(1, 0, 2**63, 2**64 - 2, 1)]),
        wire.Submit(req=6, route="r", direction=Direction.PUSH, checksum=Checksum.ROUTE, tag="", local_names=[],
                    remote_names=[], ops=[]),
        wire.Submit(req=7, route="r", direction=Direction.PUSH, local_names=["a"], remote_names=["b"],
                    ops=[LocalOp(0, 0, 0, 0, 1)], peer="decode-1"),
        wire.Submitted(req=9, transfer=0xDEADBEEF),
        wire.Wait(req=10, transfer=11, timeout_ms=0xFFFFFFFF),
        wire.Status(req=12, transfer=13),
        wire.XferStatus(req=14, transfer=15, state=State.FAILED, done=1, total=2, code=Code.OUT_OF_RANGE,
                        message="region \"x\": past its end"),
        wire.XferStatus(req=14, transfer=15, state=State.DONE, done=2, total=2, code=999, message=""),
        wire.Cancel(req=16, transfer=17),
        wire.Subscribe(req=18),
        wire.Notify(transfer=19, peer="prefill", route="", tag="t" * 1024, direction=Direction.PUSH, bytes=1 << 33,
                    code=Code.OK, message=""),
        wire.Query(req=20, what=QueryKind.CATALOG, arg="decode"),
        wire.Query(req=21, what=200, arg=""),
        wire.QueryReply(req=22, json=b'{"node":"x"}'),
        wire.OK(req=23),
        wire.Fail(req=0, code=Code.MALFORMED, message="bad"),
        # the KV frames (151, 152; golden bytes in test_wire_kv)
        wire.RegisterKV(req=24, name="kv", layout=wire.KVLayout(
            2, 16, 256, 8, 2, 4, (wire.KVPart("k", 64, 0, 16, 8192, 512, 128), wire.KVPart("v", 64, 1, 32, 8192, 512, 128))),
            layers=[["a", "b"], ["c", "d"]]),
        wire.SubmitKV(req=25, route="decode", peer="p", direction=Direction.PULL, checksum=Checksum.ON, tag="t",
                      local="x", remote="y", layers=[0, 2], remote_layers=[1, 3], local_blocks=[7, 0xDEADBEEF],
                      remote_blocks=[5], local_first=1, remote_first=2, tokens=300, head_lo=1, head_hi=3),
        wire.SubmitKV(req=26, route="r", local="a", remote="b", layers=[0], local_blocks=[1], remote_blocks=[2], tokens=1),
        wire.SubmitKV(req=27, route="r", local="a", remote="b", layers=[0], local_blocks=[1], remote_blocks=[2], tokens=1,
                      key=b"k" * 16),
        # the grant frames (154, 155; golden bytes in test_grants)
        Grant(req=28, cache="kv-tp0", key=bytes(range(16)), ttl_ms=120000, uses=8, blocks=[3, 9, 0xFFFFFFFF]),
        Grant(req=29, cache="kv", key=b"\xfe" * 64, write=True, ttl_ms=3_600_000, blocks=[]),
        RevokeGrant(req=30, cache="kv-tp0", key=bytes(range(16))),
    ]


class TestGolden(unittest.TestCase):
    def test_header_golden(self) -> None:
        # PROTOCOL.md section 2: the header of a 20-byte Ack body without CRC.
        self.assertEqual(wire.encode_header(FrameType.ACK, 0, 20), hx("53 47 01 0c 00 00 00 00 14 00 00 00 00 00 00 00"))
        h = wire.parse_header(hx("53 47 01 0c 00 00 00 00 14 00 00 00 00 00 00 00"))
        self.assertEqual((h.version, h.type, h.flags, h.length, h.crc), (1, 12, 0, 20, 0))

    def test_submit_golden(self) -> None:
        # PROTOCOL.md 9.5, byte for byte.
        want = hx("""
            53 47 01 82 00 00 00 00 45 00 00 00 00 00 00 00   # header, type 130, length 69
            05 00 00 00 00 00 00 00                           # Req
            01 00 72                                          # Route "r"
            01                                                # Dir push
            01                                                # Checksum on
            01 00 74                                          # Tag "t"
            01 00 00 00 01 00 61                              # LocalNames ["a"]
            02 00 00 00 01 00 62 01 00 63                     # RemoteNames ["b", "c"]
            01 00 00 00                                       # Ops count
            00 00 00 00 01 00 00 00                           # Local 0, Remote 1
            10 00 00 00 00 00 00 00                           # LocalOff
            20 00 00 00 00 00 00 00                           # RemoteOff
            30 00 00 00 00 00 00 00                           # Len
        """)
        m = wire.Submit(req=5, route="r", direction=Direction.PUSH, checksum=Checksum.ON, tag="t",
                        local_names=["a"], remote_names=["b", "c"], ops=[LocalOp(0, 1, 0x10, 0x20, 0x30)])
        self.assertEqual(wire.encode_frame(m), want)
        h, got = wire.decode_frame(want)
        self.assertEqual(h.flags, 0)
        self.assertEqual(got, m)

    def test_submit_peer_golden(self) -> None:
        # PROTOCOL.md 9.5: the optional Peer after the ops; the rest as without it.
        want = hx("""
            53 47 01 82 00 00 00 00 49 00 00 00 00 00 00 00   # header, type 130, length 73
            05 00 00 00 00 00 00 00 01 00 72 01 01 01 00 74   # Req, Route "r", push, checksum on, Tag "t"
            01 00 00 00 01 00 61                              # LocalNames ["a"]
            02 00 00 00 01 00 62 01 00 63                     # RemoteNames ["b", "c"]
            01 00 00 00 00 00 00 00 01 00 00 00               # Ops count, Local 0, Remote 1
            10 00 00 00 00 00 00 00 20 00 00 00 00 00 00 00   # LocalOff, RemoteOff
            30 00 00 00 00 00 00 00                           # Len
            02 00 64 31                                       # Peer "d1"
        """)
        m = wire.Submit(req=5, route="r", direction=Direction.PUSH, checksum=Checksum.ON, tag="t",
                        local_names=["a"], remote_names=["b", "c"], ops=[LocalOp(0, 1, 0x10, 0x20, 0x30)], peer="d1")
        self.assertEqual(wire.encode_frame(m), want)
        _, got = wire.decode_frame(want)
        self.assertEqual(got, m)
        # An empty Peer present is not canonical: refused.
        body = wire.Submit(route="r").encode() + b"\x00\x00"
        with self.assertRaises(wire.ProtocolError):
            wire.Submit.decode(body)

    def test_register_golden(self) -> None:
        # PROTOCOL.md 9.3: body 50 + n + k bytes; n = 4 ("kv/0"), k = 2.
        want = hx("""
            53 47 01 80 02 00 00 00 38 00 00 00 00 00 00 00   # header, type 128, FlagFD, length 56
            07 00 00 00 00 00 00 00                           # Req 7
            04 00 6b 76 2f 30                                 # Name "kv/0"
            01                                                # Handle memfd
            0f                                                # Access all
            02 00 00 00                                       # Ordinal 2
            00 10 00 00 00 00 00 00                           # AllocSize 0x1000
            00 02 00 00 00 00 00 00                           # Offset 0x200
            00 01 00 00 00 00 00 00                           # Length 0x100
            00 00 00 00 00 00 00 00                           # Addr 0
            02 00 aa bb                                       # HandleRaw
        """)
        m = wire.Register(req=7, name="kv/0", handle=HandleKind.MEMFD, access=Access.ALL, ordinal=2,
                          alloc_size=0x1000, offset=0x200, length=0x100, addr=0, handle_raw=b"\xaa\xbb")
        self.assertEqual(wire.encode_frame(m, flags=wire.FLAG_FD), want)
        self.assertEqual(wire.decode_frame(want)[1], m)

    def test_wait_golden(self) -> None:
        want = hx("""
            53 47 01 84 00 00 00 00 14 00 00 00 00 00 00 00   # header, type 132, length 20
            09 00 00 00 00 00 00 00                           # Req 9
            08 07 06 05 04 03 02 01                           # Transfer
            dc 05 00 00                                       # TimeoutMs 1500
        """)
        m = wire.Wait(req=9, transfer=0x0102030405060708, timeout_ms=1500)
        self.assertEqual(wire.encode_frame(m), want)
        self.assertEqual(wire.decode_frame(want)[1], m)

    def test_unregister_wait_golden(self) -> None:
        # PROTOCOL.md 9.4's example.
        want = hx("""
            53 47 01 81 00 00 00 00 10 00 00 00 00 00 00 00   # header, type 129, length 16
            00 01 00 00 00 00 00 00                           # Req 0x100
            02 00 6b 76                                       # Name "kv"
            10 27 00 00                                       # WaitMs 10000
        """)
        m = wire.Unregister(req=0x100, name="kv", wait_ms=10000)
        self.assertEqual(wire.encode_frame(m), want)
        self.assertEqual(wire.decode_frame(want)[1], m)
        # Without WaitMs: the version-1 bytes, 4 fewer.
        plain = wire.encode_frame(wire.Unregister(req=0x100, name="kv"))
        self.assertEqual(plain, want[:8] + b"\x0c" + want[9:-4])
        with self.assertRaises(ProtocolError) as cm:
            wire.Unregister.decode(want[16:-4] + b"\x00\x00\x00\x00")
        self.assertIn("WaitMs: present but 0", str(cm.exception))

    def test_fail_golden(self) -> None:
        # PROTOCOL.md 9.16's example.
        want = hx("""
            53 47 01 8d 00 00 00 00 0e 00 00 00 00 00 00 00   # header, type 141, length 14
            00 01 00 00 00 00 00 00                           # Req 0x100
            0c 00                                             # Code 12
            02 00 6e 6f                                       # Message "no"
        """)
        h, m = wire.decode_frame(want)
        self.assertEqual(m, wire.Fail(req=0x100, code=Code.BUSY, message="no"))
        self.assertIs(m.code, Code.BUSY)
        self.assertEqual(wire.encode_frame(m), want)

    def test_decode_ok(self) -> None:
        h, m = wire.decode_frame(hx("53 47 01 8c 00 00 00 00 08 00 00 00 00 00 00 00  2a 00 00 00 00 00 00 00"))
        self.assertEqual(m, wire.OK(req=42))

    def test_decode_submitted(self) -> None:
        _, m = wire.decode_frame(hx("""
            53 47 01 83 00 00 00 00 10 00 00 00 00 00 00 00
            03 00 00 00 00 00 00 00      # Req 3
            ff 00 00 00 00 00 00 80      # Transfer
        """))
        self.assertEqual(m, wire.Submitted(req=3, transfer=0x80000000000000FF))

    def test_decode_xferstatus(self) -> None:
        # 9.9: 37 + m bytes; m = 8 ("past end") -> 45 = 0x2d.
        _, m = wire.decode_frame(hx("""
            53 47 01 86 00 00 00 00 2d 00 00 00 00 00 00 00
            03 00 00 00 00 00 00 00      # Req
            11 00 00 00 00 00 00 00      # Transfer
            04                           # State failed
            10 00 00 00 00 00 00 00      # Done
            20 00 00 00 00 00 00 00      # Total
            04 00                        # Code out of range
            08 00 70 61 73 74 20 65 6e 64  # "past end"
        """))
        self.assertEqual(m, wire.XferStatus(req=3, transfer=0x11, state=State.FAILED, done=0x10, total=0x20,
                                            code=Code.OUT_OF_RANGE, message="past end"))
        self.assertFalse(m.ok)
        self.assertTrue(m.finished)

    def test_decode_notify(self) -> None:
        # 9.12: 41 + p + r + t + m + k + 4 * layers; p = 7, r = 0, t = 5,
        # m = 0, k = 2, one layer -> 59 = 0x3b.
        _, m = wire.decode_frame(hx("""
            53 47 01 89 00 00 00 00 3b 00 00 00 00 00 00 00
            22 00 00 00 00 00 00 00                  # Transfer
            07 00 70 72 65 66 69 6c 6c               # Peer "prefill"
            00 00                                    # Route ""
            05 00 72 65 71 2d 31                     # Tag "req-1"
            01                                       # Dir push
            00 40 00 00 00 00 00 00                  # Bytes 16384
            00 00                                    # Code ok
            00 00                                    # Message ""
            02 00 6b 76                              # KV "kv"
            01 00 00 00 03 00 00 00                  # Layers [3]
            10 00 00 00                              # First 16
            00 01 00 00                              # Tokens 256
        """))
        self.assertEqual(m, wire.Notify(transfer=0x22, peer="prefill", route="", tag="req-1",
                                        direction=Direction.PUSH, bytes=16384, code=Code.OK, message="",
                                        kv="kv", layers=[3], first=16, tokens=256))
        self.assertTrue(m.ok)

    def test_decode_query_reply(self) -> None:
        _, m = wire.decode_frame(hx("""
            53 47 01 8b 00 00 00 00 13 00 00 00 00 00 00 00
            04 00 00 00 00 00 00 00      # Req
            07 00 00 00 7b 22 61 22 3a 31 7d   # JSON {"a":1}
        """))
        self.assertEqual(m, wire.QueryReply(req=4, json=b'{"a":1}'))

    def test_unknown_code_kept(self) -> None:
        m = wire.Fail.decode(hx("01 00 00 00 00 00 00 00  e7 03  00 00"))
        self.assertEqual(m.code, 999)
        self.assertNotIsInstance(m.code, Code)
        self.assertEqual(wire.code_name(m.code), "code(999)")

    def test_crc(self) -> None:
        self.assertEqual(wire.crc32c(b"123456789"), 0xE3069283)
        f = wire.encode_frame(wire.OK(req=1), crc=True)
        h, m = wire.decode_frame(f)
        self.assertEqual(h.flags, wire.FLAG_CRC)
        self.assertEqual(h.crc, wire.crc32c(f[16:]))
        bad = bytearray(f)
        bad[16] ^= 1
        with self.assertRaises(ProtocolError) as cm:
            wire.decode_frame(bytes(bad))
        self.assertEqual(cm.exception.kind, "checksum")


class TestRoundTrip(unittest.TestCase):
    def test_round_trip(self) -> None:
        for m in samples():
            with self.subTest(m=type(m).__name__):
                f = wire.encode_frame(m)
                h, got = wire.decode_frame(f)
                self.assertEqual(got, m)
                self.assertEqual(h.type, m.TYPE)
                self.assertEqual(h.length, len(f) - 16)
                self.assertEqual(got.encode(), m.encode())  # canonical

    def test_body_sizes(self) -> None:
        # The body sizes PROTOCOL.md section 9 gives.
        self.assertEqual(len(wire.Register(name="ab", handle_raw=b"xyz").encode()), 50 + 2 + 3)
        self.assertEqual(len(wire.Unregister(name="abc").encode()), 10 + 3)
        self.assertEqual(len(wire.Unregister(name="abc", wait_ms=1).encode()), 14 + 3)
        self.assertEqual(len(wire.Submitted().encode()), 16)
        self.assertEqual(len(wire.Wait().encode()), 20)
        self.assertEqual(len(wire.Status().encode()), 16)
        self.assertEqual(len(wire.XferStatus(message="xy").encode()), 37 + 2)
        self.assertEqual(len(wire.Cancel().encode()), 16)
        self.assertEqual(len(wire.Subscribe().encode()), 8)
        self.assertEqual(len(wire.Notify(peer="p", route="rr", tag="ttt", message="mmmm").encode()), 41 + 10)
        self.assertEqual(len(wire.Query(arg="abc").encode()), 11 + 3)
        self.assertEqual(len(wire.QueryReply(json=b"[]").encode()), 12 + 2)
        self.assertEqual(len(wire.OK().encode()), 8)
        self.assertEqual(len(wire.Fail(message="x").encode()), 12 + 1)
        s = wire.Submit(route="r", tag="tt", local_names=["a"], remote_names=["b"], ops=[LocalOp(0, 0, 0, 0, 1)] * 3)
        self.assertEqual(len(s.encode()), 26 + 1 + 2 + 3 + 3 + 32 * 3)

    def test_message_cut(self) -> None:
        # Text for people is cut to MAX_MESSAGE bytes at a UTF-8 boundary.
        m = wire.Fail(req=1, code=Code.INTERNAL, message="a" + "\u00e9" * 3000)  # 6001 bytes
        got = wire.Fail.decode(m.encode())
        self.assertEqual(got.message, "a" + "\u00e9" * 2047)  # 4095 bytes: the cut avoids a half character
        self.assertLessEqual(len(got.message.encode()), wire.MAX_MESSAGE)


class TestMalformed(unittest.TestCase):
    def assertProto(self, kind: str, f, *args) -> ProtocolError:  # type: ignore[no-untyped-def]
        with self.assertRaises(ProtocolError) as cm:
            f(*args)
        self.assertEqual(cm.exception.kind, kind, str(cm.exception))
        return cm.exception

    def test_truncated(self) -> None:
        for m in samples():
            body = m.encode()
            # A Submit cut just before its optional Peer is one naming no
            # peer; an Unregister cut before its WaitMs waits for nothing.
            tail = -1
            if isinstance(m, wire.Submit) and m.peer:
                tail = len(body) - 2 - len(m.peer.encode())
            elif isinstance(m, wire.SubmitKV) and m.key:
                tail = len(body) - 2 - len(m.key)
            elif isinstance(m, wire.Unregister) and m.wait_ms:
                tail = len(body) - 4
            for n in range(len(body)):
                with self.subTest(m=type(m).__name__, n=n):
                    if n == tail:
                        cut = wire.decode_body(m.TYPE, body[:n])
                        self.assertFalse(cut.wait_ms if isinstance(cut, wire.Unregister) else
                                         cut.key if isinstance(cut, wire.SubmitKV) else cut.peer)
                        continue
                    self.assertProto("malformed", wire.decode_body, m.TYPE, body[:n])

    def test_trailing(self) -> None:
        for m in samples():
            with self.subTest(m=type(m).__name__):
                e = self.assertProto("malformed", wire.decode_body, m.TYPE, m.encode() + b"\x00")
                if isinstance(m, wire.Submit) and not m.peer:
                    # Read as the start of the optional Peer.
                    self.assertIn("Submit.Peer", str(e))
                elif isinstance(m, wire.Unregister) and not m.wait_ms:
                    self.assertIn("Unregister.WaitMs", str(e))
                elif isinstance(m, wire.SubmitKV) and not m.key:
                    self.assertIn("SubmitKV.Key", str(e))  # read as the start of the optional Key
                else:
                    self.assertIn("trailing", str(e))

    def test_truncated_frame(self) -> None:
        f = wire.encode_frame(wire.OK(req=1))
        for n in range(len(f)):
            with self.subTest(n=n):
                self.assertProto("malformed", wire.decode_frame, f[:n])

    def test_header(self) -> None:
        good = bytearray(wire.encode_header(FrameType.OK, 0, 8))

        def mut(i: int, v: int) -> bytes:
            b = bytearray(good)
            b[i] = v
            return bytes(b)

        self.assertProto("bad_magic", wire.parse_header, mut(0, ord("X")))
        self.assertProto("bad_magic", wire.parse_header, mut(1, ord("X")))
        self.assertProto("bad_version", wire.parse_header, mut(2, 0))
        self.assertProto("bad_version", wire.parse_header, mut(2, 2))
        self.assertProto("unknown_type", wire.parse_header, mut(3, 0))
        self.assertProto("unknown_type", wire.parse_header, mut(3, 18))
        self.assertProto("unknown_type", wire.parse_header, mut(3, 142))
        self.assertProto("malformed", wire.parse_header, mut(6, 1))  # reserved
        self.assertProto("malformed", wire.parse_header, mut(4, 4))  # unknown flag
        self.assertProto("malformed", wire.parse_header, mut(5, 1))  # unknown flag, high byte
        self.assertProto("malformed", wire.parse_header, mut(12, 1))  # CRC without FlagCRC
        self.assertProto("malformed", wire.parse_header, wire.encode_header(FrameType.ACK, wire.FLAG_FD, 8))
        wire.parse_header(wire.encode_header(FrameType.REGISTER, wire.FLAG_FD, 8))  # fine on a local frame
        self.assertProto("too_large", wire.parse_header, wire.encode_header(FrameType.SUBMIT, 0, wire.MAX_CONTROL_BODY + 1))
        wire.parse_header(wire.encode_header(FrameType.SUBMIT, 0, wire.MAX_CONTROL_BODY))
        self.assertProto("too_large", wire.parse_header, wire.encode_header(FrameType.CHUNK, 0, wire.MAX_CHUNK_BODY + 1))
        self.assertProto("malformed", wire.parse_header, wire.encode_header(FrameType.CHUNK, 0, 23))
        self.assertProto("malformed", wire.parse_header, bytes(good[:15]))
        # The e2e test's "huge length" Submit header.
        self.assertProto("too_large", wire.parse_header, bytes([0x53, 0x47, 1, 130, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0]))

    def test_not_local(self) -> None:
        self.assertProto("unknown_type", wire.decode_body, FrameType.HELLO, b"")
        self.assertProto("unknown_type", wire.decode_body, 250, b"")

    def test_length_mismatch(self) -> None:
        f = wire.encode_frame(wire.OK(req=1))
        self.assertProto("malformed", wire.decode_frame, f + b"\x00")

    def test_values(self) -> None:
        st = bytearray(wire.XferStatus(req=1, state=State.DONE).encode())
        for bad in (0, 5, 255):
            st[16] = bad
            self.assertProto("malformed", wire.XferStatus.decode, bytes(st))
        no = bytearray(wire.Notify(peer="p").encode())
        for bad in (0, 3):
            no[8 + 3 + 2 + 2] = bad  # Dir after Transfer, Peer "p", Route "", Tag ""
            self.assertProto("malformed", wire.Notify.decode, bytes(no))
        reg = bytearray(wire.Register(name="", access=Access.ALL).encode())
        reg[8 + 2 + 1] = 0x10  # Access: bit 4
        self.assertProto("malformed", wire.Register.decode, bytes(reg))

    def submit_body(self, dir_: int = 1, ck: int = 0, ops: bytes = b"", nops: int = 0, nl: int = 1, nr: int = 1) -> bytes:
        b = struct.pack("<Q", 1) + b"\x01\x00r" + bytes([dir_, ck]) + b"\x00\x00"
        b += struct.pack("<I", nl) + b"\x01\x00a" * nl + struct.pack("<I", nr) + b"\x01\x00b" * nr
        return b + struct.pack("<I", nops) + ops

    def test_submit(self) -> None:
        op = struct.Struct("<IIQQQ").pack
        wire.Submit.decode(self.submit_body(ops=op(0, 0, 0, 0, 1), nops=1))
        self.assertProto("malformed", wire.Submit.decode, self.submit_body(dir_=0))
        self.assertProto("malformed", wire.Submit.decode, self.submit_body(dir_=3))
        self.assertProto("malformed", wire.Submit.decode, self.submit_body(ck=3))
        e = self.assertProto("malformed", wire.Submit.decode, self.submit_body(ops=op(1, 0, 0, 0, 1), nops=1))
        self.assertIn("Ops[0].Local", str(e))
        self.assertProto("malformed", wire.Submit.decode, self.submit_body(ops=op(0, 1, 0, 0, 1), nops=1))
        self.assertProto("malformed", wire.Submit.decode, self.submit_body(ops=op(0, 0, 0, 0, 0), nops=1))
        self.assertProto("malformed", wire.Submit.decode, self.submit_body(ops=op(0, 0, 2**64 - 10, 0, 11), nops=1))
        self.assertProto("malformed", wire.Submit.decode, self.submit_body(ops=op(0, 0, 0, 2**64 - 10, 11), nops=1))
        wire.Submit.decode(self.submit_body(ops=op(0, 0, 2**64 - 12, 0, 11), nops=1))  # ends at 2^64-1
        # Counts: above the limit, and above what the bytes left can hold.
        self.assertProto("too_large", wire.Submit.decode, self.submit_body(nops=wire.MAX_OPS + 1))
        self.assertProto("malformed", wire.Submit.decode, self.submit_body(nops=2, ops=op(0, 0, 0, 0, 1)))
        self.assertProto("too_large", wire.Submit.decode, struct.pack("<Q", 1) + b"\x01\x00r\x01\x00\x00\x00" +
                         struct.pack("<I", wire.MAX_NAMES + 1))
        self.assertProto("malformed", wire.Submit.decode, struct.pack("<Q", 1) + b"\x01\x00r\x01\x00\x00\x00" +
                         struct.pack("<I", 100))

    def test_lengths(self) -> None:
        # A name over MAX_NAME, a tag over MAX_TAG, a handle over MAX_HANDLE_BYTES, JSON over MAX_JSON.
        long_name = struct.pack("<Q", 1) + struct.pack("<H", 256) + b"x" * 256
        self.assertProto("too_large", wire.Unregister.decode, long_name)
        self.assertProto("too_large", wire.Unregister.decode, struct.pack("<Q", 1) + b"\xff\xff")
        tag = struct.pack("<Q", 1) + b"\x00\x00\x01\x00" + struct.pack("<H", 1025) + b"t" * 1025
        self.assertProto("too_large", wire.Submit.decode, tag)
        reg = bytearray(wire.Register().encode())
        reg[-2:] = struct.pack("<H", wire.MAX_HANDLE_BYTES + 1)
        self.assertProto("too_large", wire.Register.decode, bytes(reg) + b"h" * (wire.MAX_HANDLE_BYTES + 1))
        self.assertProto("too_large", wire.QueryReply.decode, struct.pack("<QI", 1, wire.MAX_JSON + 1))
        self.assertProto("malformed", wire.QueryReply.decode, struct.pack("<QI", 1, 10) + b"{}")
        msg = struct.pack("<QH", 1, 1) + struct.pack("<H", 4097) + b"m" * 4097
        self.assertProto("too_large", wire.Fail.decode, msg)
        self.assertProto("too_large", wire.decode_body, FrameType.OK, b"\x00" * (wire.MAX_CONTROL_BODY + 1))

    def test_fuzz(self) -> None:
        """Random and mutated bodies: either a valid message that re-encodes
        to the same bytes, or ProtocolError; nothing else escapes."""
        rng = random.Random(1234)
        bodies = [(m.TYPE, m.encode()) for m in samples()]
        types = [int(t) for t in FrameType if t >= 128]
        for _ in range(20000):
            t, b = rng.choice(bodies)
            b = bytearray(b)
            r = rng.random()
            if r < 0.4 and b:
                for _ in range(rng.randint(1, 4)):
                    b[rng.randrange(len(b))] = rng.randrange(256)
            elif r < 0.6:
                b = bytearray(rng.randbytes(rng.randint(0, 64))) if hasattr(rng, "randbytes") else \
                    bytearray(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
                t = rng.choice(types)
            elif r < 0.8 and b:
                del b[rng.randrange(len(b)):]
            else:
                b += bytes([rng.randrange(256)])
            try:
                m = wire.decode_body(t, bytes(b))
            except ProtocolError:
                continue
            self.assertEqual(m.encode(), bytes(b))


class TestEncoderChecks(unittest.TestCase):
    def test_refused(self) -> None:
        with self.assertRaises(ValueError):
            wire.Register(name="x" * 256).encode()
        with self.assertRaises(ValueError):
            wire.Register(name="x", access=0x10).encode()
        with self.assertRaises(ValueError):
            wire.Register(name="x", handle_raw=b"h" * (wire.MAX_HANDLE_BYTES + 1)).encode()
        with self.assertRaises(ValueError):
            wire.Wait(timeout_ms=2**32).encode()
        with self.assertRaises(ValueError):
            wire.Unregister(name="x", wait_ms=2**32).encode()
        with self.assertRaises(ValueError):
            wire.Unregister(name="x", wait_ms=-1).encode()
        with self.assertRaises(ValueError):
            wire.OK(req=-1).encode()
        with self.assertRaises(ValueError):
            wire.Submit(direction=3).encode()
        with self.assertRaises(ValueError):
            wire.Submit(checksum=3).encode()
        with self.assertRaises(ValueError):
            wire.Submit(tag="t" * 1025).encode()
        with self.assertRaises(ValueError):
            wire.Submit(local_names=["a"], remote_names=["b"], ops=[LocalOp(1, 0, 0, 0, 1)]).encode()
        with self.assertRaises(ValueError):
            wire.Submit(local_names=["a"], remote_names=["b"], ops=[LocalOp(0, 1, 0, 0, 1)]).encode()
        with self.assertRaises(ValueError):
            wire.Submit(local_names=["a"], remote_names=["b"], ops=[LocalOp(0, 0, 0, 0, 0)]).encode()
        with self.assertRaises(ValueError):
            wire.Submit(local_names=["a"], remote_names=["b"], ops=[LocalOp(0, 0, 2**64 - 1, 0, 1)]).encode()
        with self.assertRaises(ValueError):
            wire.Submit(local_names=["a"] * 4097).encode()


if __name__ == "__main__":
    unittest.main()
