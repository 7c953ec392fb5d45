"""How a message's body is written and read: :class:`Message`, the base of
every local control-socket message, the encoder and decoder its ``encode``
and ``decode`` use (``_Enc``, ``_Dec``; the other modules of the package
use them too), and :class:`ProtocolError`.

Decoders check every length and count against its limit and against the
bytes that remain, reject trailing bytes and out-of-range enum values, and
raise :class:`ProtocolError` (never ``IndexError`` or ``struct.error``) on
anything malformed.

Encoders differ from the Go encoders in one way: the Go ones never refuse
anything (a field above its limit is sent and refused by the receiver),
while these raise :class:`ValueError` for any field the sidecar would
refuse. The sidecar answers a frame that does not decode with a
connection-level Fail and closes the connection, which would fail every
other request in flight on it; refusing early keeps one bad call from
taking the connection down. Text for people (``message`` fields) is cut to
MAX_MESSAGE bytes at a UTF-8 boundary, as Go does.
"""

from __future__ import annotations

import struct
from typing import List, Sequence, Union

from .enums import Access, Direction, FrameType
from .limits import MAX_MESSAGE, _U16_MAX, _U32_MAX, _U64_MAX

__all__ = ["ProtocolError", "Message"]


# --------------------------------------------------------------------------
# Errors


