"""Tickets (154-157): short messages between engines behind two sidecars (PROTOCOL.md 9.19).

An engine connection opens an inbox (:class:`OpenInbox`, a name that is its
and its group's until it closes); a peer engine posts a ticket for it on its
own sidecar (:class:`PostTicket`), which carries it over the sidecars'
authenticated session; the ticket waits in the inbox, bounded, until one of
the group's connections takes it (:class:`TakeTickets`, answered
:class:`Tickets`). In push mode a decode posts its block table (kind
``TICKET_PUSH``) and a prefill posts back why a push cannot happen
(``TICKET_FAILURE``); a prefill sends SGLang's aux bytes of a request
(``TICKET_AUX``). The Go package ``wire`` (ticket.go) is the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Tuple

from .codec import _Dec, _Enc
from .enums import FrameType
from .fields import Field, FieldMessage, bytes32, get_fields, put_fields, str16, u16, u32, u64
from .limits import MAX_NAME, MAX_TAG

__all__ = ["OpenInbox", "PostTicket", "TakeTickets", "Tickets", "TicketItem", "TICKET_PUSH", "TICKET_FAILURE",
           "TICKET_AUX", "TICKET_KINDS",
           "MAX_TICKET_BODY", "MAX_TICKETS_OUT"]

TICKET_PUSH = 1  # the body says where to push (a decode's block table, JSON)
TICKET_FAILURE = 2  # the body says why the transfer of the key cannot happen (UTF-8 text)
TICKET_AUX = 3  # the body is bytes the receiving engine stores (SGLang's aux metadata of a request)
TICKET_KINDS = (TICKET_PUSH, TICKET_FAILURE, TICKET_AUX)
MAX_TICKET_BODY = 256 << 10
MAX_TICKETS_OUT = 256
_MIN_ITEM = 2 + 1 + 2 + 2 + 4


def _get_kind(d: _Dec, name: str) -> int:
    k = d.u8(name)
    if k not in TICKET_KINDS:
        raise d.fail("malformed", name, "ticket kind %d (1: push, 2: failure, 3: aux)" % k)
    return k


def _put_kind(e: _Enc, k: int, name: str) -> None:
    if k not in TICKET_KINDS:
        raise ValueError("ticket kind %r (1: push, 2: failure, 3: aux)" % (k,))
    e.u8(k, name)


def _ticket(prefix: str) -> Tuple[Field, ...]:
    """What a posted ticket and a delivered one share: kind, inbox, key, body (names after ``prefix``)."""
    return (Field("kind", prefix + "Kind", _put_kind, _get_kind), str16("to", prefix + "To", MAX_NAME),
            str16("key", prefix + "Key", MAX_TAG), bytes32("body", prefix + "Body", MAX_TICKET_BODY))


@dataclass
class OpenInbox(FieldMessage):
    """OpenInbox (154): take the tickets peers address to ``name``; answered OK."""

    TYPE = FrameType.OPEN_INBOX
    FIELDS = (u64("req", "Req"), str16("name", "Name", MAX_NAME))
    req: int = 0
    name: str = ""


@dataclass
class PostTicket(FieldMessage):
    """PostTicket (155): send a ticket to inbox ``to`` ("" : the peer's only one) of ``peer`` on ``route``;
    answered OK once the peer queued it, Fail when refused (full: BUSY) or unreachable."""

    TYPE = FrameType.POST_TICKET
    FIELDS = (u64("req", "Req"), str16("route", "Route", MAX_NAME), str16("peer", "Peer", MAX_NAME)) + _ticket("")
    req: int = 0
    route: str = ""
    peer: str = ""
    kind: int = TICKET_PUSH
    to: str = ""
    key: str = ""
    body: bytes = b""


@dataclass
class TakeTickets(FieldMessage):
    """TakeTickets (156): up to ``max`` waiting tickets, waiting up to ``wait_ms`` for the first."""

    TYPE = FrameType.TAKE_TICKETS
    FIELDS = (u64("req", "Req"), u16("max", "Max"), u32("wait_ms", "WaitMs"))
    req: int = 0
    max: int = MAX_TICKETS_OUT
    wait_ms: int = 0


@dataclass
class TicketItem:
    """One delivered ticket: ``sender`` is the peer sidecar's node name, ``to`` the inbox."""

    sender: str
    kind: int
    to: str
    key: str
    body: bytes


_ITEM = (str16("sender", "Items[].From", MAX_NAME),) + _ticket("Items[].")


def _put_items(e: _Enc, items: List[TicketItem], name: str) -> None:
    if len(items) > MAX_TICKETS_OUT:
        raise ValueError("Tickets.%s: count %d exceeds limit %d" % (name, len(items), MAX_TICKETS_OUT))
    e.u32(len(items), name)
    for it in items:
        put_fields(e, it, _ITEM)


def _get_items(d: _Dec, name: str) -> List[Any]:
    return [TicketItem(**get_fields(d, _ITEM)) for _ in range(d.count(MAX_TICKETS_OUT, _MIN_ITEM, name))]


@dataclass
class Tickets(FieldMessage):
    """Tickets (157): the answer to TakeTickets (maybe none)."""

    TYPE = FrameType.TICKETS
    FIELDS = (u64("req", "Req"), Field("items", "Items", _put_items, _get_items))
    req: int = 0
    items: List[TicketItem] = field(default_factory=list)
