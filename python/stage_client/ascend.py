"""Register Ascend NPU memory with an ``acl`` sidecar by IPC export key.

An engine on Ascend (vllm-ascend over torch_npu) keeps its KV cache in
memory from ``aclrtMalloc``. The acl sidecar reaches it the way ACL shares
device memory between processes: the engine exports the allocation that
holds a tensor (``aclrtIpcMemGetExportKey`` on the allocation base, found
with ``aclrtMemGetAddressRange``), whitelists the sidecar's process
(``aclrtIpcMemSetImportPid``), and registers the key, the allocation's size
and the tensor's offset in it (HandleKind.ACL_KEY). The sidecar imports the
key (``aclrtIpcMemImportByKey``) and checks the size against the runtime.

:class:`ACL` loads libascendcl with ctypes (no CANN headers or torch_npu
needed to import this module) and keeps the keys it exported;
:func:`register_npu_tensor` registers one tensor's bytes;
``register_kv_cache(..., acl=ACL(...))`` registers a whole KV cache this way.

What ran where: this path has run only against ``fakeacl_cuda`` (the ACL
runtime emulated over CUDA, ``acl/testdata``) on an NVIDIA H100, with torch
CUDA tensors over memory from its ``aclrtMalloc``; never on an NPU. The
call sequence follows CANN's runtime API documentation.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
from typing import Any, Dict, List, Optional, Tuple

from .errors import StageError
from .wire import Code, HandleKind

__all__ = ["ACL", "ACLError", "register_npu_tensor", "sidecar_pid"]

_KEY_LEN = 65  # aclrtIpcMemGetExportKey's key buffer: 64 characters and a NUL
_REPEAT_INIT = 100002  # ACL_ERROR_REPEAT_INITIALIZE: aclInit was called before in this process
_NO_PID_CHECK = 1  # export flag: any process holding the key may import


class ACLError(StageError):
    """An ACL runtime call failed; the message names the call and ACL's text."""

    def __init__(self, what: str, rc: int, detail: str = "") -> None:
        super().__init__(Code.DEVICE, "acl: %s: error %d%s" % (what, rc, ": " + detail if detail else ""))
        self.rc = rc


