"""Grant (158) and RevokeGrant (159): which peer request may read or write which blocks of a KV cache
(PROTOCOL.md 9.20).

A grant lets the holder of a transfer key read (a peer's KVPull) or write
(a peer's KVAnnounce) exactly one block table of this connection's KV
cache, until it expires; a read grant ends after ``uses`` admitted pulls.
Once its engine made one, the cache is guarded: a peer request naming no
live grant covering exactly its blocks is refused. The Go package ``wire``
(local_grant.go) is the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from .kvwire import MAX_GRANT_KEY, MAX_GRANT_TTL_MS, MAX_GRANT_USES, MIN_GRANT_KEY, check_key, dec_key, pack_u32s
from .wire import MAX_KV_BLOCKS, MAX_NAME, FrameType, Message, _Dec, _Enc

__all__ = ["Grant", "RevokeGrant"]

@dataclass
class Grant(Message):
    """Grant (158): the holder of ``key`` may read (``write`` False, at most ``uses`` pulls) or write
    (``write`` True, ``uses`` 0) exactly ``blocks`` of KV cache ``cache`` for ``ttl_ms``; answered OK.
    No blocks: grants nothing, only guards the cache."""

    TYPE = FrameType.GRANT
    req: int = 0
    cache: str = ""
    key: bytes = b""
    write: bool = False
    ttl_ms: int = 0
    uses: int = 0
    blocks: Any = field(default_factory=list)

    def encode(self) -> bytes:
        key = check_key(self.key, "Grant.Key")
        if not 1 <= int(self.ttl_ms) <= MAX_GRANT_TTL_MS:
            raise ValueError("Grant.TTLMs: %r ms; want 1 to %d" % (self.ttl_ms, MAX_GRANT_TTL_MS))
        if (int(self.uses) == 0) != bool(self.write) or int(self.uses) > MAX_GRANT_USES:
            raise ValueError("Grant.Uses: %r uses for a %s grant; want 1 to %d for a read, 0 for a write"
                             % (self.uses, "write" if self.write else "read", MAX_GRANT_USES))
        e = _Enc("Grant")
        e.u64(self.req, "Req")
        e.str16(self.cache, MAX_NAME, "Cache")
        e.bytes16(key, MAX_GRANT_KEY, "Key")
        e.u8(1 if self.write else 0, "Write")
        e.u32(self.ttl_ms, "TTLMs")
        e.u16(self.uses, "Uses")
        e.raw(pack_u32s(self.blocks, MAX_KV_BLOCKS, "Grant.Blocks"))
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "Grant":
        d = _Dec(body, "Grant")
        req, cache, key = d.u64("Req"), d.str16(MAX_NAME, "Cache"), dec_key(d, "Key")
        w = d.u8("Write")
        if w > 1:
            raise d.fail("malformed", "Write", "boolean byte is %d" % w)
        ttl, uses = d.u32("TTLMs"), d.u16("Uses")
        if not 1 <= ttl <= MAX_GRANT_TTL_MS:
            raise d.fail("malformed", "TTLMs", "%d ms; want 1 to %d" % (ttl, MAX_GRANT_TTL_MS))
        if (uses == 0) != (w == 1) or uses > MAX_GRANT_USES:
            raise d.fail("malformed", "Uses", "%d uses for a %s grant" % (uses, "write" if w else "read"))
        blocks = d.u32s(MAX_KV_BLOCKS, "Blocks")
        d.finish()
        return cls(req=req, cache=cache, key=key, write=w == 1, ttl_ms=ttl, uses=uses, blocks=blocks)


@dataclass
class RevokeGrant(Message):
    """RevokeGrant (159): end the grant ``key`` of KV cache ``cache`` (nothing when it ended); answered OK."""

    TYPE = FrameType.REVOKE_GRANT
    req: int = 0
    cache: str = ""
    key: bytes = b""

    def encode(self) -> bytes:
        e = _Enc("RevokeGrant")
        e.u64(self.req, "Req")
        e.str16(self.cache, MAX_NAME, "Cache")
        e.bytes16(check_key(self.key, "RevokeGrant.Key"), MAX_GRANT_KEY, "Key")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "RevokeGrant":
        d = _Dec(body, "RevokeGrant")
        m = cls(req=d.u64("Req"), cache=d.str16(MAX_NAME, "Cache"), key=dec_key(d, "Key"))
        d.finish()
        return m
