"""Join (153): a connection joins an ownership group (PROTOCOL.md 9.18).

Regions, KV caches and transfers belong to the connection that made them.
Connections that joined one group (the same token, a secret their
processes share) may use, unregister, check and cancel each other's, and
every subscriber among them hears of the group's transfers. A connection
that sends no Join is a group of its own, as clients before Join were.
The Go package ``wire`` (local_join.go) is the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

from .enums import FrameType
from .fields import FieldMessage, bytes16, u64

__all__ = ["Join", "MIN_GROUP", "MAX_GROUP"]

#: The shortest token the sidecar accepts (a shorter one could be guessed).
MIN_GROUP = 16
#: The longest token the decoder accepts.
MAX_GROUP = 64


@dataclass
class Join(FieldMessage):
    """Join (153): put this connection into group ``group``; its first request, answered OK."""

    TYPE = FrameType.JOIN
    FIELDS = (u64("req", "Req"), bytes16("group", "Group", MAX_GROUP))
    req: int = 0
    group: bytes = b""

    def check(self) -> None:
        if len(self.group) < MIN_GROUP:
            raise ValueError("Join.Group: %d bytes; the sidecar needs at least %d" % (len(self.group), MIN_GROUP))
