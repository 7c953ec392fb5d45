"""Encoders and decoders for stage's local control-socket frames.

This module implements sections 1-5 and 9 of ``docs/PROTOCOL.md`` (the
engine <-> sidecar Unix-socket protocol); the KV frames (section 12) are
in :mod:`stage_client.protocol.kvwire`, and
:mod:`stage_client.protocol.messages` decodes the body of any local frame
type from the one registry of both. Every frame is a 16-byte header
followed by ``length`` body bytes; every integer is little-endian and
fixed-width, with no padding.

Header::

    0  1  magic 'S'          8  4  length (u32)
    1  1  magic 'G'         12  4  crc32c of the body when FLAG_CRC, else 0
    2  1  version (1)
    3  1  type
    4  2  flags (u16)
    6  2  reserved (0)

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

import enum
import struct
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Union

__all__ = [
    "HEADER_SIZE", "VERSION", "MAGIC", "FLAG_CRC", "FLAG_FD",
    "MAX_CONTROL_BODY", "MAX_CHUNK_BODY", "MAX_NAME", "MAX_TAG", "MAX_MESSAGE",
    "MAX_OPS", "MAX_NAMES", "MAX_HANDLE_BYTES", "MAX_JSON", "CHUNK_FIXED_SIZE",
    "FrameType", "Code", "Access", "Direction", "State", "Checksum", "QueryKind",
    "HandleKind", "ProtocolError", "Header", "LocalOp",
    "Register", "Unregister", "Submit", "Submitted", "Wait", "Status",
    "XferStatus", "Cancel", "Subscribe", "Notify", "Query", "QueryReply", "OK",
    "Fail", "Message", "crc32c", "encode_header", "parse_header", "encode_frame",
    "verify_crc", "code_name", "MAX_KV_PARTS", "MAX_KV_LAYERS", "MAX_KV_BLOCKS",
]

# --------------------------------------------------------------------------
# Constants (PROTOCOL.md sections 2 and 4)

MAGIC = b"SG"
VERSION = 1
VERSION_MIN = 1
VERSION_MAX = 1
HEADER_SIZE = 16

FLAG_CRC = 0x0001
FLAG_FD = 0x0002
_KNOWN_FLAGS = FLAG_CRC | FLAG_FD

MAX_CONTROL_BODY = 16 << 20
MAX_CHUNK_BODY = 257 << 20
MAX_CHUNK_SEGS = 1 << 16
MAX_NAME = 255
MAX_TAG = 1024
MAX_MESSAGE = 4096
MAX_OPS = 1 << 20
MAX_NAMES = 4096
MAX_HANDLE_BYTES = 65528  # an acl-vmm chunk list of 4094 chunks: 24 + 16 * 4094
MAX_JSON = 8 << 20
MAX_KV_PARTS = 8
MAX_KV_LAYERS = 4096
MAX_KV_BLOCKS = 1 << 20
CHUNK_FIXED_SIZE = 24

_U16_MAX = 0xFFFF
_U32_MAX = 0xFFFFFFFF
_U64_MAX = 0xFFFFFFFFFFFFFFFF

LOCAL_OP_SIZE = 32


# --------------------------------------------------------------------------
# Enumerations (section 5)


class FrameType(enum.IntEnum):
    """Frame types (section 3). 1..63 peer, 64 chunk, 128..141 and 151..155 local."""

    HELLO = 1
    CHALLENGE = 2
    AUTH = 3
    WELCOME = 4
    DATA_HELLO = 5
    DATA_ACCEPT = 6
    CATALOG_REQUEST = 7
    CATALOG = 8
    ANNOUNCE = 9
    PULL_REQUEST = 10
    ACCEPT = 11
    ACK = 12
    NACK = 13
    CREDIT = 14
    HEARTBEAT = 15
    GOODBYE = 16
    ERROR = 17
    CHUNK = 64
    REGISTER = 128
    UNREGISTER = 129
    SUBMIT = 130
    SUBMITTED = 131
    WAIT = 132
    STATUS = 133
    XFER_STATUS = 134
    CANCEL = 135
    SUBSCRIBE = 136
    NOTIFY = 137
    QUERY = 138
    QUERY_REPLY = 139
    OK = 140
    FAIL = 141
    REGISTER_KV = 151  # PROTOCOL.md 12.5; the message lives in kvwire
    SUBMIT_KV = 152  # 12.6
    JOIN = 153  # 9.18; the message lives in group
    OPEN_INBOX = 154  # 9.19; the messages live in tickets
    POST_TICKET = 155
    TAKE_TICKETS = 156
    TICKETS = 157
    GRANT = 158  # 9.20; the messages live in grants
    REVOKE_GRANT = 159
    SUBMIT_MORE = 160  # 9.5b; the messages live in pieces
    SUBMIT_HEAD = 161


_KNOWN_TYPES = frozenset(int(t) for t in FrameType)


class Code(enum.IntEnum):
    """Failure codes (u16), used by XferStatus, Notify and Fail.

    A receiver accepts any value; values not listed here are kept as plain
    ``int`` (see :func:`code_name`).
    """

    OK = 0
    BAD_REQUEST = 1
    UNKNOWN_ROUTE = 2
    UNKNOWN_REGION = 3
    OUT_OF_RANGE = 4
    ACCESS_DENIED = 5
    AUTH_FAILED = 6
    PEER_UNAVAILABLE = 7
    TIMEOUT = 8
    CANCELLED = 9
    CHECKSUM = 10
    INTERNAL = 11
    BUSY = 12
    EXISTS = 13
    UNSUPPORTED = 14
    MALFORMED = 15
    UNKNOWN_TRANSFER = 16
    DEVICE = 17
    SHUTDOWN = 18
    UNKNOWN_PEER = 19

    @property
    def text(self) -> str:
        """The code's text as the Go code prints it ("unknown route")."""
        return _CODE_TEXT[self]


