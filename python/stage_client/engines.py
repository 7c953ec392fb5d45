"""What the engine connectors (``stage_client.vllm``, ``stage_client.sglang``) share.

* Which rank moves which kv heads: :func:`head_slice` (a rank's heads, as
  vLLM and SGLang split them over tensor-parallel ranks), :func:`primary`
  (the heads a rank is the first holder of: with more ranks than kv heads a
  head is replicated, and only its first holder sends it, so no row moves
  twice) and :func:`plan` (every (source rank, destination rank, heads)
  pair of a transfer). Both sides compute the same plan from the tensor
  parallel sizes, so neither has to ask the other.
* Tags: a transfer's tag names the request's transfer key and the rank
  that started it (``key|p0/2``: prefill rank 0 of 2), so the side that
  did not start it knows from the notification what arrived and what is
  still to come.
* :class:`Coverage`: the token ranges each (source rank, layer) delivered,
  so a request is complete when every expected pair covers the tokens
  asked for, however the sender cut its pushes (layer by layer, chunk by
  chunk, again after a preemption).
* :class:`Mover`: a few threads per connector that talk to the sidecar, so
  the engine's forward pass never waits on the control socket, and one
  submit stuck on a peer that does not answer does not hold up the
  others; each transfer it starts is tracked per request
  (:class:`Ledger`) with a deadline, after which it is cancelled and
  counted as failed.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Set, Tuple

from .errors import StageError
from .protocol.wire import MAX_TAG

__all__ = ["head_slice", "primary", "plan", "Tag", "make_tag", "parse_tag", "Coverage", "Mover", "Ledger",
           "layer_index", "MAX_TP", "MOVER_THREADS", "grant_again"]

log = logging.getLogger("stage_client.engines")

#: the largest tensor-parallel size a tag may name: plan() walks every rank, so a
#: tag (which comes from the other side) must not make it walk a billion
MAX_TP = 1024
#: submit threads per connector: a submit that hangs (a peer that does not
#: answer) holds one of them, not every request's transfers
MOVER_THREADS = 4

_TAIL = re.compile(r"([pda])([0-9]{1,4})/([0-9]{1,4})")


def head_slice(heads: int, tp: int, rank: int) -> Tuple[int, int]:
    """Rank ``rank``'s kv heads out of ``heads`` over ``tp`` ranks: an even split,
    or one replicated head per rank when the ranks outnumber the heads."""
    if not 0 <= rank < tp or heads < 1:
        raise ValueError("rank %d of %d ranks, %d kv heads" % (rank, tp, heads))
    if tp <= heads:
        if heads % tp:
            raise ValueError("%d kv heads do not split over %d ranks" % (heads, tp))
        n = heads // tp
        return rank * n, (rank + 1) * n
    if tp % heads:
        raise ValueError("%d ranks do not replicate %d kv heads evenly" % (tp, heads))
    h = rank * heads // tp
    return h, h + 1


def primary(heads: int, tp: int, rank: int) -> Optional[Tuple[int, int]]:
    """The heads ``rank`` sends: those of its slice no lower rank holds (None: none)."""
    lo, hi = head_slice(heads, tp, rank)
    for r in range(rank):
        plo, phi = head_slice(heads, tp, r)
        if plo <= lo < phi:
            lo = phi
    return (lo, hi) if lo < hi else None


def plan(heads: int, src_tp: int, dst_tp: int) -> List[Tuple[int, int, int, int]]:
    """Every (src rank, dst rank, head_lo, head_hi) of a transfer from ``src_tp`` to ``dst_tp`` ranks.

    Each destination rank gets every head it holds exactly once, from the
    source rank that is that head's first holder.
    """
    out = []
    for s in range(src_tp):
        p = primary(heads, src_tp, s)
        if p is None:
            continue
        for d in range(dst_tp):
            dlo, dhi = head_slice(heads, dst_tp, d)
            lo, hi = max(p[0], dlo), min(p[1], dhi)
            if lo < hi:
                out.append((s, d, lo, hi))
    return out


class Tag(NamedTuple):
    """A parsed tag: transfer ``key``, ``side`` (``p``, ``d`` or ``a``), and the ``rank`` of ``tp`` ranks
    that started the transfer."""

    key: str
    side: str
    rank: int
    tp: int


def make_tag(key: str, side: str, rank: int, tp: int) -> str:
    """``key|<side><rank>/<tp>``: side ``p`` (prefill started it), ``d`` (decode did), or ``a`` (a prefill's aux bytes)."""
    if side not in ("p", "d", "a") or not 0 <= rank < tp <= MAX_TP:
        raise ValueError("tag side %r, rank %d of %d (at most %d ranks)" % (side, rank, tp, MAX_TP))
    tag = "%s|%s%d/%d" % (key, side, rank, tp)
    if len(tag.encode()) > MAX_TAG:
        raise ValueError("transfer key %r makes a tag over %d bytes" % (key[:64], MAX_TAG))
    return tag


def parse_tag(tag: str) -> Optional[Tag]:
    """The :class:`Tag` (key, side, rank, tp) of a tag :func:`make_tag` made; None for any other tag.

    Tags come from the other side's sidecar: only ASCII digits count (not
    every character str.isdigit accepts parses as an int), and the ranks
    are bounded by :data:`MAX_TP`.
    """
    if not isinstance(tag, str):
        return None
    key, sep, tail = tag.rpartition("|")
    m = _TAIL.fullmatch(tail) if sep else None
    if m is None:
        return None
    r, t = int(m.group(2)), int(m.group(3))
    if not 0 <= r < t <= MAX_TP:
        return None
    return Tag(key, m.group(1), r, t)


def layer_index(name: str, order: int) -> int:
    """A layer's index from its name (the last integer in ``model.layers.7.self_attn.attn``), else ``order``."""
    digits = [p for p in name.replace("_", ".").split(".") if p.isdigit()]
    return int(digits[0]) if digits else order


class Coverage:
    """Which tokens of [first, first + tokens) each (source rank, layer) delivered.

    ``expect`` is the set of (source rank, layer) pairs that must each cover
    the whole range; it may be set later (when the first notification says
    how many source ranks there are).
    """

    __slots__ = ("first", "tokens", "expect", "got")

    def __init__(self, first: int, tokens: int, expect: Optional[Set[Tuple[int, int]]] = None) -> None:
        self.first, self.tokens = first, tokens
        self.expect = expect
        self.got: Dict[Tuple[int, int], List[Tuple[int, int]]] = {}

    def add(self, src: int, layer: int, lo: int, hi: int) -> None:
        iv = self.got.setdefault((src, layer), [])
        iv.append((lo, hi))
        iv.sort()
        merged: List[Tuple[int, int]] = []
        for a, b in iv:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
            else:
                merged.append((a, b))
        self.got[(src, layer)] = merged

    def complete(self) -> bool:
        if self.expect is None:
            return False
        lo, hi = self.first, self.first + self.tokens
        for k in self.expect:
            if hi <= lo:
                continue
            if not any(a <= lo and hi <= b for a, b in self.got.get(k, ())):
                return False
        return True


@dataclass
class _Req:
    pending: Set[int] = field(default_factory=set)  # transfer ids not ended yet
    submitting: int = 0  # jobs queued that will add transfers
    error: Optional[BaseException] = None
    done: int = 0


class Ledger:
    """Per request: its transfers in flight, how many ended, the first failure. Thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._changed = threading.Condition(self.lock)  # a request's transfers were queued, started or ended
        self._reqs: Dict[str, _Req] = {}

    def queued(self, req: str) -> None:
        with self.lock:
            self._reqs.setdefault(req, _Req()).submitting += 1

    def submitted(self, req: str, tids: List[int], err: Optional[BaseException]) -> None:
        with self.lock:
            r = self._reqs.setdefault(req, _Req())
            r.submitting -= 1
            r.pending.update(tids)
            if err is not None and r.error is None:
                r.error = err
            self._changed.notify_all()

    def ended(self, req: str, tid: int, err: Optional[BaseException]) -> None:
        with self.lock:
            r = self._reqs.setdefault(req, _Req())
            r.pending.discard(tid)
            r.done += 1
            if err is not None and r.error is None:
                r.error = err
            self._changed.notify_all()

    def _idle(self, req: str) -> bool:
        r = self._reqs.get(req)
        return r is None or (not r.pending and r.submitting <= 0)

    def idle(self, req: str) -> bool:
        """Nothing queued or in flight for ``req``."""
        with self.lock:
            return self._idle(req)

    def wait_idle(self, req: str, timeout: float) -> bool:
        """Wait until :meth:`idle` (True) or ``timeout`` seconds passed (False)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._idle(req), max(0.0, timeout))

    def error(self, req: str) -> Optional[BaseException]:
        with self.lock:
            r = self._reqs.get(req)
            return None if r is None else r.error

    def transfers(self, req: str) -> List[int]:
        with self.lock:
            r = self._reqs.get(req)
            return [] if r is None else sorted(r.pending)

    def forget(self, req: str) -> None:
        with self.lock:
            self._reqs.pop(req, None)
            self._changed.notify_all()


