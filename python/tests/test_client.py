"""Client behaviour against a scripted fake sidecar (no staged needed)."""

from __future__ import annotations

import array
import asyncio
import json
import os
import queue
import sys
import threading
import time
import unittest
import warnings
from typing import Any, List
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fakesidecar import FakeSidecar, fail, ok  # noqa: E402
from stage_client import (  # noqa: E402
    Access, Block, Client, Code, Direction, HandleKind, Op, SidecarConnectionError, StageError, StageTimeout, State,
    TransfersFailed, make_ops, wire)
from stage_client.cuda import export_tensor, split_share_handle  # noqa: E402


def status(req: int, transfer: int, state: int, code: int = 0, msg: str = "", done: int = 0, total: int = 0) -> bytes:
    return wire.encode_frame(wire.XferStatus(req=req, transfer=transfer, state=state, done=done, total=total,
                                             code=code, message=msg))


class Base(unittest.TestCase):
    def start(self, handler: Any, **kw: Any) -> Client:
        self.fake = FakeSidecar(handler)
        self.addCleanup(self.fake.close)
        c = Client(self.fake.path, **kw)
        self.addCleanup(c.close)
        self.assertTrue(self.fake.connected.wait(5))
        return c


class TestClient(Base):
    def test_connect_refused(self) -> None:
        with self.assertRaises(SidecarConnectionError) as cm:
            Client("/nonexistent/stage.sock")
        self.assertIn("is staged running", str(cm.exception))

    def test_register_memfd_sends_fd(self) -> None:
        c = self.start(lambda s, h, m, fd: [ok(m.req)])
        fd = os.memfd_create("t")
        self.addCleanup(os.close, fd)
        os.ftruncate(fd, 1 << 16)
        c.register_memfd("kv/0", fd, 1 << 16, 4096, 8192, Access.ALL)
        h, m, got_fd = self.fake.got[-1]
        self.assertEqual(h.flags, wire.FLAG_FD)
        self.assertIsInstance(m, wire.Register)
        self.assertEqual((m.name, m.handle, m.access, m.alloc_size, m.offset, m.length),
                         ("kv/0", HandleKind.MEMFD, Access.ALL, 1 << 16, 4096, 8192))
        self.assertGreaterEqual(got_fd, 0)
        a, b = os.fstat(fd), os.fstat(got_fd)
        self.assertEqual((a.st_dev, a.st_ino), (b.st_dev, b.st_ino))
        # A request without an fd carries no FlagFD.
        c.unregister("kv/0")
        h, m, got_fd = self.fake.got[-1]
        self.assertEqual((h.flags, got_fd), (0, -1))

    def test_register_cuda_ipc(self) -> None:
        c = self.start(lambda s, h, m, fd: [ok(m.req)])
        c.register_cuda_ipc("g", bytes(range(64)), 1 << 21, 512, 1024, Access.REMOTE_READ, ordinal=1)
        _, m, fd = self.fake.got[-1]
        self.assertEqual((m.handle, m.handle_raw, m.ordinal, fd), (HandleKind.CUDA_IPC, bytes(range(64)), 1, -1))
        with self.assertRaises(ValueError):
            c.register_cuda_ipc("g", b"x" * 66, 1, 0, 1, Access.ALL)

    def test_fail_code(self) -> None:
        c = self.start(lambda s, h, m, fd: [fail(m.req, Code.UNKNOWN_REGION, 'region "x" is not registered')])
        with self.assertRaises(StageError) as cm:
            c.unregister("x")
        self.assertIs(cm.exception.code, Code.UNKNOWN_REGION)
        self.assertEqual(cm.exception.code_name, "UNKNOWN_REGION")
        self.assertIn("unknown region", str(cm.exception))
        self.assertIn('"x"', cm.exception.message)

    def test_out_of_order_answers(self) -> None:
        held: List[int] = []

        def h(s: FakeSidecar, hd: wire.Header, m: Any, fd: int) -> List[bytes]:
            if isinstance(m, wire.Submit):
                return [wire.encode_frame(wire.Submitted(req=m.req, transfer=77))]
            if isinstance(m, wire.Wait):
                held.append(m.req)  # answered when the transfer is cancelled
                return []
            if isinstance(m, wire.Cancel):
                return [ok(m.req)] + [status(r, 77, State.FAILED, Code.CANCELLED, "cancelled by the engine", 5, 10)
                                      for r in held]
            if isinstance(m, wire.Status):
                return [status(m.req, m.transfer, State.RUNNING, done=5, total=10)]
            return [fail(m.req, Code.BAD_REQUEST, "?")]

        c = self.start(h)
        tid = c.push("decode", "a", "b", [Block(0, 0, 10)], tag="x")
        self.assertEqual(tid, 77)
        fut = c.wait_future(tid)
        st = c.status(tid)  # answered while the Wait is outstanding
        self.assertEqual((st.state, st.done, st.total), (State.RUNNING, 5, 10))
        self.assertFalse(fut.done())
        c.cancel(tid)
        with self.assertRaises(StageError) as cm:
            fut.result(5)
        self.assertIs(cm.exception.code, Code.CANCELLED)
        self.assertEqual(cm.exception.status.done, 5)
        sub = [m for _, m, _ in self.fake.got if isinstance(m, wire.Submit)][0]
        self.assertEqual((sub.route, sub.direction, sub.tag, sub.local_names, sub.remote_names),
                         ("decode", Direction.PUSH, "x", ["a"], ["b"]))
        self.assertEqual(sub.ops, [wire.LocalOp(0, 0, 0, 0, 10)])

    def test_concurrent_calls(self) -> None:
        # Answers come from several threads' requests interleaved; each must reach its caller.
        c = self.start(lambda s, h, m, fd: [status(m.req, m.transfer, State.DONE, done=m.transfer, total=m.transfer)])
        errors: List[BaseException] = []

        def worker(k: int) -> None:
            try:
                for i in range(200):
                    t = k * 1000 + i
                    st = c.status(t)
                    if st.transfer != t or st.done != t:
                        raise AssertionError("asked for %d, got %d" % (t, st.transfer))
            except BaseException as e:  # noqa: B902
                errors.append(e)

        ts = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])
        reqs = [m.req for _, m, _ in self.fake.got]
        self.assertEqual(len(reqs), len(set(reqs)), "request ids must be unique")

    def test_wait(self) -> None:
        def h(s: FakeSidecar, hd: wire.Header, m: Any, fd: int) -> List[bytes]:
            if m.transfer == 1:
                return [status(m.req, 1, State.DONE, done=4, total=4)]
            if m.transfer == 2:
                return [status(m.req, 2, State.FAILED, Code.PEER_UNAVAILABLE, "session closed", 1, 4)]
            return [status(m.req, 3, State.RUNNING, done=2, total=4)]  # the sidecar's answer at the timeout

        c = self.start(h)
        st = c.wait(1)
        self.assertTrue(st.ok)
        self.assertEqual(self.fake.got[-1][1].timeout_ms, 0)
        with self.assertRaises(StageError) as cm:
            c.wait(2)
        self.assertIs(cm.exception.code, Code.PEER_UNAVAILABLE)
        with self.assertRaises(StageTimeout) as cm2:
            c.wait(3, timeout=0.25)
        self.assertEqual(self.fake.got[-1][1].timeout_ms, 250)
        self.assertIsInstance(cm2.exception, TimeoutError)
        self.assertEqual(cm2.exception.status.state, State.RUNNING)
        self.assertEqual([s.transfer for s in c.wait_all([1, 1])], [1, 1])

    def test_wait_all_reports_every_transfer(self) -> None:
        # transfer id -> the sidecar's answer to its Wait: (state, code)
        answers = {1: (State.DONE, 0), 2: (State.FAILED, Code.CHECKSUM), 3: (State.DONE, 0),
                   4: (State.FAILED, Code.PEER_UNAVAILABLE), 5: (State.RUNNING, 0)}

        def h(s: FakeSidecar, hd: wire.Header, m: Any, fd: int) -> List[bytes]:
            st, code = answers[m.transfer]
            return [status(m.req, m.transfer, st, code, "no" if code else "", 1, 4)]

        c = self.start(h)
        for name, ids, want in [
            ("all done", [1, 3, 1], []),
            ("the first of three fails", [2, 1, 3], [(2, Code.CHECKSUM)]),
            ("failures and a timeout among successes", [1, 2, 3, 4, 5],
             [(2, Code.CHECKSUM), (4, Code.PEER_UNAVAILABLE), (5, Code.TIMEOUT)]),
        ]:
            with self.subTest(name):
                if not want:
                    self.assertEqual([s.transfer for s in c.wait_all(ids, timeout=0.25)], ids)
                    continue
                with self.assertRaises(TransfersFailed) as cm:
                    c.wait_all(ids, timeout=0.25)
                e = cm.exception
                self.assertEqual([(t, err.code) for t, err in e.failed], want)
                self.assertEqual(e.transfer_ids, ids)
                self.assertIs(e.code, want[0][1])
                for t, st, err in zip(ids, e.statuses, e.errors):
                    self.assertEqual(st.transfer, t, "every transfer's status is there")
                    self.assertEqual(st.state, answers[t][0])
                    self.assertEqual(err is None, answers[t][0] == State.DONE)
                for t, _ in want:
                    self.assertIn("transfer %d:" % t, str(e))

    def test_submit_kv_refuses_repeated_destination_blocks(self) -> None:
        c = self.start(lambda s, h, m, fd: [wire.encode_frame(wire.Submitted(req=m.req, transfer=9))])
        push, pull = Direction.PUSH, Direction.PULL
        for name, direction, local, remote, refused in [
            ("push, remote table repeats", push, [0, 1], [2, 2], "remote (destination) block table names block 2 "
                                                                  "twice, at positions 0 and 1"),
            ("push, remote array repeats later", push, [0, 1, 4], array.array("I", [5, 6, 5]),
             "names block 5 twice, at positions 0 and 2"),
            ("pull, local table repeats", pull, (3, 7, 7), [1, 2, 3], "local (destination) block table names block 7 "
                                                                     "twice, at positions 1 and 2"),
            ("pull, local generator repeats", pull, (b for b in [4, 4]), [1, 2], "names block 4 twice"),
            ("push, source repeats", push, [1, 1], [2, 3], ""),
            ("pull, source repeats", pull, [2, 3], [1, 1], ""),
            ("push, distinct", push, range(3), [5, 6, 7], ""),
        ]:
            with self.subTest(name):
                sent = len(self.fake.got)
                args = ("decode", "here", "there", [0], local, remote, 20)
                if not refused:
                    self.assertEqual(c.submit_kv(*args, direction=direction), 9)
                    continue
                with self.assertRaises(ValueError) as cm:
                    c.submit_kv(*args, direction=direction)
                self.assertIn(refused, str(cm.exception))
                self.assertEqual(len(self.fake.got), sent, "nothing was sent")
        with self.assertRaises(ValueError):  # the KVCache helpers submit through it
            c.submit_kv("decode", "here", "there", [0], [0, 1], [8, 8], 20)

    def test_wait_async(self) -> None:
        c = self.start(lambda s, h, m, fd: [status(m.req, m.transfer, State.DONE, total=1, done=1)])

        async def main() -> List[Any]:
            return list(await asyncio.gather(c.wait_async(5), c.wait_async(6)))

        sts = asyncio.run(main())
        self.assertEqual([s.transfer for s in sts], [5, 6])

    def test_request_timeout(self) -> None:
        c = self.start(lambda s, h, m, fd: [], request_timeout=0.2)
        t0 = time.monotonic()
        with self.assertRaises(StageTimeout):
            c.unregister("x")
        self.assertLess(time.monotonic() - t0, 3)

    def test_submit_answered_after_its_timeout_is_cancelled(self) -> None:
        """A transfer whose Submitted comes after the submit timed out is cancelled: its caller gave up on it and
        may have reused the memory (a decode that gave up on a pull recomputes into those blocks)."""
        started = threading.Event()
        cancelled: "queue.Queue[int]" = queue.Queue()

        def h(s: FakeSidecar, hd: wire.Header, m: Any, fd: int) -> List[bytes]:
            if isinstance(m, wire.Submit):
                def late(req: int = m.req) -> None:
                    started.wait(5)
                    s.send(wire.encode_frame(wire.Submitted(req=req, transfer=91)))
                threading.Thread(target=late, daemon=True).start()
                return []
            if isinstance(m, wire.Cancel):
                cancelled.put(m.transfer)
                return [ok(m.req)]
            return [fail(m.req, Code.BAD_REQUEST, "?")]

        c = self.start(h, request_timeout=0.2)
        with self.assertRaises(StageTimeout):
            c.push("decode", "a", "b", [Block(0, 0, 10)], tag="x")
        started.set()  # the answer comes now, to nobody
        self.assertEqual(cancelled.get(timeout=5), 91)
        # an answer in time is not cancelled
        c2 = self.start(lambda s, h, m, fd: [wire.encode_frame(wire.Submitted(req=m.req, transfer=5))]
                        if isinstance(m, wire.Submit) else [fail(m.req, Code.BAD_REQUEST, "?")])
        self.assertEqual(c2.push("decode", "a", "b", [Block(0, 0, 10)]), 5)
        time.sleep(0.2)
        self.assertFalse(any(isinstance(m, wire.Cancel) for _, m, _ in self.fake.got), self.fake.got)

    def test_connection_level_fail(self) -> None:
        def h(s: FakeSidecar, hd: wire.Header, m: Any, fd: int) -> List[bytes]:
            if isinstance(m, wire.Wait):
                return []
            return [fail(0, Code.MALFORMED, "wire: Submit.Ops: count 5000000 exceeds limit")]

        c = self.start(h)
        fut = c.wait_future(1)
        with self.assertRaises(SidecarConnectionError) as cm:
            c.cancel(1)
        self.assertIs(cm.exception.code, Code.MALFORMED)
        with self.assertRaises(SidecarConnectionError):
            fut.result(5)
        self.assertTrue(c.closed)
        with self.assertRaises(SidecarConnectionError):
            c.status(1)

    def test_garbage_from_sidecar(self) -> None:
        c = self.start(lambda s, h, m, fd: [b"HTTP/1.1 400 Bad Request\r\n\r\n"])
        with self.assertRaises(SidecarConnectionError) as cm:
            c.status(1)
        self.assertIs(cm.exception.code, Code.MALFORMED)

    def test_sidecar_goes_away(self) -> None:
        c = self.start(lambda s, h, m, fd: [])
        fut = c.wait_future(9)
        time.sleep(0.05)
        self.fake.conn.shutdown(2)
        with self.assertRaises(SidecarConnectionError):
            fut.result(5)

    def test_close_fails_waiters(self) -> None:
        c = self.start(lambda s, h, m, fd: [])
        fut = c.wait_future(9)
        c.close()
        with self.assertRaises(SidecarConnectionError):
            fut.result(5)
        with self.assertRaises(SidecarConnectionError):
            c.status(1)

    def test_bad_request_keeps_connection(self) -> None:
        # What the sidecar would refuse is refused here, before anything is sent.
        c = self.start(lambda s, h, m, fd: [ok(m.req)])
        with self.assertRaises(ValueError):
            c.unregister("x" * 300)
        with self.assertRaises(ValueError):
            c.push("r", "a", "b", [Block(0, 0, 0)])
        with self.assertRaises(ValueError):
            c.push("r", "a", "b", [Op(1, 0, 0, 0, 16)])
        c.unregister("x")
        self.assertEqual(len(self.fake.got), 1)

    def test_subscribe(self) -> None:
        n = [0]

        def h(s: FakeSidecar, hd: wire.Header, m: Any, fd: int) -> List[bytes]:
            # Notifications first, then the OK: the reader hands them out in order,
            # so each batch reaches exactly the subscriptions made before it.
            out = []
            for _ in range(3):
                out.append(wire.encode_frame(wire.Notify(transfer=n[0], peer="prefill", tag="req-%d" % n[0],
                                                         direction=Direction.PUSH, bytes=n[0])))
                n[0] += 1
            return out + [ok(m.req)]

        c = self.start(h)
        s1 = c.subscribe()
        s2 = c.subscribe()
        self.assertEqual([s1.get(5).tag for _ in range(6)], ["req-%d" % i for i in range(6)])
        self.assertIsNone(s1.get(0.01))
        first = s2.get(5)
        self.assertEqual((first.tag, first.peer, first.direction, first.bytes, first.ok), ("req-3", "prefill", Direction.PUSH, 3, True))
        s1.close()
        c.subscribe()  # s1 is closed: only s2 hears of 6..8
        self.assertEqual(list(s1), [])
        c.close()
        self.assertEqual([x.tag for x in s2], ["req-4", "req-5", "req-6", "req-7", "req-8"])  # drains, then ends
        with self.assertRaises(SidecarConnectionError):
            s2.get(0)

    def test_subscription_drops_when_full(self) -> None:
        def h(s: FakeSidecar, hd: wire.Header, m: Any, fd: int) -> List[bytes]:
            return [wire.encode_frame(wire.Notify(transfer=i, peer="p")) for i in range(10)] + [ok(m.req)]

        c = self.start(h)
        s = c.subscribe(maxsize=4)
        deadline = time.monotonic() + 5
        while s.dropped < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(s.dropped, 6)
        self.assertEqual([s.get(1).transfer for _ in range(4)], [0, 1, 2, 3])

    def test_queries(self) -> None:
        docs = {
            wire.QueryKind.STATS: {"node": "decode", "links": None, "regions": 2},
            wire.QueryKind.ROUTES: [{"name": "decode", "peers": None}],
            wire.QueryKind.REGIONS: None,
            wire.QueryKind.CATALOG: [{"name": "kv/0", "size": 4096, "access": 15, "device": "hostmem:0"}],
        }

        def h(s: FakeSidecar, hd: wire.Header, m: Any, fd: int) -> List[bytes]:
            if m.what == wire.QueryKind.CATALOG and m.arg != "decode":
                return [fail(m.req, Code.UNKNOWN_ROUTE, "route %r is not configured" % m.arg)]
            return [wire.encode_frame(wire.QueryReply(req=m.req, json=json.dumps(docs[m.what]).encode()))]

        c = self.start(h)
        self.assertEqual(c.stats(), {"node": "decode", "links": [], "regions": 2})
        self.assertEqual(c.routes(), [{"name": "decode", "peers": []}])
        self.assertEqual(c.regions(), [])
        self.assertEqual(c.catalog("decode")[0]["name"], "kv/0")
        with self.assertRaises(StageError) as cm:
            c.catalog("nowhere")
        self.assertIs(cm.exception.code, Code.UNKNOWN_ROUTE)