_CODE_TEXT: Dict[int, str] = {
    0: "ok", 1: "bad request", 2: "unknown route", 3: "unknown region",
    4: "out of range", 5: "access denied", 6: "authentication failed",
    7: "peer unavailable", 8: "timeout", 9: "cancelled", 10: "checksum mismatch",
    11: "internal error", 12: "busy", 13: "already exists", 14: "unsupported",
    15: "malformed", 16: "unknown transfer", 17: "device error", 18: "shutting down", 19: "unknown peer",
}


def to_code(value: int) -> int:
    """Return ``Code(value)`` when the value is known, else the plain int."""
    try:
        return Code(value)
    except ValueError:
        return int(value)


def code_name(value: int) -> str:
    """The text for a code, ``code(N)`` for an unknown one (as Go prints it)."""
    return _CODE_TEXT.get(int(value), "code(%d)" % int(value))


class Access(enum.IntFlag):
    """Region access rights (u8 bit set); bits 4..7 must be 0."""

    NONE = 0
    LOCAL_READ = 0x01  # the local engine may push from the region
    LOCAL_WRITE = 0x02  # the local engine may pull into the region
    REMOTE_WRITE = 0x04  # peers may push into the region
    REMOTE_READ = 0x08  # peers may pull from the region
    ALL = 0x0F


class Direction(enum.IntEnum):
    """Transfer direction (u8): push local -> peer, pull peer -> local."""

    PUSH = 1
    PULL = 2


class State(enum.IntEnum):
    """Transfer state (u8), in XferStatus."""

    QUEUED = 1
    RUNNING = 2
    DONE = 3
    FAILED = 4


class Checksum(enum.IntEnum):
    """Per-transfer checksum choice (u8), in Submit."""

    ROUTE = 0  # as the route's configuration says
    ON = 1  # chunks carry a CRC32C
    OFF = 2


def checksum_choice(c: Union[None, bool, int]) -> "Checksum":
    """The Checksum of a caller's choice: None as the route says, True/False on/off, else the number."""
    if c is None:
        return Checksum.ROUTE
    if c is True:
        return Checksum.ON
    if c is False:
        return Checksum.OFF
    return Checksum(c)


class QueryKind(enum.IntEnum):
    """What a Query asks for; the answer is JSON."""

    STATS = 1
    ROUTES = 2
    REGIONS = 3
    CATALOG = 4  # Arg: route name
    DEVICE = 5  # the sidecar's device (bare_tgid, physical_id for acl)
    FEATURES = 6  # the optional requests it takes (submit_pieces: PROTOCOL.md 9.5b)


