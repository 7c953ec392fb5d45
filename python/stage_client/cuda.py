"""Export a PyTorch CUDA tensor as a legacy CUDA IPC region.

Only :func:`export_tensor` needs torch, and it imports nothing: it calls
methods of the tensor it is given, so this module loads without torch.

What ``t.untyped_storage()._share_cuda_()`` returns (torch 2.x)::

    (device, handle, storage_nbytes, storage_offset_bytes,
     ref_counter_handle, ref_counter_offset, event_handle, event_sync_required)

``handle`` starts with a version byte (2 in torch 2.11) and a type byte:
``b'c'`` (cudaMalloc) is 66 bytes, bytes 2..66 being the 64-byte
``cudaIpcMemHandle_t``; ``b'e'`` (expandable segment, 30 bytes in torch
2.11) cannot be opened with legacy IPC. Older torch returned the 64-byte
handle alone. The handle opens to the *base of the allocation* that holds
the storage (a caching-allocator segment); the storage starts
``storage_offset_bytes`` into it, and the tensor ``t.storage_offset() *
t.element_size()`` bytes after that.

Allocation size. Register needs the size of the whole allocation the
handle names, and the sidecar imports one allocation once: a second region
of the same allocation that claims a larger size is refused. torch does
not return the segment size, and ``storage_offset_bytes + storage_nbytes``
is only a lower bound (other storages may follow in the same segment). So
:func:`export_tensor` asks the CUDA driver (``cuMemGetAddressRange_v2`` on
the storage's pointer, through ctypes and the device's primary context,
the one torch uses) for the allocation's base and size, checks that the
base is where torch says it is, and uses that exact size. Only when
libcuda cannot be loaded or the call fails does it fall back to the lower
bound (``exact_alloc_size`` False); then register every region of one
allocation with the same ``alloc_size`` (pass it explicitly), or the
larger claims are refused.

Lifetime. ``_share_cuda_`` also arms torch's producer-side IPC reference
counting (torch/csrc/CudaIPCTypes.cpp): each call puts the storage's data
behind a new ``CudaIPCSentData`` whose int64 counter, in a shared-memory
file (``ref_counter_handle``, ``/dev/shm/torch_<pid>_...``) at index
``ref_counter_offset``, starts at 1; the data it wraps (the previous one, or
the caching-allocator block) goes with it. When the storage is freed while
a counter is above 0, torch keeps the block in "limbo" instead of giving it
back to the caching allocator, and checks again at each later free,
``torch.cuda.ipc_collect()`` and an allocation that runs out of memory. A
consumer gives a counter back once per ``_share_cuda_`` result it received
(``rebuild_cuda_tensor`` calls ``_release_ipc_counter`` when it does not
open the storage; ``_new_shared_cuda``'s deleter decrements when it does).

The sidecar is that consumer here, but it is written in Go, so the client
gives the counter back for it: :func:`export_tensor` records each share's
counter (:class:`IpcRef`), and :meth:`Client.unregister` asks the sidecar
for a confirmed unregister (PROTOCOL.md 9.4: answered only once no transfer
holds the region and, with the last region of its allocation, the import
is closed) and only after its OK calls :func:`release_ipc_ref`, once per
share. What that relies on, and checks where it can:

* one new counter per ``_share_cuda_`` call, at 1 (torch's source, 1.x to
  2.x: ``GetNewRefCountedSentData``, ``set_counter(1)``), so one decrement
  per result; the client warns if two live registrations name the same
  counter, and before decrementing reads the counter (when its file has
  the layout below) and skips one that is not above 0;
* the release call: ``torch.UntypedStorage._release_ipc_counter_cuda(handle,
  offset)`` (C, torch 1.13 to 2.x; ``UntypedStorage`` has no
  ``_release_ipc_counter``, ``TypedStorage._release_ipc_counter(handle,
  offset, device=)`` wraps it). Where neither exists, the counter is
  decremented in its file directly, but only when the file has the layout
  torch writes (aten ``RefcountedMapAllocator``: a 64-byte header, then
  10 000 int64 counters, 80 064 bytes); otherwise the memory stays held and
  the client warns once.

A registration the sidecar refuses, or one that fails before it is sent,
gives its counter back at once. An unregister refused BUSY (a transfer
still holds the region) leaves the region registered, the tensor kept and
the counter held, for a later unregister to give back. One whose answer is
lost (timeout, connection) or that a sidecar too old to confirm carried
out plainly keeps the counter for good: the memory stays in torch's limbo
after the tensor is dropped, as before. Safe, never early.
Whether ``torch.cuda.memory_reserved()`` really comes back on a GPU is for
``tests/test_torch_limbo.py`` and ``examples/torch_ipc_counter_probe.py``
to show.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Tuple

from .errors import StageError
from .protocol.wire import Code

__all__ = ["CudaExport", "IpcRef", "export_tensor", "allocation_range", "split_share_handle", "release_ipc_ref",
           "ipc_counter_value"]

IPC_HANDLE_SIZE = 64

#: Where POSIX shared memory objects (torch's ref counter files) live.
SHM_DIR = "/dev/shm"

# torch's ref counter file: CUDA_IPC_REF_COUNTER_FILE_SIZE int64 counters
# after the 64-byte header (map_alloc_alignment) of a RefcountedMapAllocator.
_REF_COUNTERS = 10000
_REF_HEADER = 64
_REF_FILE_SIZE = _REF_HEADER + 8 * _REF_COUNTERS
_COUNTER = struct.Struct("=q")

Releaser = Callable[[bytes, int, int], None]


@dataclass(frozen=True)
class IpcRef:
    """One ``_share_cuda_`` result's hold on torch's producer-side IPC
    reference count: the counter a consumer gives back once (see the module
    docstring). ``release`` is the storage class's own call for it, found
    at export (None: none was found)."""

    device: int  # the storage's CUDA device
    handle: bytes  # ref_counter_handle: the counter file's shm name, b"/torch_..."
    offset: int  # ref_counter_offset: the counter's index in that file
    release: Optional[Releaser] = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class CudaExport:
    """What Register needs for a CUDA tensor, plus how it was found."""

    handle: bytes  # the 64-byte cudaIpcMemHandle_t
    ordinal: int  # CUDA device ordinal
    alloc_size: int  # size of the allocation the handle names
    offset: int  # the tensor's first byte, from the allocation base
    length: int  # the tensor's bytes
    exact_alloc_size: bool  # True: from the driver; False: torch's lower bound
    event_sync_required: bool  # torch says: wait on the producer's stream before reading
    ipc_ref: Optional[IpcRef] = None  # the counter this export armed; None when torch gave none


def split_share_handle(handle: bytes) -> bytes:
    """Return the 64-byte IPC handle inside what ``_share_cuda_`` returned.

    Raises StageError(UNSUPPORTED) for an expandable segment (``'e'``),
    which legacy CUDA IPC cannot open, and for an unknown layout.
    """
    handle = bytes(handle)
    kind = handle[1:2]
    if len(handle) == IPC_HANDLE_SIZE + 2 and kind == b"c":
        return handle[2:]
    if len(handle) != IPC_HANDLE_SIZE and kind == b"e":
        # torch 2.11 sends 30 bytes for these: version, 'e', then its own segment data.
        raise StageError(
            Code.UNSUPPORTED,
            "this tensor lives in a PyTorch expandable segment (handle type 'e'); legacy CUDA IPC "
            "(cudaIpcOpenMemHandle) cannot open it. Disable expandable segments "
            "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False) for the KV cache allocation, or "
            "allocate it with the CUDA VMM API and register it as a POSIX fd export "
            "(Client.register_posix_fd)")
    if len(handle) == IPC_HANDLE_SIZE:
        return handle  # older torch: the bare cudaIpcMemHandle_t
    if len(handle) == IPC_HANDLE_SIZE + 2:
        raise StageError(Code.UNSUPPORTED, "unknown PyTorch CUDA share handle type %r (version byte %d); "
                                           "expected b'c' (cudaMalloc)" % (kind, handle[0]))
    raise StageError(Code.UNSUPPORTED, "PyTorch CUDA share handle of %d bytes (type %r); expected 66 bytes of "
                                       "type b'c', or a bare 64-byte handle" % (len(handle), kind))


# --------------------------------------------------------------------------
# libcuda through ctypes: the allocation range of a device pointer.

_cuda_lock = threading.Lock()
_cuda: Optional[Any] = None
_cuda_err: Optional[str] = None


def _libcuda() -> Any:
    global _cuda, _cuda_err
    with _cuda_lock:
        if _cuda is None and _cuda_err is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
                lib.cuInit.argtypes = [ctypes.c_uint]
                lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
                lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
                lib.cuDevicePrimaryCtxRelease_v2.argtypes = [ctypes.c_int]
                lib.cuCtxPushCurrent_v2.argtypes = [ctypes.c_void_p]
                lib.cuCtxPopCurrent_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
                lib.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64),
                                                        ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
                for f in (lib.cuInit, lib.cuDeviceGet, lib.cuDevicePrimaryCtxRetain, lib.cuDevicePrimaryCtxRelease_v2,
                          lib.cuCtxPushCurrent_v2, lib.cuCtxPopCurrent_v2, lib.cuMemGetAddressRange_v2):
                    f.restype = ctypes.c_int
                rc = lib.cuInit(0)
                if rc != 0:
                    raise OSError("cuInit returned %d" % rc)
                _cuda = lib
            except (OSError, AttributeError) as e:
                _cuda_err = str(e)
        if _cuda is None:
            raise OSError("libcuda.so.1: %s" % _cuda_err)
        return _cuda


def allocation_range(ordinal: int, ptr: int) -> Tuple[int, int]:
    """(base, size) of the CUDA allocation holding device pointer ``ptr``.

    Uses ``cuMemGetAddressRange_v2`` in device ``ordinal``'s primary context.
    Raises OSError when libcuda is missing or a call fails.
    """
    lib = _libcuda()
    dev = ctypes.c_int(0)
    rc = lib.cuDeviceGet(ctypes.byref(dev), int(ordinal))
    if rc != 0:
        raise OSError("cuDeviceGet(%d) returned %d" % (ordinal, rc))
    ctx = ctypes.c_void_p()
    rc = lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value)
    if rc != 0:
        raise OSError("cuDevicePrimaryCtxRetain(%d) returned %d" % (ordinal, rc))
    try:
        rc = lib.cuCtxPushCurrent_v2(ctx)
        if rc != 0:
            raise OSError("cuCtxPushCurrent returned %d" % rc)
        try:
            base = ctypes.c_uint64(0)
            size = ctypes.c_size_t(0)
            rc = lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
            if rc != 0:
                raise OSError("cuMemGetAddressRange(%#x) returned %d" % (ptr, rc))
            return int(base.value), int(size.value)
        finally:
            old = ctypes.c_void_p()
            lib.cuCtxPopCurrent_v2(ctypes.byref(old))
    finally:
        lib.cuDevicePrimaryCtxRelease_v2(dev.value)


def export_tensor(t: Any, alloc_size: Optional[int] = None) -> CudaExport:
    """Find the IPC handle, offset, length and allocation size of tensor ``t``.

    ``t`` must be a contiguous CUDA tensor (views at any offset are fine).
    ``alloc_size`` overrides the allocation size (see the module docstring).
    """
    if not getattr(t, "is_cuda", False):
        raise ValueError("register_tensor needs a CUDA tensor (got device %s)" % (getattr(t, "device", "?"),))
    if not t.is_contiguous():
        raise ValueError("register_tensor needs a contiguous tensor: a region is one byte range")
    storage = t.untyped_storage()
    share = storage._share_cuda_()
    ref = _ipc_ref(type(storage), share)
    try:
        return _export(t, storage, share, ref, alloc_size)
    except BaseException:
        if ref is not None:
            release_ipc_ref(ref)  # nothing was registered with it
        raise


def _export(t: Any, storage: Any, share: Tuple[Any, ...], ref: Optional[IpcRef],
            alloc_size: Optional[int]) -> CudaExport:
    handle = split_share_handle(share[1])
    storage_nbytes = int(share[2])
    storage_offset_bytes = int(share[3])
    event_sync = bool(share[7]) if len(share) > 7 else False
    esize = int(t.element_size())
    offset = storage_offset_bytes + int(t.storage_offset()) * esize
    length = int(t.numel()) * esize
    ordinal = t.device.index
    if ordinal is None:
        ordinal = 0
    lower = storage_offset_bytes + storage_nbytes
    exact = False
    if alloc_size is None:
        base_ptr = int(storage.data_ptr()) - storage_offset_bytes
        try:
            base, size = allocation_range(ordinal, int(storage.data_ptr()))
        except OSError as e:
            warnings.warn("stage_client: cannot ask the CUDA driver for the allocation size (%s); using the "
                          "lower bound %d B (storage offset + storage size). Register every region of one "
                          "allocation with the same alloc_size." % (e, lower), RuntimeWarning, stacklevel=3)
            alloc_size = lower
        else:
            if base != base_ptr:
                raise StageError(Code.INTERNAL, "the CUDA driver puts this storage's allocation at %#x, PyTorch "
                                                "at %#x (storage at %#x, %d B in): refusing to guess"
                                 % (base, base_ptr, storage.data_ptr(), storage_offset_bytes))
            alloc_size, exact = size, True
    if alloc_size < offset + length:
        raise ValueError("alloc_size %d is smaller than the tensor's end %d" % (alloc_size, offset + length))
    return CudaExport(handle=handle, ordinal=int(ordinal), alloc_size=int(alloc_size), offset=offset,
                      length=length, exact_alloc_size=exact, event_sync_required=event_sync, ipc_ref=ref)


# --------------------------------------------------------------------------
# torch's producer-side IPC counter: giving it back for the sidecar.


def _ipc_ref(storage_cls: Any, share: Tuple[Any, ...]) -> Optional[IpcRef]:
    """The counter a ``_share_cuda_`` result armed; None for an empty
    storage (torch arms none) or a result of another shape."""
    if len(share) < 6 or not isinstance(share[4], (bytes, bytearray)) or not isinstance(share[5], int):
        return None
    return IpcRef(device=int(share[0]), handle=bytes(share[4]), offset=int(share[5]),
                  release=_releaser(storage_cls))


def _releaser(storage_cls: Any) -> Optional[Releaser]:
    """The storage class's call that gives a counter back, or None."""
    fn = getattr(storage_cls, "_release_ipc_counter_cuda", None)
    if callable(fn):
        return lambda handle, offset, device: fn(handle, offset)
    fn = getattr(storage_cls, "_release_ipc_counter", None)  # TypedStorage's spelling
    if callable(fn):
        return lambda handle, offset, device: fn(handle, offset, device=device)
    return None


