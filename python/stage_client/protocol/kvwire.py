"""The KV frames of the local control socket: RegisterKV (151) and SubmitKV (152).

PROTOCOL.md sections 12.5 and 12.6; the Go package ``wire`` (kv.go,
kv_codec.go) is the reference and these encode byte for byte as it does.
The rules of :mod:`stage_client.protocol.codec` hold here too: decoders raise
ProtocolError for anything malformed, encoders raise ValueError for what
the sidecar would refuse to decode (so one bad call does not take the
connection down).

Block tables can be long (up to MAX_KV_BLOCKS ids), so u32 lists are packed
in one call (``array('I')`` or one ``struct.pack``), never id by id.
"""

from __future__ import annotations

import array
import struct
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Union

from .codec import Message, _Dec, _Enc
from .enums import Checksum, Direction, FrameType
from .limits import MAX_KV_BLOCKS, MAX_KV_LAYERS, MAX_KV_PARTS, MAX_NAME, MAX_TAG

__all__ = ["DTYPE_CODES", "KVPart", "KVLayout", "RegisterKV", "SubmitKV", "pack_u32s", "MIN_GRANT_KEY", "MAX_GRANT_KEY",
           "MAX_GRANT_TTL_MS", "MAX_GRANT_USES", "check_key", "dec_key"]

#: The dtype numbers on the wire (PROTOCOL.md 12.1), by the dtype's name (the value of
#: :class:`stage_client.layout.DType`, a ``str``, so a DType is a key too).
DTYPE_CODES: Dict[str, int] = {"f16": 1, "bf16": 2, "f32": 3, "fp8_e4m3": 4, "fp8_e5m2": 5, "int8": 6}

_U32_MAX = 0xFFFFFFFF
_PART = struct.Struct("<IBQQQQ")  # Width, Tensor, Offset, BlockStride, SlotStride, HeadStride (after the name)
_PART_MIN_SIZE = 2 + _PART.size
_LAYOUT_HEAD = struct.Struct("<BIIIII")
# the array type code of a 4-byte unsigned int ("I" on every platform CPython supports with 32-bit ints)
_U32_CODE = next(c for c in "IL" if array.array(c).itemsize == 4)


def pack_u32s(vs: Any, max_count: int, what: str) -> bytes:
    """A u32 list (count, then the values) from a list, tuple, range, array or tensor.

    One C-level call packs the values: an ``array`` of 4-byte unsigned ints
    goes out as its bytes, anything with ``tolist`` (torch, numpy) is listed
    first. Raises ValueError for more than ``max_count`` values or a value
    outside 0..2^32-1.
    """
    if not (isinstance(vs, array.array) and vs.typecode == _U32_CODE):
        if hasattr(vs, "tolist"):
            vs = vs.tolist()
        try:
            vs = array.array(_U32_CODE, vs)
        except (OverflowError, TypeError):
            _bad_u32(list(vs), what)
    if len(vs) > max_count:
        raise ValueError("%s: count %d exceeds limit %d" % (what, len(vs), max_count))
    if sys.byteorder != "little":  # pragma: no cover - the wire is little-endian
        vs = array.array(_U32_CODE, vs)
        vs.byteswap()
    return struct.pack("<I", len(vs)) + vs.tobytes()


def _bad_u32(vs: Sequence[Any], what: str) -> None:
    for i, v in enumerate(vs):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _U32_MAX:
            raise ValueError("%s[%d]: %r is not a u32" % (what, i, v))
    raise ValueError("%s: not a list of u32" % what)  # pragma: no cover


@dataclass(frozen=True)
class KVPart:
    """One part of a layer's layout as RegisterKV carries it (Go: wire.KVPart): where the row of
    (block, slot, head) of the part lives in tensor ``tensor`` of the layer. Offsets and strides in bytes,
    ``width`` in elements."""

    name: str
    width: int
    tensor: int
    offset: int
    block_stride: int
    slot_stride: int
    head_stride: int


@dataclass(frozen=True)
class KVLayout:
    """One layer's layout as RegisterKV carries it (Go: wire.KVLayout): ``dtype`` is its number
    (DTYPE_CODES). ``stage_client.kvclient`` converts to and from :class:`stage_client.layout.Layout`."""

    dtype: int
    block_size: int
    blocks: int
    heads: int
    head_lo: int
    head_hi: int
    parts: Sequence[KVPart] = ()