class HandleKind(enum.IntEnum):
    """Register.Handle: how the sidecar reaches the memory."""

    NONE = 0
    MEMFD = 1  # a memfd travels with the frame (FLAG_FD)
    CUDA_IPC = 2  # handle: CUDA legacy IPC handle, 64 bytes
    POSIX_FD = 3  # a VMM allocation exported as a POSIX fd (FLAG_FD)
    ACL_KEY = 4  # handle: Ascend IPC export key
    HIP_IPC = 5  # handle: HIP IPC handle, 64 bytes
    HOST_ADDR = 6  # an address in the sidecar's own process (refused on the socket)
    ACL_VMM = 7  # handle: Ascend VMM chunk list (PROTOCOL.md section 5)


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
# CRC32C (Castagnoli, reflected polynomial 0x82F63B78)


def _crc_table() -> List[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data: Union[bytes, bytearray, memoryview], crc: int = 0) -> int:
    """CRC32C of ``data`` (``crc32c(b"123456789") == 0xE3069283``).

    Pure Python and slow (a few MB/s): only frames with FLAG_CRC need it, and
    the sidecar sends none.
    """
    table = _CRC_TABLE
    c = crc ^ 0xFFFFFFFF
    for b in bytes(data):
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


# --------------------------------------------------------------------------
# Header


@dataclass(frozen=True)
class Header:
    """A decoded frame header."""

    version: int
    type: int
    flags: int
    length: int
    crc: int = 0


_HEADER = struct.Struct("<2sBBHHII")


def encode_header(type_: int, flags: int, length: int, crc: int = 0, version: int = VERSION) -> bytes:
    """The 16 header bytes (reserved field 0)."""
    return _HEADER.pack(MAGIC, version, int(type_), flags, 0, length, crc)


def parse_header(b: Union[bytes, bytearray, memoryview]) -> Header:
    """Decode and check the first 16 bytes of ``b`` as a header.

    Refuses, as the Go ``ParseHeader`` does: a bad magic, a version other
    than 1, an unknown type, a non-zero reserved field, unknown flag bits,
    FLAG_FD on a peer or chunk frame, a CRC without FLAG_CRC, a length above
    its limit, and a chunk shorter than its fixed part.
    """
    if len(b) < HEADER_SIZE:
        raise ProtocolError("malformed", "header: %d bytes, need %d" % (len(b), HEADER_SIZE))
    magic, version, t, flags, reserved, length, crc = _HEADER.unpack_from(b, 0)
    if magic != MAGIC:
        raise ProtocolError("bad_magic", "header: magic %#04x %#04x, want 0x53 0x47 ('S' 'G')" % (magic[0], magic[1]))
    if not VERSION_MIN <= version <= VERSION_MAX:
        raise ProtocolError("bad_version", "header: version %d, this build speaks %d to %d" % (version, VERSION_MIN, VERSION_MAX))
    if t not in _KNOWN_TYPES:
        raise ProtocolError("unknown_type", "header: type %d" % t)
    name = FrameType(t).name
    if reserved != 0:
        raise ProtocolError("malformed", "header: %s: reserved field %#06x, want 0" % (name, reserved))
    if flags & ~_KNOWN_FLAGS:
        raise ProtocolError("malformed", "header: %s: unknown flags %#06x" % (name, flags & ~_KNOWN_FLAGS))
    if flags & FLAG_FD and t < 128:
        raise ProtocolError("malformed", "header: %s: FLAG_FD on a peer frame" % name)
    if not flags & FLAG_CRC and crc != 0:
        raise ProtocolError("malformed", "header: %s: CRC field %#010x without FLAG_CRC" % (name, crc))
    if t == FrameType.CHUNK:
        if length > MAX_CHUNK_BODY:
            raise ProtocolError("too_large", "header: CHUNK: length %d exceeds limit %d" % (length, MAX_CHUNK_BODY))
        if length < CHUNK_FIXED_SIZE:
            raise ProtocolError("malformed", "header: CHUNK: length %d below the fixed part's %d" % (length, CHUNK_FIXED_SIZE))
    elif length > MAX_CONTROL_BODY:
        raise ProtocolError("too_large", "header: %s: length %d exceeds limit %d" % (name, length, MAX_CONTROL_BODY))
    return Header(version, t, flags, length, crc)


def verify_crc(h: Header, body: Union[bytes, bytearray, memoryview]) -> None:
    """Check the body's length against the header, and its CRC32C when FLAG_CRC."""
    if len(body) != h.length:
        raise ProtocolError("malformed", "%s: body of %d bytes, header says %d" % (_tname(h.type), len(body), h.length))
    if h.flags & FLAG_CRC:
        got = crc32c(body)
        if got != h.crc:
            raise ProtocolError("checksum", "%s: body CRC32C %08x, header says %08x" % (_tname(h.type), got, h.crc))


