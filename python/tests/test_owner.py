"""Ownership on the control socket (PROTOCOL.md 9.18), two real staged processes and several clients.

What a connection registers and submits is its own: another connection is
refused, hears nothing of it, and takes its names only once the owner's
connection closed, at once then (an engine restarted beside its sidecar).
Connections that pass one ``group`` share. The binary is $STAGED, or
../bin/staged (``make build``); the tests skip without it.
"""

from __future__ import annotations

import os
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from stage_client import Access, Client, Code, Op, StageError, State, wire  # noqa: E402
from stage_client.protocol import Join, ProtocolError, decode_body  # noqa: E402
from test_e2e import GUARD, HAVE_STAGED, MiB, SKIP_WHY, Mem, pair, stop_all  # noqa: E402

GROUP = b"python-owner-test-0123456789"
SIZE = 4 * MiB


class TestJoinFrame(unittest.TestCase):
    def test_golden(self) -> None:
        # The bytes of PROTOCOL.md 9.18's example (and Go's TestJoinGolden).
        got = wire.encode_frame(Join(req=0x100, group=b"0123456789abcdef"))
        want = bytes.fromhex("5347019900000000" "1a00000000000000" "0001000000000000" "1000") + b"0123456789abcdef"
        self.assertEqual(got, want)
        self.assertEqual(decode_body(153, got[16:]), Join(req=0x100, group=b"0123456789abcdef"))

    def test_refused(self) -> None:
        with self.assertRaises(ValueError):
            Join(req=1, group=b"x" * 15).encode()  # the sidecar would refuse it
        with self.assertRaises(ValueError):
            Join(req=1, group=b"x" * 65).encode()
        with self.assertRaises(ProtocolError):
            decode_body(153, b"\x01" * 8 + b"\x41\x00" + b"x" * 65)


@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestOwner(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.pre, cls.dec = pair()

    @classmethod
    def tearDownClass(cls) -> None:
        err = stop_all([cls.pre, cls.dec])
        if err:
            raise AssertionError(err)

    def client(self, sidecar, group=None) -> Client:
        c = Client(sidecar.socket, request_timeout=10, group=group)
        self.addCleanup(c.close)
        return c

    def mem(self, seed: int = 0) -> Mem:
        m = Mem("owner", SIZE)
        self.addCleanup(m.close)
        if seed:
            m.fill(seed)
        else:
            m.poison()
        return m

    def refused(self, code: Code, text: str, f, *args) -> None:
        with self.assertRaises(StageError) as cm:
            f(*args)
        self.assertEqual(cm.exception.code, code, str(cm.exception))
        self.assertIn(text, str(cm.exception))

    def push(self, name: str, dst: str, tag: str) -> None:
        c = self.pre.client
        st = c.wait(c.push("decode", name, dst, [Op(0, 0, 0, 0, SIZE)], tag=tag), timeout=30)
        self.assertEqual(st.state, State.DONE, st)

    def test_another_connection_refused(self) -> None:
        a, b = self.client(self.dec), self.client(self.dec)
        m = self.mem()
        a.register_memfd("own-a", m.fd, m.size, GUARD, SIZE, Access.ALL)
        self.refused(Code.ACCESS_DENIED, "another engine connection", b.unregister, "own-a")
        self.refused(Code.EXISTS, "another engine connection", b.register_memfd, "own-a", m.fd, m.size, GUARD, SIZE,
                     Access.ALL)
        self.assertEqual([r["name"] for r in b.regions()], [])
        self.assertEqual([r["name"] for r in a.regions()], ["own-a"])
        sub_a, sub_b = a.subscribe(), b.subscribe()
        src = self.mem(5)
        self.pre.client.register_memfd("own-src", src.fd, src.size, GUARD, SIZE, Access.ALL)
        self.addCleanup(self.pre.client.unregister, "own-src")
        self.push("own-src", "own-a", "to-a")
        n = sub_a.get(10)
        self.assertIsNotNone(n, "the owner heard nothing of the push into its region")
        self.assertEqual(n.tag, "to-a")
        self.assertIsNone(sub_b.get(0.2), "another connection heard of the push")
        a.unregister("own-a")

    def test_restart_frees_names(self) -> None:
        src = self.mem(9)
        self.pre.client.register_memfd("rs-src", src.fd, src.size, GUARD, SIZE, Access.ALL)
        self.addCleanup(self.pre.client.unregister, "rs-src")
        for rnd in range(3):
            eng = Client(self.dec.socket, request_timeout=10)
            m = self.mem()
            eng.register_memfd("rs-dst", m.fd, m.size, GUARD, SIZE, Access.ALL)  # the same name each time
            self.push("rs-src", "rs-dst", "restart-%d" % rnd)
            self.assertEqual(bytes(m.region()), bytes(src.region()))
            eng.close()  # the engine goes without unregistering
            deadline = time.monotonic() + 10
            while self.dec.client.stats()["regions"] != 0:
                self.assertLess(time.monotonic(), deadline, "the closed connection's region stayed")
                time.sleep(0.02)

    def test_group_shares(self) -> None:
        a, b = self.client(self.dec, GROUP), self.client(self.dec, GROUP.decode())
        m = self.mem()
        a.register_memfd("grp-a", m.fd, m.size, GUARD, SIZE, Access.ALL)
        self.assertEqual([r["name"] for r in b.regions()], ["grp-a"])
        b.unregister("grp-a")
        with self.assertRaises(ValueError):
            Client(self.dec.socket, group=b"short")


if __name__ == "__main__":
    unittest.main()
