"""Giving torch's producer-side IPC counter back after a confirmed
unregister, with a fake storage in place of torch (no torch, no GPU).

The fake does what torch/csrc/CudaIPCTypes.cpp does: each ``_share_cuda_``
call takes a new int64 counter in a counter file laid out as torch's (a
64-byte header, then 10 000 counters), sets it to 1, and
``_release_ipc_counter_cuda`` decrements it.
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
import unittest
import warnings
from typing import Any, Callable, Dict, List, Tuple
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fakesidecar import FakeSidecar, fail, ok  # noqa: E402
from test_client import Base, FakeTensor  # noqa: E402
from stage_client import Access, Code, SidecarConnectionError, StageError, wire  # noqa: E402
from stage_client import client as client_mod  # noqa: E402
from stage_client import cuda  # noqa: E402

HANDLE = bytes(range(64))
COUNTERS = b"/torch_4242_77"  # the counter file's shm name
BASE = 0x7F0000000000
SEGMENT = 4 << 20
FILE_SIZE = 64 + 8 * 10000


class SharingStorage:
    """A storage at ``offset_bytes`` into a segment at BASE, shared as torch shares."""

    shm_dir = ""
    next_counter = 0
    released: List[Tuple[bytes, int]] = []

    def __init__(self, nbytes: int, offset_bytes: int) -> None:
        self.nbytes_, self.offset_bytes = nbytes, offset_bytes

    def data_ptr(self) -> int:
        return BASE + self.offset_bytes

    def _share_cuda_(self) -> tuple:
        cls = type(self)
        off = cls.next_counter
        cls.next_counter += 1
        poke(off, 1)  # GetNewRefCountedSentData: set_counter(1)
        return (0, b"\x02c" + HANDLE, self.nbytes_, self.offset_bytes, COUNTERS, off, b"ev" * 32, True)

    @classmethod
    def _release_ipc_counter_cuda(cls, handle: bytes, offset: int) -> None:
        cls.released.append((handle, offset))
        poke(offset, peek(offset) - 1)


class BareStorage(SharingStorage):
    """A storage class without torch's release calls."""

    _release_ipc_counter_cuda = None  # type: ignore[assignment]


def counter_path() -> str:
    return os.path.join(SharingStorage.shm_dir, COUNTERS.decode()[1:])


def peek(i: int) -> int:
    with open(counter_path(), "rb") as f:
        f.seek(64 + 8 * i)
        return struct.unpack("=q", f.read(8))[0]


def poke(i: int, v: int) -> None:
    with open(counter_path(), "r+b") as f:
        f.seek(64 + 8 * i)
        f.write(struct.pack("=q", v))