def _enc_layout(e: _Enc, lay: KVLayout) -> None:
    e.u8(lay.dtype, "Layout.DType")
    for k in ("block_size", "blocks", "heads", "head_lo", "head_hi"):
        e.u32(getattr(lay, k), "Layout." + k)
    parts = list(lay.parts)
    if len(parts) > MAX_KV_PARTS:
        raise ValueError("RegisterKV.Layout.Parts: count %d exceeds limit %d" % (len(parts), MAX_KV_PARTS))
    e.u32(len(parts), "Layout.Parts")
    for i, p in enumerate(parts):
        e.str16(p.name, MAX_NAME, "Layout.Parts[%d].Name" % i)
        e.u32(p.width, "Layout.Parts[%d].Width" % i)
        e.u8(p.tensor, "Layout.Parts[%d].Tensor" % i)
        for k in ("offset", "block_stride", "slot_stride", "head_stride"):
            e.u64(getattr(p, k), "Layout.Parts[%d].%s" % (i, k))


def _dec_layout(d: _Dec) -> KVLayout:
    dt, bs, blocks, heads, lo, hi = _LAYOUT_HEAD.unpack(d.take(_LAYOUT_HEAD.size, "Layout"))
    n = d.count(MAX_KV_PARTS, _PART_MIN_SIZE, "Layout.Parts")
    parts = []
    for i in range(n):
        name = d.str16(MAX_NAME, "Layout.Parts[%d].Name" % i)
        parts.append(KVPart(name, *_PART.unpack(d.take(_PART.size, "Layout.Parts[%d]" % i))))
    return KVLayout(dt, bs, blocks, heads, lo, hi, tuple(parts))


@dataclass
class RegisterKV(Message):
    """RegisterKV (151): give regions already registered a KV layout.

    ``layers[l][t]`` is the region holding tensor ``t`` of layer ``l``; the
    sidecar checks the layout against every region's length. A name
    registered again replaces the old cache. Answered by OK or Fail.
    """

    TYPE = FrameType.REGISTER_KV
    req: int = 0
    name: str = ""
    layout: KVLayout = field(default_factory=lambda: KVLayout(0, 0, 0, 0, 0, 0))
    layers: List[List[str]] = field(default_factory=list)

    def encode(self) -> bytes:
        e = _Enc("RegisterKV")
        e.u64(self.req, "Req")
        e.str16(self.name, MAX_NAME, "Name")
        _enc_layout(e, self.layout)
        if len(self.layers) > MAX_KV_LAYERS:
            raise ValueError("RegisterKV.Layers: count %d exceeds limit %d" % (len(self.layers), MAX_KV_LAYERS))
        e.u32(len(self.layers), "Layers")
        for i, names in enumerate(self.layers):
            e.strs(names, MAX_KV_PARTS, MAX_NAME, "Layers[%d]" % i)
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "RegisterKV":
        d = _Dec(body, "RegisterKV")
        req = d.u64("Req")
        name = d.str16(MAX_NAME, "Name")
        lay = _dec_layout(d)
        n = d.count(MAX_KV_LAYERS, 4, "Layers")
        layers = [d.strs(MAX_KV_PARTS, MAX_NAME, "Layers[%d]" % i) for i in range(n)]
        d.finish()
        return cls(req=req, name=name, layout=lay, layers=layers)


#: The shortest transfer key the sidecar accepts (a shorter one could be guessed).
MIN_GRANT_KEY = 16
#: The longest one.
MAX_GRANT_KEY = 64
#: A grant lives at most an hour.
MAX_GRANT_TTL_MS = 3_600_000
#: Admitted pulls one read grant allows at most.
MAX_GRANT_USES = 1024


def check_key(key: bytes, what: str) -> bytes:
    key = bytes(key)
    if not MIN_GRANT_KEY <= len(key) <= MAX_GRANT_KEY:
        raise ValueError("%s: %d-byte key; want %d to %d random bytes" % (what, len(key), MIN_GRANT_KEY, MAX_GRANT_KEY))
    return key


def dec_key(d: _Dec, name: str) -> bytes:
    """A transfer key: MIN_GRANT_KEY to MAX_GRANT_KEY bytes."""
    k = d.bytes16(MAX_GRANT_KEY, name)
    if len(k) < MIN_GRANT_KEY:
        raise d.fail("malformed", name, "%d-byte key; want %d to %d random bytes" % (len(k), MIN_GRANT_KEY, MAX_GRANT_KEY))
    return bytes(k)


