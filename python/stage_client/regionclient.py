"""The region requests of :class:`~stage_client.client.Client`: Register (of every handle kind) and Unregister.

:class:`RegionRequests` is a base of Client. Apart from client.py because
a region's registration has state of its own beyond the request: the
objects kept alive while the sidecar maps them (a tensor, its torch IPC
reference counters) and the rules for giving those counters back only
after a confirmed Unregister (:mod:`stage_client.cuda`, "Lifetime"). It
uses the Client's ``_call``, ``_lock`` and the tables Client.__init__
makes (``_keep``, ``_ipc``, ``_ipc_live``).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from .connection import _timeout_ms
from .cuda import CudaExport, IpcRef, export_tensor, release_ipc_ref, warn_once
from .errors import SidecarConnectionError, StageError, StageTimeout
from .protocol import wire
from .protocol.wire import Code, HandleKind

__all__ = ["RegionRequests", "DEFAULT_UNREGISTER_WAIT"]

#: How long, in seconds, :meth:`Client.unregister` of a tensor region lets
#: the sidecar wait for the transfers holding it (a route's default
#: progress_timeout).
DEFAULT_UNREGISTER_WAIT = 30.0


class RegionRequests:
    """Register, its forms by handle kind (memfd, POSIX fd, CUDA IPC, torch tensor), and Unregister."""

    # Set by Client.__init__; declared, not assigned, here.
    request_timeout: Optional[float]
    _lock: threading.Lock
    _keep: Dict[str, Any]
    _ipc: Dict[str, "_IpcHold"]
    _ipc_live: Dict[Tuple[bytes, int], int]
    _call: Callable[..., Any]

    def register(self, name: str, handle: int, access: int, alloc_size: int, offset: int, length: int, *,
                 ordinal: int = 0, handle_raw: bytes = b"", fd: int = -1, addr: int = 0) -> None:
        """Register a region of any handle kind (the specific methods below
        are easier). ``fd`` (>= 0) is sent with the frame as SCM_RIGHTS; the
        sidecar gets its own copy and the caller keeps ``fd``."""
        self._call(lambda r: wire.Register(req=r, name=name, handle=handle, access=access, ordinal=ordinal,
                                           alloc_size=alloc_size, offset=offset, length=length, addr=addr,
                                           handle_raw=handle_raw), fd=fd)

    def register_memfd(self, name: str, fd: int, alloc_size: int, offset: int, length: int, access: int,
                       ordinal: int = 0) -> None:
        """Register ``length`` bytes at ``offset`` of the memfd ``fd`` (the
        hostmem backend's memory). ``alloc_size`` is the memfd's size; the
        sidecar maps that much of it."""
        self.register(name, HandleKind.MEMFD, access, alloc_size, offset, length, ordinal=ordinal, fd=fd)

    def register_posix_fd(self, name: str, fd: int, alloc_size: int, offset: int, length: int, access: int,
                          ordinal: int = 0) -> None:
        """Register a device allocation exported as a POSIX fd (CUDA VMM
        ``cuMemExportToShareableHandle``), e.g. one from expandable segments."""
        self.register(name, HandleKind.POSIX_FD, access, alloc_size, offset, length, ordinal=ordinal, fd=fd)

    def register_cuda_ipc(self, name: str, handle: bytes, alloc_size: int, offset: int, length: int, access: int,
                          ordinal: int = 0) -> None:
        """Register a region of a cudaMalloc allocation by its 64-byte legacy
        IPC handle (``cudaIpcGetMemHandle`` of the allocation base).
        ``offset`` is from that base; ``alloc_size`` is the allocation's size."""
        if len(handle) != 64:
            raise ValueError("a CUDA IPC handle is 64 bytes, got %d" % len(handle))
        self.register(name, HandleKind.CUDA_IPC, access, alloc_size, offset, length, ordinal=ordinal,
                      handle_raw=bytes(handle))

    def register_tensor(self, name: str, tensor: Any, access: int, *, alloc_size: Optional[int] = None,
                        ordinal: Optional[int] = None) -> CudaExport:
        """Register a contiguous torch CUDA tensor (any view) as a region.

        Uses ``tensor.untyped_storage()._share_cuda_()``: the 64-byte IPC
        handle of the caching-allocator segment that holds the storage; the
        region's offset is ``storage_offset_bytes + tensor.storage_offset() *
        tensor.element_size()``. The allocation size is asked of the CUDA
        driver (exact); see :mod:`stage_client.cuda` for the fallback and
        ``alloc_size``. Tensors in expandable segments raise StageError
        (UNSUPPORTED). The client keeps a reference to the tensor until
        :meth:`unregister`, so its memory is not freed under the sidecar.

        ``_share_cuda_`` arms torch's IPC reference count, which keeps the
        memory from the caching allocator after the tensor is freed; the
        client gives it back after a confirmed :meth:`unregister` (or at
        once when the sidecar refuses the registration). See
        :mod:`stage_client.cuda`, "Lifetime".

        The sidecar copies on its own stream: before pushing bytes a kernel
        wrote, synchronize the stream that wrote them.
        """
        ex = export_tensor(tensor, alloc_size=alloc_size)
        try:
            self.register_cuda_ipc(name, ex.handle, ex.alloc_size, ex.offset, ex.length, access,
                                   ordinal=ex.ordinal if ordinal is None else ordinal)
        except (ValueError, StageError) as e:
            # Refused before it was sent, or by the sidecar: it maps nothing
            # of this registration. No answer (timeout, connection lost): it
            # may, and the counter stays held.
            if ex.ipc_ref is not None and not isinstance(e, (StageTimeout, SidecarConnectionError)):
                release_ipc_ref(ex.ipc_ref)
            raise
        with self._lock:
            self._keep[name] = tensor
            if ex.ipc_ref is not None:
                key = (ex.ipc_ref.handle, ex.ipc_ref.offset)
                if self._ipc_live.get(key, 0):
                    warn_once("shared-counter", "stage_client: torch returned IPC counter %r[%d] for two live "
                              "registrations; this client assumes a new counter per _share_cuda_ call and gives "
                              "each result back once (stage_client/cuda.py, Lifetime)" % key)
                self._ipc_live[key] = self._ipc_live.get(key, 0) + 1
                self._ipc[name] = _IpcHold([ex.ipc_ref])
        return ex

    def unregister(self, name: str, wait: Optional[float] = None, confirm: Optional[bool] = None) -> None:
        """Remove a region.

        A confirmed unregister (PROTOCOL.md 9.4) is answered once no transfer
        holds the region and, with the last region of its allocation, the
        sidecar closed its import, waiting up to ``wait`` seconds (default
        DEFAULT_UNREGISTER_WAIT) for the transfers using it. If they still
        hold it then, it raises StageError(BUSY) and the region stays
        registered: retry once they end (or cancel them). An unconfirmed one
        removes the region at once; transfers in flight keep it mapped until
        they end.

        ``confirm`` None: confirmed for a region :meth:`register_tensor`
        made, which then gives torch's IPC reference back after the OK (so
        the tensor's memory returns to the caching allocator once freed),
        unconfirmed for any other. True or False forces it; a tensor region
        unregistered unconfirmed keeps torch's reference, and its memory
        stays held until the process exits.
        """
        with self._lock:
            hold = self._ipc.get(name)
        if not (hold is not None if confirm is None else confirm):
            self._call(lambda r: wire.Unregister(req=r, name=name))
            self._forget(name, hold)
            return
        w = DEFAULT_UNREGISTER_WAIT if wait is None else float(wait)
        ms = _timeout_ms(w)  # at least 1 ms; ValueError below 0
        limit = None if self.request_timeout is None else max(self.request_timeout, w + max(5.0, w * 0.1))
        try:
            self._call(lambda r: wire.Unregister(req=r, name=name, wait_ms=ms), timeout=limit)
        except (StageTimeout, SidecarConnectionError):
            raise  # unknown whether it went: the counter stays held
        except StageError as e:
            if e.code == Code.MALFORMED:
                self._unregister_unconfirmed(name, hold)
                return
            if e.code == Code.UNKNOWN_REGION:
                self._forget(name, hold)  # gone (another client, a restarted sidecar): the counter stays held
            if e.code == Code.BUSY and hold is not None:
                raise StageError(Code.BUSY, "unregister %r: %s. Its tensor's memory stays held by torch (its IPC "
                                            "reference is not given back) until an unregister succeeds: retry "
                                            "once the transfers using the region end" % (name, e.message)) from None
            raise
        refs = self._forget(name, hold)
        for ref in refs:
            release_ipc_ref(ref)

    def _unregister_unconfirmed(self, name: str, hold: "Optional[_IpcHold]") -> None:
        """A sidecar that predates the confirmed Unregister refused one (as
        malformed, leaving the region registered): unregister plainly, and
        keep torch's counter."""
        self._call(lambda r: wire.Unregister(req=r, name=name))
        self._forget(name, hold)
        if hold is not None:
            warn_once("old-sidecar", "stage_client: the sidecar cannot confirm an Unregister (it predates PROTOCOL.md "
                      "9.4's WaitMs); torch keeps the memory of unregistered CUDA tensors until the "
                      "process exits: upgrade staged")

    def _forget(self, name: str, hold: "Optional[_IpcHold]") -> List[IpcRef]:
        """Drop the region's kept objects; return the IPC counters of
        ``hold`` to give back, unless another call already took them."""
        with self._lock:
            self._keep.pop(name, None)
            if hold is None:
                return []
            if self._ipc.get(name) is hold:
                del self._ipc[name]
            if hold.taken:
                return []
            hold.taken = True
            for r in hold.refs:
                key = (r.handle, r.offset)
                n = self._ipc_live.pop(key, 0) - 1
                if n > 0:
                    self._ipc_live[key] = n
            return list(hold.refs)


class _IpcHold:
    """The torch IPC counters one tensor registration holds; ``taken`` once
    a confirmed unregister took them to give back (guarded by Client._lock)."""

    __slots__ = ("refs", "taken")

    def __init__(self, refs: List[IpcRef]) -> None:
        self.refs = refs
        self.taken = False
