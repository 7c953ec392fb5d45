"""Query and QueryReply (``docs/PROTOCOL.md`` 9.13, 9.14): a JSON document
asked of the sidecar; and OK and Fail (9.15, 9.16), the plain answers any
request may get.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from .codec import Message, _Dec, _Enc
from .enums import Code, FrameType, QueryKind, to_code
from .limits import MAX_JSON, MAX_MESSAGE, MAX_NAME

__all__ = ["Query", "QueryReply", "OK", "Fail"]


@dataclass
class Query(Message):
    """Query (138): ask for a JSON document (QueryKind); answered by QueryReply."""

    TYPE = FrameType.QUERY
    req: int = 0
    what: int = QueryKind.STATS
    arg: str = ""

    def encode(self) -> bytes:
        e = _Enc("Query")
        e.u64(self.req, "Req")
        e.u8(self.what, "What")
        e.str16(self.arg, MAX_NAME, "Arg")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "Query":
        d = _Dec(body, "Query")
        req = d.u64("Req")
        what = d.u8("What")
        try:
            what = QueryKind(what)
        except ValueError:
            pass  # the decoder accepts any kind; the sidecar answers Fail
        m = cls(req=req, what=what, arg=d.str16(MAX_NAME, "Arg"))
        d.finish()
        return m


@dataclass
class QueryReply(Message):
    """QueryReply (139): the JSON document answering a Query."""

    TYPE = FrameType.QUERY_REPLY
    req: int = 0
    json: bytes = b""

    def encode(self) -> bytes:
        e = _Enc("QueryReply")
        e.u64(self.req, "Req")
        e.bytes32(self.json, MAX_JSON, "JSON")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "QueryReply":
        d = _Dec(body, "QueryReply")
        m = cls(req=d.u64("Req"), json=d.bytes32(MAX_JSON, "JSON"))
        d.finish()
        return m


@dataclass
class OK(Message):
    """OK (140): plain success."""

    TYPE = FrameType.OK
    req: int = 0

    def encode(self) -> bytes:
        e = _Enc("OK")
        e.u64(self.req, "Req")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "OK":
        d = _Dec(body, "OK")
        m = cls(req=d.u64("Req"))
        d.finish()
        return m


@dataclass
class Fail(Message):
    """Fail (141): a request failed; ``req == 0`` is a connection-level
    failure after which the sidecar closes the connection."""

    TYPE = FrameType.FAIL
    req: int = 0
    code: int = Code.INTERNAL
    message: str = ""

    def encode(self) -> bytes:
        e = _Enc("Fail")
        e.u64(self.req, "Req")
        e.u16(self.code, "Code")
        e.text(self.message, "Message")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "Fail":
        d = _Dec(body, "Fail")
        m = cls(req=d.u64("Req"), code=to_code(d.u16("Code")), message=d.str16(MAX_MESSAGE, "Message"))
        d.finish()
        return m
