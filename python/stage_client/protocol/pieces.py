"""SubmitHead (161) and SubmitMore (160): a large Submit sent in pieces (PROTOCOL.md 9.5b).

The first piece is a Submit's fields with the first ops and what all the
pieces' ops add up to (``total`` bytes, and per remote region the end no op
reaches past); the rest of the ops follow in SubmitMore frames with the
same request id, the last with ``end`` set. The sidecar checks each piece
as it arrives and starts a push on the first, while the engine still
encodes and writes the rest. Ask first (:data:`QueryKind.FEATURES`): a
sidecar that predates pieces answers Fail, and gets one Submit. The Go
package ``wire`` (local_pieces.go) is the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Union

from .codec import Message, _Dec, _Enc
from .enums import FrameType
from .limits import MAX_NAMES, _U64_MAX
from .transfers import LocalOp, Submit, pack_local_ops, unpack_local_ops

__all__ = ["SubmitHead", "SubmitMore", "MAX_SUBMIT_PIECES", "SUBMIT_REST_MS", "SUBMIT_OPEN_MAX", "head_of"]

#: Pieces of one request, its head and its End included.
MAX_SUBMIT_PIECES = 4096
#: How long after its SubmitHead a request's End may come, in milliseconds.
SUBMIT_REST_MS = 10_000
#: Requests in pieces open at once on one connection.
SUBMIT_OPEN_MAX = 16


def _bool(d: _Dec, name: str) -> bool:
    v = d.u8(name)
    if v > 1:
        raise d.fail("malformed", name, "boolean byte is %d" % v)
    return v == 1


@dataclass
class SubmitHead(Message):
    """SubmitHead (161): the first piece; answered as Submit (Submitted), or, with ``wait``, as SubmitWait."""

    TYPE = FrameType.SUBMIT_HEAD
    submit: Submit = field(default_factory=Submit)  # the request, with its first ops
    wait: bool = False
    total: int = 0
    ends: List[int] = field(default_factory=list)

    def encode(self) -> bytes:
        s = self.submit
        if len(self.ends) != len(s.remote_names):
            raise ValueError("SubmitHead.Ends: %d, want one per remote name (%d)" % (len(self.ends), len(s.remote_names)))
        if not 0 < self.total <= _U64_MAX:
            raise ValueError("SubmitHead.Total: %d must be in 1..2^64-1" % self.total)
        body = s.encode()
        e = _Enc("SubmitHead")
        e.raw(body[:8])
        e.u8(1 if self.wait else 0, "Wait")
        e.u64(self.total, "Total")
        e.u32(len(self.ends), "Ends")
        for v in self.ends:
            e.u64(v, "Ends[]")
        e.raw(body[8:])
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "SubmitHead":
        d = _Dec(body, "SubmitHead")
        req = d.take(8, "Req")
        wait = _bool(d, "Wait")
        total = d.u64("Total")
        n = d.count(MAX_NAMES, 8, "Ends")
        ends = [d.u64("Ends[]") for _ in range(n)]
        s = Submit.decode(req + bytes(d.take(d.rem(), "Submit")))
        if len(ends) != len(s.remote_names):
            raise d.fail("malformed", "Ends", "count %d, want %d (one per remote name)" % (len(ends), len(s.remote_names)))
        if total == 0:
            raise d.fail("malformed", "Total", "zero (a transfer moves at least one byte)")
        return cls(submit=s, wait=wait, total=total, ends=ends)


@dataclass
class SubmitMore(Message):
    """SubmitMore (160): the next ops of request ``req``; ``end`` marks the last piece. Not answered."""

    TYPE = FrameType.SUBMIT_MORE
    req: int = 0
    end: bool = False
    ops: List[LocalOp] = field(default_factory=list)

    def encode(self) -> bytes:
        e = _Enc("SubmitMore")
        e.u64(self.req, "Req")
        e.u8(1 if self.end else 0, "End")
        # The indices are the head's names: the sidecar checks them.
        e.raw(pack_local_ops(self.ops, 1 << 32, 1 << 32, "SubmitMore"))
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "SubmitMore":
        d = _Dec(body, "SubmitMore")
        req = d.u64("Req")
        end = _bool(d, "End")
        ops = unpack_local_ops(d, 1 << 32, 1 << 32)
        d.finish()
        return cls(req=req, end=end, ops=ops)


def head_of(s: Submit) -> SubmitHead:
    """The SubmitHead of ``s`` over all its ops (Total, Ends); the caller cuts the ops into pieces.
    ValueError for ops the sidecar would refuse."""
    ends = [0] * len(s.remote_names)
    total = 0
    for i, op in enumerate(s.ops):
        if not 0 <= op.remote < len(ends) or op.length <= 0 or op.remote_off + op.length > _U64_MAX:
            raise ValueError("Submit.Ops[%d]: remote index %d, offset %d, length %d" % (i, op.remote, op.remote_off, op.length))
        ends[op.remote] = max(ends[op.remote], op.remote_off + op.length)
        total += op.length
    if not 0 < total <= _U64_MAX:
        raise ValueError("Submit: ops of %d bytes in all" % total)
    return SubmitHead(submit=s, total=total, ends=ends)
