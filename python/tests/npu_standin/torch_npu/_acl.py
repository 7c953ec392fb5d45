"""Device memory for the torch_npu stand-in: the two ways torch_npu's caching allocator gets it from CANN.

``PYTORCH_NPU_ALLOC_CONF=expandable_segments:True`` (vllm-ascend's default,
platform.py:772-790): one virtual range per pool (``aclrtReserveMemAddress``),
grown by physical pages (``aclrtMallocPhysical``) mapped at its end
(``aclrtMapMem``) and made readable and writable by this device
(``aclrtMemSetAccess``); blocks are carved from it in order, so a tensor
lies at any offset of the range and may span several pages.

``expandable_segments:False``: segments from ``aclrtMalloc``, sized as
torch_npu sizes them (NPUCachingAllocator's get_allocation_size, the same
constants as c10/cuda's CUDACachingAllocator: up to 1 MiB a 2 MiB segment,
under 10 MiB a 20 MiB one, else the request rounded up to 2 MiB); a block
goes at the start of a free tail big enough, else a new segment.

Both over whatever libascendcl ``STAGE_TEST_ACL_LIBRARY`` names (in CI,
acl/testdata/fakeacl.c, whose device memory is host memory of this
process, so torch reads and writes it as CPU memory). What torch_npu does
beyond this (block reuse after free, streams, garbage collection) is not
modelled: memory is held until :meth:`Allocator.close`.
"""

from __future__ import annotations

import ctypes
from typing import List, Optional, Tuple

__all__ = ["ACLRuntime", "Allocator", "SegmentAllocator", "ExpandableAllocator", "ACLCallError"]

MIN_BLOCK = 512  # torch_npu kMinBlockSize: every block is a multiple of it
SMALL_SIZE = 1 << 20  # kSmallSize
SMALL_BUFFER = 2 << 20  # kSmallBuffer
LARGE_BUFFER = 20 << 20  # kLargeBuffer
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge
PAGE = 2 << 20  # the expandable segments' page: aclrtMallocPhysical granularity (2 MiB, huge pages)
RESERVE = 1 << 30  # the virtual range an expandable pool reserves here (torch_npu: the device's memory)

ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEM_LOCATION_TYPE_DEVICE = 1
ACL_MEM_HANDLE_TYPE_NONE = 0
ACL_MEM_ALLOCATION_TYPE_PINNED = 0
ACL_RT_MEM_ACCESS_FLAGS_READWRITE = 3


class ACLCallError(RuntimeError):
    """A libascendcl call failed: the call, its code and the runtime's message."""


class _Location(ctypes.Structure):  # aclrtMemLocation
    _fields_ = [("id", ctypes.c_uint32), ("type", ctypes.c_int32)]


class _PhysicalMemProp(ctypes.Structure):  # aclrtPhysicalMemProp
    _fields_ = [("handleType", ctypes.c_int32), ("allocationType", ctypes.c_int32), ("memAttr", ctypes.c_int32),
                ("location", _Location), ("reserve", ctypes.c_uint64)]


class _AccessDesc(ctypes.Structure):  # aclrtMemAccessDesc
    _fields_ = [("flags", ctypes.c_int32), ("location", _Location), ("rsv", ctypes.c_uint8 * 12)]


class ACLRuntime:
    """libascendcl through ctypes, with CANN's C signatures for the calls the allocators make."""

    def __init__(self, path: str, device: int = 0) -> None:
        self.path, self.device = path, device
        self.lib = ctypes.CDLL(path)
        vp, sz, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
        for name, args in {
            "aclInit": [ctypes.c_char_p], "aclrtSetDevice": [ctypes.c_int32],
            "aclrtMalloc": [ctypes.POINTER(vp), sz, ctypes.c_int], "aclrtFree": [vp],
            "aclrtReserveMemAddress": [ctypes.POINTER(vp), sz, sz, vp, u64], "aclrtReleaseMemAddress": [vp],
            "aclrtMallocPhysical": [ctypes.POINTER(vp), sz, ctypes.POINTER(_PhysicalMemProp), u64],
            "aclrtFreePhysical": [vp], "aclrtMapMem": [vp, sz, sz, vp, u64], "aclrtUnmapMem": [vp],
            "aclrtMemSetAccess": [vp, sz, ctypes.POINTER(_AccessDesc), sz],
            "aclrtMemGetAddressRange": [vp, ctypes.POINTER(vp), ctypes.POINTER(sz)],
        }.items():
            fn = getattr(self.lib, name, None)
            if fn is None:
                raise ACLCallError("%s has no %s (the torch_npu stand-in needs it)" % (path, name))
            fn.argtypes, fn.restype = args, ctypes.c_int
        self.lib.aclGetRecentErrMsg.restype = ctypes.c_char_p
        rc = self.lib.aclInit(None)
        if rc not in (0, 100002):  # 100002: initialized before in this process
            self.check(rc, "aclInit")
        self.check(self.lib.aclrtSetDevice(device), "aclrtSetDevice(%d)" % device)

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = self.lib.aclGetRecentErrMsg()
            raise ACLCallError("%s: error %d: %s" % (what, rc, msg.decode(errors="replace") if msg else ""))

    def address_range(self, ptr: int) -> Tuple[int, int]:
        base, size = ctypes.c_void_p(), ctypes.c_size_t()
        self.check(self.lib.aclrtMemGetAddressRange(ctypes.c_void_p(ptr), ctypes.byref(base), ctypes.byref(size)),
                   "aclrtMemGetAddressRange(%#x)" % ptr)
        return int(base.value or 0), int(size.value)