class TestOps(unittest.TestCase):
    def test_make_ops(self) -> None:
        L = wire.LocalOp
        self.assertEqual(make_ops([(1, 10, 2, 20, 30)]), [L(1, 2, 10, 20, 30)])
        self.assertEqual(make_ops([Op(local=1, local_off=10, remote=2, remote_off=20, length=30)]), [L(1, 2, 10, 20, 30)])
        self.assertEqual(make_ops([(10, 20, 30)]), [L(0, 0, 10, 20, 30)])
        self.assertEqual(make_ops([Block(10, 20, 30, local=3, remote=4)]), [L(3, 4, 10, 20, 30)])
        self.assertEqual(make_ops([L(1, 2, 3, 4, 5)]), [L(1, 2, 3, 4, 5)])
        with self.assertRaises(ValueError):
            make_ops([(1, 2)])


class FakeStorage:
    def __init__(self, handle: bytes, nbytes: int, offset_bytes: int, ptr: int) -> None:
        self.handle, self.nbytes_, self.offset_bytes, self.ptr = handle, nbytes, offset_bytes, ptr

    def _share_cuda_(self) -> tuple:
        return (0, self.handle, self.nbytes_, self.offset_bytes, b"ref", 0, b"ev", True)

    @staticmethod
    def _release_ipc_counter_cuda(handle: bytes, offset: int) -> None:
        pass  # tests/test_ipc_release.py follows the counter

    def data_ptr(self) -> int:
        return self.ptr


