"""Ascend memory of both kinds, registered by stage_client.ascend with an acl sidecar over fakeacl.

The engine is this process: it loads ``acl/testdata/fakeacl.c`` (the ACL
runtime emulated in host memory, built here with gcc as libascendcl.so)
through :class:`stage_client.ascend.ACL`, and makes VMM memory the way
torch_npu's expandable segments do (one reserved range, physical chunks
mapped into it: aclrtReserveMemAddress, aclrtMallocPhysical, aclrtMapMem,
aclrtMemSetAccess) and ``aclrtMalloc`` memory. The prefill sidecar runs the
acl backend over the same library (device.kind acl); its BareTgid differs
from its pid (FAKEACL_TGID_OFFSET, a pid namespace as the emulation sees
it), so only a whitelist of the BareTgid it reports lets it import. The
decode sidecar runs hostmem. Bytes pushed out of both kinds of memory, and
pulled back into them, must arrive exactly.
"""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest
from typing import Any, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_e2e import GUARD, HAVE_STAGED, SKIP_WHY, Mem, Staged, pair, stop_all  # noqa: E402

from stage_client import Access, StageError  # noqa: E402
from stage_client.ascend import ACL, register_npu_tensor, sidecar_bare_tgid  # noqa: E402
from stage_client.client import Block, Op  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FAKEACL = os.path.join(HERE, "..", "..", "acl", "testdata", "fakeacl.c")
G = 65536  # FAKEACL_GRANULARITY: the emulated physical chunk size
TGID_OFFSET = 1000
H2D, D2H = 1, 2


def build_fakeacl(outdir: str) -> str:
    so = os.path.join(outdir, "libascendcl.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", so, FAKEACL, "-lpthread"],
                   check=True, capture_output=True)
    return so


class _Span:
    """What register_npu_tensor reads of a tensor: n bytes at ptr."""

    def __init__(self, ptr: int, n: int) -> None:
        self.ptr, self.n = ptr, n

    def data_ptr(self) -> int:
        return self.ptr

    def numel(self) -> int:
        return self.n

    def element_size(self) -> int:
        return 1


