"""A thread-safe client of the local sidecar's control socket.

One :class:`Client` is one Unix-socket connection to ``staged``. Any number
of threads may call it at once: every request carries a fresh request id,
one reader thread reads the sidecar's answers and hands each to the call
waiting for its id (answers may come in any order: a Wait answers when its
transfer ends, later requests at once), and Notify frames go to
subscriptions.

This module holds Client's construction, lifecycle, subscriptions and
queries; Client gathers the rest from its bases, one module each:
connection.py (the socket, the reader thread, the requests' futures, a
new connection's adoption), regionclient.py (Register, Unregister),
transferclient.py (Submit, Wait, Status, Cancel, and :class:`Op`,
:class:`Block`, :func:`make_ops`, :class:`TransfersFailed`), kvclient.py
(RegisterKV, SubmitKV, grants), ticketclient.py (tickets), and
subscription.py (:class:`Subscription`). The names those modules used to
hold here are imported below, so ``stage_client.client`` still offers them.
"""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from .connection import Connection, _Future, _shutdown
from .errors import SidecarConnectionError, StageError
from .kvclient import KVRequests
from .protocol import wire
from .protocol.group import Join
from .protocol.wire import Code, QueryKind
from .reconnect import Backoff, Reconnector
from .regionclient import DEFAULT_UNREGISTER_WAIT, RegionRequests, _IpcHold
from .subscription import Subscription
from .ticketclient import TicketRequests
from .transferclient import DEFAULT_FIRST_PIECE, DEFAULT_PIECE, DEFAULT_PIECE_OPS, Block, Op, TransferRequests
from .transferclient import TransfersFailed, make_ops

# Not used here: these names lived in this module before it was split, and stay importable from it
# (``from stage_client.client import ...``) for code written then.
from .connection import _REFUSAL_WAIT, _fail, _log, _resolve, _set_exception, _set_result, _timeout_ms  # noqa: F401
from .cuda import CudaExport, IpcRef, export_tensor, release_ipc_ref, warn_once  # noqa: F401
from .errors import StageTimeout  # noqa: F401
from .protocol.messages import decode_body  # noqa: F401
from .protocol.pieces import SubmitMore, head_of  # noqa: F401
from .protocol.wire import Direction, HandleKind, LocalOp, Notify, State, XferStatus  # noqa: F401
from .transferclient import OpLike, _checksum, _final_status, _names  # noqa: F401

__all__ = ["Client", "Op", "Block", "Subscription", "make_ops", "DEFAULT_REQUEST_TIMEOUT", "DEFAULT_UNREGISTER_WAIT",
           "TransfersFailed"]

#: Default limit, in seconds, for an answer to any request but Wait.
DEFAULT_REQUEST_TIMEOUT = 60.0


class Client(Connection, RegionRequests, TransferRequests, KVRequests, TicketRequests):
    """A connection to the sidecar's control socket at ``path``.

    Thread-safe; use as a context manager or call :meth:`close`.
    ``request_timeout`` bounds the wait for the answer to every request but
    Wait (None: no limit); a request past it raises StageTimeout.

    Region names, route names and tags are ``str`` (UTF-8 on the wire).
    Regions: :meth:`register` and its forms, :meth:`unregister` (from
    :class:`~stage_client.regionclient.RegionRequests`). Transfers:
    :meth:`submit`, :meth:`push`, :meth:`pull`, :meth:`wait` and its forms,
    :meth:`status`, :meth:`cancel` (from
    :class:`~stage_client.transferclient.TransferRequests`).
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
