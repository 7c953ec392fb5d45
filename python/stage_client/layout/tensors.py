"""Layouts from torch tensors, and the reference mapper (needs torch).

:func:`from_tensor` reads a layout off the tensors an engine really uses:
their shape, strides, element size and dtype, so a permuted view (vLLM's
HND cache is an NHD-shaped view of HND memory) or a ``kv[layer]`` view of a
larger allocation gives the strides and offsets of the memory, not of some
assumed contiguous shape.

:func:`gather` and :func:`scatter` map one side of a KV transfer between
its tensors and the canonical byte stream (per layer, per column range, per
token, per head). They index with torch (one advanced-indexing op per
layer and column range over a strided byte view of the region), so they
run on any device torch has. They are the reference the sidecar's
conversion is tested against; engines move KV through their sidecars with
``register_kv_cache`` and ``Client.submit_kv``.

The module imports without torch (torch is imported when a function that
needs it runs, which then raises ImportError saying so), so code and tests
that only name these functions load on a machine without torch.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .derive import derive, part_widths, roles_of
from .model import DType, Layout, LayoutError, Side

__all__ = ["from_tensor", "dtype_of", "region_bytes", "gather", "gather_tensor", "scatter"]


def _torch() -> Any:
    """The torch module; ImportError naming what needs it when torch is not installed."""
    try:
        import torch
    except ImportError as e:
        raise ImportError("stage_client.layout.tensors works on torch tensors and torch is not installed: %s "
                          "(install torch for this python)" % e) from e
    return torch


@functools.lru_cache(maxsize=None)
def _torch_dtypes() -> Dict[Any, DType]:
    torch = _torch()
    m = {torch.float16: DType.F16, torch.bfloat16: DType.BF16, torch.float32: DType.F32, torch.int8: DType.INT8}
    # float8 types exist from torch 2.1 on
    for attr, d in (("float8_e4m3fn", DType.FP8_E4M3), ("float8_e5m2", DType.FP8_E5M2)):
        t = getattr(torch, attr, None)
        if t is not None:
            m[t] = d
    return m


def dtype_of(t: Any, override: Union[None, str, DType] = None) -> DType:
    """The model's dtype of tensor ``t`` (``override`` for caches kept in another torch type, e.g. fp8 as uint8)."""
    if override is not None:
        d = DType.parse(override)
        if d.size != t.element_size():
            raise LayoutError("dtype %s is %d bytes, the tensor's elements are %d" % (d, d.size, t.element_size()))
        return d
    try:
        return _torch_dtypes()[t.dtype]
    except KeyError:
        raise LayoutError("tensor dtype %s has no kv layout dtype; pass dtype=" % t.dtype) from None


