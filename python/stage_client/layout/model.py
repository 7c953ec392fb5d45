"""KV-cache layouts: how one engine stores one layer's KV cache.

The model (shared with the Go package ``kvlayout``; the same names, fields
and rules): a layer's KV cache is a set of logical rows, one per (token,
kv head), each the concatenation of the layout's parts (K then V; for MLA
the latent then the rope part). A :class:`Layout` gives, per part, the row
width in elements and where the row of (block, slot, head) lives: byte
``offset + block*block_stride + slot*slot_stride + (head-head_lo)*head_stride``
of the tensor (region) ``tensor``. All offsets and strides are in bytes,
widths in elements.

Two layouts meet in a KV transfer: :func:`check` refuses pairs that cannot
hold the same rows, :func:`columns` cuts the logical row at both sides'
part boundaries, and the bytes travel in one canonical order (layer,
column range, token, head), so that each side maps only its own layout.

This module is standard-library only and imports nothing of stage_client:
the presets (:mod:`.presets`), layouts from presets and shapes
(:mod:`.derive`) and from torch tensors, with the reference mapper
(:mod:`.tensors`), sit above it in the package :mod:`stage_client.layout`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["DType", "Part", "Layout", "LayoutError", "Side", "columns", "check", "sides", "MAX_PARTS", "MAX_ROW_WIDTH"]

MAX_PARTS = 8
MAX_ROW_WIDTH = 65535
_MAX_INT = (1 << 63) - 1  # every count, offset and stride must fit an int64 (the Go side's type)


class LayoutError(ValueError):
    """A layout that is invalid, or two that cannot meet in one transfer."""


class DType(str, enum.Enum):
    """Element types of a KV cache; the value is the wire name."""

    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"
    INT8 = "int8"

    @property
    def size(self) -> int:
        """Bytes per element."""
        return _DTYPE_SIZE[self]

    @classmethod
    def parse(cls, v: Union[str, "DType"]) -> "DType":
        try:
            return cls(v)
        except ValueError:
            raise LayoutError("unknown dtype %r (known: %s)" % (v, ", ".join(d.value for d in cls))) from None

    def __str__(self) -> str:
        return self.value


_DTYPE_SIZE = {DType.F16: 2, DType.BF16: 2, DType.F32: 4, DType.FP8_E4M3: 1, DType.FP8_E5M2: 1, DType.INT8: 1}


@dataclass(frozen=True)
class Part:
    """One part of the logical row (K, V, an MLA latent or rope) in one tensor."""

    name: str
    width: int
    tensor: int
    offset: int
    block_stride: int
    slot_stride: int
    head_stride: int

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "width": self.width, "tensor": self.tensor, "offset": self.offset,
                "block_stride": self.block_stride, "slot_stride": self.slot_stride, "head_stride": self.head_stride}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Part":
        _keys(d, _PART_KEYS, "part")
        name = d["name"]
        if not isinstance(name, str):
            raise LayoutError("part name %r is not a string" % (name,))
        return cls(name, *(_int(d, k, "part %r" % name) for k in _PART_KEYS[1:]))


_PART_KEYS = ("name", "width", "tensor", "offset", "block_stride", "slot_stride", "head_stride")
_LAYOUT_KEYS = ("dtype", "block_size", "blocks", "heads", "head_lo", "head_hi", "parts")


def _keys(d: Mapping[str, Any], want: Sequence[str], what: str) -> None:
    if not isinstance(d, Mapping):
        raise LayoutError("%s: %s, not an object" % (what, type(d).__name__))
    missing = [k for k in want if k not in d]
    extra = sorted(k for k in d if k not in want)
    if missing or extra:
        raise LayoutError("%s: missing fields %s, unknown fields %s" % (what, missing, extra))


def _int(d: Mapping[str, Any], k: str, what: str) -> int:
    v = d[k]
    if isinstance(v, bool) or not isinstance(v, int):
        raise LayoutError("%s: %s = %r is not an integer" % (what, k, v))
    if not 0 <= v <= _MAX_INT:
        raise LayoutError("%s: %s = %d out of range [0, 2^63)" % (what, k, v))
    return v


@dataclass(frozen=True)
class Layout:
    """One layer of a KV cache as one engine (one TP rank) stores it."""

    dtype: DType
    block_size: int
    blocks: int
    heads: int
    head_lo: int
    head_hi: int
    parts: Tuple[Part, ...] = field(default_factory=tuple)

    #: ``Layout.from_tensor(tensors, preset_or_roles, head_lo, head_hi, heads, **kw)``: the layout read off
    #: torch tensors in the engine's own shape. It is :func:`stage_client.layout.tensors.from_tensor`, which
    #: the package :mod:`stage_client.layout` (above both modules) sets here, so that this module imports
    #: nothing of the code that reads tensors.
    from_tensor: ClassVar[Callable[..., "Layout"]]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DType.parse(self.dtype))
        object.__setattr__(self, "parts", tuple(self.parts))

    @property
    def held(self) -> int:
        """Kv heads this side holds (head_hi - head_lo)."""
        return self.head_hi - self.head_lo

    @property
    def row_width(self) -> int:
        """Elements of one logical row (the sum of the parts' widths)."""
        return sum(p.width for p in self.parts)

    @property
    def tensors(self) -> int:
        """How many tensors (regions) a layer of this layout spans."""
        return 1 + max((p.tensor for p in self.parts), default=-1)

    def boundaries(self) -> List[int]:
        """Column offsets where parts start, and the row width: [0, w0, w0+w1, ..., W]."""
        out = [0]
        for p in self.parts:
            out.append(out[-1] + p.width)
        return out

    def part_at(self, col: int) -> Tuple[Part, int]:
        """The part holding logical column ``col`` and the column where that part starts."""
        start = 0
        for p in self.parts:
            if start <= col < start + p.width:
                return p, start
            start += p.width
        raise LayoutError("column %d outside the row of %d elements" % (col, start))

    def extent(self, p: Part) -> int:
        """One past the highest byte any row of part ``p`` touches."""
        return (p.offset + (self.blocks - 1) * p.block_stride + (self.block_size - 1) * p.slot_stride
                + (self.held - 1) * p.head_stride + p.width * self.dtype.size)

    def validate(self, tensor_lens: Optional[Sequence[int]] = None) -> None:
        """Raise LayoutError unless this is a valid layout.

        ``tensor_lens`` are the byte lengths of the layer's tensors (regions),
        one per tensor index the parts use; without it the bounds are not
        checked. Rows of distinct (block, slot, head, part) must not overlap:
        see :func:`_check_overlap` for the (sufficient) rule.
        """
        for k in ("block_size", "blocks", "heads", "head_lo", "head_hi"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _MAX_INT:
                raise LayoutError("layout: %s = %r is not an integer in [0, 2^63)" % (k, v))
        if self.block_size < 1 or self.blocks < 1 or self.heads < 1:
            raise LayoutError("layout: block_size %d, blocks %d, heads %d: each must be at least 1"
                              % (self.block_size, self.blocks, self.heads))
        if not self.head_lo < self.head_hi <= self.heads:
            raise LayoutError("layout: head slice [%d, %d) is not inside [0, %d)"
                              % (self.head_lo, self.head_hi, self.heads))
        if not 1 <= len(self.parts) <= MAX_PARTS:
            raise LayoutError("layout: %d parts; 1 to %d allowed" % (len(self.parts), MAX_PARTS))
        for p in self.parts:
            for k in _PART_KEYS[1:]:
                v = getattr(p, k)
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _MAX_INT:
                    raise LayoutError("part %r: %s = %r is not an integer in [0, 2^63)" % (p.name, k, v))
            if p.width < 1:
                raise LayoutError("part %r: width %d; at least 1" % (p.name, p.width))
            if p.name == "kv":
                raise LayoutError('part name "kv" is not allowed: a packed K|V row is two parts, k and v')
        if self.row_width > MAX_ROW_WIDTH:
            raise LayoutError("layout: logical row of %d elements; at most %d" % (self.row_width, MAX_ROW_WIDTH))
        if tensor_lens is not None:
            for p in self.parts:
                if p.tensor >= len(tensor_lens):
                    raise LayoutError("part %r: tensor %d, but the layer has %d tensors"
                                      % (p.name, p.tensor, len(tensor_lens)))
                end, n = self.extent(p), tensor_lens[p.tensor]
                # Python ints do not overflow; the bound is the same one Go checks with care.
                if end > n:
                    raise LayoutError("part %r: rows reach byte %d of tensor %d, which has %d bytes"
                                      % (p.name, end, p.tensor, n))
        _check_overlap(self)

    def to_dict(self) -> Dict[str, Any]:
        """The JSON form (field names as in the Go package and the wire)."""
        return {"dtype": self.dtype.value, "block_size": self.block_size, "blocks": self.blocks,
                "heads": self.heads, "head_lo": self.head_lo, "head_hi": self.head_hi,
                "parts": [p.to_dict() for p in self.parts]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Layout":
        """Parse :meth:`to_dict`'s form strictly (every field, no others), then validate."""
        _keys(d, _LAYOUT_KEYS, "layout")
        if not isinstance(d["dtype"], str):
            raise LayoutError("layout: dtype %r is not a string" % (d["dtype"],))
        parts = d["parts"]
        if not isinstance(parts, (list, tuple)):
            raise LayoutError("layout: parts is %s, not a list" % type(parts).__name__)
        if len(parts) > MAX_PARTS:
            raise LayoutError("layout: %d parts; 1 to %d allowed" % (len(parts), MAX_PARTS))
        lay = cls(DType.parse(d["dtype"]), *(_int(d, k, "layout") for k in _LAYOUT_KEYS[1:6]),
                  tuple(Part.from_dict(p) for p in parts))
        lay.validate()
        return lay



def _check_overlap(lay: Layout) -> None:
    """Refuse layouts whose rows could overlap (a sufficient check, not an exact one).

    Within a part, the (count, stride) dimensions of block, slot and head,
    sorted by stride, must nest: each stride at least the span of the
    dimensions inside it, starting from the row's bytes. Parts in one
    tensor must either occupy disjoint byte intervals (K and V halves of a
    vLLM flash tensor, or separate tensors), or share all three strides and
    then either sit side by side inside one row (packed K|V) or be spaced
    evenly so the part acts as one more nested dimension (FlashInfer's K
    and V blocks). Anything else is refused even if it happens not to
    overlap.
    """
    e = lay.dtype.size
    for p in lay.parts:
        if not _nests(lay, p, p.width * e, []):
            raise LayoutError("part %r: strides block %d, slot %d, head %d let rows of %d bytes overlap"
                              % (p.name, p.block_stride, p.slot_stride, p.head_stride, p.width * e))
    by_tensor: Dict[int, List[Part]] = {}
    for p in lay.parts:
        by_tensor.setdefault(p.tensor, []).append(p)
    for t, ps in by_tensor.items():
        if len(ps) < 2:
            continue
        iv = sorted((p.offset, lay.extent(p)) for p in ps)
        if all(iv[i][1] <= iv[i + 1][0] for i in range(len(iv) - 1)):
            continue
        strides = {(p.block_stride, p.slot_stride, p.head_stride) for p in ps}
        if len(strides) == 1 and (_side_by_side(lay, ps) or _evenly_spaced(lay, ps)):
            continue
        raise LayoutError("tensor %d: parts %s may overlap (neither disjoint nor interleaved with equal strides)"
                          % (t, [p.name for p in ps]))


def _nests(lay: Layout, p: Part, row: int, extra: List[Tuple[int, int]]) -> bool:
    dims = [(lay.blocks, p.block_stride), (lay.block_size, p.slot_stride), (lay.held, p.head_stride)] + extra
    span = row
    for count, stride in sorted((d for d in dims if d[0] > 1), key=lambda d: d[1]):
        if stride < span:
            return False
        span = stride * (count - 1) + span
    return True


def _side_by_side(lay: Layout, ps: List[Part]) -> bool:
    e = lay.dtype.size
    ps = sorted(ps, key=lambda p: p.offset)
    if any(a.offset + a.width * e > b.offset for a, b in zip(ps, ps[1:])):
        return False
    row = ps[-1].offset + ps[-1].width * e - ps[0].offset
    return _nests(lay, ps[0], row, [])


def _evenly_spaced(lay: Layout, ps: List[Part]) -> bool:
    ps = sorted(ps, key=lambda p: p.offset)
    gap = ps[1].offset - ps[0].offset
    if any(b.offset - a.offset != gap for a, b in zip(ps, ps[1:])):
        return False
    row = max(p.width for p in ps) * lay.dtype.size
    return _nests(lay, ps[0], row, [(len(ps), gap)])


# ----------------------------------------------------------------------
# two layouts meet


def columns(a: Layout, b: Layout) -> List[Tuple[int, int]]:
    """The logical row cut at the union of both sides' part boundaries: [(c0, c1), ...]."""
    if a.row_width != b.row_width:
        raise LayoutError("kv layouts: logical row width %d elements against %d" % (a.row_width, b.row_width))
    cuts = sorted(set(a.boundaries()) | set(b.boundaries()))
    return list(zip(cuts, cuts[1:]))


def check(a: Layout, b: Layout) -> Tuple[int, int]:
    """Refuse two layouts that cannot hold the same rows; give the head range they share.

    The checks before any byte moves: same dtype, same logical row width,
    same total kv heads, overlapping head slices. Each error names both
    sides' values (``a`` first).
    """
    if a.dtype != b.dtype:
        raise LayoutError("kv layouts: dtype %s against %s" % (a.dtype, b.dtype))
    if a.row_width != b.row_width:
        raise LayoutError("kv layouts: logical row width %d elements against %d" % (a.row_width, b.row_width))
    if a.heads != b.heads:
        raise LayoutError("kv layouts: %d kv heads in total against %d" % (a.heads, b.heads))
    lo, hi = max(a.head_lo, b.head_lo), min(a.head_hi, b.head_hi)
    if lo >= hi:
        raise LayoutError("kv layouts: head slices [%d, %d) and [%d, %d) do not overlap"
                          % (a.head_lo, a.head_hi, b.head_lo, b.head_hi))
    return lo, hi


@dataclass
class Side:
    """One side of a KV transfer: what it maps between its memory and the canonical byte stream.

    Token ``t`` of the transfer lives in block ``block_table[(first_token +
    t) // block_size]``, slot ``(first_token + t) % block_size``. The
    stream holds, per layer, per column range, per token, per head in
    ``[head_lo, head_hi)``, that row piece's bytes.
    """

    layout: Layout
    block_table: Sequence[int]
    tokens: int
    first_token: int = 0
    head_lo: int = 0
    head_hi: int = 0
    cols: List[Tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.head_hi == 0:
            self.head_lo, self.head_hi = self.layout.head_lo, self.layout.head_hi
        if not self.cols:
            b = self.layout.boundaries()
            self.cols = list(zip(b, b[1:]))

    def blocks_needed(self) -> int:
        if self.tokens == 0:
            return 0
        return (self.first_token + self.tokens - 1) // self.layout.block_size + 1

    def validate(self, what: str = "side") -> None:
        """Refuse a side whose tokens, heads, columns or block ids do not fit its layout."""
        lay = self.layout
        if self.tokens < 0 or self.first_token < 0:
            raise LayoutError("%s: %d tokens from token %d" % (what, self.tokens, self.first_token))
        need = self.blocks_needed()
        if need > len(self.block_table):
            raise LayoutError("%s: %d tokens from token %d need %d blocks of %d, the block table has %d"
                              % (what, self.tokens, self.first_token, need, lay.block_size, len(self.block_table)))
        if not lay.head_lo <= self.head_lo < self.head_hi <= lay.head_hi:
            raise LayoutError("%s: heads [%d, %d) not inside the slice [%d, %d) it holds"
                              % (what, self.head_lo, self.head_hi, lay.head_lo, lay.head_hi))
        cols = self.cols
        if not (cols and cols[0][0] == 0 and cols[-1][1] == lay.row_width and all(c0 < c1 for c0, c1 in cols)
                and all(x[1] == y[0] for x, y in zip(cols, cols[1:]))):
            raise LayoutError("%s: columns %s do not cut [0, %d)" % (what, cols, lay.row_width))
        for c0, c1 in self.cols:
            p, start = lay.part_at(c0)
            if c1 > start + p.width:
                raise LayoutError("%s: columns [%d, %d) cross the end of part %r" % (what, c0, c1, p.name))
        used = self.block_table[:need]
        if need:
            # min/max are one pass each and work on lists and torch tensors alike
            lo = int(used.min()) if hasattr(used, "min") else min(used)
            hi = int(used.max()) if hasattr(used, "max") else max(used)
            if lo < 0 or hi >= lay.blocks:
                bad = next(i for i in range(need) if not 0 <= int(used[i]) < lay.blocks)
                raise LayoutError("%s: block id %d at table index %d is outside the %d blocks of the region"
                                  % (what, int(used[bad]), bad, lay.blocks))

    def nbytes(self, layers: int = 1) -> int:
        """Bytes of the canonical stream for ``layers`` layers."""
        return layers * self.tokens * (self.head_hi - self.head_lo) * self.layout.row_width * self.layout.dtype.size


def sides(a: Layout, table_a: Sequence[int], b: Layout, table_b: Sequence[int], tokens: int,
          first_a: int = 0, first_b: int = 0, heads: Optional[Tuple[int, int]] = None) -> Tuple[Side, Side]:
    """Check two layouts and build the matching sides of one transfer.

    ``heads`` narrows the moved heads to a sub-range of the slices'
    intersection. Raises LayoutError naming both sides' values.
    """
    lo, hi = check(a, b)
    if heads is not None:
        if not lo <= heads[0] < heads[1] <= hi:
            raise LayoutError("kv transfer: heads [%d, %d) not inside the shared slice [%d, %d)"
                              % (heads[0], heads[1], lo, hi))
        lo, hi = heads
    cols = columns(a, b)
    sa = Side(a, table_a, tokens, first_a, lo, hi, cols)
    sb = Side(b, table_b, tokens, first_b, lo, hi, list(cols))
    sa.validate("source")
    sb.validate("destination")
    return sa, sb

