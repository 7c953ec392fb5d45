"""Register Ascend NPU memory with an ``acl`` sidecar.

ACL shares device memory between processes two ways, and
:func:`register_npu_tensor` picks the one the tensor's memory needs:

* VMM memory (torch_npu's expandable segments, vllm-ascend's default;
  physical chunks of 2 MiB or 20 MiB mapped into a reserved range): for
  every chunk under the tensor (``aclrtMemGetAddressRange`` names the
  mapping that holds an address) the engine retains the chunk's handle
  (``aclrtMemRetainAllocationHandle``), exports it once
  (``aclrtMemExportToShareableHandle``) and whitelists the sidecar
  (``aclrtMemSetPidToShareableHandle``); it registers the chunk list and the
  tensor's offset in the first chunk (HandleKind.ACL_VMM). The sidecar
  imports, maps in order and opens the chunks.
* ``aclrtMalloc`` memory (``expandable_segments:False``): the engine exports
  the allocation that holds the tensor (``aclrtIpcMemGetExportKey`` on its
  base), whitelists the sidecar (``aclrtIpcMemSetImportPid``), and registers
  the key, the allocation's size and the tensor's offset in it
  (HandleKind.ACL_KEY). The sidecar imports the key
  (``aclrtIpcMemImportByKey``).

Memory is VMM when ``aclrtMemRetainAllocationHandle`` accepts the start of
the mapping that holds it. Both whitelists name the sidecar's BareTgid
(``aclrtDeviceGetBareTgid``), which the sidecar reports (QueryDevice); the
SO_PEERCRED pid of the socket differs from it across pid namespaces and VMs
and is used only with a sidecar too old to report it (with a warning).

:class:`ACL` loads libascendcl with ctypes (no CANN headers or torch_npu
needed to import this module) and keeps the keys and chunks it exported;
``register_kv_cache(..., acl=ACL(...))`` registers a whole KV cache this way.

What ran where: the key path has run against ``fakeacl_cuda`` (the ACL
runtime emulated over CUDA, ``acl/testdata``) on an NVIDIA H100, with torch
CUDA tensors over memory from its ``aclrtMalloc``; both paths run in CI
against ``fakeacl`` (host memory). Never on an NPU. The call sequences
follow CANN's runtime API documentation.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
from typing import Any, Dict, List, Optional, Tuple

from .cuda import warn_once
from .errors import StageError
from .protocol.wire import Code, HandleKind, QueryKind

__all__ = ["ACL", "ACLError", "register_npu_tensor", "sidecar_bare_tgid", "sidecar_pid"]

_KEY_LEN = 65  # aclrtIpcMemGetExportKey's key buffer: 64 characters and a NUL
_REPEAT_INIT = 100002  # ACL_ERROR_REPEAT_INITIALIZE: aclInit was called before in this process
_NO_PID_CHECK = 1  # export flag (key and VMM): any process holding the handle may import
_VMM_HEAD = struct.Struct("<B3xiQII")  # version, physical device, offset in the first chunk, count, reserved
_VMM_CHUNK = struct.Struct("<QQ")  # shareable handle, size
_VMM_VERSION = 1
MAX_VMM_CHUNKS = 4094  # what one Register's handle bytes hold (wire.MAX_HANDLE_BYTES)


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
        # VMM chunk start -> [physical handle it had, shareable handle, pid-checked, pids whitelisted]
        self._chunks: Dict[int, List[Any]] = {}
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
        vmm = {
            "aclrtMemRetainAllocationHandle": [vp, ctypes.POINTER(vp)],
            "aclrtMemExportToShareableHandle": [vp, ctypes.c_int32, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)],
            "aclrtMemSetPidToShareableHandle": [ctypes.c_uint64, ctypes.POINTER(ctypes.c_int32), sz],
            "aclrtFreePhysical": [vp],
        }
        self._vmm_missing = [n for n in vmm if not hasattr(L, n)]
        for name, args in vmm.items():
            if name not in self._vmm_missing:
                fn = getattr(L, name)
                fn.argtypes, fn.restype = args, ctypes.c_int
        phys = getattr(L, "aclrtGetPhyDevIdByLogicDevId", None)
        if phys is not None:
            phys.argtypes, phys.restype = [ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)], ctypes.c_int
        self._phys = phys
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

    def physical_id(self) -> int:
        """``device``'s physical NPU id (aclrtGetPhyDevIdByLogicDevId), or -1 when the library cannot say."""
        if self._phys is None:
            return -1
        out = ctypes.c_int32()
        if self._phys(self.device, ctypes.byref(out)) != 0:
            self._msg()
            return -1
        return int(out.value)

    def _retain(self, base: int) -> Optional[int]:
        """The physical handle mapped at ``base`` (retained: free it), or None when ``base`` is not VMM memory."""
        if self._vmm_missing:
            return None
        h = ctypes.c_void_p()
        if self.lib.aclrtMemRetainAllocationHandle(ctypes.c_void_p(base), ctypes.byref(h)) != 0:
            self._msg()  # not a mapping's start: aclrtMalloc memory
            return None
        return int(h.value or 0)

    def _unretain(self, h: int, base: int) -> None:
        self._check(self.lib.aclrtFreePhysical(ctypes.c_void_p(h)), "aclrtFreePhysical(retained chunk at %#x)" % base)

    def is_vmm(self, ptr: int) -> bool:
        """Whether ``ptr`` lies in VMM memory (a chunk mapped with aclrtMapMem)."""
        base, _ = self.address_range(ptr)
        h = self._retain(base)
        if h is None:
            return False
        self._unretain(h, base)
        return True

    def export_vmm(self, ptr: int, n: int, importer: Optional[int]) -> bytes:
        """Export the VMM chunks under ``[ptr, ptr+n)``: the HandleKind.ACL_VMM bytes (PROTOCOL.md, section 5).

        Each chunk is exported once (CANN allows one shareable handle per
        physical handle; a chunk mapped anew at the same address is
        exported anew); ``importer`` (a BareTgid) is added to each chunk's
        whitelist. ``None`` exports without pid validation.
        """
        chunks: List[Tuple[int, int]] = []
        first = -1
        p, end = ptr, ptr + n
        while p < end:
            base, size = self.address_range(p)
            if first < 0:
                first = p - base
            chunks.append((self._export_chunk(base, importer), size))
            if len(chunks) > MAX_VMM_CHUNKS:
                raise StageError(Code.UNSUPPORTED, "acl: %d B at %#x span more than %d VMM chunks; register it as "
                                 "smaller regions" % (n, ptr, MAX_VMM_CHUNKS))
            p = base + size
        head = _VMM_HEAD.pack(_VMM_VERSION, self.physical_id(), first, len(chunks), 0)
        return head + b"".join(_VMM_CHUNK.pack(sh, size) for sh, size in chunks)

    def _export_chunk(self, base: int, importer: Optional[int]) -> int:
        h = self._retain(base)
        if h is None:
            raise StageError(Code.BAD_REQUEST, "acl: %#x is not the start of a VMM mapping "
                             "(aclrtMemRetainAllocationHandle refused it)" % base)
        try:
            with self._lock:
                got = self._chunks.get(base)
                if got is None or got[0] != h:
                    out = ctypes.c_uint64()
                    flags = 0 if importer is not None else _NO_PID_CHECK
                    self._check(self.lib.aclrtMemExportToShareableHandle(ctypes.c_void_p(h), 0, flags, ctypes.byref(out)),
                                "aclrtMemExportToShareableHandle(chunk at %#x, flags %d)" % (base, flags))
                    got = [h, int(out.value), importer is not None, set()]
                    self._chunks[base] = got
                _, sh, checked, pids = got
                if checked and importer is not None and importer not in pids:
                    arr = (ctypes.c_int32 * 1)(importer)
                    self._check(self.lib.aclrtMemSetPidToShareableHandle(sh, arr, 1),
                                "aclrtMemSetPidToShareableHandle(%#x, %d)" % (sh, importer))
                    pids.add(importer)
                elif checked and importer is None:
                    raise StageError(Code.BAD_REQUEST, "acl: the VMM chunk at %#x was exported with pid validation; "
                                     "give the importer's BareTgid" % base)
                return sh
        finally:
            self._unretain(h, base)

    def close_key(self, ptr: int) -> None:
        """Close the export key of the allocation holding ``ptr`` (after every importer closed it)."""
        with self._lock:
            base = next((b for b, (_, n, _) in self._keys.items() if b <= ptr < b + n), None)
            got = self._keys.pop(base, None) if base is not None else None
        if got is not None:
            self._check(self.lib.aclrtIpcMemClose(got[0].encode()), "aclrtIpcMemClose(%s)" % got[0])

    def close(self) -> None:
        """Close every key this object exported (the sidecar must have unregistered them).

        Exported VMM chunks need no closing: their shareable handles end
        with the physical memory (freed by its allocator, torch_npu)."""
        self._chunks.clear()
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