class ACL:
    """The ACL runtime of this process, for exporting device memory to a sidecar.

    ``path``: libascendcl (default ``libascendcl.so`` from the loader
    path, as CANN's ``set_env.sh`` sets it). ``device``: the NPU to bind
    the calling thread to (``aclrtSetDevice``). ACL contexts are per
    thread: call the methods from the thread that made this object, or
    call :meth:`bind` first on another.
    """

    def __init__(self, path: Optional[str] = None, device: int = 0) -> None:
        self.path = path or "libascendcl.so"
        self.device = device
        try:
            self.lib = ctypes.CDLL(self.path)
        except OSError as e:
            raise StageError(Code.UNSUPPORTED, "acl: load %s: %s (give ACL(path=...) libascendcl's path)"
                             % (self.path, e)) from None
        self._sigs()
        self._lock = threading.Lock()
        self._keys: Dict[int, Tuple[str, int, bool]] = {}  # allocation base -> key, size, pid-checked
        rc = self.lib.aclInit(None)
        if rc not in (0, _REPEAT_INIT):
            raise ACLError("aclInit", rc, self._msg())
        self.bind()

    def _sigs(self) -> None:
        L, vp, sz = self.lib, ctypes.c_void_p, ctypes.c_size_t
        sigs = {
            "aclInit": [ctypes.c_char_p],
            "aclrtSetDevice": [ctypes.c_int32],
            "aclrtMalloc": [ctypes.POINTER(vp), sz, ctypes.c_int],
            "aclrtFree": [vp],
            "aclrtMemGetAddressRange": [vp, ctypes.POINTER(vp), ctypes.POINTER(sz)],
            "aclrtIpcMemGetExportKey": [vp, sz, ctypes.c_char_p, sz, ctypes.c_uint64],
            "aclrtIpcMemSetImportPid": [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32), sz],
            "aclrtIpcMemClose": [ctypes.c_char_p],
        }
        for name, args in sigs.items():
            try:
                fn = getattr(L, name)
            except AttributeError:
                raise StageError(Code.UNSUPPORTED, "acl: %s has no %s (CANN too old for IPC export?)"
                                 % (self.path, name)) from None
            fn.argtypes, fn.restype = args, ctypes.c_int
        msg = getattr(L, "aclGetRecentErrMsg", None)
        if msg is not None:
            msg.argtypes, msg.restype = [], ctypes.c_char_p
        self._errmsg = msg

    def _msg(self) -> str:
        if self._errmsg is None:
            return ""
        m = self._errmsg()
        return m.decode(errors="replace") if m else ""

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise ACLError(what, rc, self._msg())

    def bind(self) -> None:
        """Make ``device`` current on the calling thread (aclrtSetDevice)."""
        self._check(self.lib.aclrtSetDevice(self.device), "aclrtSetDevice(%d)" % self.device)

    def malloc(self, size: int) -> int:
        """``size`` bytes of device memory (aclrtMalloc, huge pages first); free with :meth:`free`."""
        p = ctypes.c_void_p()
        self._check(self.lib.aclrtMalloc(ctypes.byref(p), size, 0), "aclrtMalloc(%d B)" % size)
        return int(p.value or 0)

    def free(self, ptr: int) -> None:
        """Free an allocation; its export key, if any, is closed first."""
        self.close_key(ptr)
        self._check(self.lib.aclrtFree(ctypes.c_void_p(ptr)), "aclrtFree(%#x)" % ptr)

    def address_range(self, ptr: int) -> Tuple[int, int]:
        """The base and size of the allocation holding ``ptr``."""
        base, size = ctypes.c_void_p(), ctypes.c_size_t()
        self._check(self.lib.aclrtMemGetAddressRange(ctypes.c_void_p(ptr), ctypes.byref(base), ctypes.byref(size)),
                    "aclrtMemGetAddressRange(%#x)" % ptr)
        return int(base.value or 0), int(size.value)

    def export(self, ptr: int, importer: Optional[int]) -> Tuple[str, int, int]:
        """Export the allocation holding ``ptr``: its key, its size, and ``ptr``'s offset in it.

        ``importer``: the sidecar's pid as the NPU driver sees it; only it
        may import. ``None`` exports without pid validation (any process
        holding the key may import: use only where pid namespaces make the
        sidecar's pid unknowable, and keep the key private). An allocation
        is exported once; later calls add ``importer`` to its whitelist.
        """
        base, size = self.address_range(ptr)
        with self._lock:
            got = self._keys.get(base)
            if got is None:
                buf = ctypes.create_string_buffer(_KEY_LEN)
                flags = 0 if importer is not None else _NO_PID_CHECK
                self._check(self.lib.aclrtIpcMemGetExportKey(ctypes.c_void_p(base), size, buf, _KEY_LEN, flags),
                            "aclrtIpcMemGetExportKey(base %#x, %d B)" % (base, size))
                got = (buf.value.decode("ascii"), size, importer is not None)
                self._keys[base] = got
        key, size, checked = got
        if checked and importer is not None:
            pids = (ctypes.c_int32 * 1)(importer)
            self._check(self.lib.aclrtIpcMemSetImportPid(key.encode(), pids, 1),
                        "aclrtIpcMemSetImportPid(%s, %d)" % (key, importer))
        elif checked:
            raise StageError(Code.BAD_REQUEST, "acl: allocation %#x was exported with pid validation; "
                             "give the importer's pid" % base)
        return key, size, ptr - base

    def close_key(self, ptr: int) -> None:
        """Close the export key of the allocation holding ``ptr`` (after every importer closed it)."""
        with self._lock:
            base = next((b for b, (_, n, _) in self._keys.items() if b <= ptr < b + n), None)
            got = self._keys.pop(base, None) if base is not None else None
        if got is not None:
            self._check(self.lib.aclrtIpcMemClose(got[0].encode()), "aclrtIpcMemClose(%s)" % got[0])

    def close(self) -> None:
        """Close every key this object exported (the sidecar must have unregistered them)."""
        errs: List[BaseException] = []
        for base in list(self._keys):
            try:
                self.close_key(base)
            except StageError as e:
                errs.append(e)
        if errs:
            raise errs[0]


def sidecar_pid(client: Any) -> int:
    """The pid of the sidecar at the other end of ``client``'s socket (SO_PEERCRED)."""
    sock = getattr(client, "sock", None) or getattr(client, "_sock", None)
    if not isinstance(sock, socket.socket):
        raise StageError(Code.BAD_REQUEST, "acl: cannot find the client's socket to ask for the sidecar's pid; "
                         "pass importer= explicitly")
    cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _, _ = struct.unpack("3i", cred)
    return pid


def register_npu_tensor(client: Any, acl: ACL, name: str, tensor: Any, access: int, *, ordinal: Optional[int] = None,
                        importer: Any = "peer") -> None:
    """Register the bytes ``tensor`` spans (a flat uint8 view) as region ``name`` by ACL export key.

    ``importer``: the pid the key is whitelisted for: ``"peer"`` (default)
    asks the socket for the sidecar's pid, an int gives it, ``None``
    exports without pid validation (see :meth:`ACL.export`).
    """
    pid = sidecar_pid(client) if importer == "peer" else importer
    ptr, n = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    key, size, off = acl.export(ptr, pid)
    client.register(name, HandleKind.ACL_KEY, access, size, off, n, ordinal=acl.device if ordinal is None else ordinal,
                    handle_raw=key.encode("ascii"))