def _tname(t: int) -> str:
    try:
        return FrameType(t).name
    except ValueError:
        return "type(%d)" % t


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
# Messages (section 9)


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


@dataclass
class Register(Message):
    """Register (128): make memory known to the sidecar under ``name``.

    With HandleKind.MEMFD or POSIX_FD the fd travels as SCM_RIGHTS with the
    frame and the header carries FLAG_FD (the client does that).
    """

    TYPE = FrameType.REGISTER
    req: int = 0
    name: str = ""
    handle: int = HandleKind.NONE
    access: int = Access.NONE
    ordinal: int = 0
    alloc_size: int = 0
    offset: int = 0
    length: int = 0
    addr: int = 0
    handle_raw: bytes = b""

    def encode(self) -> bytes:
        e = _Enc("Register")
        e.u64(self.req, "Req")
        e.str16(self.name, MAX_NAME, "Name")
        e.u8(self.handle, "Handle")
        if int(self.access) & ~int(Access.ALL):
            raise ValueError("Register.Access: unknown access bits %#x" % (int(self.access) & ~int(Access.ALL)))
        e.u8(self.access, "Access")
        e.u32(self.ordinal, "Ordinal")
        e.u64(self.alloc_size, "AllocSize")
        e.u64(self.offset, "Offset")
        e.u64(self.length, "Length")
        e.u64(self.addr, "Addr")
        e.bytes16(self.handle_raw, MAX_HANDLE_BYTES, "HandleRaw")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "Register":
        d = _Dec(body, "Register")
        m = cls(
            req=d.u64("Req"),
            name=d.str16(MAX_NAME, "Name"),
            handle=to_handle(d.u8("Handle")),
            access=d.access("Access"),
            ordinal=d.u32("Ordinal"),
            alloc_size=d.u64("AllocSize"),
            offset=d.u64("Offset"),
            length=d.u64("Length"),
            addr=d.u64("Addr"),
            handle_raw=d.bytes16(MAX_HANDLE_BYTES, "HandleRaw"),
        )
        d.finish()
        return m


def to_handle(v: int) -> int:
    """HandleKind(v) when known, else the plain int (wire carries any value)."""
    try:
        return HandleKind(v)
    except ValueError:
        return v


@dataclass
class Unregister(Message):
    """Unregister (129): remove a region; transfers in flight keep it mapped.

    ``wait_ms`` > 0 asks for a confirmed unregister (PROTOCOL.md 9.4): the
    OK comes only once no transfer holds the region and, with the last
    region of its allocation, the sidecar closed its import; transfers that
    still hold it after ``wait_ms`` get Fail BUSY, and the region stays
    registered. It is encoded only when set, so an Unregister without it
    has the bytes of earlier versions.
    """

    TYPE = FrameType.UNREGISTER
    req: int = 0
    name: str = ""
    wait_ms: int = 0

    def encode(self) -> bytes:
        e = _Enc("Unregister")
        e.u64(self.req, "Req")
        e.str16(self.name, MAX_NAME, "Name")
        if self.wait_ms:
            e.u32(self.wait_ms, "WaitMs")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "Unregister":
        d = _Dec(body, "Unregister")
        m = cls(req=d.u64("Req"), name=d.str16(MAX_NAME, "Name"))
        if d.rem():
            m.wait_ms = d.u32("WaitMs")
            if m.wait_ms == 0:
                raise d.fail("malformed", "WaitMs", "present but 0 (leave it out for an unconfirmed unregister)")
        d.finish()
        return m


@dataclass(frozen=True)
class LocalOp:
    """One range of a Submit, in wire field order (32 bytes on the wire).

    ``local`` and ``remote`` index Submit.local_names and remote_names.
    """

    local: int
    remote: int
    local_off: int
    remote_off: int
    length: int


_LOCAL_OP = struct.Struct("<IIQQQ")


