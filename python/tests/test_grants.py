"""Grant (158) and RevokeGrant (159) and the transfer key of SubmitKV (PROTOCOL.md 9.20): golden bytes from Go,
refused values, the client's calls against a real sidecar.

The golden frames are what Go's ``wire.AppendFrame`` writes (wire/local_grant_test.go, TestGrantGolden).
Truncation, trailing-byte and fuzz tests cover the frames through test_wire's samples.
"""

from __future__ import annotations

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from stage_client import wire  # noqa: E402
from stage_client.kvclient import grant_key  # noqa: E402
from stage_client.protocol import ProtocolError, decode_body  # noqa: E402
from stage_client.protocol.grants import Grant, RevokeGrant  # noqa: E402

KEY = b"0123456789abcdef"


class TestGrantFrames(unittest.TestCase):
    def test_golden(self) -> None:
        got = wire.encode_frame(Grant(req=1, cache="c", key=KEY, ttl_ms=1000, uses=2, blocks=[5]))
        want = bytes.fromhex("5347019e000000002c000000000000000100000000000000010063") + b"\x10\x00" + KEY + \
            bytes.fromhex("00e8030000020001000000" + "05000000")
        self.assertEqual(got, want)
        self.assertEqual(decode_body(158, got[16:]), Grant(req=1, cache="c", key=KEY, ttl_ms=1000, uses=2, blocks=[5]))
        got = wire.encode_frame(RevokeGrant(req=2, cache="c", key=KEY))
        self.assertEqual(got, bytes.fromhex("5347019f000000001d000000000000000200000000000000010063") + b"\x10\x00" + KEY)

    def test_refused(self) -> None:
        for what, m in (("short key", Grant(cache="c", key=b"k" * 15, ttl_ms=1, uses=1)),
                        ("no ttl", Grant(cache="c", key=KEY, ttl_ms=0, uses=1)),
                        ("ttl over an hour", Grant(cache="c", key=KEY, ttl_ms=3_600_001, uses=1)),
                        ("read without uses", Grant(cache="c", key=KEY, ttl_ms=1, uses=0)),
                        ("write with uses", Grant(cache="c", key=KEY, ttl_ms=1, uses=1, write=True)),
                        ("revoke, short key", RevokeGrant(cache="c", key=b"k"))):
            with self.subTest(what=what), self.assertRaises(ValueError):
                m.encode()
        body = bytearray(Grant(cache="c", key=KEY, ttl_ms=1, uses=1).encode())
        body[8 + 3 + 2 + 16] = 2  # the Write byte
        with self.assertRaises(ProtocolError):
            decode_body(158, bytes(body))

    def test_key(self) -> None:
        a, b = grant_key(), grant_key()
        self.assertEqual(len(a), 16)
        self.assertNotEqual(a, b)


if __name__ == "__main__":
    unittest.main()
