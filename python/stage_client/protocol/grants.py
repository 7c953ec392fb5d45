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
from typing import Any, List

from .codec import _Dec, _Enc
from .enums import FrameType
from .fields import Field, FieldMessage, str16, u16, u32, u64
from .kvwire import MAX_GRANT_KEY, MAX_GRANT_TTL_MS, MAX_GRANT_USES, check_key, dec_key, pack_u32s
from .limits import MAX_KV_BLOCKS, MAX_NAME

__all__ = ["Grant", "RevokeGrant"]


def _put_key(e: _Enc, key: bytes, name: str) -> None:
    e.bytes16(check_key(key, "%s.%s" % (e.msg, name)), MAX_GRANT_KEY, name)


def _put_write(e: _Enc, write: bool, name: str) -> None:
    e.u8(1 if write else 0, name)


def _get_write(d: _Dec, name: str) -> bool:
    w = d.u8(name)
    if w > 1:
        raise d.fail("malformed", name, "boolean byte is %d" % w)
    return w == 1


def _put_blocks(e: _Enc, blocks: Any, name: str) -> None:
    e.raw(pack_u32s(blocks, MAX_KV_BLOCKS, "%s.%s" % (e.msg, name)))


def _get_blocks(d: _Dec, name: str) -> List[int]:
    return d.u32s(MAX_KV_BLOCKS, name)


#: The cache and the transfer key: what a grant and its revocation both name.
_CACHE_KEY = (u64("req", "Req"), str16("cache", "Cache", MAX_NAME), Field("key", "Key", _put_key, dec_key))


@dataclass
class Grant(FieldMessage):
    """Grant (158): the holder of ``key`` may read (``write`` False, at most ``uses`` pulls) or write
    (``write`` True, ``uses`` 0) exactly ``blocks`` of KV cache ``cache`` for ``ttl_ms``; answered OK.
    No blocks: grants nothing, only guards the cache."""

    TYPE = FrameType.GRANT
    FIELDS = _CACHE_KEY + (Field("write", "Write", _put_write, _get_write), u32("ttl_ms", "TTLMs"),
                           u16("uses", "Uses"), Field("blocks", "Blocks", _put_blocks, _get_blocks))
    req: int = 0
    cache: str = ""
    key: bytes = b""
    write: bool = False
    ttl_ms: int = 0
    uses: int = 0
    blocks: Any = field(default_factory=list)

    def check(self) -> None:
        check_key(self.key, "Grant.Key")
        if not 1 <= int(self.ttl_ms) <= MAX_GRANT_TTL_MS:
            raise ValueError("Grant.TTLMs: %r ms; want 1 to %d" % (self.ttl_ms, MAX_GRANT_TTL_MS))
        if (int(self.uses) == 0) != bool(self.write) or int(self.uses) > MAX_GRANT_USES:
            raise ValueError("Grant.Uses: %r uses for a %s grant; want 1 to %d for a read, 0 for a write"
                             % (self.uses, "write" if self.write else "read", MAX_GRANT_USES))

    def verify(self, d: _Dec) -> None:
        if not 1 <= self.ttl_ms <= MAX_GRANT_TTL_MS:
            raise d.fail("malformed", "TTLMs", "%d ms; want 1 to %d" % (self.ttl_ms, MAX_GRANT_TTL_MS))
        if (self.uses == 0) != self.write or self.uses > MAX_GRANT_USES:
            raise d.fail("malformed", "Uses", "%d uses for a %s grant" % (self.uses, "write" if self.write else "read"))


@dataclass
class RevokeGrant(FieldMessage):
    """RevokeGrant (159): end the grant ``key`` of KV cache ``cache`` (nothing when it ended); answered OK."""

    TYPE = FrameType.REVOKE_GRANT
    FIELDS = _CACHE_KEY
    req: int = 0
    cache: str = ""
    key: bytes = b""