def pack_local_ops(ops: Sequence[LocalOp], nl: int, nr: int, msg: str) -> bytes:
    """A LocalOp list as the wire has it (u32 count, then 32 bytes each),
    checked as the sidecar's decoder checks it: indices below ``nl`` local
    and ``nr`` remote names, lengths above 0, no offset + length past
    2^64 - 1. ValueError names ``msg`` and the op."""
    if len(ops) > MAX_OPS:
        raise ValueError("%s.Ops: count %d exceeds limit %d" % (msg, len(ops), MAX_OPS))
    pack = _LOCAL_OP.pack
    out = [struct.pack("<I", len(ops))]
    for i, op in enumerate(ops):
        loc, rem, loff, roff, ln = op.local, op.remote, op.local_off, op.remote_off, op.length
        if not 0 <= loc < nl:
            raise ValueError("%s.Ops[%d].Local: index %d out of range (%d local names)" % (msg, i, loc, nl))
        if not 0 <= rem < nr:
            raise ValueError("%s.Ops[%d].Remote: index %d out of range (%d remote names)" % (msg, i, rem, nr))
        if not 0 < ln <= _U64_MAX:
            raise ValueError("%s.Ops[%d].Len: length %d must be in 1..2^64-1" % (msg, i, ln))
        if not 0 <= loff <= _U64_MAX - ln:
            raise ValueError("%s.Ops[%d].LocalOff: offset %d + length %d overflows u64" % (msg, i, loff, ln))
        if not 0 <= roff <= _U64_MAX - ln:
            raise ValueError("%s.Ops[%d].RemoteOff: offset %d + length %d overflows u64" % (msg, i, roff, ln))
        out.append(pack(loc, rem, loff, roff, ln))
    return b"".join(out)


def unpack_local_ops(d: "_Dec", nl: int, nr: int) -> List[LocalOp]:
    """Read a LocalOp list, checked as :func:`pack_local_ops` checks it."""
    n = d.count(MAX_OPS, LOCAL_OP_SIZE, "Ops")
    raw = d.take(n * LOCAL_OP_SIZE, "Ops")
    ops: List[LocalOp] = []
    for i, (loc, rem, loff, roff, length) in enumerate(_LOCAL_OP.iter_unpack(raw)):
        if loc >= nl:
            raise d.fail("malformed", "Ops[%d].Local" % i, "index %d out of range (%d local names)" % (loc, nl))
        if rem >= nr:
            raise d.fail("malformed", "Ops[%d].Remote" % i, "index %d out of range (%d remote names)" % (rem, nr))
        if length == 0:
            raise d.fail("malformed", "Ops[%d].Len" % i, "zero length")
        if loff > _U64_MAX - length:
            raise d.fail("malformed", "Ops[%d].LocalOff" % i, "offset %d + length %d overflows" % (loff, length))
        if roff > _U64_MAX - length:
            raise d.fail("malformed", "Ops[%d].RemoteOff" % i, "offset %d + length %d overflows" % (roff, length))
        ops.append(LocalOp(loc, rem, loff, roff, length))
    return ops


@dataclass
class Submit(Message):
    """Submit (130): start a transfer on a route; answered by Submitted.

    ``peer`` names the route's peer (node name or host:port); empty: the
    route's only peer. It is encoded after the ops only when set, so a
    Submit naming no peer has the bytes of earlier versions.
    """

    TYPE = FrameType.SUBMIT
    req: int = 0
    route: str = ""
    direction: int = Direction.PUSH
    checksum: int = Checksum.ROUTE
    tag: str = ""
    local_names: List[str] = field(default_factory=list)
    remote_names: List[str] = field(default_factory=list)
    ops: List[LocalOp] = field(default_factory=list)
    peer: str = ""

    def encode(self) -> bytes:
        e = _Enc("Submit")
        e.u64(self.req, "Req")
        e.str16(self.route, MAX_NAME, "Route")
        if int(self.direction) not in (1, 2):
            raise ValueError("Submit.Dir: unknown direction %r (1 push, 2 pull)" % (self.direction,))
        e.u8(self.direction, "Dir")
        if int(self.checksum) not in (0, 1, 2):
            raise ValueError("Submit.Checksum: unknown checksum choice %r (0 route, 1 on, 2 off)" % (self.checksum,))
        e.u8(self.checksum, "Checksum")
        e.str16(self.tag, MAX_TAG, "Tag")
        e.strs(self.local_names, MAX_NAMES, MAX_NAME, "LocalNames")
        e.strs(self.remote_names, MAX_NAMES, MAX_NAME, "RemoteNames")
        e.raw(pack_local_ops(self.ops, len(self.local_names), len(self.remote_names), "Submit"))
        if self.peer:
            e.str16(self.peer, MAX_NAME, "Peer")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "Submit":
        d = _Dec(body, "Submit")
        req = d.u64("Req")
        route = d.str16(MAX_NAME, "Route")
        direction = d.direction("Dir")
        ck = d.u8("Checksum")
        if ck > 2:
            raise d.fail("malformed", "Checksum", "unknown checksum choice %d" % ck)
        tag = d.str16(MAX_TAG, "Tag")
        ln = d.strs(MAX_NAMES, MAX_NAME, "LocalNames")
        rn = d.strs(MAX_NAMES, MAX_NAME, "RemoteNames")
        ops = unpack_local_ops(d, len(ln), len(rn))
        peer = ""
        if d.rem() > 0:
            peer = d.str16(MAX_NAME, "Peer")
            if not peer:
                raise d.fail("malformed", "Peer", "present but empty (leave it out to name no peer)")
        d.finish()
        return cls(req=req, route=route, direction=direction, checksum=Checksum(ck), tag=tag,
                   local_names=ln, remote_names=rn, ops=ops, peer=peer)


