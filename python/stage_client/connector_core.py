"""The engine connectors' bookkeeping: what each transfer of a request is waiting for, and what ends it.

A pure core, as the sidecar's receive core is: no socket, no sidecar call,
no thread, no clock and no torch. The connectors feed it what happened
(a step's instructions, a notification, "vLLM says these requests
finished", the time) and it answers with what to do (grants to make and
revoke, requests to report sent or received, failures to tell); the
connector performs that outside (:mod:`stage_client.vllm.worker`,
:mod:`stage_client.sglang.core`). The caller serialises the calls (one
lock of its own); nothing here blocks.

* :class:`Receives`: transfers arriving into this rank's cache (a vLLM
  decode's requests, an SGLang decode's rooms), by owner's key with an
  index by transfer key; each tracks the rows that landed (a
  :class:`~stage_client.engines.Coverage` over the (source rank, layer)
  pairs the head plan says to expect) and the first error. vLLM's
  scheduler keeps its push receives' transfer keys in one too (bounded),
  to find the request a failure notice names.
* :class:`LiveGrants`: the grants a rank made and has not ended, to make
  again on a sidecar that restarted (a new sidecar holds none).
* :class:`WorkerCore`: one vLLM worker's state: receives; holds (a pull
  mode prefill's blocks kept for the decode's pulls, with the grant to
  revoke once every pull expected was served); seals (pushes that will
  not grow, reported sent once their transfers ended); grants not yet
  held; notifications that came before their request (kept, bounded:
  when full, those no receive took within the timeout go first); where
  each push goes (for failure notices); the block ids whose load failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple

from .engines import Coverage, Tag, plan
from .mover import RETRY_CODES
from .protocol.wire import Code

__all__ = ["MAX_EARLY", "MAX_LIVE_GRANTS", "LiveGrants", "Receive", "Receives", "Hold", "PushDest", "FailedPush", "FailedLoad", "Finished", "Absorbed",
           "Noted", "WorkerCore", "code_text"]

#: notifications kept for transfer keys not known yet (those of a transfer no receive came for within the
#: core's timeout are dropped first: a failed push's notice after its receive ended, say)
MAX_EARLY = 65536

#: a receive still waiting when the connection that would have told of it closed
DISCONNECTED = "the sidecar closed its connection (restarted?) while the KV arrived"


def code_text(code: int) -> str:
    """A notification's code as its name (``UNKNOWN_ROUTE``), ``code(N)`` for a code this client does not know."""
    try:
        return Code(code).name
    except ValueError:
        return "code(%d)" % int(code)


class Receive:
    """One transfer arriving into this rank's cache: rows ``[first, first + tokens)`` (registered units).

    ``pull``: this side pulls it (its end is the pull's, not the
    notifications'). ``blocks``: the engine's blocks it lands in (failed
    with it). ``key``: a grant of the peer's writes this side made for it
    (revoked when it ends). ``aux``: SGLang's aux slot that must land too
    (None: none), ``aux_landed`` once it did. ``cov``: what landed.
    ``cut``: why a push into it was cut short by a sidecar going away (its
    sender starts it again; "" while none was), told when it times out.
    """

    __slots__ = ("req", "xfer", "first", "tokens", "deadline", "pull", "blocks", "error", "key", "aux", "aux_landed",
                 "cut", "_cov")

    def __init__(self, req: str, xfer: str, first: int, tokens: int, deadline: float = float("inf"),
                 pull: bool = False, blocks: Sequence[int] = (), error: str = "") -> None:
        self.req, self.xfer, self.first, self.tokens, self.deadline = req, xfer, first, tokens, deadline
        self.pull, self.blocks, self.error = pull, blocks, error
        self.key = b""
        self.aux: Optional[int] = None
        self.aux_landed = False
        self.cut = ""
        self._cov: Optional[Coverage] = None  # made at the first look: vLLM's scheduler keeps many, never filled

    @property
    def cov(self) -> Coverage:
        if self._cov is None:
            self._cov = Coverage(self.first, self.tokens)
        return self._cov

    def arriving(self) -> bool:
        """Neither failed nor complete (a pull's end is the mover's, not this)."""
        return not self.error and not self.cov.complete()

    def overdue(self, timeout: float) -> str:
        """Why it failed at its deadline, ``timeout`` seconds after it began (and what cut it short, if aught)."""
        why = "not complete after %ss" % timeout
        return why + " (%s, and not pushed again in time)" % self.cut if self.cut else why