class FakeDevice:
    index = 1


class FakeTensor:
    """Just enough of a torch CUDA tensor for export_tensor."""

    is_cuda = True
    device = FakeDevice()

    def __init__(self, storage: FakeStorage, storage_offset: int, numel: int, esize: int = 2) -> None:
        self.storage, self.off, self.n, self.esize = storage, storage_offset, numel, esize

    def is_contiguous(self) -> bool:
        return True

    def untyped_storage(self) -> FakeStorage:
        return self.storage

    def storage_offset(self) -> int:
        return self.off

    def element_size(self) -> int:
        return self.esize

    def numel(self) -> int:
        return self.n


class TestTensorExport(Base):
    HANDLE = bytes(range(64))

    def test_split(self) -> None:
        self.assertEqual(split_share_handle(b"\x01c" + self.HANDLE), self.HANDLE)
        self.assertEqual(split_share_handle(self.HANDLE), self.HANDLE)  # older torch: the bare handle
        with self.assertRaises(StageError) as cm:
            split_share_handle(b"\x01e" + self.HANDLE)
        self.assertIs(cm.exception.code, Code.UNSUPPORTED)
        self.assertIn("expandable segment", str(cm.exception))
        self.assertIn("expandable_segments:False", str(cm.exception))
        with self.assertRaises(StageError):
            split_share_handle(b"\x01z" + self.HANDLE)
        with self.assertRaises(StageError):
            split_share_handle(b"short")
        # torch 2.11's expandable-segment handle is 30 bytes.
        with self.assertRaises(StageError) as cm:
            split_share_handle(b"\x02e" + bytes(28))
        self.assertIn("expandable segment", str(cm.exception))

    def test_export_offsets(self) -> None:
        # Storage 1 MiB at 2 MiB into a 20 MiB segment; the tensor starts 1000 elements into it.
        st = FakeStorage(b"\x01c" + self.HANDLE, 1 << 20, 2 << 20, 0x7f0000000000 + (2 << 20))
        t = FakeTensor(st, 1000, 4096)
        with mock.patch("stage_client.cuda.allocation_range", return_value=(0x7f0000000000, 20 << 20)):
            ex = export_tensor(t)
        self.assertEqual((ex.handle, ex.offset, ex.length, ex.alloc_size, ex.exact_alloc_size, ex.ordinal),
                         (self.HANDLE, (2 << 20) + 2000, 8192, 20 << 20, True, 1))
        self.assertTrue(ex.event_sync_required)
        # Without the driver: the lower bound, with a warning.
        with mock.patch("stage_client.cuda.allocation_range", side_effect=OSError("no libcuda")):
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                ex = export_tensor(t)
        self.assertEqual((ex.alloc_size, ex.exact_alloc_size), ((2 << 20) + (1 << 20), False))
        self.assertTrue(any("lower bound" in str(x.message) for x in w))
        # The driver disagreeing with torch about the base is refused.
        with mock.patch("stage_client.cuda.allocation_range", return_value=(0x7f0000001000, 20 << 20)):
            with self.assertRaises(StageError):
                export_tensor(t)
        # An explicit alloc_size wins.
        self.assertEqual(export_tensor(t, alloc_size=64 << 20).alloc_size, 64 << 20)

    def test_expandable_refused(self) -> None:
        st = FakeStorage(b"\x01e" + self.HANDLE, 1 << 20, 0, 0x7f0000000000)
        with self.assertRaises(StageError) as cm:
            export_tensor(FakeTensor(st, 0, 16))
        self.assertIs(cm.exception.code, Code.UNSUPPORTED)

    def test_register_tensor(self) -> None:
        c = self.start(lambda s, h, m, fd: [ok(m.req)])
        st = FakeStorage(b"\x01c" + self.HANDLE, 1 << 20, 4096, 0x7f0000001000)
        t = FakeTensor(st, 8, 100, esize=4)
        with mock.patch("stage_client.cuda.allocation_range", return_value=(0x7f0000000000, 2 << 20)):
            c.register_tensor("kv/0", t, Access.ALL)
        _, m, fd = self.fake.got[-1]
        self.assertEqual((m.handle, m.handle_raw, m.offset, m.length, m.alloc_size, m.ordinal, fd),
                         (HandleKind.CUDA_IPC, self.HANDLE, 4096 + 32, 400, 2 << 20, 1, -1))
        self.assertIs(c._keep["kv/0"], t)
        c.unregister("kv/0")
        self.assertNotIn("kv/0", c._keep)


if __name__ == "__main__":
    unittest.main()
