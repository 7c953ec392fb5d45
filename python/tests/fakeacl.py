"""NPU memory as torch tensors, over fakeacl_cuda, for the GPU tests.

``acl/testdata/fakeacl_cuda.c`` emulates libascendcl over the CUDA runtime:
its ``aclrtMalloc`` is ``cudaMalloc`` in this process's primary context, the
one torch uses, and its VMM calls are CUDA's (cuMemCreate, cuMemMap).
:class:`ACLArena` takes one ``aclrtMalloc`` allocation (torch_npu with
``expandable_segments:False``), :class:`VMMArena` chunks mapped into one
reserved range (torch_npu's expandable segments, vllm-ascend's default);
both hand out torch CUDA tensors over their memory
(``__cuda_array_interface__``), so an "Ascend" engine's KV cache can be
written by torch and registered with an ``acl`` sidecar
(``register_kv_cache(..., acl=...)``: by export key, or by chunk list), as
vllm-ascend's would be on an NPU. On a real NPU the tensors would come from
torch_npu; nothing here runs there.

Build the library on the GPU machine and point the tests at it::

    nvcc -shared -Xcompiler -fPIC -o libascendcl.so acl/testdata/fakeacl_cuda.c -lpthread -lcuda
    STAGE_TEST_ACL_LIBRARY=$PWD/libascendcl.so ...

(the variable the Go acl tests read too; the acl sidecars get the path as
``device.acl.library`` from :func:`sidecar_config`).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Optional, Sequence

import torch

from stage_client.ascend import ACL

LIBRARY = os.environ.get("STAGE_TEST_ACL_LIBRARY", "")


class _Span:
    """A CUDA array interface over ``n`` bytes at ``ptr`` (what torch.as_tensor wraps)."""

    def __init__(self, ptr: int, n: int) -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None}


class ACLArena:
    """One ``aclrtMalloc`` allocation handing out torch tensors (bump allocation, nothing freed before close)."""

    def __init__(self, acl: ACL, size: int, device: Any, align: int = 256) -> None:
        self.acl, self.size, self.align, self.device = acl, size, align, torch.device(device)
        self.base = self._alloc()
        self.used = 0
        with torch.cuda.device(self.device):
            self.mem = torch.as_tensor(_Span(self.base, self.size), device=self.device)
        if self.mem.data_ptr() != self.base:
            raise AssertionError("torch wrapped %#x, not the ACL allocation %#x" % (self.mem.data_ptr(), self.base))

    def _alloc(self) -> int:
        return self.acl.malloc(self.size)

    def empty(self, shape: Sequence[int], dtype: Any) -> Any:
        n = torch.Size(shape).numel() * torch.tensor([], dtype=dtype).element_size()
        off = -(-self.used // self.align) * self.align
        if off + n > self.size:
            raise MemoryError("ACLArena: %d B wanted, %d of %d B used" % (n, off, self.size))
        self.used = off + n
        return self.mem[off:off + n].view(dtype).view(tuple(shape))

    def close(self) -> None:
        """Free the allocation (its export key closed first); the sidecar must have let go of it."""
        torch.cuda.synchronize(self.device)
        self.mem = None
        self.acl.free(self.base)


class VMMArena(ACLArena):
    """Chunks of the runtime's granularity mapped in order into one reserved range, handing out torch tensors.

    Made as torch_npu's expandable segments make theirs
    (aclrtReserveMemAddress, aclrtMallocPhysical, aclrtMapMem,
    aclrtMemSetAccess); register_npu_tensor shares it by chunk list."""

    def _alloc(self) -> int:
        L, vp, sz = self.acl.lib, ctypes.c_void_p, ctypes.c_size_t
        for name, args in {"aclrtMemGetAllocationGranularity": [vp, ctypes.c_int, ctypes.POINTER(sz)],
                           "aclrtReserveMemAddress": [ctypes.POINTER(vp), sz, sz, vp, ctypes.c_uint64],
                           "aclrtMallocPhysical": [ctypes.POINTER(vp), sz, vp, ctypes.c_uint64],
                           "aclrtMapMem": [vp, sz, sz, vp, ctypes.c_uint64],
                           "aclrtMemSetAccess": [vp, sz, vp, sz],
                           "aclrtUnmapMem": [vp], "aclrtFreePhysical": [vp], "aclrtReleaseMemAddress": [vp]}.items():
            fn = getattr(L, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        # aclrtPhysicalMemProp {handleType 0, PINNED 0, HBM_HUGE 4, location {device, DEVICE 1}, reserve}
        prop = (ctypes.c_int32 * 8)(0, 0, 4, self.acl.device, 1, 0, 0, 0)
        # aclrtMemAccessDesc {READWRITE 3, location {device, DEVICE 1}, rsv[12]}
        desc = (ctypes.c_int32 * 6)(3, self.acl.device, 1, 0, 0, 0)
        g = sz()
        self._ok(L.aclrtMemGetAllocationGranularity(prop, 0, ctypes.byref(g)), "aclrtMemGetAllocationGranularity")
        self.chunk = g.value
        self.size = -(-self.size // self.chunk) * self.chunk
        va = vp()
        self._ok(L.aclrtReserveMemAddress(ctypes.byref(va), self.size, 0, None, 0), "aclrtReserveMemAddress")
        self.handles = []
        for at in range(va.value, va.value + self.size, self.chunk):
            h = vp()
            self._ok(L.aclrtMallocPhysical(ctypes.byref(h), self.chunk, prop, 0), "aclrtMallocPhysical")
            self.handles.append((at, h.value))
            self._ok(L.aclrtMapMem(at, self.chunk, 0, h, 0), "aclrtMapMem")
            self._ok(L.aclrtMemSetAccess(at, self.chunk, desc, 1), "aclrtMemSetAccess")
        return int(va.value)

    def _ok(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError("fakeacl: %s: error %d %s" % (what, rc, self.acl._msg()))

    def close(self) -> None:
        """Unmap and free the chunks and release the range; the sidecar must have let go of them."""
        torch.cuda.synchronize(self.device)
        self.mem = None
        L = self.acl.lib
        for at, h in self.handles:
            self._ok(L.aclrtUnmapMem(at), "aclrtUnmapMem")
            self._ok(L.aclrtFreePhysical(h), "aclrtFreePhysical")
        self._ok(L.aclrtReleaseMemAddress(self.base), "aclrtReleaseMemAddress")


def open_acl(ordinal: int) -> Optional[ACL]:
    """The fake ACL runtime on GPU ``ordinal``, or None without ``STAGE_TEST_ACL_LIBRARY``."""
    return ACL(LIBRARY, ordinal) if LIBRARY else None


def sidecar_config(ordinal: int) -> str:
    """staged config for an acl sidecar over the fake library on GPU ``ordinal``."""
    return "device: {kind: acl, ordinal: %d, acl: {library: %s}}\n" % (ordinal, LIBRARY)