class Receives:
    """Transfers arriving into one rank (``rank`` of ``tp``, ``heads`` kv heads, ``layers`` layers).

    By the owner's key (vLLM: the request id; SGLang: the room), with an
    index by transfer key for notifications. ``limit`` > 0 keeps at most
    that many, the oldest dropped first.
    """

    def __init__(self, heads: int, tp: int, rank: int, layers: int = 0, limit: int = 0) -> None:
        self.heads, self.tp, self.rank, self.layers, self.limit = heads, tp, rank, layers, limit
        self._by_req: Dict[str, Receive] = {}
        self._by_xfer: Dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._by_req)

    def __iter__(self) -> Iterator[Receive]:
        return iter(list(self._by_req.values()))

    def add(self, r: Receive) -> Receive:
        """Track ``r`` (in place of one of the same request)."""
        self.pop(r.req)
        self._by_req[r.req] = r
        self._by_xfer[r.xfer] = r.req
        while self.limit and len(self._by_req) > self.limit:
            self.pop(next(iter(self._by_req)))
        return r

    def get(self, req: str) -> Optional[Receive]:
        return self._by_req.get(req)

    def by_xfer(self, xfer: str) -> Optional[Receive]:
        req = self._by_xfer.get(xfer)
        return None if req is None else self._by_req.get(req)

    def pop(self, req: str) -> Optional[Receive]:
        r = self._by_req.pop(req, None)
        if r is not None and self._by_xfer.get(r.xfer) == req:
            del self._by_xfer[r.xfer]
        return r

    def pop_xfer(self, xfer: str) -> Optional[Receive]:
        """Stop tracking the receive of transfer ``xfer``; it, or None when none is tracked."""
        req = self._by_xfer.get(xfer)
        return None if req is None else self.pop(req)

    def fail(self, req: str, why: str) -> None:
        """Fail ``req`` with ``why`` unless it failed already (unknown: nothing)."""
        r = self._by_req.get(req)
        if r is not None and not r.error:
            r.error = why

    def disconnected(self) -> None:
        """The connection the notifications come on closed (the sidecar restarted): a push still arriving keeps
        waiting, to its deadline. Its sender saw it cut short too and pushes it again into the restarted sidecar
        (:mod:`stage_client.mover`); the rows it landed before are filed again then. (A pull in flight failed with
        the connection, and the mover pulls it again.)"""
        for r in self._by_req.values():
            if not r.pull and r.arriving():
                r.cut = r.cut or DISCONNECTED

    def file(self, r: Receive, tag: Tag, code: int, message: str, layers: List[int], first: int,
             tokens: int) -> None:
        """A push into this rank's cache ended (its notification): what it delivered, or why it failed. A push
        cut short by a sidecar going away (:data:`~stage_client.mover.RETRY_CODES`) fails nothing: its sender
        starts it again, or tells of its failure, and the deadline bounds the wait."""
        if code in RETRY_CODES:
            r.cut = r.cut or "a push from prefill rank %d was cut short: %s (%s)" % (tag.rank, message,
                                                                                 code_text(code))
            return
        if code != Code.OK:
            r.error = r.error or "a push from prefill rank %d failed: %s (%s)" % (tag.rank, message, code_text(code))
            return
        if r.cov.expect is None:
            try:
                srcs = {s for s, d, _, _ in plan(self.heads, tag.tp, self.tp) if d == self.rank}
            except ValueError as e:  # the tag names a split of the heads this side cannot make
                r.error = r.error or "a push from prefill rank %d of %d: %s" % (tag.rank, tag.tp, e)
                return
            r.cov.expect = {(s, layer) for s in srcs for layer in range(self.layers)}
        for layer in layers:
            r.cov.add(tag.rank, int(layer), first, first + tokens)

    def file_note(self, r: Receive, tag: Tag, n: Any) -> None:
        """:meth:`file` a notification (``code``, ``message``, ``layers``, ``first``, ``tokens``)."""
        self.file(r, tag, n.code, n.message, n.layers, n.first, n.tokens)