class Mover:
    """Threads that submit transfers for the engine and follow them to their end.

    :meth:`submit` queues ``fn`` (which starts transfers and returns their
    ids) for request ``req``; ``event`` (a CUDA event, or None) is waited
    for first, so rows the GPU is still writing are not read. ``threads``
    threads take jobs in turn, in no order between them: a job whose
    submit waits on a dead peer's sidecar holds one thread and the others
    go on. Each transfer is awaited with ``timeout`` seconds; one that
    outlives it is cancelled. Ends and failures go to :attr:`ledger`.
    """

    def __init__(self, client: Any, timeout: float, name: str = "stage-mover", threads: int = MOVER_THREADS) -> None:
        if threads < 1:
            raise ValueError("stage mover: %d threads" % threads)
        self.client, self.timeout = client, timeout
        self.ledger = Ledger()
        self._q: "queue.Queue[Any]" = queue.Queue()
        self._cv = threading.Condition()
        self._queued = 0  # jobs not submitted yet
        self._closed = False
        self._threads = [threading.Thread(target=self._run, name="%s-%d" % (name, i), daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    def submit(self, req: str, fn: Callable[[], List[int]], event: Any = None) -> None:
        if self._closed:
            raise RuntimeError("stage mover closed")
        self.ledger.queued(req)
        with self._cv:
            self._queued += 1
        self._q.put((req, fn, event))

    def drain(self, timeout: float) -> bool:
        """Wait until every job queued so far has been submitted; False at the timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: self._queued <= 0, timeout)

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            try:
                self._one(*job)
            finally:
                with self._cv:
                    self._queued -= 1
                    self._cv.notify_all()

    def _one(self, req: str, fn: Callable[[], List[int]], event: Any) -> None:
        tids: List[int] = []
        err: Optional[BaseException] = None
        try:
            if event is not None:
                event.synchronize()
            tids = list(fn())
        except BaseException as e:  # noqa: B902 - recorded for the request, the engine goes on
            err = e
            log.warning("stage: starting a transfer for %s failed: %s", req, e)
        self.ledger.submitted(req, tids, err)
        for t in tids:
            self._follow(req, t)

    def _follow(self, req: str, tid: int) -> None:
        try:
            fut = self.client.wait_future(tid, self.timeout)
        except BaseException as e:  # noqa: B902
            self.ledger.ended(req, tid, e)
            return

        def done(f: Any) -> None:
            e = f.exception()
            if e is not None and isinstance(e, TimeoutError):
                # outlived its deadline: stop it so it writes nothing later (not from the reader thread)
                threading.Thread(target=self.cancel, args=(tid,), daemon=True).start()
            self.ledger.ended(req, tid, e)

        fut.add_done_callback(done)

    def wait(self, req: str, timeout: float) -> bool:
        """Wait until ``req``'s transfers were all submitted and ended (True) or ``timeout`` passed (False)."""
        return self.ledger.wait_idle(req, timeout)

    def cancel(self, tid: int) -> None:
        """Cancel transfer ``tid`` (logged when the sidecar refuses: it may have ended already)."""
        try:
            self.client.cancel(tid)
        except (StageError, OSError) as e:
            log.info("stage: cancelling transfer %d: %s", tid, e)

    def close(self, timeout: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._q.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


def now() -> float:
    return time.monotonic()


def grant_again(client: Any, cache: str, grants: List[Any], log: logging.Logger) -> None:
    """Make ``grants`` (:class:`~stage_client.connector_core.LiveGrant`: key, blocks, write, the time left,
    uses) again on KV cache ``cache`` of ``client``'s sidecar, which restarted and holds none (after the cache
    was registered anew); one it refuses is logged, and that request's transfer is refused and recomputed."""
    for g in grants:
        try:
            client.grant(cache, g.key, g.blocks, min(max(g.ttl, 0.001), 3600.0), write=g.write, uses=g.uses)
        except (StageError, OSError, ValueError) as e:
            log.warning("stage: granting %s of %d blocks of %s again after the restart: %s",
                        "writes" if g.write else "reads", len(g.blocks), cache, e)
    if grants:
        log.info("stage: %d grants on %s made again", len(grants), cache)
