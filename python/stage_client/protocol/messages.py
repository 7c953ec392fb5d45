"""The one registry of local control-socket messages, and the decoders that use it.

Every message class of :mod:`.regions`, :mod:`.transfers` and :mod:`.queries`
(section 9 of ``docs/PROTOCOL.md``) and of :mod:`.kvwire` (12.5, 12.6) is
registered here, by its frame type (and Join, of :mod:`.group`, 9.18; the
tickets of :mod:`.tickets`, 9.19; Grant and RevokeGrant, of :mod:`.grants`,
9.20; SubmitHead and SubmitMore, of :mod:`.pieces`, 9.5b), once, when this
module is imported; nothing adds to the registry afterwards (it is
read-only).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, Tuple, Type, Union

from .codec import Message, ProtocolError
from .enums import _tname
from .frame import Header, parse_header, verify_crc
from .grants import Grant, RevokeGrant
from .group import Join
from .kvwire import RegisterKV, SubmitKV
from .limits import HEADER_SIZE, MAX_CONTROL_BODY
from .pieces import SubmitHead, SubmitMore
from .queries import OK, Fail, Query, QueryReply
from .regions import Register, Unregister
from .tickets import OpenInbox, PostTicket, TakeTickets, Tickets
from .transfers import Cancel, Notify, Status, Submit, Submitted, Subscribe, Wait, XferStatus

__all__ = ["MESSAGES", "decode_body", "decode_frame"]

#: Message class by frame type, for every local control-socket frame.
MESSAGES: Mapping[int, Type[Message]] = MappingProxyType({
    int(c.TYPE): c
    for c in (Register, Unregister, Submit, Submitted, Wait, Status, XferStatus, Cancel, Subscribe, Notify,
              Query, QueryReply, OK, Fail, RegisterKV, SubmitKV, Join, OpenInbox, PostTicket, TakeTickets, Tickets,
              Grant, RevokeGrant, SubmitHead, SubmitMore)
})


def decode_body(type_: int, body: Union[bytes, bytearray, memoryview]) -> Message:
    """Decode the body of a local control-socket frame of type ``type_``."""
    if len(body) > MAX_CONTROL_BODY:
        raise ProtocolError("too_large", "%s: body of %d bytes exceeds limit %d" % (_tname(type_), len(body), MAX_CONTROL_BODY))
    cls = MESSAGES.get(int(type_))
    if cls is None:
        raise ProtocolError("unknown_type", "decode: type %d is not a local control-socket frame" % int(type_))
    return cls.decode(body)


def decode_frame(data: Union[bytes, bytearray, memoryview]) -> Tuple[Header, Message]:
    """Decode exactly one whole frame (header and body, nothing after it)."""
    h = parse_header(data)
    body = bytes(data[HEADER_SIZE:])
    verify_crc(h, body)
    return h, decode_body(h.type, body)
