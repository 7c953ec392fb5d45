"""A frame around a body (``docs/PROTOCOL.md`` sections 1 and 2): the
16-byte header, the CRC32C of the body, and :func:`encode_frame`, which puts
both around a message's body. Decoding a whole local frame needs the
registry of message types, so it is :mod:`.messages`' ``decode_frame``.

Every frame is a 16-byte header followed by ``length`` body bytes; every
integer is little-endian and fixed-width, with no padding. Header::

    0  1  magic 'S'          8  4  length (u32)
    1  1  magic 'G'         12  4  crc32c of the body when FLAG_CRC, else 0
    2  1  version (1)
    3  1  type
    4  2  flags (u16)
    6  2  reserved (0)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import List, Union

from .codec import Message, ProtocolError
from .enums import _KNOWN_TYPES, FrameType, _tname
from .limits import (CHUNK_FIXED_SIZE, FLAG_CRC, FLAG_FD, HEADER_SIZE, MAGIC, MAX_CHUNK_BODY, MAX_CONTROL_BODY,
                     VERSION, VERSION_MAX, VERSION_MIN, _KNOWN_FLAGS)

__all__ = ["Header", "crc32c", "encode_header", "parse_header", "verify_crc", "encode_frame"]


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