@dataclass
class Hold:
    """A pull-mode prefill's blocks held for the decode's pulls until ``deadline``.

    ``expect``: the decode ranks that pull from this rank (None until the
    first pull's tag says the decode's TP); ``got``: those that did.
    ``key``: the grant they pull with, until revoked.
    """

    xfer: str
    deadline: float
    expect: Optional[Set[int]] = None
    got: Set[int] = field(default_factory=set)
    key: bytes = b""

    def served(self) -> bool:
        return self.expect is not None and self.expect <= self.got


class PushDest(NamedTuple):
    """Where a prefill's pushes of one transfer go: the decode told when they fail."""

    xfer: str
    peer: str
    kv: str


class FailedPush(NamedTuple):
    req: str
    xfer: str
    error: BaseException
    dest: Optional[PushDest]


class FailedLoad(NamedTuple):
    req: str
    xfer: str
    why: str


@dataclass
class Finished:
    """What :meth:`WorkerCore.finish` decided: requests to report, grants to revoke, failures to tell."""

    sending: Set[str] = field(default_factory=set)
    recving: Set[str] = field(default_factory=set)
    revoke: List[bytes] = field(default_factory=list)
    failed_pushes: List[FailedPush] = field(default_factory=list)
    failed_loads: List[FailedLoad] = field(default_factory=list)
    expired: List[Tuple[str, str]] = field(default_factory=list)  # (req, xfer): holds whose lease ran out unpulled


class Absorbed(NamedTuple):
    """What a step's instructions ask for: grants to make (key, blocks), keys to revoke, warnings to log."""

    grants: List[Tuple[bytes, List[int]]]
    revoke: List[bytes]
    warnings: List[str]


class Noted(NamedTuple):
    """What a notification asks for: a grant to revoke (every pull it expected was served), a warning."""

    revoke: bytes = b""
    warning: str = ""


#: a request's transfers on the mover: (nothing queued or in flight, the first failure)
Progress = Callable[[str], Tuple[bool, Optional[BaseException]]]


#: grants remembered for a restarted sidecar (the oldest go first past it; a rank holds one per request in flight)
MAX_LIVE_GRANTS = 65536


class LiveGrant(NamedTuple):
    key: bytes
    blocks: List[int]
    write: bool
    ttl: float  # seconds left
    uses: int


class LiveGrants:
    """The grants a rank made and has not ended: a sidecar that restarts holds none, so the rank makes these
    again on the new one (with the time they have left), and a decode's pull of a request the prefill finished
    before the restart, or a prefill's push into a decode's blocks, is admitted instead of recomputed."""

    def __init__(self, limit: int = MAX_LIVE_GRANTS) -> None:
        self.limit = limit
        self._g: Dict[bytes, Tuple[List[int], bool, float, int]] = {}  # key -> (blocks, write, expires, uses)

    def __len__(self) -> int:
        return len(self._g)

    def made(self, key: bytes, blocks: Sequence[int], write: bool, ttl: float, uses: int, now: float) -> None:
        """A grant was made at ``now`` for ``ttl`` seconds."""
        self._g.pop(key, None)
        self._g[key] = (list(blocks), write, now + ttl, uses)
        while len(self._g) > self.limit:
            del self._g[next(iter(self._g))]

    def ended(self, key: bytes) -> None:
        """A grant was revoked (or its request is over)."""
        self._g.pop(key, None)

    def live(self, now: float) -> List[LiveGrant]:
        """The grants not expired at ``now``, oldest first, with the time each has left; the expired go."""
        out = []
        for key, (blocks, write, expires, uses) in list(self._g.items()):
            if expires <= now:
                del self._g[key]
            else:
                out.append(LiveGrant(key, blocks, write, expires - now, uses))
        return out