class TestIpcRelease(Base):
    def setUp(self) -> None:
        d = tempfile.TemporaryDirectory(prefix="stage-shm-")
        self.addCleanup(d.cleanup)
        SharingStorage.shm_dir, SharingStorage.next_counter, SharingStorage.released = d.name, 0, []
        with open(counter_path(), "wb") as f:
            f.write(bytes(FILE_SIZE))
        for target, kw in (("stage_client.cuda.SHM_DIR", {"new": d.name}),
                           ("stage_client.cuda.allocation_range", {"return_value": (BASE, SEGMENT)})):
            p = mock.patch(target, **kw)
            p.start()
            self.addCleanup(p.stop)
        # Warnings given once per process are given again in each test.
        p = mock.patch("stage_client.cuda._warned", set())
        p.start()
        self.addCleanup(p.stop)
        self.unregister_answers: List[Callable[[Any], List[bytes]]] = []

    def sidecar(self, register: Callable[[Any], List[bytes]] = lambda m: [ok(m.req)], **kw: Any) -> Any:
        def h(s: FakeSidecar, hd: wire.Header, m: Any, fd: int) -> List[bytes]:
            if isinstance(m, wire.Register):
                return register(m)
            if isinstance(m, wire.Unregister):
                return self.unregister_answers.pop(0)(m) if self.unregister_answers else [ok(m.req)]
            return [fail(m.req, Code.BAD_REQUEST, "?")]
        return self.start(h, **kw)

    def unregisters(self) -> List[int]:
        """The WaitMs of every Unregister the sidecar got."""
        return [m.wait_ms for _, m, _ in self.fake.got if isinstance(m, wire.Unregister)]

    def released(self) -> List[int]:
        return [off for h, off in SharingStorage.released if h == COUNTERS]

    def test_released_once_after_confirmed_unregister(self) -> None:
        c = self.sidecar()
        t = FakeTensor(SharingStorage(1 << 20, 1 << 20), 0, 1 << 19)
        ex = c.register_tensor("kv/0", t, Access.ALL)
        self.assertEqual((ex.ipc_ref.handle, ex.ipc_ref.offset, ex.ipc_ref.device), (COUNTERS, 0, 0))
        self.assertEqual((peek(0), self.released()), (1, []))
        c.unregister("kv/0")
        self.assertEqual(self.unregisters(), [int(client_mod.DEFAULT_UNREGISTER_WAIT * 1000)])
        self.assertEqual((peek(0), self.released()), (0, [0]))
        self.assertNotIn("kv/0", c._keep)
        # A second unregister of the name finds nothing to give back.
        self.unregister_answers.append(lambda m: [fail(m.req, Code.UNKNOWN_REGION, 'region "kv/0" is not registered')])
        with self.assertRaises(StageError):
            c.unregister("kv/0")
        self.assertEqual(self.released(), [0])

    def test_two_views_of_one_storage(self) -> None:
        # Two regions of one storage: two _share_cuda_ calls, two counters,
        # each given back after its own region's confirmed unregister.
        c = self.sidecar()
        st = SharingStorage(2 << 20, 0)
        c.register_tensor("k", FakeTensor(st, 0, 1 << 19), Access.ALL)
        c.register_tensor("v", FakeTensor(st, 1 << 19, 1 << 19), Access.ALL)
        self.assertEqual((peek(0), peek(1)), (1, 1))
        c.unregister("k")
        self.assertEqual((peek(0), peek(1), self.released()), (0, 1, [0]))
        c.unregister("v")
        self.assertEqual((peek(0), peek(1), self.released()), (0, 0, [0, 1]))

    def test_busy_keeps_the_counter(self) -> None:
        c = self.sidecar()
        t = FakeTensor(SharingStorage(1 << 20, 0), 0, 1 << 19)
        c.register_tensor("kv/0", t, Access.ALL)
        self.unregister_answers.append(lambda m: [fail(m.req, Code.BUSY, 'region "kv/0": 1 transfer(s) still use it '
                                                                        'after 2s; it stays registered')])
        with self.assertRaises(StageError) as cm:
            c.unregister("kv/0", wait=2)
        self.assertIs(cm.exception.code, Code.BUSY)
        self.assertIn("1 transfer(s) still use it", str(cm.exception))
        self.assertIn("retry", str(cm.exception))
        self.assertEqual((peek(0), self.released(), self.unregisters()), (1, [], [2000]))
        self.assertIs(c._keep["kv/0"], t)
        c.unregister("kv/0")  # the transfer ended: confirmed now
        self.assertEqual((peek(0), self.released()), (0, [0]))

    def test_refused_register_gives_back_at_once(self) -> None:
        c = self.sidecar(register=lambda m: [fail(m.req, Code.EXISTS, 'region "kv/0" is already registered')])
        with self.assertRaises(StageError):
            c.register_tensor("kv/0", FakeTensor(SharingStorage(1 << 20, 0), 0, 16), Access.ALL)
        self.assertEqual((peek(0), self.released()), (0, [0]))
        self.assertEqual(c._ipc, {})

    def test_export_failure_gives_back(self) -> None:
        c = self.sidecar()
        with mock.patch("stage_client.cuda.allocation_range", return_value=(BASE + 4096, SEGMENT)):
            with self.assertRaises(StageError):
                c.register_tensor("kv/0", FakeTensor(SharingStorage(1 << 20, 0), 0, 16), Access.ALL)
        self.assertEqual(self.released(), [0])
        self.assertEqual([m for _, m, _ in self.fake.got], [])

    def test_connection_lost_keeps_the_counter(self) -> None:
        c = self.sidecar()
        c.register_tensor("kv/0", FakeTensor(SharingStorage(1 << 20, 0), 0, 16), Access.ALL)
        self.unregister_answers.append(lambda m: [fail(0, Code.INTERNAL, "going away")])
        with self.assertRaises(SidecarConnectionError):
            c.unregister("kv/0")
        self.assertEqual((peek(0), self.released()), (1, []))

    def test_old_sidecar(self) -> None:
        # A sidecar that predates WaitMs refuses it as malformed: the client
        # unregisters plainly and keeps the counter.
        c = self.sidecar()
        c.register_tensor("kv/0", FakeTensor(SharingStorage(1 << 20, 0), 0, 16), Access.ALL)
        self.unregister_answers.append(lambda m: [fail(m.req, Code.MALFORMED, "Unregister: 4 trailing bytes")])
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            c.unregister("kv/0")
        self.assertEqual(self.unregisters(), [30000, 0])
        self.assertEqual((peek(0), self.released()), (1, []))
        self.assertNotIn("kv/0", c._keep)
        self.assertTrue(any("predates" in str(x.message) for x in w), [str(x.message) for x in w])

    def test_other_regions(self) -> None:
        c = self.sidecar()
        c.register_cuda_ipc("g", HANDLE, 1 << 21, 0, 4096, Access.ALL)
        c.unregister("g", wait=5)  # not a tensor: at once, as before
        c.register_cuda_ipc("g", HANDLE, 1 << 21, 0, 4096, Access.ALL)
        c.unregister("g", wait=0.25, confirm=True)  # asked for: confirmed
        self.assertEqual(self.unregisters(), [0, 250])
        with self.assertRaises(ValueError):
            c.unregister("g", wait=-1, confirm=True)

    def test_unconfirmed_tensor_keeps_the_counter(self) -> None:
        c = self.sidecar()
        c.register_tensor("kv/0", FakeTensor(SharingStorage(1 << 20, 0), 0, 16), Access.ALL)
        c.unregister("kv/0", confirm=False)
        self.assertEqual(self.unregisters(), [0])
        self.assertEqual((peek(0), self.released()), (1, []))
        self.assertEqual((c._ipc, c._keep), ({}, {}))

    def test_unregister_all_shares_one_wait(self) -> None:
        # A transfer holds every region: the first unregister waits it out
        # (here: is refused at once), the others do not wait again.
        from stage_client.kvcache import unregister_all

        c = self.sidecar()
        st = SharingStorage(4 << 20, 0)
        names = ["kv/%d" % i for i in range(4)]
        for i, n in enumerate(names):
            c.register_tensor(n, FakeTensor(st, i << 19, 1 << 19), Access.ALL)
        busy = lambda m: [fail(m.req, Code.BUSY, "1 transfer(s) still use it")]  # noqa: E731
        self.unregister_answers.extend([busy] * 4)
        with mock.patch("stage_client.kvcache.time.monotonic", side_effect=[100.0, 100.0, 110.0, 120.0, 130.0]):
            with self.assertRaises(StageError) as cm:
                unregister_all(c, names, wait=20)
        self.assertIs(cm.exception.code, Code.BUSY)
        self.assertEqual(self.unregisters(), [20000, 10000, 1, 1])
        self.assertEqual(self.released(), [])

    def test_fallback_through_the_counter_file(self) -> None:
        c = self.sidecar()
        c.register_tensor("kv/0", FakeTensor(BareStorage(1 << 20, 0), 0, 16), Access.ALL)
        c.unregister("kv/0")
        self.assertEqual((peek(0), self.released()), (0, []))  # decremented in the file

    def test_fallback_refuses_another_layout(self) -> None:
        c = self.sidecar()
        c.register_tensor("kv/0", FakeTensor(BareStorage(1 << 20, 0), 0, 16), Access.ALL)
        with open(counter_path(), "ab") as f:
            f.write(b"\0" * 8)  # not torch's 80 064 bytes any more
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            c.unregister("kv/0")
        self.assertEqual(peek(0), 1)
        self.assertTrue(any("stays reserved by torch" in str(x.message) for x in w), [str(x.message) for x in w])

    def test_counter_already_zero_is_left_alone(self) -> None:
        c = self.sidecar()
        c.register_tensor("kv/0", FakeTensor(SharingStorage(1 << 20, 0), 0, 16), Access.ALL)
        poke(0, 0)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            c.unregister("kv/0")
        self.assertEqual((peek(0), self.released()), (0, []))
        self.assertTrue(any("already 0" in str(x.message) for x in w), [str(x.message) for x in w])

    def test_same_counter_twice_warns(self) -> None:
        c = self.sidecar()
        st = SharingStorage(1 << 20, 0)
        c.register_tensor("a", FakeTensor(st, 0, 16), Access.ALL)
        SharingStorage.next_counter = 0  # a torch that hands out one counter per storage
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            c.register_tensor("b", FakeTensor(st, 16, 16), Access.ALL)
        self.assertTrue(any("two live registrations" in str(x.message) for x in w), [str(x.message) for x in w])

    def test_empty_storage_arms_nothing(self) -> None:
        share = (0, None, 0, 0, None, 0, None, None)
        self.assertIsNone(cuda._ipc_ref(SharingStorage, share))

    def test_counter_value(self) -> None:
        ref = cuda.IpcRef(device=0, handle=COUNTERS, offset=3)
        poke(3, 5)
        self.assertEqual(cuda.ipc_counter_value(ref), 5)
        for bad in (b"torch_1", b"/a/b", b"/.."):
            with self.assertRaises(ValueError):
                cuda.ipc_counter_value(cuda.IpcRef(device=0, handle=bad, offset=0))
        with self.assertRaises(ValueError):
            cuda.ipc_counter_value(cuda.IpcRef(device=0, handle=COUNTERS, offset=10000))


class TestReleaserChoice(unittest.TestCase):
    def test_prefers_the_cuda_call(self) -> None:
        calls: Dict[str, tuple] = {}

        class Untyped:  # torch.UntypedStorage: the C static method
            @staticmethod
            def _release_ipc_counter_cuda(h: bytes, o: int) -> None:
                calls["cuda"] = (h, o)

        class Typed:  # torch.TypedStorage: the Python wrapper with device=
            @classmethod
            def _release_ipc_counter(cls, h: bytes, o: int, device: Any = None) -> None:
                calls["typed"] = (h, o, device)

        cuda._releaser(Untyped)(b"/x", 1, 2)
        cuda._releaser(Typed)(b"/y", 3, 4)
        self.assertEqual(calls, {"cuda": (b"/x", 1), "typed": (b"/y", 3, 4)})
        self.assertIsNone(cuda._releaser(object))


if __name__ == "__main__":
    unittest.main()