def _counter_pos(handle: bytes, offset: int, shm_dir: Optional[str]) -> Tuple[str, int]:
    """The counter file's path and the counter's byte offset in it."""
    name = handle.decode("ascii", "replace")
    if not name.startswith("/") or "/" in name[1:] or name in ("/", "/.", "/.."):
        raise ValueError("IPC counter handle %r is not a shared memory name" % (handle,))
    if not 0 <= offset < _REF_COUNTERS:
        raise ValueError("IPC counter offset %d outside torch's %d counters" % (offset, _REF_COUNTERS))
    return os.path.join(SHM_DIR if shm_dir is None else shm_dir, name[1:]), _REF_HEADER + 8 * offset


def _with_counter(handle: bytes, offset: int, shm_dir: Optional[str], f: Callable[[mmap.mmap, int], int]) -> int:
    """Map torch's counter file, check its layout, and apply f to the counter's place."""
    path, pos = _counter_pos(handle, offset, shm_dir)
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size != _REF_FILE_SIZE:
            raise ValueError("%s has %d bytes, not the %d of torch's IPC counter file (64-byte header, %d int64 "
                             "counters)" % (path, size, _REF_FILE_SIZE, _REF_COUNTERS))
        with mmap.mmap(fd, _REF_FILE_SIZE) as mm:
            return f(mm, pos)
    finally:
        os.close(fd)