@dataclass
class Submitted(Message):
    """Submitted (131): answers Submit with the transfer's id on this sidecar."""

    TYPE = FrameType.SUBMITTED
    req: int = 0
    transfer: int = 0

    def encode(self) -> bytes:
        e = _Enc("Submitted")
        e.u64(self.req, "Req")
        e.u64(self.transfer, "Transfer")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "Submitted":
        d = _Dec(body, "Submitted")
        m = cls(req=d.u64("Req"), transfer=d.u64("Transfer"))
        d.finish()
        return m


@dataclass
class Wait(Message):
    """Wait (132): answered by XferStatus when the transfer ends or
    ``timeout_ms`` passed (0: no limit)."""

    TYPE = FrameType.WAIT
    req: int = 0
    transfer: int = 0
    timeout_ms: int = 0

    def encode(self) -> bytes:
        e = _Enc("Wait")
        e.u64(self.req, "Req")
        e.u64(self.transfer, "Transfer")
        e.u32(self.timeout_ms, "TimeoutMs")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "Wait":
        d = _Dec(body, "Wait")
        m = cls(req=d.u64("Req"), transfer=d.u64("Transfer"), timeout_ms=d.u32("TimeoutMs"))
        d.finish()
        return m


@dataclass
class Status(Message):
    """Status (133): asks for a transfer's state now (answered by XferStatus)."""

    TYPE = FrameType.STATUS
    req: int = 0
    transfer: int = 0

    def encode(self) -> bytes:
        e = _Enc("Status")
        e.u64(self.req, "Req")
        e.u64(self.transfer, "Transfer")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "Status":
        d = _Dec(body, "Status")
        m = cls(req=d.u64("Req"), transfer=d.u64("Transfer"))
        d.finish()
        return m


@dataclass
class XferStatus(Message):
    """XferStatus (134): a transfer's state; answers Wait and Status.

    ``done`` counts bytes acked (pushes) or landed (pulls) so far.
    """

    TYPE = FrameType.XFER_STATUS
    req: int = 0
    transfer: int = 0
    state: int = State.QUEUED
    done: int = 0
    total: int = 0
    code: int = Code.OK
    message: str = ""

    @property
    def finished(self) -> bool:
        """True when the transfer ended (done or failed)."""
        return self.state in (State.DONE, State.FAILED)

    @property
    def ok(self) -> bool:
        """True when the transfer is done and succeeded."""
        return self.state == State.DONE

    def encode(self) -> bytes:
        e = _Enc("XferStatus")
        e.u64(self.req, "Req")
        e.u64(self.transfer, "Transfer")
        if int(self.state) not in (1, 2, 3, 4):
            raise ValueError("XferStatus.State: unknown state %r" % (self.state,))
        e.u8(self.state, "State")
        e.u64(self.done, "Done")
        e.u64(self.total, "Total")
        e.u16(self.code, "Code")
        e.text(self.message, "Message")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "XferStatus":
        d = _Dec(body, "XferStatus")
        req = d.u64("Req")
        transfer = d.u64("Transfer")
        st = d.u8("State")
        if not 1 <= st <= 4:
            raise d.fail("malformed", "State", "unknown state %d" % st)
        m = cls(req=req, transfer=transfer, state=State(st), done=d.u64("Done"), total=d.u64("Total"),
                code=to_code(d.u16("Code")), message=d.str16(MAX_MESSAGE, "Message"))
        d.finish()
        return m