def _span(t: Any) -> int:
    """Elements from the tensor's first to one past its last (strides are non-negative in torch)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def region_bytes(t: Any) -> Any:
    """A flat uint8 view of the memory tensor ``t`` spans (its region), sharing its storage."""
    torch = _torch()
    flat = t.as_strided((_span(t),), (1,), t.storage_offset())
    return flat.view(torch.uint8)


def from_tensor(tensors: Any, preset_or_roles: Any, head_lo: int, head_hi: int, heads: int, *,
                head_size: Optional[int] = None, widths: Optional[Sequence[int]] = None,
                page_size: Optional[int] = None, dtype: Union[None, str, DType] = None,
                base: Any = None) -> Layout:
    """The layout of one layer from the engine's tensors for it.

    ``tensors``: one tensor, or one per tensor of the preset (ascend: K and
    V). ``preset_or_roles``: a preset name (the dims are then as the engine
    indexes them, e.g. vllm-hnd's ``(2, blocks, block_size, heads,
    head_size)`` view) or explicit :class:`~stage_client.layout.presets.TensorRoles`.
    ``widths`` splits a ``chan`` dim holding several parts unevenly;
    ``page_size`` is SGLang's; ``dtype`` overrides the torch dtype (same
    element size). ``base``: the tensor (or one per tensor) the engine
    registers as the region, when it is larger than the tensor (e.g. the
    whole ``(layers, ...)`` allocation); offsets are then from its first
    byte. The layout is validated against the regions' lengths.
    """
    ts = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
    roles = roles_of(preset_or_roles)
    name = preset_or_roles if isinstance(preset_or_roles, str) else ""
    if len(ts) != len(roles):
        raise LayoutError("%s: %d tensors given, the layout has %d" % (name or "layout", len(ts), len(roles)))
    d = dtype_of(ts[0], dtype)
    for i, t in enumerate(ts):
        if t.dtype != ts[0].dtype or t.device != ts[0].device:
            raise LayoutError("tensor %d is %s on %s, tensor 0 %s on %s" % (i, t.dtype, t.device, ts[0].dtype, ts[0].device))
    bases = ts if base is None else (list(base) if isinstance(base, (list, tuple)) else [base] * len(ts))
    if len(bases) != len(ts):
        raise LayoutError("%d base tensors for %d tensors" % (len(bases), len(ts)))
    offsets, lens = [], []
    for i, (t, b) in enumerate(zip(ts, bases)):
        off = t.data_ptr() - b.data_ptr()
        blen = _span(b) * b.element_size()
        if off < 0 or off + _span(t) * t.element_size() > blen:
            raise LayoutError("tensor %d (bytes %d..%d of its base) is not inside its base region of %d bytes"
                              % (i, off, off + _span(t) * t.element_size(), blen))
        offsets.append(off)
        lens.append(blen)
    if widths is not None or head_size is not None:  # else the tensors' chan dims give the widths
        widths = part_widths(roles, widths, head_size, name)
    lay = derive(roles, [tuple(t.shape) for t in ts], [tuple(t.stride()) for t in ts], offsets, d, head_lo, head_hi,
                 heads, widths, page_size=page_size, name=name)
    lay.validate(lens)
    return lay


# ----------------------------------------------------------------------
# the reference mapper


def _layer_regions(side: Side, layer: Any) -> List[Any]:
    lay = side.layout
    regs = list(layer) if isinstance(layer, (list, tuple)) else [layer]
    if len(regs) < lay.tensors:
        raise LayoutError("a layer of this layout has %d tensors, %d given" % (lay.tensors, len(regs)))
    flats = [region_bytes(t) for t in regs]
    lay.validate([f.numel() for f in flats])
    return flats


def _index(side: Side, device: Any) -> Tuple[Any, Any, Any]:
    torch = _torch()
    lay = side.layout
    tok = torch.arange(side.first_token, side.first_token + side.tokens, dtype=torch.int64, device=device)
    table = torch.as_tensor(side.block_table, dtype=torch.int64).to(device)
    blk = table[tok // lay.block_size]
    slot = tok % lay.block_size
    heads = torch.arange(side.head_lo - lay.head_lo, side.head_hi - lay.head_lo, dtype=torch.int64, device=device)
    return blk[:, None], slot[:, None], heads[None, :]


def _rows(side: Side, flat: Any, c0: int, c1: int) -> Any:
    """A (blocks, block_size, held, bytes) view of the row pieces [c0, c1) in a region."""
    lay = side.layout
    p, start = lay.part_at(c0)
    e = lay.dtype.size
    return flat.as_strided((lay.blocks, lay.block_size, lay.held, (c1 - c0) * e),
                           (p.block_stride, p.slot_stride, p.head_stride, 1),
                           flat.storage_offset() + p.offset + (c0 - start) * e)


def _regions_for(side: Side, c0: int, flats: List[Any]) -> Any:
    return flats[side.layout.part_at(c0)[0].tensor]


def gather_tensor(side: Side, tensors: Sequence[Any]) -> Any:
    """The canonical stream of ``side`` as a uint8 tensor on the tensors' device.

    ``tensors[layer]`` are the layer's region tensors (those the engine
    registers: the ones given to from_tensor, or their ``base``), in tensor
    index order; a single tensor for a one-tensor layout.
    """
    torch = _torch()
    side.validate()
    out = []
    idx = None
    for layer in tensors:
        flats = _layer_regions(side, layer)
        if idx is None:
            idx = _index(side, flats[0].device)
        for c0, c1 in side.cols:
            out.append(_rows(side, _regions_for(side, c0, flats), c0, c1)[idx].reshape(-1))
    if not out:
        return torch.empty(0, dtype=torch.uint8)
    return torch.cat(out)


def gather(side: Side, tensors: Sequence[Any]) -> bytes:
    """The canonical bytes of ``side`` (see :func:`gather_tensor`)."""
    t = gather_tensor(side, tensors).cpu()
    try:
        return t.numpy().tobytes()
    except (RuntimeError, TypeError, ImportError):  # torch without numpy
        return bytes(t.tolist())


def scatter(side: Side, tensors: Sequence[Any], data: Any) -> None:
    """Write the canonical stream ``data`` (bytes-like or uint8 tensor) into ``side``'s rows.

    Only the rows the transfer names change. Raises LayoutError before
    writing anything when ``data`` has the wrong length.
    """
    torch = _torch()
    side.validate()
    layers = list(tensors)
    want = side.nbytes(len(layers))
    if isinstance(data, torch.Tensor):
        src = data.reshape(-1).view(torch.uint8) if data.dtype != torch.uint8 else data.reshape(-1)
    else:
        src = torch.frombuffer(bytearray(data), dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8)
    if src.numel() != want:
        raise LayoutError("scatter: %d bytes given, the transfer has %d" % (src.numel(), want))
    all_flats = [_layer_regions(side, layer) for layer in layers]
    if not all_flats:
        return
    dev = all_flats[0][0].device
    src = src.to(dev)
    idx = _index(side, dev)
    e = side.layout.dtype.size
    pos = 0
    th = side.tokens * (side.head_hi - side.head_lo)
    for flats in all_flats:
        for c0, c1 in side.cols:
            n = th * (c1 - c0) * e
            piece = src[pos:pos + n].reshape(side.tokens, side.head_hi - side.head_lo, (c1 - c0) * e)
            _rows(side, _regions_for(side, c0, flats), c0, c1)[idx] = piece
            pos += n