def ipc_counter_value(ref: IpcRef, shm_dir: Optional[str] = None) -> int:
    """The counter's value now, read from its file (``shm_dir``: SHM_DIR).

    Raises OSError when the file cannot be opened, ValueError when it does
    not have torch's layout.
    """
    return _with_counter(ref.handle, ref.offset, shm_dir, lambda mm, pos: _COUNTER.unpack_from(mm, pos)[0])


def _decrement(mm: mmap.mmap, pos: int) -> int:
    v = _COUNTER.unpack_from(mm, pos)[0]
    if v > 0:
        _COUNTER.pack_into(mm, pos, v - 1)
    return v


_warned: set = set()  # keys of the warnings given (warn_once)


def warn_once(key: str, msg: str, stacklevel: int = 3) -> None:
    """A RuntimeWarning given once per process for ``key`` (the client's
    warnings about torch's IPC counters share it)."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, RuntimeWarning, stacklevel=stacklevel)


def _warn_held(why: str) -> None:
    warn_once("held", "stage_client: cannot give torch's IPC reference back (%s); the memory of unregistered CUDA "
                      "tensors stays reserved by torch until the process exits" % why, stacklevel=4)


def release_ipc_ref(ref: IpcRef, shm_dir: Optional[str] = None) -> bool:
    """Give back the counter ``ref`` names, once the sidecar no longer maps
    the memory (a confirmed unregister, or a refused register).

    The counter is read first where its file has torch's layout, and left
    alone (with a warning) when it is not above 0. Then the storage class's
    call gives it back; without one, or when that call fails, the counter is
    decremented in its file, only where the file has torch's layout. True
    when it was given back; False (and a warning, once) when the memory
    stays held.
    """
    try:
        before: Optional[int] = ipc_counter_value(ref, shm_dir)
    except (OSError, ValueError):
        before = None  # torch's own call below still works; only the check is skipped
    if before is not None and before < 1:
        warnings.warn("stage_client: torch's IPC counter %r[%d] is already %d; not giving it back again"
                      % (ref.handle, ref.offset, before), RuntimeWarning, stacklevel=2)
        return False
    why = []
    if ref.release is not None:
        try:
            ref.release(ref.handle, ref.offset, ref.device)
            return True
        except (NotImplementedError, RuntimeError, TypeError) as e:
            why.append("torch's release call: %s" % e)
    else:
        why.append("the storage class has no _release_ipc_counter_cuda or _release_ipc_counter")
    try:
        if _with_counter(ref.handle, ref.offset, shm_dir, _decrement) > 0:
            return True
        why.append("its counter is not above 0")
    except (OSError, ValueError) as e:
        why.append(str(e))
    _warn_held("; ".join(why))
    return False