def sidecar_bare_tgid(client: Any) -> int:
    """The pid an exporter whitelists for the sidecar at the other end of ``client``: its BareTgid.

    Asked of the sidecar (QueryDevice: ``aclrtDeviceGetBareTgid`` in its
    process) and kept on the client. A sidecar too old to answer gets its
    SO_PEERCRED pid, with a warning: right only when both processes share
    a pid namespace on one host.
    """
    got = getattr(client, "_stage_bare_tgid", None)
    if got is not None:
        return int(got)
    try:
        info = client.query(QueryKind.DEVICE)
    except StageError as e:
        if e.code != Code.BAD_REQUEST:
            raise
        warn_once("bare_tgid", "stage_client: the sidecar does not report its BareTgid (older than QueryDevice: %s); "
                               "whitelisting its SO_PEERCRED pid, which is wrong across pid namespaces and VMs" % e)
        return sidecar_pid(client)
    if not isinstance(info, dict) or info.get("bare_tgid") is None:
        raise StageError(Code.BAD_REQUEST, "acl: the sidecar serves %s, not an acl device: it has no BareTgid to "
                         "whitelist" % (info.get("device") if isinstance(info, dict) else info))
    src = info.get("bare_tgid_from", "")
    if src != "aclrtDeviceGetBareTgid":
        warn_once("bare_tgid_from", "stage_client: the sidecar's BareTgid is %s" % src)
    pid = int(info["bare_tgid"])
    try:
        setattr(client, "_stage_bare_tgid", pid)
    except AttributeError:
        pass
    return pid


def register_npu_tensor(client: Any, acl: ACL, name: str, tensor: Any, access: int, *, ordinal: Optional[int] = None,
                        importer: Any = "peer") -> None:
    """Register the bytes ``tensor`` spans (a flat uint8 view) as region ``name``.

    VMM memory goes as its chunk list (HandleKind.ACL_VMM), ``aclrtMalloc``
    memory by export key (HandleKind.ACL_KEY); see the module's text.
    ``importer``: the pid whitelisted: ``"peer"`` (default) asks the
    sidecar for its BareTgid (:func:`sidecar_bare_tgid`), an int gives it,
    ``None`` exports without pid validation (see :meth:`ACL.export`).
    """
    pid = sidecar_bare_tgid(client) if importer == "peer" else importer
    ptr, n = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    ordinal = acl.device if ordinal is None else ordinal
    if acl.is_vmm(ptr):
        raw = acl.export_vmm(ptr, n, pid)
        client.register(name, HandleKind.ACL_VMM, access, n, 0, n, ordinal=ordinal, handle_raw=raw)
        return
    key, size, off = acl.export(ptr, pid)
    client.register(name, HandleKind.ACL_KEY, access, size, off, n, ordinal=ordinal, handle_raw=key.encode("ascii"))
