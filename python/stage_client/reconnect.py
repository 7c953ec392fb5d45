"""Coming back after the sidecar restarts: backoff, the reconnecting thread, rate-limited warnings.

A :class:`~stage_client.client.Client` made with ``reconnect=True`` (or a
:class:`Backoff`) outlives its connection. When the sidecar closes it
(restart, crash, upgrade), the calls in flight fail once with
SidecarConnectionError, as without reconnecting; calls made while the
client is away fail at once the same way, or, with ``reconnect_wait``,
wait for the new connection until that long after the loss.
One thread, :class:`Reconnector`, then dials the socket again after a
jittered, growing pause (at most :attr:`Backoff.maximum` seconds apart;
no busy loop), and on the new connection joins the client's group again,
subscribes again where the client has subscriptions (they carry on; what
the sidecar notified while away is lost), and runs the client's
``on_reconnect`` callbacks in order, which register again what the
connection owned (regions are a connection's: PROTOCOL.md 9.18). Only
then do other calls go through. A callback that fails makes the client
drop that connection and try again after the next pause. ``close()``
stops it all and joins the thread.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from typing import Any, Callable, Dict, Optional

__all__ = ["Backoff", "Reconnector", "RateLimited", "failure_kind"]

log = logging.getLogger("stage_client")


class Backoff:
    """Pauses between attempts: ``initial`` seconds, times ``factor`` each
    attempt, at most ``maximum``; each drawn uniformly from [d/2, d] (so
    clients of a restarted sidecar do not all dial at once)."""

    def __init__(self, initial: float = 0.05, maximum: float = 2.0, factor: float = 2.0,
                 rand: Callable[[], float] = random.random) -> None:
        if not 0 < initial <= maximum or factor < 1:
            raise ValueError("Backoff: need 0 < initial (%r) <= maximum (%r) and factor (%r) >= 1"
                             % (initial, maximum, factor))
        self.initial, self.maximum, self.factor, self._rand = initial, maximum, factor, rand
        self._d = initial

    def next(self) -> float:
        """The next pause, in seconds."""
        d = self._d
        self._d = min(self.maximum, d * self.factor)
        return d / 2 + self._rand() * d / 2

    def reset(self) -> None:
        self._d = self.initial


_VARYING = re.compile(r'"[^"]*"|\'[^\']*\'|\b[0-9a-f]{8,}\b|[-0-9a-f]{36}|\d+')


def failure_kind(why: str) -> str:
    """``why`` without what varies from one failure of a cause to the next (names, ids, numbers): a
    :class:`RateLimited` kind."""
    return _VARYING.sub("", why)[:120]


class RateLimited:
    """A log line at most once per ``every`` seconds and kind; the lines held back in between are counted in
    the next of their kind.

    ``kind`` (default: one kind) keeps different causes apart: a run of one failure must not hide the
    first line of another. At most ``kinds`` kinds are remembered; the one logged longest ago is forgotten
    first (its next line goes out at once).
    """

    def __init__(self, logger: logging.Logger, every: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 kinds: int = 16) -> None:
        self.logger, self.every, self._clock, self._kinds = logger, every, clock, max(1, kinds)
        self._last: Dict[str, float] = {}  # kind -> when its last line went out
        self._held: Dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, level: int, msg: str, *args: Any, kind: str = "") -> bool:
        """Log ``msg % args`` unless a line of ``kind`` went out less than ``every`` seconds ago; True when
        it was logged."""
        with self._lock:
            now = self._clock()
            last = self._last.get(kind)
            if last is not None and now - last < self.every:
                self._held[kind] = self._held.get(kind, 0) + 1
                return False
            held = self._held.pop(kind, 0)
            self._last.pop(kind, None)
            self._last[kind] = now  # dicts keep insertion order: the first key is the oldest line
            while len(self._last) > self._kinds:
                old = next(iter(self._last))
                del self._last[old]
                self._held.pop(old, None)
        if held:
            msg += " (and %d more like it in the last %.0fs)" % (held, self.every)
        self.logger.log(level, msg, *args)
        return True


class Reconnector:
    """The thread that brings a client's connection back (see the module doc).

    ``client`` provides ``_dial() -> socket``, ``_adopt(sock) -> bool``
    (installs it and starts its reader; False when the client is closing),
    ``_resume()`` (Join, Subscribe, callbacks: on this thread) and
    ``_resumed()`` (lets other calls through again).
    """

    def __init__(self, client: Any, backoff: Backoff) -> None:
        self.client, self.backoff = client, backoff
        self._lost = threading.Event()
        self._stop = threading.Event()
        self.reconnects = 0  # connections brought back
        self._warn = RateLimited(log, 10.0)
        self._thread = threading.Thread(target=self._run, name="stage-client-reconnect", daemon=True)
        self._thread.start()

    @property
    def ident(self) -> Optional[int]:
        return self._thread.ident

    def lost(self) -> None:
        """The connection ended (called by its reader thread)."""
        self._lost.set()

    def stop(self) -> None:
        self._stop.set()
        self._lost.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():  # checked before each wait: _attempt may clear the wake-up stop() set
            self._lost.wait()
            if self._stop.is_set():
                return
            self._lost.clear()
            self.backoff.reset()
            attempt = 0
            while not self._stop.is_set():
                attempt += 1
                if self._stop.wait(self.backoff.next()):
                    return
                if self._attempt(attempt):
                    break

    def _attempt(self, attempt: int) -> bool:
        """One dial and resume; True once the client is back (or closing)."""
        c = self.client
        try:
            sock = c._dial()
        except OSError as e:
            self._warn(logging.WARNING, "stage: the sidecar at %s is away (attempt %d): %s; retrying", c.path,
                       attempt, e)
            return False
        if not c._adopt(sock):
            return True  # closing
        try:
            c._resume()
        except Exception as e:  # noqa: BLE001 - a callback's failure: drop this connection and try again
            self._warn(logging.WARNING, "stage: reconnected to the sidecar at %s but could not restore the "
                       "connection's state (attempt %d): %s; retrying", c.path, attempt, e)
            c._drop()  # ends the connection and joins its reader, which called lost()
            self._lost.clear()
            return False
        self.reconnects += 1
        c._resumed()
        log.warning("stage: reconnected to the sidecar at %s after %d attempt(s); group, subscriptions and "
                    "registrations restored", c.path, attempt)
        return True
