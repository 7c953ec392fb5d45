"""Put an engine's CPU tensors, where they already are, into a memfd the hostmem sidecar can map.

A CPU engine (vLLM's CPU build, SGLang on CPU) allocates its KV cache with
plain ``torch.zeros``; the hostmem sidecar can only reach memory it can map,
a memfd passed over the control socket. :func:`share_in_place` copies the
pages under each tensor's storage into a new memfd and maps the memfd over
those same addresses (``MAP_FIXED``), so every tensor and view the engine
already holds, at any address inside, keeps working and now reads and
writes the shared pages. Nothing in the engine changes: no tensor is
replaced, no pointer moves.

Call it before the engine writes the cache concurrently (vLLM calls
``register_kv_caches`` before the first forward). Only a storage that is
an anonymous mapping of its own is taken: the allocator's mmap'd chunk of
any allocation above malloc's mmap threshold (a KV cache is gigabytes),
whose pages hold nothing else. A smaller tensor lives among other
allocations on heap pages that the allocator trims and reuses; replacing
those would corrupt the heap, so it is refused with what to do instead.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any, Iterable, List, Optional, Tuple

from . import kvcache
from .kvcache import HostArena

__all__ = ["SharedPages", "share_in_place"]

_PAGE = mmap.PAGESIZE
_PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_FIXED = 0x10  # linux, every architecture
_libc: Optional[Any] = None


def _mmap_fn() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mmap.restype = ctypes.c_void_p
        _libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                               ctypes.c_long)
    return _libc.mmap


class SharedPages:
    """A memfd mapped over ``size`` bytes at ``base`` of this process (as :class:`HostArena` for registration)."""

    def __init__(self, base: int, size: int, name: str) -> None:
        self.base, self.size, self.name = base, size, name
        self.fd = kvcache.sealed_memfd(name, size)
        try:
            src = (ctypes.c_char * size).from_address(base)
            view = memoryview(src).cast("B")
            done = 0
            while done < size:  # pwrite may write less than asked
                done += os.pwrite(self.fd, view[done:], done)
            got = _mmap_fn()(base, size, _PROT_RW, mmap.MAP_SHARED | _MAP_FIXED, self.fd, 0)
            if got != base:
                e = ctypes.get_errno()
                raise OSError(e, "mapping memfd %r over %d B at %#x: %s" % (name, size, base, os.strerror(e)))
        except BaseException:
            os.close(self.fd)
            self.fd = -1
            raise

    #: the memfd offset of ``nbytes`` at address ``ptr``; None when they are not all inside it
    offset_of = HostArena.offset_of

    def close(self) -> None:
        """Close the memfd; the mapping stays (the engine's tensors live on it until it frees them)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _own_chunk(ptr: int, nbytes: int) -> Optional[str]:
    """None when the allocation at ``ptr`` is a glibc mmap'd chunk holding [ptr, ptr + nbytes); else why not.

    glibc puts a chunk's header in the 16 bytes before the pointer it
    returns: the size with bit 1 (IS_MMAPPED) set for a chunk that is its
    own mapping, and, for such a chunk, the offset of the chunk from the
    mapping's start (posix_memalign may return a pointer past it). The
    mapping is then [ptr - 16 - offset, ptr - 16 + size): page-aligned and
    no one else's. (The kernel merges neighbouring anonymous mappings in
    /proc/self/maps, so that file cannot tell.)"""
    if ptr % 16 or ptr < 2 * _PAGE:
        return "its address %#x is not one malloc returns" % ptr
    head = ctypes.c_size_t.from_address(ptr - 8).value
    if not head & 2:
        return "it is not an mmap'd chunk of its own (glibc's IS_MMAPPED bit is clear): it shares heap pages"
    size, lead = head & ~7, ctypes.c_size_t.from_address(ptr - 16).value
    start, end = ptr - 16 - lead, ptr - 16 + size
    if start % _PAGE or end % _PAGE or ptr + nbytes > end:
        return "its chunk header does not describe a mapping around it (not glibc's allocator?)"
    return None


def _storage(t: Any) -> Tuple[int, int]:
    """(address, bytes) of the storage under tensor ``t`` (torch 2's untyped storage, or torch 1's typed one)."""
    f = getattr(t, "untyped_storage", None)
    if f is not None:
        st = f()
        return st.data_ptr(), st.nbytes()
    st = t.storage()
    return st.data_ptr(), st.size() * st.element_size()


def _ranges(tensors: Iterable[Any]) -> List[Tuple[int, int]]:
    """The page-aligned address ranges of the tensors' storages, overlapping ones merged."""
    spans = []
    for t in tensors:
        lo, n = _storage(t)
        if n:
            spans.append((lo - lo % _PAGE, -(-(lo + n) // _PAGE) * _PAGE))
    spans.sort()
    out: List[Tuple[int, int]] = []
    for lo, hi in spans:
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def share_in_place(tensors: Iterable[Any], name: str = "stage-kv") -> List[SharedPages]:
    """Move the pages under the CPU tensors' storages into memfds, in place; one :class:`SharedPages` per range.

    Tensors already inside a live :class:`~stage_client.kvcache.HostArena`
    (or pages shared before) are left alone. The results are also made
    known to :func:`~stage_client.kvcache.register_kv_cache`, which then
    finds the tensors inside them; keep them until the cache is unregistered.
    """
    ts = [t for t in tensors if t.device.type == "cpu"]
    out: List[SharedPages] = []
    todo = [(lo, hi) for lo, hi in _ranges(ts)
            if not any(a.offset_of(lo, hi - lo) is not None for a in list(kvcache._ARENAS))]
    for t in ts:
        ptr, n = _storage(t)
        if any(a.offset_of(ptr, n) is not None for a in list(kvcache._ARENAS)):
            continue
        why = _own_chunk(ptr, n)
        if why is not None:
            raise ValueError("share_in_place %r: the tensor storage at %#x (%d B) cannot be shared in place: %s. "
                             "Allocate it in a HostArena, or make it larger than malloc's mmap threshold"
                             % (name, ptr, n, why))
    for i, (lo, hi) in enumerate(todo):
        sp = SharedPages(lo, hi - lo, "%s-%d" % (name, i))
        kvcache._ARENAS.add(sp)
        out.append(sp)
    return out
