"""CUDA tensor registration with real torch; skipped without torch or CUDA.

The handle check opens the exported IPC handle in a child process with the
CUDA driver (ctypes) and reads the region back, so it proves the handle,
offset and length together, without staged's CUDA backend.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import unittest
from typing import Any, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchenv import CUDA_WHY as WHY, HAVE_CUDA, HERE, torch  # noqa: E402

from fakesidecar import FakeSidecar, ok  # noqa: E402
from test_e2e import HAVE_STAGED, SKIP_WHY, Staged  # noqa: E402
from stage_client import Access, Client, HandleKind, PagedKV, wire  # noqa: E402
from stage_client.cuda import export_tensor  # noqa: E402

# Child: open a 64-byte IPC handle, copy `length` bytes at `offset` to the host, print their sha256.
READER = textwrap.dedent("""
    import ctypes, hashlib, sys
    ordinal, handle, offset, length = int(sys.argv[1]), bytes.fromhex(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    cu = ctypes.CDLL("libcuda.so.1")
    class H(ctypes.Structure):
        _fields_ = [("b", ctypes.c_ubyte * 64)]
    def ck(rc, what):
        if rc != 0:
            raise SystemExit("%s returned %d" % (what, rc))
    ck(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    ck(cu.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ptr = ctypes.c_uint64()
    cu.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), H, ctypes.c_uint]
    ck(cu.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), H.from_buffer_copy(handle), 1), "cuIpcOpenMemHandle")
    buf = ctypes.create_string_buffer(length)
    cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    ck(cu.cuMemcpyDtoH_v2(buf, ptr.value + offset, length), "cuMemcpyDtoH")
    print(hashlib.sha256(buf.raw).hexdigest())
    cu.cuIpcCloseMemHandle.argtypes = [ctypes.c_uint64]
    cu.cuIpcCloseMemHandle(ptr.value)
