"""The threads that start the engine connectors' transfers and follow them to their end.

:class:`Mover` runs a few threads per connector that talk to the sidecar,
so the engine's forward pass never waits on the control socket, and one
submit stuck on a peer that does not answer does not hold up the others.
Each transfer it starts is tracked per request (:class:`Ledger`) with a
deadline, after which it is cancelled and counted as failed.

A transfer cut short by a sidecar that went away is started again. When
either side's ``staged`` restarts under a transfer (a rolling update, a
crash and its restart), the transfer fails with the peer's session
closed (PEER_UNAVAILABLE), the peer shutting down (SHUTDOWN), or this
client's connection lost; the rows it was moving are still where they
were (a prefill holds its blocks until its pushes end, a decode's
blocks wait for its pull), and the restarted sidecar is back within a
second. So the job is run again, after a pause that grows, for up to
:data:`RETRY_WINDOW` seconds from its first cut and within the
transfer's timeout; only then does the failure count, and the engine
recomputes. A refusal (no grant, no such cache, a bad request) is never
retried: doing it again would get the same answer. Once transfers have
been cut short for longer than that window with none going through (a
peer down for good, not restarting), a job cut short for the first time
fails at once again, until a transfer goes through.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set

from .errors import SidecarConnectionError, StageError
from .protocol.wire import Code

__all__ = ["Ledger", "Mover", "MOVER_THREADS", "RETRY_CODES", "RETRY_WINDOW", "cut_short"]

log = logging.getLogger("stage_client.engines")

#: submit threads per connector: a submit that hangs (a peer that does not
#: answer) holds one of them, not every request's transfers
MOVER_THREADS = 4

#: the codes of a transfer cut short by a sidecar that went away (its session closed under the transfer,
#: its route's peer down while it restarts, or it shutting down): worth starting again
RETRY_CODES = frozenset({Code.PEER_UNAVAILABLE, Code.SHUTDOWN})

#: how long after its first cut a job is started again: a restarted staged is ready in well under a
#: second, its peers dial it again within another, and the engine registers its cache and grants anew
RETRY_WINDOW = 3.0

#: the pause before the first retry, doubled for each next one (at most RETRY_PAUSE_MAX)
RETRY_PAUSE = 0.1
RETRY_PAUSE_MAX = 1.0


def cut_short(e: BaseException, client: Any) -> bool:
    """Whether failure ``e`` of a transfer started on ``client`` is a sidecar going away (worth another try):
    the client's connection lost while it dials again, or a code of :data:`RETRY_CODES`."""
    if isinstance(e, SidecarConnectionError):
        return bool(getattr(client, "restores", False))  # a closed client, or one that does not redial: no
    return isinstance(e, StageError) and e.code in RETRY_CODES


@dataclass
class _Req:
    pending: Set[int] = field(default_factory=set)  # transfer ids not ended yet
    submitting: int = 0  # jobs queued that will add transfers
    error: Optional[BaseException] = None
    done: int = 0


class Ledger:
    """Per request: its transfers in flight, how many ended, the first failure. Thread-safe.

    The mover holds each request's record (:meth:`queued` returns it) and
    updates that record, so a request forgotten meanwhile (ended, or
    preempted) is not made again by a late end, and a retry of it is not
    started (:meth:`alive`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._changed = threading.Condition(self.lock)  # a request's transfers were queued, started or ended
        self._reqs: Dict[str, _Req] = {}

    def queued(self, req: str) -> _Req:
        """A job for ``req`` was queued: its record."""
        with self.lock:
            r = self._reqs.setdefault(req, _Req())
            r.submitting += 1
            return r

    def requeue(self, req: str, rec: _Req) -> bool:
        """Another run of a job of ``req`` is queued on record ``rec``; False when ``req`` was forgotten (the run
        must not happen)."""
        with self.lock:
            if self._reqs.get(req) is not rec:
                return False
            rec.submitting += 1
            return True

    def alive(self, req: str, rec: _Req) -> bool:
        """Whether ``rec`` is still ``req``'s record (not forgotten)."""
        with self.lock:
            return self._reqs.get(req) is rec

    def submitted(self, req: str, tids: List[int], err: Optional[BaseException], rec: Optional[_Req] = None) -> None:
        with self.lock:
            r = rec if rec is not None else self._reqs.setdefault(req, _Req())
            r.submitting -= 1
            r.pending.update(tids)
            if err is not None and r.error is None:
                r.error = err
            self._changed.notify_all()

    def ended(self, req: str, tid: int, err: Optional[BaseException], rec: Optional[_Req] = None) -> None:
        with self.lock:
            r = rec if rec is not None else self._reqs.setdefault(req, _Req())
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
        """Drop ``req``'s record: a job of it still to run again does not (its blocks may be reused)."""
        with self.lock:
            self._reqs.pop(req, None)
            self._changed.notify_all()


class _Job:
    """One run of a queued job: ``fn`` starts its transfers; ``rec`` is its request's record. ``attempt`` 0 is
    the first run; ``deadline`` (a timeout after the first run was taken up) bounds every run's transfers and when a
    run may start; ``cut`` is when a sidecar first cut it short (0: not yet);
    ``again`` once this run's retry is scheduled (a second transfer of the run cut short needs no second);
    ``why`` the failure this run is a retry of."""

    __slots__ = ("req", "fn", "event", "rec", "attempt", "deadline", "cut", "again", "why")

    def __init__(self, req: str, fn: Callable[[], List[int]], event: Any, rec: _Req, attempt: int = 0,
                 deadline: float = 0.0, cut: float = 0.0, why: Optional[BaseException] = None) -> None:
        self.req, self.fn, self.event, self.rec = req, fn, event, rec
        self.attempt, self.deadline, self.cut, self.why = attempt, deadline, cut, why
        self.again = False


