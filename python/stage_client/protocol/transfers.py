"""A transfer on the control socket (``docs/PROTOCOL.md`` 9.5 to 9.12):
its byte ranges (:class:`LocalOp`), Submit and its answer Submitted, Wait,
Status and their answer XferStatus, Cancel; and Subscribe and Notify, by
which an engine hears of the transfers peers made with its sidecar.

:func:`pack_local_ops` and :func:`unpack_local_ops` are shared with
SubmitHead and SubmitMore (:mod:`.pieces`), whose ops are checked as
Submit's are.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import List, Sequence, Union

from .codec import Message, _Dec, _Enc
from .enums import Checksum, Code, Direction, FrameType, State, to_code
from .limits import LOCAL_OP_SIZE, MAX_KV_LAYERS, MAX_MESSAGE, MAX_NAME, MAX_NAMES, MAX_OPS, MAX_TAG, _U64_MAX

__all__ = ["LocalOp", "pack_local_ops", "unpack_local_ops", "Submit", "Submitted", "Wait", "Status", "XferStatus",
           "Cancel", "Subscribe", "Notify"]


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
