"""A thread-safe client of the local sidecar's control socket.

One :class:`Client` is one Unix-socket connection to ``staged``. Any number
of threads may call it at once: every request carries a fresh request id,
one reader thread reads the sidecar's answers and hands each to the call
waiting for its id (answers may come in any order: a Wait answers when its
transfer ends, later requests at once), and Notify frames go to
subscriptions.
"""

from __future__ import annotations

import array
import asyncio
import concurrent.futures
import itertools
import json
import logging
import math
import queue
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

from .cuda import CudaExport, IpcRef, export_tensor, release_ipc_ref, warn_once
from .errors import SidecarConnectionError, StageError, StageTimeout
from .kvclient import KVRequests
from .protocol import wire
from .protocol.group import Join
from .protocol.messages import decode_body
from .protocol.pieces import SubmitMore, head_of
from .protocol.wire import Code, Direction, HandleKind, LocalOp, Notify, QueryKind, State, XferStatus
from .reconnect import Backoff, Reconnector
from .ticketclient import TicketRequests

__all__ = ["Client", "Op", "Block", "Subscription", "make_ops", "DEFAULT_REQUEST_TIMEOUT", "DEFAULT_UNREGISTER_WAIT",
           "TransfersFailed"]

#: Default limit, in seconds, for an answer to any request but Wait.
DEFAULT_REQUEST_TIMEOUT = 60.0

#: A submit of more ops than this goes in pieces when the sidecar takes them (PROTOCOL.md 9.5b): the
#: head carries DEFAULT_FIRST_PIECE ops, each later piece DEFAULT_PIECE. As the Go client's defaults
#: (client.DefaultPieceOps, measured there).
DEFAULT_PIECE_OPS = 16384
DEFAULT_FIRST_PIECE = 1024
DEFAULT_PIECE = 8192

#: How long, in seconds, :meth:`Client.unregister` of a tensor region lets
#: the sidecar wait for the transfers holding it (a route's default
#: progress_timeout).
DEFAULT_UNREGISTER_WAIT = 30.0

#: How long, in seconds, a send that failed waits for the reader to take
#: the reason the sidecar gave for closing the connection.
_REFUSAL_WAIT = 0.5

_Future = concurrent.futures.Future
_log = logging.getLogger("stage_client")


class Op(NamedTuple):
    """One range of a transfer, as the caller writes it.

    ``local`` and ``remote`` index the transfer's local and remote region
    names. For a push the bytes go local -> remote, for a pull remote ->
    local. (The wire orders the fields differently: see wire.LocalOp.)
    """

    local: int
    local_off: int
    remote: int
    remote_off: int
    length: int


class Block(NamedTuple):
    """A range between one local and one remote region (indices default 0)."""

    local_off: int
    remote_off: int
    length: int
    local: int = 0
    remote: int = 0


OpLike = Union[Op, Block, LocalOp, Tuple[int, ...]]


def make_ops(ops: Iterable[OpLike]) -> List[LocalOp]:
    """Normalize ops to wire.LocalOp.

    Accepted: :class:`Op` or a 5-tuple ``(local_idx, local_off, remote_idx,
    remote_off, length)``; :class:`Block` or a 3-tuple ``(local_off,
    remote_off, length)`` (region index 0 on both sides); wire.LocalOp as is.
    """
    out: List[LocalOp] = []
    for i, op in enumerate(ops):
        if isinstance(op, LocalOp):
            out.append(op)
        elif isinstance(op, Block):
            out.append(LocalOp(op.local, op.remote, op.local_off, op.remote_off, op.length))
        elif len(op) == 5:
            out.append(LocalOp(op[0], op[2], op[1], op[3], op[4]))
        elif len(op) == 3:
            out.append(LocalOp(0, 0, op[0], op[1], op[2]))
        else:
            raise ValueError("op %d: %r is neither (local_idx, local_off, remote_idx, remote_off, length) nor "
                             "(local_off, remote_off, length)" % (i, op))
    return out


def _names(x: Union[str, Sequence[str]]) -> List[str]:
    return [x] if isinstance(x, str) else list(x)


_checksum = wire.checksum_choice