class Mover:
    """Threads that submit transfers for the engine and follow them to their end.

    :meth:`submit` queues ``fn`` (which starts transfers and returns their
    ids) for request ``req``; ``event`` (a CUDA event, or None) is waited
    for first, so rows the GPU is still writing are not read. ``threads``
    threads take jobs in turn, in no order between them: a job whose
    submit waits on a dead peer's sidecar holds one thread and the others
    go on. Each transfer is awaited with ``timeout`` seconds; one that
    outlives it is cancelled. A job cut short by a sidecar going away runs
    again (see the module doc; :attr:`retries` counts the runs again, and
    ``on_retry`` is called for each).
    Ends and failures go to :attr:`ledger`.
    """

    def __init__(self, client: Any, timeout: float, name: str = "stage-mover", threads: int = MOVER_THREADS,
                 on_retry: Optional[Callable[[], None]] = None) -> None:
        if threads < 1:
            raise ValueError("stage mover: %d threads" % threads)
        self.client, self.timeout, self._on_retry = client, timeout, on_retry
        self.ledger = Ledger()
        self.retries = 0  # jobs run again after a sidecar cut them short
        self._cut_since = 0.0  # when transfers began being cut short with none going through since (0: not)
        self._q: "queue.Queue[Any]" = queue.Queue()
        self._cv = threading.Condition()
        self._queued = 0  # jobs not submitted yet
        self._closed = False
        self._timers: Set[threading.Timer] = set()  # retries waiting out their pause
        self._threads = [threading.Thread(target=self._run, name="%s-%d" % (name, i), daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    def submit(self, req: str, fn: Callable[[], List[int]], event: Any = None) -> None:
        if self._closed:
            raise RuntimeError("stage mover closed")
        rec = self.ledger.queued(req)
        with self._cv:
            self._queued += 1
        self._q.put(_Job(req, fn, event, rec))

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
                self._one(job)
            finally:
                with self._cv:
                    self._queued -= 1
                    self._cv.notify_all()

    def _one(self, job: _Job) -> None:
        led = self.ledger
        if job.attempt and (not led.alive(job.req, job.rec) or time.monotonic() >= job.deadline):
            # forgotten (its blocks may be in use again), or past its deadline: this run does not happen, and the
            # failure it was to make good is the request's
            led.submitted(job.req, [], job.why, job.rec)
            return
        job.deadline = job.deadline or time.monotonic() + self.timeout
        tids: List[int] = []
        err: Optional[BaseException] = None
        try:
            if job.event is not None:
                job.event.synchronize()
                job.event = None  # a run again reads rows already written
            tids = list(job.fn())
        except BaseException as e:  # noqa: B902 - recorded for the request, the engine goes on
            if self._again(job, e):
                led.submitted(job.req, [], None, job.rec)
                return
            err = e
            log.warning("stage: starting a transfer for %s failed: %s", job.req, e)
        led.submitted(job.req, tids, err, job.rec)
        for t in tids:
            self._follow(job, t)

    def _follow(self, job: _Job, tid: int) -> None:
        req, led = job.req, self.ledger
        try:
            fut = self.client.wait_future(tid, max(job.deadline - time.monotonic(), 0.001))
        except BaseException as e:  # noqa: B902
            led.ended(req, tid, None if self._again(job, e) else e, job.rec)
            return

        def done(f: Any) -> None:
            e = f.exception()
            if e is None:
                with self._cv:
                    self._cut_since = 0.0  # transfers go through again
            elif isinstance(e, TimeoutError):
                # outlived its deadline: stop it so it writes nothing later (not from the reader thread)
                threading.Thread(target=self.cancel, args=(tid,), daemon=True).start()
            elif self._again(job, e):
                e = None  # this run's failure is not the request's: the next run's end is
            led.ended(req, tid, e, job.rec)

        fut.add_done_callback(done)

    def _again(self, job: _Job, e: BaseException) -> bool:
        """Whether ``job``, which failed with ``e``, runs again: a sidecar cut it short, its request is not
        forgotten, and it is within its window and its deadline. The next run is queued (and the request kept
        busy) before this returns."""
        if self._closed or not cut_short(e, self.client):
            return False
        now = time.monotonic()
        with self._cv:
            if job.again:
                return True  # another transfer of this run was cut: its retry is on the way
            self._cut_since = self._cut_since or now
            if not job.cut and now - self._cut_since > RETRY_WINDOW:
                return False  # cut for longer than a restart takes, nothing through: fail at once
            cut = job.cut or now
            pause = min(RETRY_PAUSE * (2 ** job.attempt), RETRY_PAUSE_MAX)
            if now + pause > cut + RETRY_WINDOW or now + pause >= job.deadline:
                return False
            if not self.ledger.requeue(job.req, job.rec):
                return False  # forgotten: its blocks may be in use again
            job.again = True
            self._queued += 1
            self.retries += 1
            nxt = _Job(job.req, job.fn, None, job.rec, job.attempt + 1, job.deadline, cut, e)
            t = threading.Timer(pause, self._requeue, args=(nxt,))
            t.daemon = True
            self._timers.add(t)
        log.info("stage: a transfer for %s was cut short (%s); starting it again in %.1fs", job.req, e, pause)
        t.start()
        if self._on_retry is not None:
            self._on_retry()
        return True

    def _requeue(self, job: _Job) -> None:
        with self._cv:
            self._timers.discard(threading.current_thread())  # type: ignore[arg-type]
            if self._closed:
                self._queued -= 1
                self._cv.notify_all()
                return
        self._q.put(job)

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
        with self._cv:
            timers, self._timers = self._timers, set()
        for t in timers:
            t.cancel()
        for _ in self._threads:
            self._q.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
