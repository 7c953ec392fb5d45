"""stage_client.rendezvous: signed tickets, and every refusal of what is forged, stale, replayed, malformed or too big.

Each refusal is sent as raw bytes to a live server, whose answer must be
``error ...``; the server must store nothing for it and still take a good
ticket afterwards.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading
import time
import unittest
from typing import Any, Dict
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stage_client import rendezvous as rdv  # noqa: E402
from stage_client.engines import MAX_TP  # noqa: E402

SECRET = b"rendezvous-test-secret"


def ticket(**kw: Any) -> Dict[str, Any]:
    t: Dict[str, Any] = {"peer": "decode-0", "kv": "dec", "tp": 2, "block_ids": [5, 9, 3], "first": 0, "tokens": 40}
    t.update(kw)
    return t


def signed(body: Dict[str, Any], secret: bytes = SECRET) -> bytes:
    raw = json.dumps(body).encode()
    return b"stage1 %s %s\n" % (rdv._mac(secret, raw).encode(), raw)


def fresh(key: str = "k", t: Any = None, **kw: Any) -> Dict[str, Any]:
    body = {"key": key, "ticket": ticket() if t is None else t, "ts": time.time(), "nonce": os.urandom(16).hex()}
    body.update(kw)
    return body


class TestRendezvous(unittest.TestCase):
    def setUp(self) -> None:
        self.srv = rdv.RendezvousServer("127.0.0.1", 0, secret=SECRET, max_conns=4)
        self.addCleanup(self.srv.close)

    def send(self, raw: bytes, srv: Any = None) -> str:
        with socket.create_connection(rdv.parse_addr((self.srv if srv is None else srv).address), timeout=10) as s:
            try:
                s.sendall(raw)
            except OSError:  # the server may close a connection sending too much before reading it all
                pass
            return s.makefile("rb").readline(4096).decode().strip()

    def refused(self, raw: bytes, why: str, srv: Any = None) -> None:
        srv = self.srv if srv is None else srv
        n = len(srv)
        ans = self.send(raw, srv)
        self.assertTrue(ans.startswith("error "), "%s: answered %r" % (why, ans))
        self.assertEqual(len(srv), n, "%s: something was stored" % why)

    def test_signed_ticket(self) -> None:
        rdv.post(self.srv.address, "req-1", ticket(), secret=SECRET)
        self.assertEqual(self.srv.get("req-1"), ticket())
        self.assertEqual(self.srv.take("req-1"), ticket())
        self.assertIsNone(self.srv.take("req-1"))
        aux = ticket(aux_index=7, aux_items=[64, 32, 128])  # an SGLang decode's metadata slot
        rdv.post(self.srv.address, "req-2", aux, secret=SECRET)
        self.assertEqual(self.srv.take("req-2"), aux)

    def test_forged(self) -> None:
        body = fresh()
        self.refused(signed(body, b"another secret"), "wrong secret")
        raw = json.dumps(body).encode()
        self.refused(b"stage1 - " + raw + b"\n", "unsigned")
        self.refused(b"stage1 " + b"0" * 64 + b" " + raw + b"\n", "zero mac")
        good = signed(body)
        self.refused(good.replace(b'"tokens": 40', b'"tokens": 41'), "body changed after signing")
        with self.assertRaises(OSError):
            rdv.post(self.srv.address, "k", ticket())  # a poster without the secret
        with self.assertRaises(OSError):
            rdv.post(self.srv.address, "k", ticket(), secret=b"wrong")

    def test_stale_and_replayed(self) -> None:
        self.refused(signed(fresh(ts=time.time() - 3600)), "an hour old")
        self.refused(signed(fresh(ts=time.time() + 3600)), "from the future")
        self.refused(signed(fresh(ts="now")), "ts not a number")
        self.refused(signed(fresh(ts=float("nan"))), "ts NaN")
        self.refused(signed({"key": "k", "ticket": ticket(), "ts": time.time()}), "no nonce")
        self.refused(signed(fresh(nonce="short")), "short nonce")
        good = signed(fresh("once"))
        self.assertEqual(self.send(good), "ok")
        self.srv.take("once")
        self.refused(good, "replayed")

    def test_malformed(self) -> None:
        cases = {
            "empty line": b"\n",
            "no protocol": b"hello\n",
            "other protocol": b"stage2 - {}\n",
            "binary": b"\x00\xff\xfe stage1\n",
            "not json": signed_raw(b"{not json"),
            "not utf-8": signed_raw(b'{"key": "\xff\xfe"}'),
            "json array": signed_raw(b"[1, 2]"),
            "deep nesting": signed_raw(b"[" * 100000 + b"]" * 100000),
            "no key": signed({"ticket": ticket(), "ts": time.time(), "nonce": os.urandom(16).hex()}),
            "key not a string": signed(fresh(key=7)),  # type: ignore[arg-type]
            "key empty": signed(fresh(key="")),
            "key too long": signed(fresh(key="k" * (rdv.MAX_KEY + 1))),
            "no ticket": signed({"key": "k", "ts": time.time(), "nonce": os.urandom(16).hex()}),
        }
        bad_tickets = {
            "ticket a list": [1], "missing key": {k: v for k, v in ticket().items() if k != "kv"},
            "extra key": ticket(code="import os"), "tp a bool": ticket(tp=True), "tp zero": ticket(tp=0),
            "tp huge": ticket(tp=MAX_TP + 1), "tp a string": ticket(tp="2"), "tokens zero": ticket(tokens=0),
            "first negative": ticket(first=-1), "tokens float": ticket(tokens=4.0), "no blocks": ticket(block_ids=[]),
            "negative block": ticket(block_ids=[1, -2]), "block too big": ticket(block_ids=[1 << 31]),
            "block a string": ticket(block_ids=["1"]), "kv empty": ticket(kv=""), "kv long": ticket(kv="k" * 300),
            "peer not a string": ticket(peer=None),
            "aux index alone": ticket(aux_index=3), "aux items alone": ticket(aux_items=[64]),
            "aux index negative": ticket(aux_index=-1, aux_items=[64]),
            "aux items empty": ticket(aux_index=1, aux_items=[]),
            "aux item zero": ticket(aux_index=1, aux_items=[64, 0]),
            "aux item huge": ticket(aux_index=1, aux_items=[rdv.MAX_AUX_ITEM + 1]),
            "aux items many": ticket(aux_index=1, aux_items=[8] * (rdv.MAX_AUX + 1)),
            "aux item a bool": ticket(aux_index=1, aux_items=[True]),
        }
        for why, t in bad_tickets.items():
            cases["ticket: " + why] = signed(fresh(t=t))
        for why, raw in cases.items():
            self.refused(raw, why)
        self.assertEqual(self.send(signed(fresh("after"))), "ok", "the server stopped taking tickets")

    def test_sizes(self) -> None:
        big = signed(fresh(t=ticket(block_ids=list(range(rdv.MAX_LINE // 4)))))
        self.assertGreater(len(big), rdv.MAX_LINE)
        self.refused(big, "line over the limit")
        self.refused(b"x" * (rdv.MAX_LINE + 10), "no newline, over the limit")
        with self.assertRaises(ValueError):
            rdv.post(self.srv.address, "k", ticket(block_ids=list(range(rdv.MAX_LINE // 4))), secret=SECRET)

    def test_slow_poster(self) -> None:
        self.srv._srv.read_timeout = 0.3
        with socket.create_connection(rdv.parse_addr(self.srv.address), timeout=5) as s:
            t0 = time.monotonic()
            s.sendall(b"stage1 ")  # and nothing more
            ans = s.makefile("rb").readline().decode()
        self.assertTrue(ans.startswith("error "), ans)
        self.assertLess(time.monotonic() - t0, 3)

    def test_connection_limit(self) -> None:
        self.srv._srv.read_timeout = 3
        held = [socket.create_connection(rdv.parse_addr(self.srv.address), timeout=5) for _ in range(4)]
        try:
            time.sleep(0.2)  # the server took them all
            self.assertEqual(self.send(signed(fresh("busy"))), "error busy")
        finally:
            for s in held:
                s.close()
        deadline = time.monotonic() + 5
        while self.send(signed(fresh("free"))) != "ok":  # the slots come back
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.05)

    def test_no_secret_loopback_only(self) -> None:
        with self.assertRaises(ValueError):
            rdv.RendezvousServer("0.0.0.0", 0, insecure=True)
        with self.assertRaisesRegex(ValueError, "insecure"):  # unsigned tickets can be replayed: only when asked
            rdv.RendezvousServer("127.0.0.1", 0)
        plain = rdv.RendezvousServer("127.0.0.1", 0, insecure=True)
        self.addCleanup(plain.close)
        rdv.post(plain.address, "p", ticket())
        self.assertEqual(plain.take("p"), ticket())
        self.refused(signed(fresh()), "a signed ticket to a server without a secret", plain)
        open_srv = rdv.RendezvousServer("0.0.0.0", 0, secret=SECRET)  # with a secret: any address
        open_srv.close()

    def test_burst_of_posts(self) -> None:
        """64 posts at once all land (a listen backlog of 5 reset most of them)."""
        errs: list = []

        def one(i: int) -> None:
            try:
                rdv.post(self.srv.address, "burst-%d" % i, ticket(), secret=SECRET)
            except (OSError, ValueError) as e:
                errs.append(e)

        # max_conns 4 here: at most 4 posts are served at once, the rest wait in the backlog, not reset
        self.srv._srv.max_conns = 64
        self.srv._srv._slots = threading.BoundedSemaphore(64)
        ts = [threading.Thread(target=one, args=(i,)) for i in range(64)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        self.assertEqual(errs, [])
        self.assertEqual(sum(self.srv.take("burst-%d" % i) is not None for i in range(64)), 64)

    def test_local_full_and_checked(self) -> None:
        loc = rdv.LocalRendezvous(ttl=60)
        loc.max_tickets = 2
        loc.post("a", ticket())
        loc.post("b", ticket())
        loc.post("a", ticket(tokens=3))  # replacing one is fine
        with self.assertRaises(ValueError):
            loc.post("c", ticket())
        with self.assertRaises(ValueError):
            loc.post("d", ticket(tp=0))
        with self.assertRaises(ValueError):
            loc.post("", ticket())
        # an optional grant (the decode's capability for its blocks): 16 to 64 bytes in lower-case hex
        for good in ("ab" * 16, "0f" * 64):
            rdv.check_ticket(dict(ticket(), grant=good))
        for bad in (1, "ab" * 15, "ab" * 65, "AB" * 16, "g" * 32, "abc" * 11):
            with self.assertRaises(ValueError):
                rdv.check_ticket(dict(ticket(), grant=bad))
        # aux as tickets (SGLang): only with aux and a grant, and only true
        aux = dict(ticket(), aux_index=3, aux_items=[4, 8], grant="ab" * 16)
        rdv.check_ticket(dict(aux, aux_tickets=True))
        for name, bad in [("false", dict(aux, aux_tickets=False)), ("1", dict(aux, aux_tickets=1)),
                          ("no grant", {k: v for k, v in dict(aux, aux_tickets=True).items() if k != "grant"}),
                          ("no aux", dict(ticket(), grant="ab" * 16, aux_tickets=True))]:
            with self.subTest(name), self.assertRaises(ValueError):
                rdv.check_ticket(bad)

    def test_load_secret(self) -> None:
        with mock.patch.dict(os.environ, {"STAGE_RENDEZVOUS_SECRET": "from-env"}):
            self.assertEqual(rdv.load_secret(), b"from-env")
            self.assertEqual(rdv.load_secret("given"), b"given")
            with tempfile.NamedTemporaryFile("w", delete=False) as f:
                f.write("from-file\nignored\n")
            self.addCleanup(os.unlink, f.name)
            self.assertEqual(rdv.load_secret(secret_file=f.name), b"from-file")
            with open(f.name, "w"):
                pass
            with self.assertRaises(ValueError):
                rdv.load_secret(secret_file=f.name)
        with mock.patch.dict(os.environ, {}, clear=True):
            self.assertIsNone(rdv.load_secret())


def signed_raw(raw: bytes) -> bytes:
    return b"stage1 %s %s\n" % (rdv._mac(SECRET, raw).encode(), raw)


if __name__ == "__main__":
    unittest.main()
