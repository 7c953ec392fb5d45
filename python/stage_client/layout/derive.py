"""Layouts from tensor shapes: the one place that turns an engine's tensors into parts.

:func:`preset` builds the layout of a freshly allocated cache of a named
preset (:mod:`.presets`); :func:`.tensors.from_tensor` feeds :func:`derive` the
strides of the engine's real tensors instead, so both go through the same
code.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .model import DType, Layout, LayoutError, Part
from .presets import DIMS, MLA_WIDTHS, PRESETS, TensorRoles

__all__ = ["derive", "part_widths", "physical_shape", "preset", "roles_of", "tensor_lens"]


def roles_of(name_or_roles: Any) -> Tuple[TensorRoles, ...]:
    """A preset's roles, or explicit roles (TensorRoles or (dims, parts) pairs) checked."""
    if isinstance(name_or_roles, str):
        try:
            return PRESETS[name_or_roles]
        except KeyError:
            raise LayoutError("unknown kv layout preset %r (known: %s)" % (name_or_roles, ", ".join(PRESETS))) from None
    out = []
    for r in name_or_roles:
        r = r if isinstance(r, TensorRoles) else TensorRoles(tuple(r[0]), tuple(r[1]))
        bad = [d for d in r.dims if d not in DIMS]
        if bad or len(set(r.dims)) != len(r.dims) or "chan" not in r.dims or not r.parts:
            raise LayoutError("tensor roles %s: dims must be distinct names among kv, block, slot, token, head, "
                              "chan, with chan present and at least one part" % (r.dims,))
        if ("token" in r.dims) == ("block" in r.dims or "slot" in r.dims):
            raise LayoutError("tensor roles %s: either token, or block and slot" % (r.dims,))
        out.append(r)
    if not out:
        raise LayoutError("no tensor roles")
    return tuple(out)


def part_widths(roles: Sequence[TensorRoles], widths: Optional[Sequence[int]], head_size: Optional[int],
                name: str = "") -> List[int]:
    """One width per part (logical order): ``widths``, or ``head_size`` for every part, or an MLA default."""
    nparts = sum(len(r.parts) for r in roles)
    if widths is None:
        if head_size is not None:
            widths = [head_size] * nparts
        elif name in MLA_WIDTHS:
            widths = list(MLA_WIDTHS[name])
        else:
            raise LayoutError("%s: give head_size or widths" % (name or "layout"))
    widths = [int(w) for w in widths]
    if len(widths) != nparts:
        raise LayoutError("%s: %d widths for %d parts" % (name or "layout", len(widths), nparts))
    return widths