""")


def tensor_digest(t: Any) -> str:
    return hashlib.sha256(bytes(t.contiguous().view(torch.uint8).reshape(-1).cpu().tolist())).hexdigest()


@unittest.skipUnless(HAVE_CUDA, WHY)
class TestTorchCUDA(unittest.TestCase):
    def read_back(self, ex: Any) -> str:
        r = subprocess.run([sys.executable, "-c", READER, str(ex.ordinal), ex.handle.hex(), str(ex.offset),
                            str(ex.length)], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        return r.stdout.strip()

    def test_export_views(self) -> None:
        torch.cuda.synchronize()
        big = torch.randint(0, 255, (4, 64, 1024), dtype=torch.uint8, device="cuda")
        # A second storage in (probably) the same segment, and views of the first at offsets.
        other = torch.randn(1000, device="cuda")
        torch.cuda.synchronize()
        exs = [export_tensor(big[i]) for i in range(4)]
        self.assertTrue(all(len(e.handle) == 64 for e in exs))
        self.assertEqual(len({e.handle for e in exs}), 1, "views of one storage share one IPC handle")
        self.assertEqual(len({e.alloc_size for e in exs}), 1)
        self.assertTrue(all(e.exact_alloc_size for e in exs), "libcuda should give the exact allocation size")
        base = exs[0].offset
        self.assertEqual([e.offset - base for e in exs], [i * 64 * 1024 for i in range(4)])
        self.assertTrue(all(e.length == 64 * 1024 for e in exs))
        for i in (0, 3):
            self.assertEqual(self.read_back(exs[i]), tensor_digest(big[i]), "view %d read through IPC differs" % i)
        eo = export_tensor(other)
        self.assertGreaterEqual(eo.alloc_size, eo.offset + eo.length)
        self.assertEqual(self.read_back(eo), tensor_digest(other))

    def test_register_tensor_and_paged_kv(self) -> None:
        fake = FakeSidecar(lambda s, h, m, fd: [ok(m.req)])
        self.addCleanup(fake.close)
        c = Client(fake.path)
        self.addCleanup(c.close)
        kv = torch.zeros((3, 16, 8, 128), dtype=torch.float16, device="cuda")  # layers, blocks, ...
        pkv = PagedKV.from_tensors(c, "kv", [kv[i] for i in range(3)], Access.ALL)
        self.assertEqual((pkv.num_regions, pkv.num_blocks, pkv.block_bytes), (3, 16, 8 * 128 * 2))
        regs: List[wire.Register] = [m for _, m, _ in fake.got if isinstance(m, wire.Register)]
        self.assertEqual([r.name for r in regs], ["kv/0", "kv/1", "kv/2"])
        self.assertTrue(all(r.handle == HandleKind.CUDA_IPC and len(r.handle_raw) == 64 for r in regs))
        self.assertEqual(len({r.alloc_size for r in regs}), 1)
        self.assertEqual([r.offset - regs[0].offset for r in regs], [i * 16 * 8 * 128 * 2 for i in range(3)])
        self.assertEqual(regs[0].ordinal, kv.device.index)
        pkv.close()
        self.assertEqual(c._keep, {})

    def test_non_contiguous_refused(self) -> None:
        t = torch.zeros((8, 8), device="cuda").t()
        with self.assertRaises(ValueError):
            export_tensor(t)

    def test_expandable_segments_refused(self) -> None:
        code = textwrap.dedent("""
            import sys
            sys.path.insert(0, %r)
            import torch
            from stage_client import StageError, Code
            from stage_client.cuda import export_tensor
            t = torch.zeros(1 << 20, device="cuda")
            try:
                export_tensor(t)
            except StageError as e:
                print("refused", e.code == Code.UNSUPPORTED, "expandable" in str(e))
            else:
                print("accepted")
        """ % os.path.dirname(HERE))
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "refused True True", r.stdout + r.stderr)


@unittest.skipUnless(HAVE_CUDA, WHY)
@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestTorchE2E(unittest.TestCase):
    """A CUDA staged ("decode", device kind cuda) imports torch tensors by
    IPC handle; a hostmem staged ("prefill") pushes into them and pulls back."""

    def test_push_into_tensors_and_pull_back(self) -> None:
        ordinal = torch.cuda.current_device()
        dec = Staged("decode", extra="device: {kind: cuda, ordinal: %d}\n" % ordinal)
        pre = None
        try:
            pre = Staged("prefill", route_to=dec.peers)
            pre.settle(1)
            dec.settle(1)
            layers, blocks, bb = 4, 64, 16 << 10
            pad = torch.zeros(3 << 20, dtype=torch.uint8, device="cuda")  # something else in the segment first
            cache = torch.full((layers, blocks, bb), 0xAB, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            dkv = PagedKV.from_tensors(dec.client, "dkv", [cache[i] for i in range(layers)], Access.ALL)
            skv = PagedKV.hostmem(pre.client, "skv", layers, blocks, bb)
            try:
                assert skv.buffer is not None
                skv.buffer[:] = os.urandom(len(skv.buffer))
                src = list(range(0, 10)) + [30, 31]
                dst = list(range(5, 15)) + [40, 41]
                self.assertTrue(all(s.ok for s in skv.wait(skv.push_blocks("decode", src, dst, tag="gpu",
                                                                             remote="dkv"), timeout=60)))
                host = cache.cpu()
                for layer in range(layers):
                    sv = skv.layer(layer)
                    for s_, d_ in zip(src, dst):
                        self.assertEqual(bytes(host[layer, d_].tolist()), bytes(sv[s_ * bb:(s_ + 1) * bb]),
                                         "layer %d block %d -> %d" % (layer, s_, d_))
                    untouched = [b for b in range(blocks) if b not in dst]
                    self.assertTrue(bool((host[layer, untouched] == 0xAB).all()), "layer %d: other blocks changed" % layer)
                # Pull: the engine writes blocks on the GPU, synchronizes, and the peer pulls them.
                cache[2, 50:52] = torch.randint(0, 255, (2, bb), dtype=torch.uint8, device="cuda")
                torch.cuda.synchronize()
                ids = skv.pull_blocks("decode", [50, 51], [60, 61], tag="gpu-pull", remote="dkv", layers=[2])
                self.assertTrue(all(s.ok for s in skv.wait(ids, timeout=60)))
                self.assertEqual(bytes(skv.layer(2)[60 * bb:62 * bb]), bytes(cache[2, 50:52].reshape(-1).cpu().tolist()))
                self.assertEqual(len(dec.client.regions()), layers)
            finally:
                skv.close()
                dkv.close()
            del pad
        finally:
            rcs = [n.stop() for n in (pre, dec) if n is not None]
        self.assertEqual(rcs, [0] * len(rcs), dec.tail())


if __name__ == "__main__":
    unittest.main()
