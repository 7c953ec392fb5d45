"""Register (128) and Unregister (129): an engine's memory made known to
the sidecar under a name, and taken back (``docs/PROTOCOL.md`` 9.3, 9.4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from .codec import Message, _Dec, _Enc
from .enums import Access, FrameType, HandleKind, to_handle
from .limits import MAX_HANDLE_BYTES, MAX_NAME

__all__ = ["Register", "Unregister"]


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
