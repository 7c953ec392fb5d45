"""The transfer requests of :class:`~stage_client.client.Client`: Submit (whole or in pieces), Wait, Status, Cancel.

:class:`TransferRequests` is a base of Client; with it here are the types a
caller writes a transfer's ranges in (:class:`Op`, :class:`Block`,
:func:`make_ops`) and the error :meth:`Client.wait_all` raises
(:class:`TransfersFailed`). Apart from client.py because this is the
byte-range transfer API, which only sends requests and reads their
answers: the socket, the reader and the futures' plumbing live in
connection.py, the regions a transfer names in regionclient.py. It uses
the Client's ``_call``, ``_send``, ``_result`` and ``query``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

from .connection import _Future, _set_exception, _set_result, _timeout_ms
from .errors import StageError, StageTimeout
from .protocol import wire
from .protocol.pieces import SubmitMore, head_of
from .protocol.wire import Code, Direction, LocalOp, QueryKind, State, XferStatus

__all__ = ["TransferRequests", "Op", "Block", "OpLike", "make_ops", "TransfersFailed", "DEFAULT_PIECE_OPS",
           "DEFAULT_FIRST_PIECE", "DEFAULT_PIECE"]

#: A submit of more ops than this goes in pieces when the sidecar takes them (PROTOCOL.md 9.5b): the
#: head carries DEFAULT_FIRST_PIECE ops, each later piece DEFAULT_PIECE. As the Go client's defaults
#: (client.DefaultPieceOps, measured there).
DEFAULT_PIECE_OPS = 16384
DEFAULT_FIRST_PIECE = 1024
DEFAULT_PIECE = 8192


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


class TransferRequests:
    """Submit, push, pull; wait (blocking, a future, asyncio, several at once), status, cancel."""

    # Set by Client.__init__ (the pieces' settings and the sidecar's limits, asked once); declared here.
    request_timeout: Optional[float]
    pieces_above: int
    first_piece: int
    piece_ops: int
    _pieces: Optional[Dict[str, Any]]
    # Client's: connection.py's and client.py's.
    _call: Callable[..., Any]
    _send: Callable[..., Tuple[int, _Future, str]]
    _result: Callable[..., Any]
    query: Callable[..., Any]

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
            raise StageTimeout("Wait for transfer %d: no answer from the sidecar in %.3gs"
                               % (transfer_id, local)) from None

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
        super().__init__(first.code, "%d of %d transfers failed: %s%s"
                         % (len(bad), len(self.transfer_ids), shown, more), first.status)

    @property
    def failed(self) -> List[Tuple[int, StageError]]:
        """(transfer id, its error) of each transfer that failed, in order."""
        return [(t, e) for t, e in zip(self.transfer_ids, self.errors) if e is not None]


def _final_status(st: Any, timeout: Optional[float]) -> XferStatus:
    if not isinstance(st, XferStatus):
        raise StageError(Code.INTERNAL, "Wait answered with %s" % type(st).__name__)
    if st.state == State.FAILED:
        raise StageError(st.code, st.message, st)
    if st.state != State.DONE:
        raise StageTimeout("transfer %d still %s after %.3gs (%d of %d B)"
                           % (st.transfer, State(st.state).name.lower(), timeout or 0, st.done, st.total), st)
    return st