class Engine:
    """VMM and aclrtMalloc memory of this process, through the ACL object's library."""

    def __init__(self, acl: ACL) -> None:
        self.acl, L = acl, acl.lib
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        for name, args in {
            "aclrtReserveMemAddress": [ctypes.POINTER(vp), sz, sz, vp, ctypes.c_uint64],
            "aclrtReleaseMemAddress": [vp],
            "aclrtMallocPhysical": [ctypes.POINTER(vp), sz, ctypes.c_void_p, ctypes.c_uint64],
            "aclrtMapMem": [vp, sz, sz, vp, ctypes.c_uint64],
            "aclrtUnmapMem": [vp],
            "aclrtMemSetAccess": [vp, sz, ctypes.c_void_p, sz],
            "aclrtMemcpy": [vp, sz, vp, sz, ctypes.c_int],
        }.items():
            fn = getattr(L, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        self.vmm: List[Tuple[int, List[Tuple[int, int]]]] = []

    def ok(self, rc: int, what: str) -> None:
        if rc != 0:
            raise AssertionError("%s: %d %s" % (what, rc, self.acl._msg()))

    def alloc_vmm(self, nchunks: int) -> int:
        """nchunks chunks of G bytes mapped in order into one reserved range (expandable segments' way)."""
        L, va = self.acl.lib, ctypes.c_void_p()
        self.ok(L.aclrtReserveMemAddress(ctypes.byref(va), nchunks * G, 0, None, 0), "aclrtReserveMemAddress")
        # aclrtPhysicalMemProp: handleType 0, allocationType 0, memAttr HBM_HUGE 4, location {device, DEVICE 1}, reserve.
        prop = (ctypes.c_int32 * 8)(0, 0, 4, self.acl.device, 1, 0, 0, 0)
        # aclrtMemAccessDesc: flags READWRITE 3, location {device, DEVICE 1}, rsv[12].
        desc = (ctypes.c_int32 * 6)(3, self.acl.device, 1, 0, 0, 0)
        chunks = []
        for i in range(nchunks):
            h, at = ctypes.c_void_p(), va.value + i * G
            self.ok(L.aclrtMallocPhysical(ctypes.byref(h), G, prop, 0), "aclrtMallocPhysical")
            self.ok(L.aclrtMapMem(at, G, 0, h, 0), "aclrtMapMem")
            self.ok(L.aclrtMemSetAccess(at, G, desc, 1), "aclrtMemSetAccess")
            chunks.append((at, h.value))
        self.vmm.append((va.value, chunks))
        return int(va.value)

    def free_all(self) -> None:
        L = self.acl.lib
        for va, chunks in self.vmm:
            for at, h in chunks:
                self.ok(L.aclrtUnmapMem(at), "aclrtUnmapMem")
                self.ok(L.aclrtFreePhysical(h), "aclrtFreePhysical")
            self.ok(L.aclrtReleaseMemAddress(va), "aclrtReleaseMemAddress")
        self.vmm = []

    def write(self, ptr: int, data: bytes) -> None:
        self.ok(self.acl.lib.aclrtMemcpy(ptr, len(data), data, len(data), H2D), "aclrtMemcpy H2D")

    def read(self, ptr: int, n: int) -> bytes:
        buf = ctypes.create_string_buffer(n)
        self.ok(self.acl.lib.aclrtMemcpy(buf, n, ptr, n, D2H), "aclrtMemcpy D2H")
        return buf.raw


class _Env:
    """Environment variables for this process and the sidecars it starts, restored after."""

    def __init__(self, **kv: str) -> None:
        self.kv, self.old = kv, {k: os.environ.get(k) for k in kv}
        os.environ.update(kv)

    def restore(self) -> None:
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
@unittest.skipUnless(shutil.which("gcc"), "gcc not found: cannot build the emulated libascendcl")
class TestAscendVMM(unittest.TestCase):
    """One emulated runtime for the class: it reads its settings once, at aclInit."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="stage-acl-vmm-")
        cls.so = build_fakeacl(cls.tmp)
        cls.env = _Env(FAKEACL_GRANULARITY=str(G), FAKEACL_DEVICES="2")
        cls.nodes: List[Staged] = []
        try:
            # Only the acl sidecar sees itself under another id than its pid.
            sidecar = "device: {kind: acl, ordinal: 0, acl: {library: %s}}\n" % cls.so
            os.environ["FAKEACL_TGID_OFFSET"] = str(TGID_OFFSET)
            try:
                cls.pre, cls.dec = pair("", pre_extra=sidecar, pulls=True, pre_name="ascend")
            finally:
                del os.environ["FAKEACL_TGID_OFFSET"]
            cls.nodes += [cls.dec, cls.pre]
            cls.acl = ACL(cls.so, 0)
            cls.engine = Engine(cls.acl)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        why = stop_all(getattr(cls, "nodes", []))
        if hasattr(cls, "engine"):
            cls.engine.free_all()  # after the sidecar let go of the chunks
            cls.acl.close()
        cls.env.restore()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if why:
            raise AssertionError(why)

    def test_bare_tgid_reported(self) -> None:
        """The sidecar reports its BareTgid, not its pid; the whitelist uses it."""
        c = self.pre.client
        info = c.query(5)
        self.assertEqual(info["bare_tgid"], self.pre.proc.pid + TGID_OFFSET, info)
        self.assertEqual(info["bare_tgid_from"], "aclrtDeviceGetBareTgid")
        self.assertEqual(sidecar_bare_tgid(c), self.pre.proc.pid + TGID_OFFSET)
        self.assertNotIn("bare_tgid", self.dec.client.query(5))  # hostmem has none

    def test_vmm_and_key_push_and_pull(self) -> None:
        """A VMM region starting mid-chunk over 4 chunks and an aclrtMalloc region, pushed in one transfer and pulled back."""
        e, c = self.engine, self.pre.client
        rng = random.Random(32)
        vbase = e.alloc_vmm(5)
        voff, vlen = G // 2 + 3, 3 * G + 100
        vdata = rng.randbytes(5 * G)
        e.write(vbase, vdata)
        klen = 3 * G + 17
        kbase = self.acl.malloc(4 * G)
        self.addCleanup(self.acl.free, kbase)
        kdata = rng.randbytes(klen)
        e.write(kbase + 4096, kdata)
        register_npu_tensor(c, self.acl, "vmm-src", _Span(vbase + voff, vlen), Access.ALL)
        self.addCleanup(c.unregister, "vmm-src", wait=10)
        register_npu_tensor(c, self.acl, "key-src", _Span(kbase + 4096, klen), Access.ALL)
        self.addCleanup(c.unregister, "key-src", wait=10)
        kinds = {r["name"]: r for r in c.query(3)}
        self.assertEqual(kinds["vmm-src"]["size"], vlen)
        self.assertEqual(kinds["key-src"]["size"], klen)

        dst = Mem("dst", vlen + klen)
        self.addCleanup(dst.close)
        dst.poison()
        self.dec.client.register_memfd("dst", dst.fd, dst.size, GUARD, vlen + klen, Access.ALL)
        self.addCleanup(self.dec.client.unregister, "dst")
        st = c.wait(c.push("decode", ["vmm-src", "key-src"], ["dst"], [Op(0, 0, 0, 0, vlen), Op(1, 0, 0, vlen, klen)],
                           tag="both"), timeout=60)
        self.assertTrue(st.ok, st)
        got = bytes(dst.region())
        self.assertEqual(got[:vlen], vdata[voff:voff + vlen], "VMM bytes differ")
        self.assertEqual(got[vlen:], kdata, "key bytes differ")
        self.assertTrue(dst.guards_ok())

        # Pull new bytes into both (scatter into the chunks, across their borders).
        back = rng.randbytes(vlen + klen)
        dst.region()[:] = back
        st = c.wait(c.pull("decode", "vmm-src", "dst", [Block(0, 0, vlen)], tag="into-vmm"), timeout=60)
        self.assertTrue(st.ok, st)
        st = c.wait(c.pull("decode", "key-src", "dst", [Block(0, vlen, klen)], tag="into-key"), timeout=60)
        self.assertTrue(st.ok, st)
        now = e.read(vbase, 5 * G)
        self.assertEqual(now[voff:voff + vlen], back[:vlen], "pulled VMM bytes differ")
        self.assertEqual(now[:voff] + now[voff + vlen:], vdata[:voff] + vdata[voff + vlen:],
                         "bytes of the chunks outside the VMM region changed")
        self.assertEqual(e.read(kbase + 4096, klen), back[vlen:], "pulled key bytes differ")

        # A second region over the same chunks shares their import.
        register_npu_tensor(c, self.acl, "vmm-src2", _Span(vbase + G, G), Access.ALL)
        self.addCleanup(c.unregister, "vmm-src2", wait=10)

    def test_whitelist_is_the_bare_tgid(self) -> None:
        """Whitelisting the socket's pid (what stage did before) is refused by the runtime; importer= still overrides."""
        e, c = self.engine, self.pre.client
        vbase = e.alloc_vmm(1)
        with self.assertRaises(StageError) as cm:
            register_npu_tensor(c, self.acl, "vmm-wrong", _Span(vbase, G), Access.ALL, importer=self.pre.proc.pid)
        self.assertIn("NO_PERMISSION", str(cm.exception))
        register_npu_tensor(c, self.acl, "vmm-right", _Span(vbase, G), Access.ALL,
                            importer=self.pre.proc.pid + TGID_OFFSET)
        c.unregister("vmm-right", wait=10)

    def test_other_device_refused(self) -> None:
        """Memory of NPU 1 registered with the sidecar of NPU 0 (the ordinal forced) is refused with what to do."""
        before = self.pre.client.stats()["mappings"]
        acl1 = ACL(self.so, 1)  # binds this thread to device 1; back to 0 at the end
        e1 = Engine(acl1)
        self.addCleanup(acl1.close)
        self.addCleanup(e1.free_all)
        self.addCleanup(self.acl.bind)
        vbase = e1.alloc_vmm(2)
        with self.assertRaises(StageError) as cm:
            register_npu_tensor(self.pre.client, acl1, "vmm-npu1", _Span(vbase + 10, G), Access.ALL, ordinal=0)
        msg = str(cm.exception)
        self.assertIn("physical NPU 1", msg)
        self.assertIn("one acl sidecar per NPU", msg)
        self.assertEqual(self.pre.client.stats()["mappings"], before, "the refused import left a mapping")
        # Said as the engine numbers it, the device is refused before any import, with the same advice.
        with self.assertRaises(StageError) as cm:
            register_npu_tensor(self.pre.client, acl1, "vmm-npu1", _Span(vbase + 10, G), Access.ALL)
        self.assertIn("ASCEND_RT_VISIBLE_DEVICES", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
