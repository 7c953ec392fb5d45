"""The ticket requests of :class:`~stage_client.client.Client` (PROTOCOL.md 9.19).

A ticket is a short message from an engine to an engine behind a peer
sidecar, carried over the sidecars' authenticated session: in push mode a
decode's block table for the prefill, and the prefill's failure notice back.
:class:`TicketRequests` is a base of Client and uses only its ``_call``.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from .protocol.tickets import (MAX_TICKETS_OUT, TICKET_AUX, TICKET_FAILURE, TICKET_PUSH, OpenInbox, PostTicket,
                               TakeTickets, TicketItem)

__all__ = ["TicketRequests", "TicketItem", "TICKET_PUSH", "TICKET_FAILURE", "TICKET_AUX"]


class TicketRequests:
    """OpenInbox, PostTicket and TakeTickets."""

    _call: Callable[..., Any]

    def open_inbox(self, name: str) -> None:
        """Take the tickets peers address to ``name`` (this connection's and its group's until it closes);
        StageError EXISTS when another engine holds the name."""
        self._call(lambda r: OpenInbox(req=r, name=name))

    def post_ticket(self, route: str, key: str, body: bytes, *, peer: str = "", to: str = "",
                    kind: int = TICKET_PUSH, timeout: Optional[float] = None) -> None:
        """Send a ticket for transfer ``key`` to inbox ``to`` ("" : the peer's only one) of ``peer`` ("" : the
        route's only one); returns once the peer's sidecar queued it. StageError when it was refused (a full
        inbox: BUSY; no such inbox: UNKNOWN_REGION) or could not reach the peer."""
        self._call(lambda r: PostTicket(req=r, route=route, peer=peer, kind=kind, to=to, key=key, body=body),
                   timeout=timeout)

    def take_tickets(self, max_items: int = MAX_TICKETS_OUT, wait: float = 0.0) -> List[TicketItem]:
        """Up to ``max_items`` tickets waiting in this connection's group's inboxes, waiting up to ``wait``
        seconds for the first (an empty list when none came)."""
        ms = max(0, int(wait * 1000))
        m = self._call(lambda r: TakeTickets(req=r, max=min(max_items, MAX_TICKETS_OUT), wait_ms=ms),
                       timeout=wait + 10.0)
        return list(m.items)
