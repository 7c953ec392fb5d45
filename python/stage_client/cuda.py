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
counting: when a shared storage is freed, torch keeps its block in "limbo"
until consumers drop their references, and the sidecar takes no part in
that protocol. So the memory of a registered tensor is not returned to the
caching allocator before the process exits (torch then prints "Producer
process has been terminated before all shared CUDA tensors released").
That is what a KV cache allocated once wants (the sidecar may still have it
mapped); do not register short-lived tensors.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from .errors import StageError
from .wire import Code

__all__ = ["CudaExport", "export_tensor", "allocation_range", "split_share_handle"]

IPC_HANDLE_SIZE = 64


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
                      length=length, exact_alloc_size=exact, event_sync_required=event_sync)