@dataclass
class Cancel(Message):
    """Cancel (135): cancel a transfer; answered by OK."""

    TYPE = FrameType.CANCEL
    req: int = 0
    transfer: int = 0

    def encode(self) -> bytes:
        e = _Enc("Cancel")
        e.u64(self.req, "Req")
        e.u64(self.transfer, "Transfer")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "Cancel":
        d = _Dec(body, "Cancel")
        m = cls(req=d.u64("Req"), transfer=d.u64("Transfer"))
        d.finish()
        return m


@dataclass
class Subscribe(Message):
    """Subscribe (136): answered by OK, then Notify frames on this connection."""

    TYPE = FrameType.SUBSCRIBE
    req: int = 0

    def encode(self) -> bytes:
        e = _Enc("Subscribe")
        e.u64(self.req, "Req")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "Subscribe":
        d = _Dec(body, "Subscribe")
        m = cls(req=d.u64("Req"))
        d.finish()
        return m


@dataclass
class Notify(Message):
    """Notify (137), unasked: a transfer a peer started with this sidecar ended.

    For a push from the peer it is sent once every byte landed (or it
    failed); for a pull the peer made from here, once every chunk was acked.
    ``transfer`` is the id in the peer session (not a local transfer id);
    ``direction`` is as seen by the peer that started it. Notify has no
    request id.
    """

    TYPE = FrameType.NOTIFY
    transfer: int = 0
    peer: str = ""
    route: str = ""
    tag: str = ""
    direction: int = Direction.PUSH
    bytes: int = 0
    code: int = Code.OK
    message: str = ""
    #: A KV transfer also says what landed: our KV cache, its layers, and
    #: tokens [first, first + tokens) of the block table the peer named.
    kv: str = ""
    layers: List[int] = field(default_factory=list)
    first: int = 0
    tokens: int = 0

    @property
    def ok(self) -> bool:
        """True when the transfer succeeded."""
        return self.code == Code.OK

    def encode(self) -> bytes:
        e = _Enc("Notify")
        e.u64(self.transfer, "Transfer")
        e.str16(self.peer, MAX_NAME, "Peer")
        e.str16(self.route, MAX_NAME, "Route")
        e.str16(self.tag, MAX_TAG, "Tag")
        if int(self.direction) not in (1, 2):
            raise ValueError("Notify.Dir: unknown direction %r" % (self.direction,))
        e.u8(self.direction, "Dir")
        e.u64(self.bytes, "Bytes")
        e.u16(self.code, "Code")
        e.text(self.message, "Message")
        e.str16(self.kv, MAX_NAME, "KV")
        e.u32s(self.layers, MAX_KV_LAYERS, "Layers")
        e.u32(self.first, "First")
        e.u32(self.tokens, "Tokens")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "Notify":
        d = _Dec(body, "Notify")
        m = cls(transfer=d.u64("Transfer"), peer=d.str16(MAX_NAME, "Peer"), route=d.str16(MAX_NAME, "Route"),
                tag=d.str16(MAX_TAG, "Tag"), direction=d.direction("Dir"), bytes=d.u64("Bytes"),
                code=to_code(d.u16("Code")), message=d.str16(MAX_MESSAGE, "Message"),
                kv=d.str16(MAX_NAME, "KV"), layers=d.u32s(MAX_KV_LAYERS, "Layers"), first=d.u32("First"),
                tokens=d.u32("Tokens"))
        d.finish()
        return m


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


# --------------------------------------------------------------------------
# Frames


def encode_frame(msg: Message, flags: int = 0, crc: bool = False) -> bytes:
    """Header + body of ``msg``. ``flags`` may carry FLAG_FD; ``crc`` (or
    FLAG_CRC in flags) fills the header's CRC32C."""
    body = msg.encode()
    if len(body) > MAX_CONTROL_BODY:
        raise ValueError("%s: body of %d bytes exceeds limit %d" % (msg.TYPE.name, len(body), MAX_CONTROL_BODY))
    if crc:
        flags |= FLAG_CRC
    if flags & ~_KNOWN_FLAGS:
        raise ValueError("unknown flags %#06x" % (flags & ~_KNOWN_FLAGS))
    c = crc32c(body) if flags & FLAG_CRC else 0
    return encode_header(msg.TYPE, flags, len(body), c) + body