class ProtocolError(ValueError):
    """A frame or body that does not decode.

    ``kind`` mirrors the Go sentinel errors: ``"malformed"``, ``"too_large"``,
    ``"bad_magic"``, ``"bad_version"``, ``"unknown_type"`` or ``"checksum"``.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__("wire: %s: %s" % (message, kind.replace("_", " ")))
        self.kind = kind


# --------------------------------------------------------------------------
# Body encoding


def _utf8(s: Union[str, bytes]) -> bytes:
    """UTF-8 of a str (surrogateescape, so decoded bytes round-trip); bytes as is."""
    return s.encode("utf-8", "surrogateescape") if isinstance(s, str) else bytes(s)


class _Enc:
    """Appends fields to a body; raises ValueError for what the receiver refuses."""

    __slots__ = ("parts", "msg")

    def __init__(self, msg: str) -> None:
        self.parts: List[bytes] = []
        self.msg = msg

    def _int(self, fmt: str, v: int, hi: int, name: str) -> None:
        try:
            iv = int(v)
        except (TypeError, ValueError):
            raise ValueError("%s.%s: %r is not an integer" % (self.msg, name, v)) from None
        if not 0 <= iv <= hi:
            raise ValueError("%s.%s: %d does not fit (0..%d)" % (self.msg, name, iv, hi))
        self.parts.append(struct.pack(fmt, iv))

    def u8(self, v: int, name: str) -> None:
        self._int("<B", v, 0xFF, name)

    def u16(self, v: int, name: str) -> None:
        self._int("<H", v, _U16_MAX, name)

    def u32(self, v: int, name: str) -> None:
        self._int("<I", v, _U32_MAX, name)

    def u64(self, v: int, name: str) -> None:
        self._int("<Q", v, _U64_MAX, name)

    def str16(self, s: Union[str, bytes], limit: int, name: str) -> None:
        b = _utf8(s)
        if len(b) > limit:
            raise ValueError("%s.%s: %d bytes exceeds limit %d" % (self.msg, name, len(b), limit))
        self.parts.append(struct.pack("<H", len(b)))
        self.parts.append(b)

    def text(self, s: Union[str, bytes], name: str) -> None:
        """Text for people: cut to MAX_MESSAGE bytes at a UTF-8 boundary."""
        b = _utf8(s)
        if len(b) > MAX_MESSAGE:
            n = MAX_MESSAGE
            i = 0
            while i < 3 and n > 0 and b[n] & 0xC0 == 0x80:
                n -= 1
                i += 1
            b = b[:n]
        self.parts.append(struct.pack("<H", len(b)))
        self.parts.append(b)

    def bytes16(self, p: bytes, limit: int, name: str) -> None:
        p = bytes(p)
        if len(p) > limit:
            raise ValueError("%s.%s: %d bytes exceeds limit %d" % (self.msg, name, len(p), limit))
        self.parts.append(struct.pack("<H", len(p)))
        self.parts.append(p)

    def bytes32(self, p: bytes, limit: int, name: str) -> None:
        p = bytes(p)
        if len(p) > limit:
            raise ValueError("%s.%s: %d bytes exceeds limit %d" % (self.msg, name, len(p), limit))
        self.parts.append(struct.pack("<I", len(p)))
        self.parts.append(p)

    def strs(self, ss: Sequence[str], max_count: int, max_len: int, name: str) -> None:
        if len(ss) > max_count:
            raise ValueError("%s.%s: count %d exceeds limit %d" % (self.msg, name, len(ss), max_count))
        self.parts.append(struct.pack("<I", len(ss)))
        for i, s in enumerate(ss):
            self.str16(s, max_len, "%s[%d]" % (name, i))

    def u32s(self, vs: Sequence[int], max_count: int, name: str) -> None:
        if len(vs) > max_count:
            raise ValueError("%s.%s: count %d exceeds limit %d" % (self.msg, name, len(vs), max_count))
        self.parts.append(struct.pack("<I%dI" % len(vs), len(vs), *vs))

    def raw(self, b: bytes) -> None:
        self.parts.append(b)

    def done(self) -> bytes:
        return b"".join(self.parts)


# --------------------------------------------------------------------------
# Body decoding


class _Dec:
    """Reads a body front to back; raises ProtocolError at the first problem."""

    __slots__ = ("b", "off", "msg", "idx")

    def __init__(self, body: Union[bytes, bytearray, memoryview], msg: str) -> None:
        self.b = bytes(body)
        self.off = 0
        self.msg = msg

    def fail(self, kind: str, name: str, text: str) -> "ProtocolError":
        return ProtocolError(kind, "%s.%s: %s" % (self.msg, name, text))

    def rem(self) -> int:
        return len(self.b) - self.off

    def take(self, n: int, name: str) -> bytes:
        if n > self.rem():
            raise self.fail("malformed", name, "need %d bytes at offset %d, have %d" % (n, self.off, self.rem()))
        p = self.b[self.off:self.off + n]
        self.off += n
        return p

    def u8(self, name: str) -> int:
        return self.take(1, name)[0]

    def u16(self, name: str) -> int:
        return int.from_bytes(self.take(2, name), "little")

    def u32(self, name: str) -> int:
        return int.from_bytes(self.take(4, name), "little")

    def u64(self, name: str) -> int:
        return int.from_bytes(self.take(8, name), "little")

    def len16(self, limit: int, name: str) -> int:
        n = self.u16(name)
        if n > limit:
            raise self.fail("too_large", name, "length %d exceeds limit %d" % (n, limit))
        return n

    def str16(self, limit: int, name: str) -> str:
        n = self.len16(limit, name)
        return self.take(n, name).decode("utf-8", "surrogateescape")

    def bytes16(self, limit: int, name: str) -> bytes:
        n = self.len16(limit, name)
        return self.take(n, name)

    def bytes32(self, limit: int, name: str) -> bytes:
        n = self.u32(name)
        if n > limit:
            raise self.fail("too_large", name, "length %d exceeds limit %d" % (n, limit))
        return self.take(n, name)

    def count(self, limit: int, min_size: int, name: str) -> int:
        n = self.u32(name)
        if n > limit:
            raise self.fail("too_large", name, "count %d exceeds limit %d" % (n, limit))
        if n * min_size > self.rem():
            raise self.fail("malformed", name, "count %d needs at least %d bytes, %d remain" % (n, n * min_size, self.rem()))
        return n

    def u32s(self, max_count: int, name: str) -> List[int]:
        n = self.count(max_count, 4, name)
        return list(struct.unpack("<%dI" % n, self.take(4 * n, name)))

    def strs(self, max_count: int, max_len: int, name: str) -> List[str]:
        n = self.count(max_count, 2, name)
        return [self.str16(max_len, "%s[%d]" % (name, i)) for i in range(n)]

    def direction(self, name: str) -> Direction:
        v = self.u8(name)
        if v not in (1, 2):
            raise self.fail("malformed", name, "unknown direction %d" % v)
        return Direction(v)

    def access(self, name: str) -> Access:
        v = self.u8(name)
        if v & ~int(Access.ALL):
            raise self.fail("malformed", name, "unknown access bits %#x" % (v & ~int(Access.ALL)))
        return Access(v)

    def finish(self) -> None:
        if self.rem():
            raise ProtocolError("malformed", "%s: %d trailing bytes after offset %d" % (self.msg, self.rem(), self.off))


# --------------------------------------------------------------------------
# The base of every message


class Message:
    """Base of every local control-socket message.

    ``TYPE`` is the frame type; :meth:`encode` gives the body (no header);
    :meth:`decode` parses a body.
    """

    TYPE: FrameType

    def encode(self) -> bytes:  # pragma: no cover - overridden
        raise NotImplementedError

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "Message":  # pragma: no cover
        raise NotImplementedError