class Subscription:
    """Notifications of one :meth:`Client.subscribe` call.

    Iterate it (``for n in sub``: ends when the connection closes) or call
    :meth:`get`. Notifications arrive on the client's reader thread and wait
    in a queue of ``maxsize``; when the queue is full new ones are dropped
    and counted in :attr:`dropped` (a reader that stalls must not stall the
    answers to requests).
    """

    _END = object()

    def __init__(self, client: "Client", maxsize: int) -> None:
        self._client = client
        self._q: "queue.Queue[Any]" = queue.Queue(maxsize=maxsize + 1)  # +1: room for the end marker
        self._max = maxsize
        self._ended = False
        self.dropped = 0

    def _put(self, n: Notify) -> None:
        if self._q.qsize() >= self._max:
            self.dropped += 1
            return
        try:
            self._q.put_nowait(n)
        except queue.Full:
            self.dropped += 1

    def _end(self) -> None:
        try:
            self._q.put_nowait(self._END)
        except queue.Full:  # pragma: no cover - the +1 slot is kept free
            pass

    def get(self, timeout: Optional[float] = None) -> Optional[Notify]:
        """The next notification; None when ``timeout`` seconds passed first.

        Raises SidecarConnectionError once the connection closed and every
        queued notification was read.
        """
        if self._ended:
            raise SidecarConnectionError("the connection to the sidecar is closed; no more notifications")
        try:
            n = self._q.get(timeout=timeout)
        except queue.Empty:
            return None
        if n is self._END:
            self._ended = True
            self._end()  # for other readers of this subscription
            raise SidecarConnectionError("the connection to the sidecar is closed; no more notifications")
        return n

    async def get_async(self, timeout: Optional[float] = None) -> Optional[Notify]:
        """:meth:`get` for asyncio (runs the blocking get in the default executor)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.get, timeout)

    def __iter__(self) -> Iterator[Notify]:
        while True:
            try:
                n = self.get()
            except SidecarConnectionError:
                return
            if n is not None:
                yield n

    def close(self) -> None:
        """Stop collecting notifications here (the sidecar keeps sending them
        to the connection; other subscriptions still get them)."""
        self._client._unsubscribe(self)
        self._end()


class Client(KVRequests, TicketRequests):
    """A connection to the sidecar's control socket at ``path``.

    Thread-safe; use as a context manager or call :meth:`close`.
    ``request_timeout`` bounds the wait for the answer to every request but
    Wait (None: no limit); a request past it raises StageTimeout.

    Region names, route names and tags are ``str`` (UTF-8 on the wire).
    KV caches and KV transfers: :meth:`register_kv`, :meth:`submit_kv`
    (from :class:`~stage_client.kvclient.KVRequests`).

    What a connection registers and submits is its own (PROTOCOL.md 9.18):
    another connection cannot use, unregister, check or cancel it, nor hear
    of its transfers, and it goes when the connection closes. Processes of
    one engine that must share (a worker that registers, another process
    that subscribes or waits) pass the same ``group``: a secret token of
    16 to 64 bytes (str: UTF-8) they all know and nobody else can guess;
    the connection joins that group first thing.

    ``reconnect`` (True, or a :class:`~stage_client.reconnect.Backoff`):
    when the sidecar closes the connection (a restart), calls in flight
    fail once with SidecarConnectionError, and the client dials again with
    backoff, joins its group, subscribes again and runs the
    :meth:`on_reconnect` callbacks (which register again what the old
    connection owned); see :mod:`stage_client.reconnect`. False: the client
    stays closed, and its subscriptions end. ``reconnect_wait`` (seconds):
    a call made while a reconnecting client is away waits for the new
    connection (its callbacks run) instead of failing at once, until that
    long after the old one was lost: a sidecar that restarts in well under
    a second costs the calls of that moment a short wait, not a failure,
    and one that stays away longer fails calls at once again. 0: never
    waits.
    """

    def __init__(self, path: str, request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
                 group: Optional[Union[str, bytes]] = None, reconnect: Union[bool, Backoff] = False,
                 reconnect_wait: float = 0.0) -> None:
        self.path = path
        self.request_timeout = request_timeout
        self.reconnect_wait = reconnect_wait
        try:
            self._sock = self._dial()
        except OSError as e:
            raise SidecarConnectionError("connect to the sidecar at %s: %s; is staged running, and is this its "
                                         "control_socket?" % (path, e)) from e
        self._wlock = threading.Lock()
        self._lock = threading.Lock()
        self._back = threading.Condition(self._lock)  # notified when a reconnecting client is back, or closes
        self._lost_at = 0.0  # time.monotonic() when a reconnecting client lost its connection; 0 while it has one
        self._seq = itertools.count(1)
        self._pending: Dict[int, _Future] = {}
        self._subs: List[Subscription] = []
        self._error: Optional[SidecarConnectionError] = None
        self._closing = False
        self._keep: Dict[str, Any] = {}  # objects kept alive while their region is registered
        self._ipc: Dict[str, _IpcHold] = {}  # torch IPC counters held for registered tensor regions
        self._ipc_live: Dict[Tuple[bytes, int], int] = {}  # how many holds name each counter
        self._group = None if group is None else group.encode("utf-8") if isinstance(group, str) else bytes(group)
        self._hooks: List[Callable[["Client"], None]] = []  # on_reconnect callbacks
        self._lost_hooks: List[Callable[[], None]] = []  # on_disconnect callbacks
        self._resuming: Optional[int] = None  # the thread restoring a new connection; others' calls wait out
        #: A submit of more ops than this goes in pieces (PROTOCOL.md 9.5b) when the sidecar takes them:
        #: ``first_piece`` ops in the head, ``piece_ops`` in each later piece. 0: always one Submit.
        self.pieces_above, self.first_piece, self.piece_ops = DEFAULT_PIECE_OPS, DEFAULT_FIRST_PIECE, DEFAULT_PIECE
        self._pieces: Optional[Dict[str, Any]] = None  # the sidecar's submit_pieces limits ({} none), once asked
        # Everything the reader reads when the connection ends is set before it starts: a sidecar that
        # refuses the connection (a Fail with Req 0) may close it at once.
        self._reconnector: Optional[Reconnector] = None
        if reconnect:
            self._reconnector = Reconnector(self, reconnect if isinstance(reconnect, Backoff) else Backoff())
        self._reader = self._start_reader(self._sock)
        if self._group is not None:
            token = self._group
            try:
                self._call(lambda req: Join(req=req, group=token))
            except BaseException:
                self.close()
                raise

    # ------------------------------------------------------------------
    # lifecycle

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; calls in flight fail with SidecarConnectionError.

        The sidecar then lets go of every region and KV cache this
        connection registered (at once; a transfer still holding one fails
        and keeps it mapped until it ends), and frees their names. A
        reconnecting client stops trying (its thread is joined).
        """
        with self._lock:
            self._closing = True
            sock = self._sock
            self._back.notify_all()
        _shutdown(sock)
        if self._reconnector is not None:
            self._reconnector.stop()  # a new connection is not adopted once closing
        with self._lock:
            sock = self._sock
        _shutdown(sock)
        if threading.current_thread() is not self._reader:
            self._reader.join()
        sock.close()

    def on_reconnect(self, fn: Callable[["Client"], None]) -> None:
        """Call ``fn(client)`` on each new connection of a reconnecting client, after it joined its group and
        subscribed again and before other calls go through: register there what the old connection owned.
        It runs on the client's reconnect thread; if it raises, that connection is dropped and tried again."""
        with self._lock:
            self._hooks.append(fn)

    def on_disconnect(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` when a reconnecting client's connection ends (after the calls in flight failed), on
        the client's reader thread: keep it short, make no call to the sidecar there."""
        with self._lock:
            self._lost_hooks.append(fn)

    @property
    def reconnects(self) -> int:
        """How many times the connection was brought back after the sidecar closed it."""
        return 0 if self._reconnector is None else self._reconnector.reconnects

    # -- the connection's lifecycle (stage_client.reconnect drives it)

    def _dial(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        return sock

    def _start_reader(self, sock: socket.socket) -> threading.Thread:
        t = threading.Thread(target=self._read_loop, args=(sock,), name="stage-client-reader", daemon=True)
        t.start()
        return t

    def _adopt(self, sock: socket.socket) -> bool:
        """Make ``sock`` the connection (the old one's reader has ended); False, and ``sock`` closed, when closing."""
        self._reader.join()
        with self._lock:
            if self._closing:
                sock.close()
                return False
            old, self._sock, self._error = self._sock, sock, None
            self._resuming = threading.get_ident()
            # _keep and _ipc stay: a sidecar that only dropped the connection may still map the old regions
            # until their transfers end; registering a name again replaces its entries
        old.close()
        self._reader = self._start_reader(sock)
        return True

    def _resume(self) -> None:
        """On a new connection: join the group, subscribe again, run the on_reconnect callbacks."""
        token = self._group
        if token is not None:
            self._call(lambda req: Join(req=req, group=token))
        with self._lock:
            subscribed, hooks = bool(self._subs), list(self._hooks)
        if subscribed:
            self._call(lambda r: wire.Subscribe(req=r))
        for fn in hooks:
            fn(self)

    def _resumed(self) -> None:
        with self._lock:
            self._resuming, self._lost_at = None, 0.0
            self._back.notify_all()

    def _drop(self) -> None:
        """End the connection (not the client) and wait for its reader."""
        with self._lock:
            sock, self._resuming = self._sock, None
        _shutdown(sock)
        self._reader.join()

    def _await_back(self) -> None:
        """Under the lock: while a reconnecting client is away (or another thread restores its connection), wait
        for it to be back, up to ``reconnect_wait`` after the connection was lost."""
        me = threading.get_ident()
        while self._reconnector is not None and not self._closing and (
                self._error is not None or (self._resuming is not None and self._resuming != me)):
            left = self._lost_at + self.reconnect_wait - time.monotonic()
            if left <= 0:
                return
            self._back.wait(left)

    @property
    def restores(self) -> bool:
        """True while a lost connection is dialed again (``reconnect`` on, the client not closed): a call that
        failed with the connection may go through on the next one."""
        with self._lock:
            return self._reconnector is not None and not self._closing

    @property
    def closed(self) -> bool:
        """True once the connection is gone."""
        with self._lock:
            return self._error is not None or self._closing

    # ------------------------------------------------------------------
    # reader

    def _recv_exact(self, sock: socket.socket, n: int, what: str) -> Optional[bytes]:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = sock.recv_into(view[got:], n - got)
            if k == 0:
                if got == 0 and what == "header":
                    return None
                raise wire.ProtocolError("malformed", "connection ended inside a frame's %s (%d of %d bytes)"
                                         % (what, got, n))
            got += k
        return bytes(buf)

    def _read_loop(self, sock: socket.socket) -> None:
        err: SidecarConnectionError
        try:
            while True:
                hb = self._recv_exact(sock, wire.HEADER_SIZE, "header")
                if hb is None:
                    err = SidecarConnectionError("the sidecar closed the connection")
                    break
                h = wire.parse_header(hb)
                body = self._recv_exact(sock, h.length, "body") if h.length else b""
                assert body is not None
                wire.verify_crc(h, body)
                m = decode_body(h.type, body)
                if isinstance(m, Notify):
                    with self._lock:
                        subs = list(self._subs)
                    for s in subs:
                        s._put(m)
                    continue
                req = getattr(m, "req", 0)
                with self._lock:
                    fut = self._pending.pop(req, None)
                if fut is not None:
                    _resolve(fut, m)
                elif isinstance(m, wire.Fail) and req == 0:
                    err = SidecarConnectionError("the sidecar ended the connection: %s" % m.message, m.code)
                    break
                # else: an answer nobody waits for any more (its call timed out)
        except wire.ProtocolError as e:
            err = SidecarConnectionError("bad frame from the sidecar: %s" % e, Code.MALFORMED)
        except OSError as e:
            err = SidecarConnectionError("connection to the sidecar: %s" % e)
        with self._lock:
            again = self._reconnector is not None and not self._closing
            if self._closing:
                err = SidecarConnectionError("the client was closed")
            elif again:
                err = SidecarConnectionError(err.message + "; reconnecting", err.code)
                if not self._lost_at:  # the first loss since it was last back: the wait counts from it
                    self._lost_at = time.monotonic()
            self._error = err
            pending = list(self._pending.values())
            self._pending.clear()
            subs = [] if again else list(self._subs)  # a reconnecting client's subscriptions carry on
            if not again:
                self._subs.clear()
        for fut in pending:
            _fail(fut, err)
        for s in subs:
            s._end()
        if again:
            assert self._reconnector is not None
            for fn in list(self._lost_hooks):
                try:
                    fn()
                except Exception as e:  # noqa: BLE001 - a callback's bug must not stop the reconnect
                    _log.warning("stage: an on_disconnect callback failed: %s", e)
            self._pieces = None  # the sidecar may come back as another version: ask again
            self._reconnector.lost()

    # ------------------------------------------------------------------
    # requests

    def _send(self, make: Callable[[int], wire.Message], fd: int = -1,
              more: Optional[Callable[[int], Iterator[bytes]]] = None) -> Tuple[int, _Future, str]:
        """Encode the request ``make(req)``, register its future, send it; then, when given, the frames
        ``more(req)`` yields (the rest of a request in pieces), each encoded as the one before is sent."""
        with self._lock:
            self._await_back()
            if self._error is not None:
                raise self._error
            if self._closing:
                raise SidecarConnectionError("the client was closed")
            if self._resuming is not None and self._resuming != threading.get_ident():
                raise SidecarConnectionError("the connection to the sidecar is being restored after it closed")
            req = next(self._seq)
            sock = self._sock
        msg = make(req)
        frame = wire.encode_frame(msg, flags=wire.FLAG_FD if fd >= 0 else 0)  # ValueError before anything is sent
        fut: _Future = _Future()
        with self._lock:
            if self._error is not None:
                raise self._error
            self._pending[req] = fut
        try:
            with self._wlock:
                if fd >= 0:
                    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())]
                    n = sock.sendmsg([frame], anc)
                    if n < len(frame):
                        sock.sendall(memoryview(frame)[n:])
                else:
                    sock.sendall(frame)
                for f in more(req) if more is not None else ():
                    sock.sendall(f)
        except OSError as e:
            with self._lock:
                self._pending.pop(req, None)
            # A sidecar that refuses the connection (limits.max_clients, no
            # request in limits.client_first_request_timeout) says why in a
            # Fail with Req 0 before it closes: report that, not the broken pipe.
            if threading.current_thread() is not self._reader:
                self._reader.join(_REFUSAL_WAIT)
            with self._lock:
                why = self._error
            if why is not None and why.code != Code.INTERNAL:
                raise why from e
            raise SidecarConnectionError("send %s to the sidecar: %s" % (msg.TYPE.name, e)) from e
        return req, fut, msg.TYPE.name

    def _result(self, req: int, fut: _Future, timeout: Optional[float], what: str) -> Any:
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            # On 3.11+ this is the builtin TimeoutError, which StageTimeout is too.
            if fut.done():
                raise
            with self._lock:
                self._pending.pop(req, None)
            raise StageTimeout("%s: no answer from the sidecar in %.3gs" % (what, timeout)) from None

    def _call(self, make: Callable[[int], wire.Message], fd: int = -1, timeout: Optional[float] = None) -> Any:
        req, fut, what = self._send(make, fd)
        t = self.request_timeout if timeout is None else timeout
        return self._result(req, fut, t, what)

    # ------------------------------------------------------------------
    # regions

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

    # ------------------------------------------------------------------
    # transfers

    def submit(self, route: str, direction: int, ops: Iterable[OpLike], local_names: Union[str, Sequence[str]],
               remote_names: Union[str, Sequence[str]], tag: str = "",
               checksum: Union[None, bool, int] = None, peer: str = "") -> int:
        """Start a transfer on ``route``; returns its id on this sidecar.

        ``ops`` index ``local_names`` (this sidecar's regions) and
        ``remote_names`` (the peer's); see :func:`make_ops` for the forms.
        ``checksum``: None as the route says, True/False to force CRC32C per
        chunk on/off. ``tag`` reaches the peer's subscribers in Notify.
        ``peer`` names the route's peer the transfer goes to: its node name
        or ``host:port``. Empty: the route's only peer (or any live one on a
        route with ``pick: any``); a route of several peers refuses a
        transfer naming none (BAD_REQUEST, listing them), a peer it does
        not have (UNKNOWN_PEER), and an address outside its ``allow`` list
        (ACCESS_DENIED, never dialed).
        """
        wops = ops if isinstance(ops, list) and all(isinstance(o, LocalOp) for o in ops) else make_ops(ops)
        ln, rn, ck, d = _names(local_names), _names(remote_names), _checksum(checksum), Direction(direction)

        def make(r: int) -> wire.Submit:
            return wire.Submit(req=r, route=route, direction=d, checksum=ck, tag=tag, local_names=ln,
                               remote_names=rn, ops=wops, peer=peer)

        if 0 < self.pieces_above < len(wops) and self._pieces_fit(len(wops)):
            a = self._submit_pieces(make, wops)
        else:
            a = self._call(make)
        if not isinstance(a, wire.Submitted):
            raise StageError(Code.INTERNAL, "Submit answered with %s" % type(a).__name__)
        return a.transfer

    def _pieces_fit(self, n: int) -> bool:
        """Whether the sidecar takes requests in pieces and ``n`` ops in them stay inside its limits."""
        if self._pieces is None:
            try:
                f = self.query(QueryKind.FEATURES)
            except StageError:  # a sidecar that predates pieces: unknown query 6
                f = None
            self._pieces = (f or {}).get("submit_pieces") or {}
        lim = self._pieces
        if not lim:
            return False
        first, rest = max(self.first_piece, 1), max(self.piece_ops, 1)
        pieces = 1 + max(1, -(-max(n - first, 0) // rest))
        return n <= lim.get("max_ops", 0) and pieces <= lim.get("max_pieces", 0)

    def _submit_pieces(self, make: Callable[[int], wire.Submit], ops: List[LocalOp]) -> Any:
        """Send ``make(req)`` as a SubmitHead of its first ops and SubmitMore frames of the rest."""
        first, rest = max(self.first_piece, 1), max(self.piece_ops, 1)

        def head(r: int) -> wire.Message:
            h = head_of(make(r))  # Total and Ends over every op; ValueError before anything is sent
            h.submit.ops = ops[:first]
            return h

        def more(r: int) -> Iterator[bytes]:
            i = min(first, len(ops))
            while True:
                k = min(i + rest, len(ops))
                yield wire.encode_frame(SubmitMore(req=r, end=k == len(ops), ops=ops[i:k]))
                if k == len(ops):
                    return
                i = k

        req, fut, what = self._send(head, more=more)
        return self._result(req, fut, self.request_timeout, what)

    def push(self, route: str, local: Union[str, Sequence[str]], remote: Union[str, Sequence[str]],
             ops: Iterable[OpLike], tag: str = "", checksum: Union[None, bool, int] = None, peer: str = "") -> int:
        """Push local regions' bytes into the peer's regions; returns the transfer id.

        ``peer``: the route's peer (node name or host:port), as :meth:`submit`.
        """
        return self.submit(route, Direction.PUSH, ops, local, remote, tag, checksum, peer)

    def pull(self, route: str, local: Union[str, Sequence[str]], remote: Union[str, Sequence[str]],
             ops: Iterable[OpLike], tag: str = "", checksum: Union[None, bool, int] = None, peer: str = "") -> int:
        """Pull the peer's regions' bytes into local regions; returns the transfer id.

        ``peer``: the route's peer (node name or host:port), as :meth:`submit`.
        """
        return self.submit(route, Direction.PULL, ops, local, remote, tag, checksum, peer)

    def wait_future(self, transfer_id: int, timeout: Optional[float] = None) -> "concurrent.futures.Future[XferStatus]":
        """Start waiting for a transfer; the future resolves when it ends.

        Its result is the final XferStatus; it raises StageError (with the
        transfer's code, and ``.status``) when the transfer failed,
        StageTimeout when ``timeout`` seconds passed first, and
        SidecarConnectionError when the connection closes. Callbacks added
        with ``add_done_callback`` run on the client's reader thread: keep
        them short and do not block in them.
        """
        ms = _timeout_ms(timeout)
        _, fut, _ = self._send(lambda r: wire.Wait(req=r, transfer=transfer_id, timeout_ms=ms))
        out: _Future = _Future()

        def done(f: _Future) -> None:
            try:
                st = f.result()
                _set_result(out, _final_status(st, timeout))
            except BaseException as e:  # noqa: B902 - handed to the waiter
                _set_exception(out, e)

        fut.add_done_callback(done)
        return out

    def wait(self, transfer_id: int, timeout: Optional[float] = None) -> XferStatus:
        """Wait for a transfer to end; returns its final XferStatus (state DONE).

        Raises StageError with the transfer's code when it failed,
        StageTimeout (with ``.status``) when ``timeout`` seconds passed
        first (the transfer goes on), SidecarConnectionError when the
        connection closes. ``timeout`` None: no limit.
        """
        fut = self.wait_future(transfer_id, timeout)
        # The sidecar answers at the timeout; the margin covers a sidecar that cannot.
        local = None if timeout is None else timeout + max(5.0, timeout * 0.1)
        try:
            return fut.result(local)
        except concurrent.futures.TimeoutError:
            if fut.done():
                raise  # the StageTimeout (a TimeoutError) the sidecar's answer made
            raise StageTimeout("Wait for transfer %d: no answer from the sidecar in %.3gs" % (transfer_id, local)) from None

    async def wait_async(self, transfer_id: int, timeout: Optional[float] = None) -> XferStatus:
        """:meth:`wait` for asyncio: no thread is blocked while waiting."""
        return await asyncio.wrap_future(self.wait_future(transfer_id, timeout))

    def wait_all(self, transfer_ids: Iterable[int], timeout: Optional[float] = None) -> List[XferStatus]:
        """Wait for several transfers (all Waits are sent at once); their final statuses, in order.

        Waits for every one of them, failed or not. When any failed (or
        ran past ``timeout``), raises :class:`TransfersFailed` once all
        have ended: it carries every transfer's status and error, so the
        caller learns about each, not only the first that failed.
        """
        ids = list(transfer_ids)
        futs = [self.wait_future(t, timeout) for t in ids]
        local = None if timeout is None else timeout + max(5.0, timeout * 0.1)
        concurrent.futures.wait(futs, local)
        statuses: List[Optional[XferStatus]] = []
        errors: List[Optional[StageError]] = []
        for t, f in zip(ids, futs):
            if not f.done():
                err: Optional[StageError] = StageTimeout("Wait for transfer %d: no answer from the sidecar in %.3gs"
                                                         % (t, local or 0))
            elif isinstance(f.exception(), StageError):
                err = f.exception()  # type: ignore[assignment]
            elif f.exception() is not None:
                raise f.exception()  # type: ignore[misc]  # a bug here, not a transfer's failure
            else:
                err = None
            statuses.append(f.result() if err is None else err.status)
            errors.append(err)
        if any(e is not None for e in errors):
            raise TransfersFailed(ids, statuses, errors)
        return statuses  # type: ignore[return-value]  # every one is set when none failed

    def status(self, transfer_id: int) -> XferStatus:
        """A transfer's state now. Does not raise for a failed transfer
        (look at ``.state`` and ``.code``); raises StageError(UNKNOWN_TRANSFER)
        for an id the sidecar does not know."""
        a = self._call(lambda r: wire.Status(req=r, transfer=transfer_id))
        if not isinstance(a, XferStatus):
            raise StageError(Code.INTERNAL, "Status answered with %s" % type(a).__name__)
        return a

    def cancel(self, transfer_id: int) -> None:
        """Cancel a transfer; its waiters see code CANCELLED."""
        self._call(lambda r: wire.Cancel(req=r, transfer=transfer_id))

    # ------------------------------------------------------------------
    # notifications

    def subscribe(self, maxsize: int = 65536) -> Subscription:
        """Ask for notifications of transfers peers start with this sidecar
        (their pushes that landed here, their pulls served from here).

        Returns a :class:`Subscription`; each call makes a new one, and every
        subscription gets every notification from then on.
        """
        sub = Subscription(self, maxsize)
        with self._lock:
            self._subs.append(sub)  # before Subscribe, so no early Notify is missed
        try:
            self._call(lambda r: wire.Subscribe(req=r))
        except BaseException:
            self._unsubscribe(sub)
            raise
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    # ------------------------------------------------------------------
    # queries

    def query(self, what: int, arg: str = "") -> Any:
        """Send a Query and return its JSON answer, parsed."""
        a = self._call(lambda r: wire.Query(req=r, what=what, arg=arg))
        if not isinstance(a, wire.QueryReply):
            raise StageError(Code.INTERNAL, "Query answered with %s" % type(a).__name__)
        try:
            return json.loads(a.json.decode("utf-8")) if a.json else None
        except ValueError as e:
            raise StageError(Code.MALFORMED, "query answer is not JSON: %s" % e) from None

    def stats(self) -> Dict[str, Any]:
        """The sidecar's figures (keys as in PROTOCOL.md 9.17, ``wire.Stats``)."""
        s = self.query(QueryKind.STATS)
        if s is None:
            return {}
        if s.get("links") is None:
            s["links"] = []
        return s

    def routes(self) -> List[Dict[str, Any]]:
        """The sidecar's routes and their peers (``wire.RouteInfo``)."""
        rs = self.query(QueryKind.ROUTES) or []
        for r in rs:
            if r.get("peers") is None:
                r["peers"] = []
        return rs

    def regions(self) -> List[Dict[str, Any]]:
        """The regions of this connection and its group (``wire.RegionInfo``:
        name, size, access, device); other engines' are not listed."""
        return self.query(QueryKind.REGIONS) or []

    def catalog(self, route: str, peer: str = "") -> List[Dict[str, Any]]:
        """The regions the peer of ``route`` offers (asks the peer; up to 5 s).

        ``peer`` names one of a route's several peers (node name or host:port).
        """
        return self.query(QueryKind.CATALOG, route + "@" + peer if peer else route) or []


class _IpcHold:
    """The torch IPC counters one tensor registration holds; ``taken`` once
    a confirmed unregister took them to give back (guarded by Client._lock)."""

    __slots__ = ("refs", "taken")

    def __init__(self, refs: List[IpcRef]) -> None:
        self.refs = refs
        self.taken = False


class TransfersFailed(StageError):
    """:meth:`Client.wait_all`: some of the transfers failed; what became of each.

    ``transfer_ids``, ``statuses`` and ``errors`` are in the order given to
    wait_all. ``statuses[i]`` is transfer ``i``'s last known XferStatus (its
    final one when it ended; None when none came back, e.g. the connection
    closed); ``errors[i]`` is the StageError it ended with (StageTimeout
    for one still running at the timeout), None for a transfer that
    succeeded. ``code`` and ``status`` are those of the first failure.
    """

    def __init__(self, transfer_ids: Sequence[int], statuses: Sequence[Optional[XferStatus]],
                 errors: Sequence[Optional[StageError]]) -> None:
        self.transfer_ids, self.statuses, self.errors = list(transfer_ids), list(statuses), list(errors)
        bad = self.failed
        first = bad[0][1]
        shown = "; ".join("transfer %d: %s" % (t, e) for t, e in bad[:8])
        more = " (and %d more)" % (len(bad) - 8) if len(bad) > 8 else ""
        super().__init__(first.code, "%d of %d transfers failed: %s%s" % (len(bad), len(self.transfer_ids), shown, more),
                         first.status)

    @property
    def failed(self) -> List[Tuple[int, StageError]]:
        """(transfer id, its error) of each transfer that failed, in order."""
        return [(t, e) for t, e in zip(self.transfer_ids, self.errors) if e is not None]


# ----------------------------------------------------------------------
# helpers


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _timeout_ms(timeout: Optional[float]) -> int:
    if timeout is None:
        return 0
    if timeout < 0:
        raise ValueError("timeout %r < 0" % timeout)
    return min(max(1, math.ceil(timeout * 1000)), 0xFFFFFFFF)


def _final_status(st: Any, timeout: Optional[float]) -> XferStatus:
    if not isinstance(st, XferStatus):
        raise StageError(Code.INTERNAL, "Wait answered with %s" % type(st).__name__)
    if st.state == State.FAILED:
        raise StageError(st.code, st.message, st)
    if st.state != State.DONE:
        raise StageTimeout("transfer %d still %s after %.3gs (%d of %d B)"
                           % (st.transfer, State(st.state).name.lower(), timeout or 0, st.done, st.total), st)
    return st


def _resolve(fut: _Future, m: wire.Message) -> None:
    if isinstance(m, wire.Fail):
        _set_exception(fut, StageError(m.code, m.message))
    else:
        _set_result(fut, m)


def _set_result(fut: _Future, v: Any) -> None:
    try:
        fut.set_result(v)
    except concurrent.futures.InvalidStateError:  # cancelled by its waiter
        pass


def _set_exception(fut: _Future, e: BaseException) -> None:
    try:
        fut.set_exception(e)
    except concurrent.futures.InvalidStateError:
        pass


def _fail(fut: _Future, e: BaseException) -> None:
    _set_exception(fut, e)
