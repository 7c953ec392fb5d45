"""Tickets (154-157): short messages between engines behind two sidecars (PROTOCOL.md 9.19).

An engine connection opens an inbox (:class:`OpenInbox`, a name that is its
and its group's until it closes); a peer engine posts a ticket for it on its
own sidecar (:class:`PostTicket`), which carries it over the sidecars'
authenticated session; the ticket waits in the inbox, bounded, until one of
the group's connections takes it (:class:`TakeTickets`, answered
:class:`Tickets`). In push mode a decode posts its block table (kind
``TICKET_PUSH``) and a prefill posts back why a push cannot happen
(``TICKET_FAILURE``). The Go package ``wire`` (ticket.go) is the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Union

from .wire import MAX_NAME, MAX_TAG, FrameType, Message, _Dec, _Enc

__all__ = ["OpenInbox", "PostTicket", "TakeTickets", "Tickets", "TicketItem", "TICKET_PUSH", "TICKET_FAILURE",
           "MAX_TICKET_BODY", "MAX_TICKETS_OUT"]

TICKET_PUSH = 1  # the body says where to push (a decode's block table, JSON)
TICKET_FAILURE = 2  # the body says why the transfer of the key cannot happen (UTF-8 text)
MAX_TICKET_BODY = 256 << 10
MAX_TICKETS_OUT = 256
_MIN_ITEM = 2 + 1 + 2 + 2 + 4


def _kind(d: _Dec, name: str) -> int:
    k = d.u8(name)
    if k not in (TICKET_PUSH, TICKET_FAILURE):
        raise d.fail("malformed", name, "ticket kind %d (1: push, 2: failure)" % k)
    return k


def _check_kind(k: int) -> int:
    if k not in (TICKET_PUSH, TICKET_FAILURE):
        raise ValueError("ticket kind %r (1: push, 2: failure)" % (k,))
    return k


@dataclass
class OpenInbox(Message):
    """OpenInbox (154): take the tickets peers address to ``name``; answered OK."""

    TYPE = FrameType.OPEN_INBOX
    req: int = 0
    name: str = ""

    def encode(self) -> bytes:
        e = _Enc("OpenInbox")
        e.u64(self.req, "Req")
        e.str16(self.name, MAX_NAME, "Name")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "OpenInbox":
        d = _Dec(body, "OpenInbox")
        m = cls(req=d.u64("Req"), name=d.str16(MAX_NAME, "Name"))
        d.finish()
        return m


@dataclass
class PostTicket(Message):
    """PostTicket (155): send a ticket to inbox ``to`` ("" : the peer's only one) of ``peer`` on ``route``;
    answered OK once the peer queued it, Fail when refused (full: BUSY) or unreachable."""

    TYPE = FrameType.POST_TICKET
    req: int = 0
    route: str = ""
    peer: str = ""
    kind: int = TICKET_PUSH
    to: str = ""
    key: str = ""
    body: bytes = b""

    def encode(self) -> bytes:
        e = _Enc("PostTicket")
        e.u64(self.req, "Req")
        e.str16(self.route, MAX_NAME, "Route")
        e.str16(self.peer, MAX_NAME, "Peer")
        e.u8(_check_kind(self.kind), "Kind")
        e.str16(self.to, MAX_NAME, "To")
        e.str16(self.key, MAX_TAG, "Key")
        e.bytes32(self.body, MAX_TICKET_BODY, "Body")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "PostTicket":
        d = _Dec(body, "PostTicket")
        m = cls(req=d.u64("Req"), route=d.str16(MAX_NAME, "Route"), peer=d.str16(MAX_NAME, "Peer"),
                kind=_kind(d, "Kind"), to=d.str16(MAX_NAME, "To"), key=d.str16(MAX_TAG, "Key"),
                body=d.bytes32(MAX_TICKET_BODY, "Body"))
        d.finish()
        return m


@dataclass
class TakeTickets(Message):
    """TakeTickets (156): up to ``max`` waiting tickets, waiting up to ``wait_ms`` for the first."""

    TYPE = FrameType.TAKE_TICKETS
    req: int = 0
    max: int = MAX_TICKETS_OUT
    wait_ms: int = 0

    def encode(self) -> bytes:
        e = _Enc("TakeTickets")
        e.u64(self.req, "Req")
        e.u16(self.max, "Max")
        e.u32(self.wait_ms, "WaitMs")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "TakeTickets":
        d = _Dec(body, "TakeTickets")
        m = cls(req=d.u64("Req"), max=d.u16("Max"), wait_ms=d.u32("WaitMs"))
        d.finish()
        return m


@dataclass
class TicketItem:
    """One delivered ticket: ``sender`` is the peer sidecar's node name, ``to`` the inbox."""

    sender: str
    kind: int
    to: str
    key: str
    body: bytes


@dataclass
class Tickets(Message):
    """Tickets (157): the answer to TakeTickets (maybe none)."""

    TYPE = FrameType.TICKETS
    req: int = 0
    items: List[TicketItem] = field(default_factory=list)

    def encode(self) -> bytes:
        if len(self.items) > MAX_TICKETS_OUT:
            raise ValueError("Tickets.Items: count %d exceeds limit %d" % (len(self.items), MAX_TICKETS_OUT))
        e = _Enc("Tickets")
        e.u64(self.req, "Req")
        e.u32(len(self.items), "Items")
        for it in self.items:
            e.str16(it.sender, MAX_NAME, "Items[].From")
            e.u8(_check_kind(it.kind), "Items[].Kind")
            e.str16(it.to, MAX_NAME, "Items[].To")
            e.str16(it.key, MAX_TAG, "Items[].Key")
            e.bytes32(it.body, MAX_TICKET_BODY, "Items[].Body")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "Tickets":
        d = _Dec(body, "Tickets")
        m = cls(req=d.u64("Req"))
        for _ in range(d.count(MAX_TICKETS_OUT, _MIN_ITEM, "Items")):
            m.items.append(TicketItem(sender=d.str16(MAX_NAME, "Items[].From"), kind=_kind(d, "Items[].Kind"),
                                      to=d.str16(MAX_NAME, "Items[].To"), key=d.str16(MAX_TAG, "Items[].Key"),
                                      body=d.bytes32(MAX_TICKET_BODY, "Items[].Body")))
        d.finish()
        return m