class WorkerCore:
    """One vLLM worker rank's bookkeeping (see the module doc). Not thread-safe: the worker locks.

    ``heads`` kv heads over ``tp`` ranks, this is ``rank``; a receive not
    complete ``timeout`` seconds after it was announced fails (a pull gets
    a second more: its own wait ends at ``timeout``).
    """

    def __init__(self, heads: int, tp: int, rank: int, timeout: float) -> None:
        self.heads, self.tp, self.rank, self.timeout = heads, tp, rank, timeout
        self.receives = Receives(heads, tp, rank)
        self.held: Dict[str, Hold] = {}
        self._held_by_xfer: Dict[str, str] = {}
        self.sealed: Dict[str, str] = {}  # req -> xfer: nothing more will be pushed
        self._granted: Dict[str, bytes] = {}  # req -> the key its blocks are granted under, until held
        self._early: Dict[str, List[Tuple[Tag, Any]]] = {}
        self._early_at: Dict[str, float] = {}  # when each transfer's first early notice came, oldest first
        self._early_n = 0
        self._push_to: Dict[str, PushDest] = {}
        self._seen: Set[str] = set()  # request ids vLLM said finished
        self._errors: Set[int] = set()

    @property
    def layers(self) -> int:
        return self.receives.layers

    @layers.setter
    def layers(self, n: int) -> None:
        self.receives.layers = n

    # ------------------------------------------------------------------
    # a step's instructions

    def absorb(self, seal: Dict[str, str], grant: Dict[str, Tuple[bytes, List[int]]], revoke: List[Tuple[str, bytes]],
               hold: Dict[str, Tuple[str, float]], now: float, replica: bool) -> "Absorbed":
        """Take a step's seals, grants, grant ends and holds (``replica``: this rank is no head's first
        holder, so no decode pulls from it): the grants to make and the keys to revoke."""
        self.sealed.update(seal)
        out = Absorbed([] if replica else [(k, b) for k, b in grant.values()], [], [])
        gone = out.revoke
        gone.extend(k for rid, k in revoke if self._granted.pop(rid, None) is not None)
        if not replica:
            self._granted.update((rid, k) for rid, (k, _) in grant.items())
        for rid, (xfer, lease) in hold.items():
            h = Hold(xfer, now + lease, key=self._granted.pop(rid, b""))
            if replica:
                h.expect = set()
            self.held[rid] = h
            self._held_by_xfer[xfer] = rid
            for t, n in self._take_early(xfer):
                noted = self._note_pull(h, t, n.code)
                if noted.revoke:
                    gone.append(noted.revoke)
                if noted.warning:
                    out.warnings.append(noted.warning)
        return out

    def receive(self, r: Receive) -> None:
        """A receive starts (its grant made or its pulls queued, or failed already: ``r.error``); notifications
        that came before it are filed now."""
        self.receives.add(r)
        for t, n in self._take_early(r.xfer):
            self.receives.file_note(r, t, n)

    def fail(self, failed: Dict[str, str]) -> None:
        """The scheduler says these receives cannot arrive (their push tickets were not posted)."""
        for rid, why in failed.items():
            self.receives.fail(rid, why)

    def pushing(self, req: str, dest: PushDest) -> None:
        self._push_to[req] = dest

    def disconnected(self) -> None:
        self.receives.disconnected()

    # ------------------------------------------------------------------
    # notifications

    def note(self, tag: Tag, n: Any, now: Optional[float] = None) -> Noted:
        """File one notification of this rank's cache under its transfer, or keep it until the transfer is
        known (at most :data:`MAX_EARLY`; when full, those kept longer than the timeout before ``now`` go)."""
        if tag.side == "p":
            r = self.receives.by_xfer(tag.key)
            if r is not None:
                self.receives.file_note(r, tag, n)
                return Noted()
        else:
            rid = self._held_by_xfer.get(tag.key)
            if rid is not None:
                return self._note_pull(self.held[rid], tag, n.code)
        if self._early_n >= MAX_EARLY and now is not None:
            self._expire_early(now - self.timeout)
        if self._early_n < MAX_EARLY:
            self._early.setdefault(tag.key, []).append((tag, n))
            self._early_at.setdefault(tag.key, now if now is not None else 0.0)
            self._early_n += 1
        return Noted()

    def _expire_early(self, before: float) -> None:
        """Drop the notices of transfers whose first one came before ``before`` (no receive took them)."""
        for xfer, at in list(self._early_at.items()):
            if at >= before:
                break
            self._take_early(xfer)

    def _take_early(self, xfer: str) -> List[Tuple[Tag, Any]]:
        notes = self._early.pop(xfer, [])
        self._early_at.pop(xfer, None)
        self._early_n -= len(notes)
        return notes

    def _note_pull(self, h: Hold, tag: Tag, code: int) -> Noted:
        """A decode rank's pull from this rank ended. Its grant's key once every pull expected was served. A
        pull cut short by a sidecar going away (:data:`~stage_client.mover.RETRY_CODES`) was not served: the
        decode pulls again, under the same grant."""
        if code in RETRY_CODES:
            return Noted()
        if h.expect is None:
            try:
                h.expect = {d for s, d, _, _ in plan(self.heads, self.tp, tag.tp) if s == self.rank}
            except ValueError as e:  # not a decode of this model: the lease frees the blocks
                return Noted(warning="pull of %s by decode rank %d of %d ignored: %s" % (h.xfer, tag.rank, tag.tp, e))
        h.got.add(tag.rank)
        if h.key and h.served():
            key, h.key = h.key, b""
            return Noted(revoke=key)
        return Noted()

    # ------------------------------------------------------------------
    # vLLM's get_finished

    def finish(self, finished: Set[str], now: float, progress: Progress) -> Finished:
        """Requests whose transfers ended: sealed pushes whose transfers are idle, holds pulled or past their
        lease, receives that arrived or failed; ``finished`` are those vLLM says finished this step."""
        out = Finished()
        self._seen |= finished
        for rid in [r for r in self.sealed if r in self._seen]:
            idle, err = progress(rid)
            if not idle:
                continue
            dest = self._push_to.pop(rid, None)
            if err is not None:
                out.failed_pushes.append(FailedPush(rid, self.sealed[rid], err, dest))
            out.sending.add(rid)
            del self.sealed[rid]
        for rid, h in list(self.held.items()):
            if rid in self._seen and (h.served() or now > h.deadline):
                if not h.served():
                    out.expired.append((rid, h.xfer))
                out.sending.add(rid)
                del self.held[rid]
                self._held_by_xfer.pop(h.xfer, None)
                if h.key:
                    out.revoke.append(h.key)
        for r in self.receives:
            why = self.state(r, now, progress)
            if why is None:
                continue
            if why:
                out.failed_loads.append(FailedLoad(r.req, r.xfer, why))
                self._errors.update(r.blocks)
            out.recving.add(r.req)
            self.receives.pop(r.req)
            if r.key:
                out.revoke.append(r.key)
        self._seen -= out.sending
        return out

    def state(self, r: Receive, now: float, progress: Progress) -> Optional[str]:
        """None: still arriving; "": arrived; else why it failed."""
        if r.error:
            return r.error
        if r.pull:
            idle, err = progress(r.req)
            if idle:
                return "" if err is None else str(err)
        elif r.cov.complete():
            return ""
        if now > r.deadline + (1.0 if r.pull else 0.0):
            return r.overdue(self.timeout)
        return None

    def take_errors(self) -> Set[int]:
        """The block ids whose load failed since the last call."""
        out, self._errors = self._errors, set()
        return out