def derive(roles: Sequence[TensorRoles], shapes: Sequence[Sequence[int]], strides: Sequence[Sequence[int]],
           offsets: Sequence[int], dtype: DType, head_lo: int, head_hi: int, heads: int,
           widths: Optional[Sequence[int]] = None, page_size: Optional[int] = None, name: str = "") -> Layout:
    """Build a layout from each tensor's shape and strides (elements), byte offset and roles.

    This is the one place that turns shapes into parts: :func:`preset`
    feeds it the strides of a freshly allocated tensor, and
    :func:`.tensors.from_tensor` those of the engine's real tensor.
    """
    what = name or "layout"
    dtype = DType.parse(dtype)
    e = dtype.size
    if len(shapes) != len(roles):
        raise LayoutError("%s: %d tensors given, the layout has %d" % (what, len(shapes), len(roles)))
    if widths is not None:
        widths = [int(w) for w in widths]
    geo: Optional[Tuple[int, int, int]] = None
    parts: List[Part] = []
    wi = 0
    for ti, (r, shape, stride, off) in enumerate(zip(roles, shapes, strides, offsets)):
        if len(shape) != len(r.dims):
            raise LayoutError("%s: tensor %d has shape %s, expected %d dims (%s)"
                              % (what, ti, tuple(shape), len(r.dims), ", ".join(r.dims)))
        d = {k: (int(n), int(s)) for k, n, s in zip(r.dims, shape, stride)}
        if "token" in d:
            if page_size is None or page_size < 1:
                raise LayoutError("%s: a token-indexed tensor needs page_size >= 1" % what)
            tokens, ts = d["token"]
            if tokens < page_size:
                raise LayoutError("%s: tensor %d holds %d tokens, less than one page of %d" % (what, ti, tokens, page_size))
            blocks, bs, bstride, sstride = tokens // page_size, page_size, page_size * ts, ts
        else:
            (blocks, bstride), (bs, sstride) = d["block"], d["slot"]
        held, hstride = d.get("head", (1, 0))
        if geo is None:
            geo = (blocks, bs, held)
        elif geo != (blocks, bs, held):
            raise LayoutError("%s: tensor %d has (blocks, block_size, heads) %s, tensor 0 %s"
                              % (what, ti, (blocks, bs, held), geo))
        chan, cstride = d["chan"]
        if chan > 1 and cstride != 1:
            raise LayoutError("%s: tensor %d: channels are not contiguous (stride %d)" % (what, ti, cstride))
        if "kv" in d:
            nkv, kvstride = d["kv"]
            if nkv != len(r.parts):
                raise LayoutError("%s: tensor %d: kv dim of %d for parts %s" % (what, ti, nkv, list(r.parts)))
            for k, pname in enumerate(r.parts):
                if widths is not None and widths[wi] != chan:
                    raise LayoutError("%s: part %r is %d wide in the tensor, %d expected" % (what, pname, chan, widths[wi]))
                parts.append(Part(pname, chan, ti, off + k * kvstride * e, bstride * e, sstride * e, hstride * e))
                wi += 1
        else:
            if widths is not None:
                ws = widths[wi:wi + len(r.parts)]
            elif chan % len(r.parts) == 0:
                ws = [chan // len(r.parts)] * len(r.parts)
            else:
                raise LayoutError("%s: tensor %d: %d channels do not split evenly into %s; give widths"
                                  % (what, ti, chan, list(r.parts)))
            if sum(ws) != chan or len(ws) != len(r.parts):
                raise LayoutError("%s: tensor %d has %d channels, parts %s want %s" % (what, ti, chan, list(r.parts), ws))
            c0 = 0
            for pname, w in zip(r.parts, ws):
                parts.append(Part(pname, w, ti, off + c0 * e, bstride * e, sstride * e, hstride * e))
                c0 += w
                wi += 1
    assert geo is not None
    blocks, bs, held = geo
    # A stride over a dimension of one element is meaningless (torch leaves it arbitrary): it is 0.
    parts = [Part(p.name, p.width, p.tensor, p.offset, 0 if blocks == 1 else p.block_stride,
                  0 if bs == 1 else p.slot_stride, 0 if held == 1 else p.head_stride) for p in parts]
    if held != head_hi - head_lo:
        raise LayoutError("%s: the tensors hold %d heads, the slice [%d, %d) is %d"
                          % (what, held, head_lo, head_hi, head_hi - head_lo))
    return Layout(dtype, bs, blocks, heads, head_lo, head_hi, tuple(parts))


def physical_shape(name: str, dtype: Union[str, DType], blocks: int, block_size: int, head_lo: int, head_hi: int,
                   widths: Sequence[int]) -> List[Tuple[Tuple[int, ...], Tuple[int, ...]]]:
    """Per tensor of preset ``name``: (logical shape, logical strides in elements) of a fresh allocation."""
    roles = roles_of(name)
    out = []
    wi = 0
    for r in roles:
        n = len(r.parts)
        ws = widths[wi:wi + n]
        wi += n
        size = {"kv": n, "block": blocks, "slot": block_size, "token": blocks * block_size,
                "head": head_hi - head_lo, "chan": ws[0] if "kv" in r.dims else sum(ws)}
        phys = r.physical or r.dims
        st: Dict[str, int] = {}
        acc = 1
        for dname in reversed(phys):
            st[dname] = acc
            acc *= size[dname]
        out.append((tuple(size[x] for x in r.dims), tuple(st[x] for x in r.dims)))
    return out


def preset(name: str, *, dtype: Union[str, DType], blocks: int, block_size: int, heads: int = 1,
           head_lo: int = 0, head_hi: Optional[int] = None, head_size: Optional[int] = None,
           widths: Optional[Sequence[int]] = None) -> Layout:
    """The layout of preset ``name`` as the engine allocates it (each tensor contiguous in its physical order).

    ``block_size`` is SGLang's page size. MLA presets have ``heads`` 1 and
    default widths 576 (vllm-mla, sglang-mla) or 512 + 64 (ascend-mla).
    """
    roles = roles_of(name)
    hi = heads if head_hi is None else head_hi
    if not 0 <= head_lo < hi <= heads:
        raise LayoutError("%s: head slice [%d, %s) is not inside [0, %d)" % (name, head_lo, hi, heads))
    ws = part_widths(roles, widths, head_size, name)
    geo = physical_shape(name, dtype, blocks, block_size, head_lo, hi, ws)
    lay = derive(roles, [g[0] for g in geo], [g[1] for g in geo], [0] * len(geo), DType.parse(dtype), head_lo, hi,
                 heads, ws, page_size=block_size, name=name)
    return lay


def tensor_lens(name: str, lay: Layout) -> List[int]:
    """Byte lengths of the tensors :func:`preset` describes (for validate)."""
    geo = physical_shape(name, lay.dtype, lay.blocks, lay.block_size, lay.head_lo, lay.head_hi,
                         [p.width for p in lay.parts])
    out = []
    for shape, _ in geo:
        n = lay.dtype.size
        for x in shape:
            n *= x
        out.append(n)
    return out
