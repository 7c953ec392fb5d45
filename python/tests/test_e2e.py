"""End to end: two real staged processes, driven by the Python client.

The binary is $STAGED, or ../bin/staged relative to python/ (build it with
``cd /work/main && make build``); the tests skip when neither exists.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from stage_client.kvcache import sealed_memfd  # noqa: E402
from stage_client import (  # noqa: E402
    Access, Block, Client, Code, Direction, Op, PagedKV, StageError, State, wire)

STAGED = os.environ.get("STAGED") or os.path.join(os.path.dirname(HERE), "..", "bin", "staged")
STAGED = os.path.abspath(STAGED)
HAVE_STAGED = os.path.isfile(STAGED) and os.access(STAGED, os.X_OK)
SKIP_WHY = ("staged binary not found at %s: set STAGED=/path/to/staged, or build it with "
            "`cd /work/main && make build`" % STAGED)

TOKEN = "python-e2e-token"
#: The tests' own knobs, not staged's: which GPU a test (STAGE_GPU) or a
#: script's sides (STAGE_GPU_SRC, STAGE_GPU_DST) use. They are kept out of
#: the sidecars' environment, where staged would warn about unknown STAGE_*
#: variables.
TEST_ONLY_ENV = ("STAGE_GPU", "STAGE_GPU_SRC", "STAGE_GPU_DST")


def sidecar_env() -> Dict[str, str]:
    """The environment a test's staged runs with: this one, less the tests' knobs, with the e2e token."""
    env = {k: v for k, v in os.environ.items() if k not in TEST_ONLY_ENV}
    env["STAGE_SECURITY_TOKEN"] = TOKEN
    return env
GUARD = 12288  # regions start this far into their allocation
POISON = 0xAB
MiB = 1 << 20


class Staged:
    """One staged process with its config in a temporary directory."""

    def __init__(self, name: str, route_to: Optional[str] = None, slots: int = 16, extra: str = "") -> None:
        self.name = name
        self.dir = tempfile.mkdtemp(prefix="stage-py-%s-" % name)
        sock = os.path.join(self.dir, "s", name + ".sock")
        cfg = ("node: {name: %s}\nlisten: 127.0.0.1:0\ncontrol_socket: %s\n"
               "staging: {slot_size: 1MiB, slots: %d, window: %d}\n" % (name, sock, slots, slots // 2))
        if route_to:
            cfg += "routes:\n  - name: decode\n    peers: [\"%s\"]\n    stripes: 2\n" % route_to
        cfg += extra
        self.config = os.path.join(self.dir, name + ".yaml")
        with open(self.config, "w") as f:
            f.write(cfg)
        self.log = os.path.join(self.dir, name + ".log")
        self.peers = ""
        self.socket = ""
        self._start("wb")

    def _start(self, mode: str) -> None:
        """Start staged with the config and wait until it is ready (its log opened with ``mode``)."""
        name = self.name
        self.logf = open(self.log, mode)
        self.proc = subprocess.Popen([STAGED, "--config", self.config], stdout=subprocess.PIPE,
                                     stderr=self.logf, env=sidecar_env())
        ready = threading.Event()

        def read_stdout() -> None:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:  # keeps draining after ready, so staged never blocks on stdout
                line = raw.decode("utf-8", "replace").strip()
                if line.startswith("staged ready "):
                    for f in line.split():
                        if f.startswith("peers="):
                            self.peers = f[len("peers="):]
                        elif f.startswith("socket="):
                            self.socket = f[len("socket="):]
                    ready.set()

        self.reader = threading.Thread(target=read_stdout, daemon=True)
        self.reader.start()
        deadline = time.monotonic() + 15
        while not ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("%s did not get ready (exit %s):\n%s" % (name, self.proc.returncode, self.tail()))
        self.client = Client(self.socket)

    def tail(self, n: int = 30) -> str:
        try:
            with open(self.log, "rb") as f:
                return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-n:])
        except OSError:
            return ""

    def settle(self, sessions: int) -> None:
        deadline = time.monotonic() + 10
        while self.client.stats()["sessions"] < sessions:
            if time.monotonic() > deadline:
                raise RuntimeError("%s: no session after 10s\n%s" % (self.name, self.tail()))
            time.sleep(0.02)

    def add_route(self, name: str, peer: str, timeout: float = 15) -> None:
        """Give this running staged a route to ``peer`` (its config reloads on
        SIGHUP) and wait until the route's session is up. Only for a staged
        started without routes: the file gets its one ``routes:`` key here."""
        with open(self.config, "a") as f:
            f.write("routes:\n  - name: %s\n    peers: [\"%s\"]\n" % (name, peer))
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while True:
            rs = {r["name"]: r for r in self.client.routes()}
            if name in rs and any(p.get("state") == "up" for p in rs[name]["peers"]):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("%s: route %s to %s not up after %ss: %s\n%s" % (self.name, name, peer, timeout,
                                                                                 rs, self.tail()))
            time.sleep(0.05)

    def stop(self) -> int:
        """SIGTERM; the exit code (or -9 when it had to be killed)."""
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
                return -9
        self.reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.logf.close()
        rc = self.proc.returncode
        if rc == 0:
            shutil.rmtree(self.dir, ignore_errors=True)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.logf.close()

    def restart(self, sig: int = signal.SIGKILL, down: float = 0.0) -> None:
        """End staged with ``sig``, wait ``down`` seconds, start it again: the same config, control socket and
        listen address (so its peers' routes find it again), the log appended to."""
        with open(self.config) as f:
            cfg = f.read()
        if self.peers and "listen: 127.0.0.1:0\n" in cfg:
            with open(self.config, "w") as f:
                f.write(cfg.replace("listen: 127.0.0.1:0\n", "listen: %s\n" % self.peers, 1))
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.logf.close()
        time.sleep(down)
        self._start("ab")


def pair(extra: str = "", pre_extra: Optional[str] = None, slots: int = 16, pulls: bool = False,
         pre_name: str = "prefill") -> Tuple[Staged, Staged]:
    """A receiver "decode" and a sender (``pre_name``) with route "decode" to it, its session up.

    ``extra`` is config for both (``pre_extra``, when given, for the
    sender's); with ``pulls`` the decode also gets route "prefill" to the
    sender, for its pulls. A sidecar started before a failure is stopped.
    """
    dec = Staged("decode", slots=slots, extra=extra)
    pre: Optional[Staged] = None
    try:
        pre = Staged(pre_name, route_to=dec.peers, slots=slots, extra=extra if pre_extra is None else pre_extra)
        pre.settle(1)
        if pulls:
            dec.add_route("prefill", pre.peers)
        else:
            dec.settle(1)
    except BaseException:
        for n in (pre, dec):
            if n is not None:
                n.stop()
        raise
    return pre, dec


def stop_all(nodes: Sequence[Staged]) -> Optional[str]:
    """SIGTERM every sidecar; None when all exited 0, else their exit codes and log tails."""
    rcs = {n.name: n.stop() for n in nodes}
    if all(rc == 0 for rc in rcs.values()):
        return None
    return "staged exit codes after SIGTERM: %s, want 0\n%s" % (rcs, "\n".join(n.tail() for n in nodes))


class Mem:
    """A memfd allocation with one region at GUARD bytes in, GUARD bytes after it."""

    def __init__(self, name: str, length: int) -> None:
        self.length = length
        self.size = 2 * GUARD + length
        self.fd = sealed_memfd(name, self.size)
        self.mm = mmap.mmap(self.fd, self.size)

    def region(self) -> memoryview:
        return memoryview(self.mm)[GUARD:GUARD + self.length]

    def fill(self, seed: int) -> None:
        self.mm[:] = random.Random(seed).randbytes(self.size) if hasattr(random.Random, "randbytes") else \
            os.urandom(self.size)

    def poison(self) -> None:
        self.mm[:] = bytes([POISON]) * self.size

    def guards_ok(self) -> bool:
        g = bytes([POISON]) * GUARD
        return self.mm[:GUARD] == g and self.mm[-GUARD:] == g

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestE2E(unittest.TestCase):
    pre: Staged
    dec: Staged

    @classmethod
    def setUpClass(cls) -> None:
        cls.pre, cls.dec = pair()

    @classmethod
    def tearDownClass(cls) -> None:
        rcs = {n.name: n.stop() for n in (cls.pre, cls.dec)}
        if any(rc != 0 for rc in rcs.values()):
            raise AssertionError("staged exit codes after SIGTERM: %s, want 0\n%s\n%s"
                                 % (rcs, cls.pre.tail(), cls.dec.tail()))

    def setUp(self) -> None:
        self.n = getattr(type(self), "_n", 0) + 1
        type(self)._n = self.n

    def regions(self, size: int = 8 * MiB) -> Tuple[Mem, Mem, str, str]:
        """A filled source region on prefill and a poisoned one on decode."""
        src, dst = Mem("src", size), Mem("dst", size)
        self.addCleanup(src.close)
        self.addCleanup(dst.close)
        src.fill(self.n)
        dst.poison()
        sname, dname = "prefill-kv-%d" % self.n, "decode-kv-%d" % self.n
        self.pre.client.register_memfd(sname, src.fd, src.size, GUARD, size, Access.ALL)
        self.addCleanup(self.pre.client.unregister, sname)
        self.dec.client.register_memfd(dname, dst.fd, dst.size, GUARD, size, Access.ALL)
        self.addCleanup(self.dec.client.unregister, dname)
        return src, dst, sname, dname

    def test_push_ranges_and_pull_back(self) -> None:
        src, dst, sname, dname = self.regions()
        c = self.pre.client
        ops = [Op(0, off, 0, off, MiB) for off in range(0, 8 * MiB, MiB)]
        st = c.wait(c.push("decode", sname, dname, ops, tag="ranges"), timeout=60)
        self.assertEqual((st.state, st.done, st.total, st.code), (State.DONE, 8 * MiB, 8 * MiB, Code.OK))
        self.assertEqual(bytes(dst.region()), bytes(src.region()))
        self.assertTrue(dst.guards_ok(), "guard bytes around the destination region were overwritten")
        # Pull it back into a fresh poisoned local region.
        back = Mem("back", 8 * MiB)
        self.addCleanup(back.close)
        back.poison()
        bname = "back-%d" % self.n
        c.register_memfd(bname, back.fd, back.size, GUARD, 8 * MiB, Access.ALL)
        self.addCleanup(c.unregister, bname)
        st = c.wait(c.pull("decode", bname, dname, [Block(off, off, MiB) for off in range(0, 8 * MiB, MiB)],
                           tag="back"), timeout=60)
        self.assertTrue(st.ok)
        self.assertEqual(bytes(back.region()), bytes(src.region()))
        self.assertTrue(back.guards_ok())

    def test_push_blocks_random_order(self) -> None:
        src, dst, sname, dname = self.regions()
        bs = 16 << 10
        n = 8 * MiB // bs
        rng = random.Random(7)
        perm = list(range(n))
        rng.shuffle(perm)
        moves = [(i, perm[i]) for i in range(n)]
        rng.shuffle(moves)
        c = self.pre.client
        tid = c.push("decode", [sname], [dname], [(0, s * bs, 0, d * bs, bs) for s, d in moves], tag="blocks")
        st = c.wait(tid, timeout=60)
        self.assertEqual(st.done, 8 * MiB)
        sv, dv = src.region(), dst.region()
        for s, d in moves:
            if sv[s * bs:(s + 1) * bs] != dv[d * bs:(d + 1) * bs]:
                self.fail("block %d -> %d differs" % (s, d))
        self.assertTrue(dst.guards_ok())
        # Pull the blocks back in another random order into a poisoned region, undoing the permutation.
        back = Mem("back", 8 * MiB)
        self.addCleanup(back.close)
        back.poison()
        bname = "back-%d" % self.n
        c.register_memfd(bname, back.fd, back.size, GUARD, 8 * MiB, Access.ALL)
        self.addCleanup(c.unregister, bname)
        rng.shuffle(moves)
        st = c.wait(c.pull("decode", bname, dname, [Block(s * bs, d * bs, bs) for s, d in moves]), timeout=60)
        self.assertTrue(st.ok)
        self.assertEqual(bytes(back.region()), bytes(src.region()))
        self.assertTrue(back.guards_ok())

    def test_push_blocks_in_pieces(self) -> None:
        # The same 512 scattered blocks, each way, sent as a SubmitHead of 16 ops and SubmitMore frames
        # of 100 (PROTOCOL.md 9.5b): the push starts on the head and lands byte-exact.
        c = self.pre.client
        old = (c.pieces_above, c.first_piece, c.piece_ops)
        c.pieces_above, c.first_piece, c.piece_ops = 64, 16, 100

        def restore() -> None:
            c.pieces_above, c.first_piece, c.piece_ops = old

        self.addCleanup(restore)
        self.test_push_blocks_random_order()
        self.assertEqual((c._pieces or {}).get("max_pieces"), 4096, "the sidecar did not say it takes pieces")

    def test_notify_with_tag(self) -> None:
        src, dst, sname, dname = self.regions(2 * MiB)
        sub = self.dec.client.subscribe()
        self.addCleanup(sub.close)
        tag = "request-%d-\u00e9" % self.n
        c = self.pre.client
        c.wait(c.push("decode", sname, dname, [Block(0, 0, 2 * MiB)], tag=tag), timeout=60)
        deadline = time.monotonic() + 30
        while True:
            n = sub.get(max(0.0, deadline - time.monotonic()))
            self.assertIsNotNone(n, "no notification with tag %r in 30s" % tag)
            if n.tag == tag:
                break
        # Every byte is in place by the time the notification comes.
        self.assertEqual(bytes(dst.region()), bytes(src.region()))
        self.assertEqual((n.peer, n.direction, n.bytes, n.code), ("prefill", Direction.PUSH, 2 * MiB, Code.OK))
        self.assertTrue(n.ok)

    def test_error_codes(self) -> None:
        src, dst, sname, dname = self.regions(1 * MiB)
        c = self.pre.client

        def code_of(route: str, ops: list, local: str = sname, remote: str = dname) -> int:
            try:
                c.wait(c.push(route, local, remote, ops, tag="bad"), timeout=30)
            except StageError as e:
                return e.code
            self.fail("got success, want an error")

        self.assertEqual(code_of("nowhere", [Block(0, 0, 4096)]), Code.UNKNOWN_ROUTE)
        self.assertEqual(code_of("decode", [Block(MiB, 0, 4096)]), Code.OUT_OF_RANGE)  # local past its end
        self.assertEqual(code_of("decode", [Block(0, MiB - 1, 4096)]), Code.OUT_OF_RANGE)  # remote past its end
        self.assertEqual(code_of("decode", [Block(0, 0, 4096)], local="nope"), Code.UNKNOWN_REGION)
        self.assertEqual(code_of("decode", [Block(0, 0, 4096)], remote="nope"), Code.UNKNOWN_REGION)
        with self.assertRaises(StageError) as cm:
            c.unregister("never-registered")
        self.assertIs(cm.exception.code, Code.UNKNOWN_REGION)
        with self.assertRaises(StageError) as cm:
            c.status(999999)
        self.assertIs(cm.exception.code, Code.UNKNOWN_TRANSFER)
        with self.assertRaises(StageError) as cm:
            c.register_memfd(sname, src.fd, src.size, 0, 4096, Access.ALL)
        self.assertIs(cm.exception.code, Code.EXISTS)
        with self.assertRaises(StageError) as cm:
            c.register_memfd("past", src.fd, src.size, src.size, 1, Access.ALL)
        self.assertIs(cm.exception.code, Code.OUT_OF_RANGE)
        with self.assertRaises(StageError) as cm:
            c.catalog("nowhere")
        self.assertIs(cm.exception.code, Code.UNKNOWN_ROUTE)
        # Nothing landed, and the connection still works.
        self.assertEqual(bytes(dst.mm[:]), bytes([POISON]) * dst.size)
        self.assertEqual(c.stats()["node"], "prefill")

    def test_queries(self) -> None:
        src, dst, sname, dname = self.regions(1 * MiB)
        st = self.pre.client.stats()
        for k in ("node", "device", "listen", "uptime_s", "slot_size", "send_slots", "recv_slots", "regions",
                  "sessions", "transfers_active", "goroutines", "fds", "links"):
            self.assertIn(k, st)
        self.assertEqual((st["node"], st["slot_size"]), ("prefill", MiB))
        routes = self.pre.client.routes()
        self.assertEqual([r["name"] for r in routes], ["decode"])
        self.assertEqual(routes[0]["peers"][0]["state"], "up")
        self.assertEqual(routes[0]["peers"][0]["addr"], self.dec.peers)
        self.assertEqual(self.dec.client.routes(), [])
        regs = {r["name"]: r for r in self.pre.client.regions()}
        self.assertEqual((regs[sname]["size"], regs[sname]["access"]), (MiB, int(Access.ALL)))
        cat = {r["name"]: r for r in self.pre.client.catalog("decode")}
        self.assertIn(dname, cat)
        self.assertEqual(cat[dname]["size"], MiB)

    def test_paged_kv(self) -> None:
        layers, blocks, bb = 4, 64, 16 << 10
        src = PagedKV.hostmem(self.pre.client, "pkv-src-%d" % self.n, layers, blocks, bb)
        self.addCleanup(src.close)
        dst = PagedKV.hostmem(self.dec.client, "pkv-dst-%d" % self.n, layers, blocks, bb)
        self.addCleanup(dst.close)
        assert src.buffer is not None and dst.buffer is not None
        src.buffer[:] = os.urandom(len(src.buffer))
        dst.buffer[:] = bytes([POISON]) * len(dst.buffer)
        # A request's blocks: two runs and a stray block.
        s_ids = [3, 4, 5, 6, 20, 21, 40]
        d_ids = [10, 11, 12, 13, 0, 1, 63]
        self.assertEqual(sum(len(ops) for _, ops in src.plan(s_ids, d_ids)), 3 * layers)
        sub = self.dec.client.subscribe()
        self.addCleanup(sub.close)
        ids = src.push_blocks("decode", s_ids, d_ids, tag="pkv-%d" % self.n, remote=dst.name)
        self.assertEqual(len(ids), 1)
        self.assertTrue(all(s.ok for s in src.wait(ids, timeout=60)))
        for layer in range(layers):
            sv, dv = src.layer(layer), dst.layer(layer)
            for s, d in zip(s_ids, d_ids):
                self.assertEqual(bytes(dv[d * bb:(d + 1) * bb]), bytes(sv[s * bb:(s + 1) * bb]))
        n = sub.get(30)
        self.assertEqual((n.tag, n.bytes), ("pkv-%d" % self.n, len(s_ids) * bb * layers))
        # The asyncio form, pulling other blocks back from the peer.
        dst.buffer[dst.guard:dst.guard + layers * blocks * bb] = os.urandom(layers * blocks * bb)
        sts = asyncio.run(src.pull_blocks_async("decode", [0, 1, 2], [50, 51, 52], tag="pkv-pull",
                                                remote=dst.name, layers=[1, 3], timeout=60))
        self.assertTrue(all(s.ok for s in sts))
        for layer in (1, 3):
            self.assertEqual(bytes(src.layer(layer)[50 * bb:53 * bb]), bytes(dst.layer(layer)[0:3 * bb]))
        # The callback form.
        done = threading.Event()
        result: Dict[str, object] = {}

        def cb(statuses: List[wire.XferStatus], err: Optional[BaseException]) -> None:
            result["n"], result["err"] = len(statuses), err
            done.set()

        src.on_done(src.push_blocks("decode", [7], [8], remote=dst.name), cb, timeout=60)
        self.assertTrue(done.wait(60))
        self.assertEqual(result, {"n": 1, "err": None})

    def test_cancel_and_concurrency(self) -> None:
        src, dst, sname, dname = self.regions(8 * MiB)
        c = self.pre.client
        # Many transfers from several threads at once on one client.
        errors: List[BaseException] = []

        def worker(k: int) -> None:
            try:
                for i in range(5):
                    off = ((k * 5 + i) % 8) * MiB
                    c.wait(c.push("decode", sname, dname, [Block(off, off, MiB)], tag="w%d" % k), timeout=60)
            except BaseException as e:  # noqa: B902
                errors.append(e)

        ts = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(bytes(dst.region()), bytes(src.region()))
        # Cancel: either it finished first, or its waiter sees CANCELLED.
        tid = c.push("decode", sname, dname, [Block(off, off, 16 << 10) for off in range(0, 8 * MiB, 16 << 10)])
        try:
            c.cancel(tid)
        except StageError as e:
            self.assertIn(e.code, (Code.UNKNOWN_TRANSFER, Code.BAD_REQUEST))
        try:
            st = c.wait(tid, timeout=60)
            self.assertEqual(st.state, State.DONE)
        except StageError as e:
            self.assertIs(e.code, Code.CANCELLED)


@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestPeers(unittest.TestCase):
    """One route to two decodes whose regions have one name: peer= picks."""

    def test_named_peer_and_refusals(self) -> None:
        decs: List[Staged] = []
        try:
            for i in range(2):
                decs.append(Staged("decode-%d" % i))
            route = ("routes:\n  - name: decode\n    peers: [\"%s\", \"%s\"]\n    stripes: 1\n"
                     "    connect_timeout: 2s\n" % (decs[0].peers, decs[1].peers))
            pre = Staged("prefill", extra=route)
            decs.append(pre)
            pre.settle(2)
            src = Mem("src", MiB)
            self.addCleanup(src.close)
            src.fill(7)
            pre.client.register_memfd("src", src.fd, src.size, GUARD, MiB, Access.ALL)
            dsts = []
            for d in decs[:2]:
                m = Mem("kv", MiB)
                self.addCleanup(m.close)
                m.poison()
                d.client.register_memfd("kv", m.fd, m.size, GUARD, MiB, Access.ALL)
                dsts.append(m)
            c = pre.client
            with self.assertRaises(StageError) as cm:
                c.push("decode", "src", "kv", [Block(0, 0, 4096)])
            self.assertIs(cm.exception.code, Code.BAD_REQUEST)
            self.assertIn("decode-0 at " + decs[0].peers, str(cm.exception))
            self.assertIn("decode-1 at " + decs[1].peers, str(cm.exception))
            with self.assertRaises(StageError) as cm:
                c.push("decode", "src", "kv", [Block(0, 0, 4096)], peer="decode-7")
            self.assertIs(cm.exception.code, Code.UNKNOWN_PEER)
            with self.assertRaises(StageError) as cm:
                c.push("decode", "src", "kv", [Block(0, 0, 4096)], peer="127.0.0.1:9")
            self.assertIs(cm.exception.code, Code.ACCESS_DENIED)
            untouched = bytes([POISON]) * dsts[0].size
            self.assertEqual(bytes(dsts[0].mm), untouched)
            self.assertEqual(bytes(dsts[1].mm), untouched)
            for off in range(0, 6 * 8192, 8192):
                st = c.wait(c.push("decode", "src", "kv", [Block(off, off, 4096)], peer="decode-1"), timeout=30)
                self.assertTrue(st.ok)
                self.assertEqual(bytes(dsts[1].region()[off:off + 4096]), bytes(src.region()[off:off + 4096]))
            self.assertEqual(bytes(dsts[0].mm), untouched, "decode-0 got bytes meant for decode-1")
            st = c.wait(c.pull("decode", "src", "kv", [Block(0, 0, 4096)], peer=decs[1].peers), timeout=30)
            self.assertTrue(st.ok)
            peers = {p["node"]: p for p in c.routes()[0]["peers"]}
            self.assertEqual(sorted(peers), ["decode-0", "decode-1"])
            self.assertEqual({p["found"] for p in peers.values()}, {"static"})
            self.assertEqual(c.catalog("decode", peer="decode-0")[0]["name"], "kv")
            for d in decs:
                d.client.unregister("src" if d is pre else "kv")
        finally:
            rcs = [d.stop() for d in decs]
        self.assertEqual(rcs, [0] * len(rcs))


@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestShutdown(unittest.TestCase):
    def test_sigterm_exits_zero_and_idle(self) -> None:
        pre, dec = pair()
        try:
            src, dst = Mem("s", MiB), Mem("d", MiB)
            self.addCleanup(src.close)
            self.addCleanup(dst.close)
            src.fill(1)
            pre.client.register_memfd("s", src.fd, src.size, GUARD, MiB, Access.ALL)
            dec.client.register_memfd("d", dst.fd, dst.size, GUARD, MiB, Access.ALL)
            pre.client.wait(pre.client.push("decode", "s", "d", [Block(0, 0, MiB)]), timeout=60)
            self.assertEqual(bytes(dst.region()), bytes(src.region()))
            pre.client.unregister("s")
            dec.client.unregister("d")
            for n in (pre, dec):
                deadline = time.monotonic() + 10
                while True:
                    st = n.client.stats()
                    idle = (st["regions"], st["mappings"], st["send_in_use"], st["recv_in_use"], st["transfers_active"])
                    if idle == (0, 0, 0, 0, 0) or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                self.assertEqual(idle, (0, 0, 0, 0, 0), "%s not idle" % n.name)
        finally:
            rc_pre, rc_dec = pre.stop(), dec.stop()
        self.assertEqual(rc_pre, 0, pre.tail())
        self.assertEqual(rc_dec, 0, dec.tail())


@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestSidecarEnvironment(unittest.TestCase):
    def test_test_knobs_do_not_reach_staged(self) -> None:
        # A sidecar a test starts warns about no variable of the tests' own:
        # the GPU tests run with STAGE_GPU (and the GPU scripts export
        # STAGE_GPU_SRC / STAGE_GPU_DST). A misspelt config key still warns,
        # so the check would see a warning.
        warn = "unknown environment variable"
        for name, env, warned in [
            ("the tests' GPU knobs", {"STAGE_GPU": "0", "STAGE_GPU_SRC": "0", "STAGE_GPU_DST": "1"}, []),
            ("a misspelt config key", {"STAGE_STAGIN_SLOTS": "2"}, ["STAGE_STAGIN_SLOTS"]),
        ]:
            with self.subTest(name), mock.patch.dict(os.environ, env):
                n = Staged("env")
                try:
                    with open(n.log, "rb") as f:
                        lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if warn in ln]
                finally:
                    self.assertEqual(n.stop(), 0, n.tail())
                self.assertEqual([v for v in env if any("\"%s\"" % v in ln for ln in lines)], warned, "\n".join(lines))


if __name__ == "__main__":
    unittest.main()
