"""Push tickets over the sidecars' link (PROTOCOL.md 9.19), for :mod:`.scheduler`.

In push mode the decode's scheduler tells the prefill's where to push (a
*ticket*: its sidecar's peer name, its KV cache name, its tensor-parallel
size, the block ids and the token range), and the prefill's tells the
decode's at once when a push cannot happen (a *failure notice*, naming the
transfer key). Both travel over the link the two sidecars already hold,
authenticated by it: each scheduler opens a connection of its own to its
sidecar and an inbox named after its engine (``kv_name``); a peer's tickets
for that name wait in the sidecar, bounded, until the :class:`TicketLink`'s
thread takes them. A full inbox refuses a ticket, and the poster hears it
at once. (Before this, tickets went through a rendezvous server of their
own, :mod:`stage_client.rendezvous`, now deprecated.)
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable, Dict, Optional

from ..client import Client
from ..errors import SidecarConnectionError, StageError
from ..protocol.wire import Code
from ..reconnect import Backoff
from ..ticketclient import TICKET_FAILURE, TICKET_PUSH, TicketItem
from .compat import LOGGER
from .config import StageConfig, for_rank

__all__ = ["TicketLink", "TICKET_PUSH", "TICKET_FAILURE", "post_on", "failure_body"]

log = logging.getLogger(LOGGER)

MAX_FAILURE_TEXT = 1024  # bytes of a failure notice's reason

#: How long a post waits for the link's connection when there is none (the sidecar is restarting): a restart
#: takes well under a second, and the link dials again within a second of it.
LINK_WAIT = 2.0


def post_on(cl: Any, route: str, kind: int, key: str, body: bytes, peer: str, to: str, timeout: float) -> None:
    """Post a ticket with client ``cl`` on ``route``; where this sidecar has no such route (a decode that only
    receives pushes), on the session the peer dialed."""
    try:
        cl.post_ticket(route, key, body, peer=peer, to=to, kind=kind, timeout=timeout + 1.0)
    except StageError as e:
        if e.code != Code.UNKNOWN_ROUTE:
            raise
        cl.post_ticket("", key, body, peer=peer, to=to, kind=kind, timeout=timeout + 1.0)


def failure_body(why: str) -> bytes:
    """A failure notice's body: the reason, cut to MAX_FAILURE_TEXT bytes."""
    return why.encode("utf-8", "replace")[:MAX_FAILURE_TEXT]


class TicketLink:
    """The scheduler's connection to its sidecar for tickets: an inbox named ``cfg.kv_name`` whose tickets a
    thread hands to ``on_ticket``, and :meth:`post`. It connects (and reconnects) on that thread."""

    def __init__(self, cfg: StageConfig, on_ticket: Callable[[TicketItem], None],
                 connect: Optional[Callable[[], Any]] = None) -> None:
        self.cfg, self.on_ticket = cfg, on_ticket
        self._connect = connect or (lambda: Client(for_rank(cfg.socket, 0), request_timeout=cfg.timeout_s))
        self._lock = threading.Lock()
        self._client: Any = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stage-tickets", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float) -> bool:
        """Whether the inbox is open (waiting up to ``timeout``)."""
        return self._ready.wait(timeout)

    def post(self, kind: int, key: str, body: bytes, peer: str = "", to: str = "", timeout: float = 5.0) -> None:
        """Send a ticket to inbox ``to`` ("" : the only one) of ``peer`` on the configured route; StageError,
        OSError or SidecarConnectionError when refused or unreachable. A connection the sidecar dropped (it
        restarted) is waited out, up to LINK_WAIT, and the ticket posted on the next one: a second copy of
        a ticket that did arrive replaces the first."""
        stale: Any = None
        while True:
            cl = self._live(stale, min(timeout, LINK_WAIT))
            if cl is None:
                raise SidecarConnectionError("no connection to the sidecar (%s) for push tickets%s"
                                             % (self.cfg.socket, " again" if stale is not None else " yet"))
            try:
                post_on(cl, self.cfg.route, kind, key, body, for_rank(peer, 0), to, timeout)  # rank 0's sidecar
                return
            except SidecarConnectionError:
                if stale is not None or not cl.closed:
                    raise
                stale = cl

    def _live(self, stale: Any, wait: float) -> Any:
        """The link's open connection, not ``stale``, waiting up to ``wait`` for one; None when none came."""
        end = time.monotonic() + wait
        while True:
            if self._ready.is_set():
                with self._lock:
                    cl = self._client
                if cl is not None and cl is not stale and not cl.closed:
                    return cl
            left = end - time.monotonic()
            if left <= 0 or self._stop.is_set():
                return None
            self._stop.wait(min(left, 0.01))

    def post_ticket(self, key: str, ticket: Dict[str, Any], peer: str = "", to: str = "", timeout: float = 5.0) -> None:
        """:meth:`post` of a push ticket (a JSON object)."""
        self.post(TICKET_PUSH, key, json.dumps(ticket, separators=(",", ":")).encode(), peer, to, timeout)

    def post_failure(self, key: str, why: str, peer: str, to: str, timeout: float = 5.0) -> None:
        """:meth:`post` of a failure notice for transfer ``key``."""
        self.post(TICKET_FAILURE, key, failure_body(why), peer, to, timeout)

    def _run(self) -> None:
        warned, pause = False, Backoff(0.05, 1.0)  # pauses between dials: 50 ms doubling to 1 s, jittered
        while not self._stop.is_set():
            try:
                cl = self._connect()
            except (OSError, StageError) as e:
                if not warned:
                    log.warning("stage: no connection to the sidecar for push tickets (%s); retrying", e)
                    warned = True
                self._stop.wait(pause.next())
                continue
            try:
                cl.open_inbox(self.cfg.kv_name)
                with self._lock:
                    self._client = cl
                self._ready.set()
                warned = False
                pause.reset()
                while not self._stop.is_set():
                    for it in cl.take_tickets(wait=0.5):
                        self.on_ticket(it)
            except (OSError, StageError) as e:
                if not self._stop.is_set():
                    log.warning("stage: push tickets for %s: %s; reconnecting", self.cfg.kv_name, e)
                    self._stop.wait(pause.next())
            finally:
                self._ready.clear()
                with self._lock:
                    self._client = None
                cl.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
