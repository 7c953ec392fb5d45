"""The connection machinery under :class:`~stage_client.client.Client`: one socket, its reader, the requests' futures.

:class:`Connection` is a base of Client and holds none of its public API:
it dials the socket, sends a request and hands back the future its answer
resolves, runs the reader thread that matches answers to futures and
feeds Notify frames to subscriptions, fails every call in flight when
the connection ends, and, for a reconnecting client, adopts the new
socket that :mod:`stage_client.reconnect` dialed and restores the
connection's state on it. It is separate from client.py so that the
requests (regionclient.py, transferclient.py, kvclient.py,
ticketclient.py) read as requests: each is one ``_call`` (or ``_send``)
and what it makes of the answer, with the threads and locks here.

Client.__init__ sets every attribute used here (declared below for
readers and type checkers), in an order that matters: see there.
"""

from __future__ import annotations

import array
import concurrent.futures
import logging
import math
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from .errors import SidecarConnectionError, StageError, StageTimeout
from .protocol import wire
from .protocol.group import Join
from .protocol.messages import decode_body
from .protocol.wire import Code, Notify
from .reconnect import Reconnector
from .subscription import Subscription

__all__ = ["Connection"]

#: How long, in seconds, a send that failed waits for the reader to take
#: the reason the sidecar gave for closing the connection.
_REFUSAL_WAIT = 0.5

#: How long, in seconds, the Cancel of a transfer started after its submit
#: had timed out waits for its answer.
_ORPHAN_CANCEL_WAIT = 5.0

_Future = concurrent.futures.Future
_log = logging.getLogger("stage_client")


class Connection:
    """The socket, reader thread and pending requests of a :class:`~stage_client.client.Client` (a base of it)."""

    # Set by Client.__init__ (and swapped by _adopt on a new connection); declared, not assigned, here.
    path: str
    request_timeout: Optional[float]
    reconnect_wait: float
    _sock: socket.socket
    _wlock: threading.Lock
    _lock: threading.Lock
    _back: threading.Condition
    _lost_at: float
    _seq: Iterator[int]
    _pending: Dict[int, _Future]
    _subs: List[Subscription]
    _error: Optional[SidecarConnectionError]
    _closing: bool
    _group: Optional[bytes]
    _hooks: List[Callable[[Any], None]]
    _lost_hooks: List[Callable[[], None]]
    _resuming: Optional[int]
    _pieces: Optional[Dict[str, Any]]
    _reconnector: Optional[Reconnector]
    _reader: threading.Thread

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
                elif isinstance(m, wire.Submitted):
                    self._cancel_orphan(m.transfer)
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

    def _cancel_orphan(self, transfer: int) -> None:
        """Cancel ``transfer``, started by a submit whose caller stopped waiting (its call timed out): nobody
        follows it, and that caller may already have handed its memory to something else (a decode engine that
        gave up on a pull recomputes into those blocks), so it must not go on writing or reading there. On a
        thread of its own: the reader must not wait for an answer only it can read."""

        def cancel() -> None:
            try:
                self._call(lambda r: wire.Cancel(req=r, transfer=transfer), timeout=_ORPHAN_CANCEL_WAIT)
                _log.warning("stage: transfer %d started after its submit had timed out: cancelled", transfer)
            except (StageError, OSError) as e:  # ended already, or the connection went: nothing left to stop
                _log.info("stage: cancelling transfer %d, started after its submit had timed out: %s", transfer, e)

        threading.Thread(target=cancel, name="stage-cancel-orphan", daemon=True).start()

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


# ----------------------------------------------------------------------
# helpers (the request modules use _Future, _timeout_ms and the _set_* helpers too)

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