def _round_block(n: int) -> int:
    return max(MIN_BLOCK, -(-n // MIN_BLOCK) * MIN_BLOCK)


class Allocator:
    """Device memory in one of torch_npu's two modes; :meth:`malloc` gives an address, :meth:`close` frees all."""

    expandable = False

    def __init__(self, rt: ACLRuntime) -> None:
        self.rt = rt

    def malloc(self, nbytes: int) -> int:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SegmentAllocator(Allocator):
    """``expandable_segments:False``: aclrtMalloc segments, blocks at the start of a free tail."""

    def __init__(self, rt: ACLRuntime) -> None:
        super().__init__(rt)
        self.segments: List[List[int]] = []  # [base, size, used]

    @staticmethod
    def segment_size(n: int) -> int:
        """torch_npu's get_allocation_size."""
        if n <= SMALL_SIZE:
            return SMALL_BUFFER
        if n < MIN_LARGE_ALLOC:
            return LARGE_BUFFER
        return -(-n // ROUND_LARGE) * ROUND_LARGE

    def malloc(self, nbytes: int) -> int:
        n = _round_block(nbytes)
        small = n <= SMALL_SIZE
        for seg in self.segments:  # small and large blocks come from different pools
            if (seg[1] == SMALL_BUFFER) == small and seg[1] - seg[2] >= n:
                p = seg[0] + seg[2]
                seg[2] += n
                return p
        size = self.segment_size(n)
        p = ctypes.c_void_p()
        self.rt.check(self.rt.lib.aclrtMalloc(ctypes.byref(p), size, ACL_MEM_MALLOC_HUGE_FIRST),
                      "aclrtMalloc(%d B)" % size)
        self.segments.append([int(p.value or 0), size, n])
        return int(p.value or 0)

    def close(self) -> None:
        errs = []
        for base, _, _ in self.segments:
            try:
                self.rt.check(self.rt.lib.aclrtFree(ctypes.c_void_p(base)), "aclrtFree(%#x)" % base)
            except ACLCallError as e:
                errs.append(e)
        self.segments = []
        if errs:
            raise errs[0]


class ExpandableAllocator(Allocator):
    """``expandable_segments:True``: one reserved range, 2 MiB physical pages mapped as it fills."""

    expandable = True

    def __init__(self, rt: ACLRuntime, reserve: int = RESERVE) -> None:
        super().__init__(rt)
        va = ctypes.c_void_p()
        rt.check(rt.lib.aclrtReserveMemAddress(ctypes.byref(va), reserve, 0, None, 0),
                 "aclrtReserveMemAddress(%d B)" % reserve)
        self.base, self.reserved, self.used = int(va.value or 0), reserve, 0
        self.pages: List[Tuple[int, int]] = []  # (address, physical handle)

    def _grow(self, end: int) -> None:
        rt = self.rt
        while len(self.pages) * PAGE < end:
            prop = _PhysicalMemProp(ACL_MEM_HANDLE_TYPE_NONE, ACL_MEM_ALLOCATION_TYPE_PINNED, 0,
                                    _Location(rt.device, ACL_MEM_LOCATION_TYPE_DEVICE), 0)
            h = ctypes.c_void_p()
            rt.check(rt.lib.aclrtMallocPhysical(ctypes.byref(h), PAGE, ctypes.byref(prop), 0),
                     "aclrtMallocPhysical(%d B)" % PAGE)
            at = self.base + len(self.pages) * PAGE
            try:
                rt.check(rt.lib.aclrtMapMem(ctypes.c_void_p(at), PAGE, 0, h, 0), "aclrtMapMem(%#x)" % at)
            except ACLCallError:
                rt.lib.aclrtFreePhysical(h)
                raise
            self.pages.append((at, int(h.value or 0)))
            desc = _AccessDesc(ACL_RT_MEM_ACCESS_FLAGS_READWRITE, _Location(rt.device, ACL_MEM_LOCATION_TYPE_DEVICE))
            rt.check(rt.lib.aclrtMemSetAccess(ctypes.c_void_p(at), PAGE, ctypes.byref(desc), 1),
                     "aclrtMemSetAccess(%#x)" % at)

    def malloc(self, nbytes: int) -> int:
        n = _round_block(nbytes)
        if n > self.reserved - self.used:
            raise ACLCallError("the expandable segment's %d B of address space are used up (%d B wanted)"
                               % (self.reserved, n))
        p = self.base + self.used
        self._grow(self.used + n)
        self.used += n
        return p

    def close(self) -> None:
        """Unmap and free every page, then release the range (the reverse of the growth)."""
        rt, errs = self.rt, []
        for at, h in reversed(self.pages):
            for rc, what in ((rt.lib.aclrtUnmapMem(ctypes.c_void_p(at)), "aclrtUnmapMem(%#x)" % at),
                             (rt.lib.aclrtFreePhysical(ctypes.c_void_p(h)), "aclrtFreePhysical(%#x)" % h)):
                try:
                    rt.check(rc, what)
                except ACLCallError as e:
                    errs.append(e)
        self.pages = []
        if self.base:
            try:
                rt.check(rt.lib.aclrtReleaseMemAddress(ctypes.c_void_p(self.base)), "aclrtReleaseMemAddress")
            except ACLCallError as e:
                errs.append(e)
            self.base = 0
        if errs:
            raise errs[0]


def allocator(rt: ACLRuntime, conf: Optional[str]) -> Allocator:
    """The allocator ``PYTORCH_NPU_ALLOC_CONF`` asks for (``expandable_segments:True`` or not)."""
    opts = dict(kv.split(":", 1) for kv in (conf or "").split(",") if ":" in kv)
    return ExpandableAllocator(rt) if opts.get("expandable_segments", "False") == "True" else SegmentAllocator(rt)