@dataclass
class SubmitKV(Message):
    """SubmitKV (152): start a KV transfer; answered by Submitted, then as Submit.

    The rows of ``tokens`` tokens from token ``local_first`` of
    ``local_blocks`` (``remote_first`` of ``remote_blocks`` on the peer), of
    ``layers`` (the peer's ``remote_layers``, one per local layer; empty:
    the same indices), heads [head_lo, head_hi) (both 0: every head both
    sides hold). ``peer`` names the route's peer; empty: its only one.
    """

    TYPE = FrameType.SUBMIT_KV
    req: int = 0
    route: str = ""
    peer: str = ""
    direction: int = Direction.PUSH
    checksum: int = Checksum.ROUTE
    tag: str = ""
    local: str = ""
    remote: str = ""
    layers: Any = field(default_factory=list)
    remote_layers: Any = field(default_factory=list)
    local_blocks: Any = field(default_factory=list)
    remote_blocks: Any = field(default_factory=list)
    local_first: int = 0
    remote_first: int = 0
    tokens: int = 0
    head_lo: int = 0
    head_hi: int = 0
    key: bytes = b""  # the peer's grant (9.20); empty: none, and no bytes on the wire

    def encode(self) -> bytes:
        e = _Enc("SubmitKV")
        e.u64(self.req, "Req")
        e.str16(self.route, MAX_NAME, "Route")
        e.str16(self.peer, MAX_NAME, "Peer")
        if int(self.direction) not in (1, 2):
            raise ValueError("SubmitKV.Dir: unknown direction %r (1 push, 2 pull)" % (self.direction,))
        e.u8(self.direction, "Dir")
        if int(self.checksum) not in (0, 1, 2):
            raise ValueError("SubmitKV.Checksum: unknown checksum choice %r (0 route, 1 on, 2 off)" % (self.checksum,))
        e.u8(self.checksum, "Checksum")
        e.str16(self.tag, MAX_TAG, "Tag")
        e.str16(self.local, MAX_NAME, "Local")
        e.str16(self.remote, MAX_NAME, "Remote")
        layers = pack_u32s(self.layers, MAX_KV_LAYERS, "SubmitKV.Layers")
        remote_layers = pack_u32s(self.remote_layers, MAX_KV_LAYERS, "SubmitKV.RemoteLayers")
        nl, nr = (len(layers) - 4) // 4, (len(remote_layers) - 4) // 4
        if nr not in (0, nl):
            raise ValueError("SubmitKV.RemoteLayers: %d remote layers for %d local ones" % (nr, nl))
        e.raw(layers)
        e.raw(remote_layers)
        e.raw(pack_u32s(self.local_blocks, MAX_KV_BLOCKS, "SubmitKV.LocalBlocks"))
        e.raw(pack_u32s(self.remote_blocks, MAX_KV_BLOCKS, "SubmitKV.RemoteBlocks"))
        for k, n in (("local_first", "LocalFirst"), ("remote_first", "RemoteFirst"), ("tokens", "Tokens"),
                     ("head_lo", "HeadLo"), ("head_hi", "HeadHi")):
            e.u32(getattr(self, k), n)
        if self.key:
            e.bytes16(check_key(self.key, "SubmitKV.Key"), MAX_GRANT_KEY, "Key")
        return e.done()

    @classmethod
    def decode(cls, body: Union[bytes, bytearray, memoryview]) -> "SubmitKV":
        d = _Dec(body, "SubmitKV")
        req = d.u64("Req")
        route = d.str16(MAX_NAME, "Route")
        peer = d.str16(MAX_NAME, "Peer")
        direction = d.direction("Dir")
        ck = d.u8("Checksum")
        if ck > 2:
            raise d.fail("malformed", "Checksum", "unknown checksum choice %d" % ck)
        tag = d.str16(MAX_TAG, "Tag")
        local = d.str16(MAX_NAME, "Local")
        remote = d.str16(MAX_NAME, "Remote")
        layers = d.u32s(MAX_KV_LAYERS, "Layers")
        remote_layers = d.u32s(MAX_KV_LAYERS, "RemoteLayers")
        lb = d.u32s(MAX_KV_BLOCKS, "LocalBlocks")
        rb = d.u32s(MAX_KV_BLOCKS, "RemoteBlocks")
        lf, rf, tokens, lo, hi = (d.u32(n) for n in ("LocalFirst", "RemoteFirst", "Tokens", "HeadLo", "HeadHi"))
        key = dec_key(d, "Key") if d.rem() else b""
        d.finish()
        if remote_layers and len(remote_layers) != len(layers):
            raise d.fail("malformed", "RemoteLayers", "%d remote layers for %d local ones" % (len(remote_layers), len(layers)))
        return cls(req=req, route=route, peer=peer, direction=direction, checksum=Checksum(ck), tag=tag, local=local,
                   remote=remote, layers=layers, remote_layers=remote_layers, local_blocks=lb, remote_blocks=rb,
                   local_first=lf, remote_first=rf, tokens=tokens, head_lo=lo, head_hi=hi, key=key)
