"""Named KV layouts of the engines, as data: which dim of each tensor is what.

A preset names how each tensor of one layer maps to the model (which dim
is the block, the slot, the head, K/V, the channels). This module is a
leaf: it imports nothing of stage_client, so any module may import it
first. :mod:`.derive` turns these roles and real shapes into a Layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

__all__ = ["DIMS", "MLA_WIDTHS", "PRESETS", "TensorRoles", "is_mla"]


@dataclass(frozen=True)
class TensorRoles:
    """How one tensor of a layer maps to the model.

    ``dims`` names each dimension of the tensor as the engine indexes it:
    ``kv`` (selects the part: K, V), ``block``, ``slot`` (token in block),
    ``token`` (SGLang's flat token index: block * page_size + slot),
    ``head`` and ``chan`` (the channels: one part's row, or several parts
    side by side). ``parts`` are the names of the parts this tensor holds,
    in logical order. ``physical`` is the order of the dims in memory when
    :func:`preset` allocates it (default: ``dims``).
    """

    dims: Tuple[str, ...]
    parts: Tuple[str, ...]
    physical: Optional[Tuple[str, ...]] = None


_KV5 = ("kv", "block", "slot", "head", "chan")
_NHD4 = ("block", "slot", "head", "chan")

#: name -> the tensors of one layer, in tensor-index order
PRESETS: Dict[str, Tuple[TensorRoles, ...]] = {
    "vllm-flash": (TensorRoles(_KV5, ("k", "v")),),
    "vllm-nhd": (TensorRoles(_KV5, ("k", "v")),),
    # vLLM allocates HND physically and hands the engine a permuted view in NHD order.
    "vllm-hnd": (TensorRoles(_KV5, ("k", "v"), ("kv", "block", "head", "slot", "chan")),),
    "vllm-flashinfer": (TensorRoles(("block", "kv", "slot", "head", "chan"), ("k", "v")),),
    # vLLM's one 4-D tensor (blocks, heads, block_size, 2*head_size) with K|V in each token's row (GPU backends),
    # stored HND (as indexed) or NHD (stride order (0, 2, 1, 3)).
    "vllm-packed": (TensorRoles(("block", "head", "slot", "chan"), ("k", "v")),),
    "vllm-packed-hnd": (TensorRoles(("block", "head", "slot", "chan"), ("k", "v")),),
    "vllm-packed-nhd": (TensorRoles(("block", "head", "slot", "chan"), ("k", "v"), ("block", "slot", "head", "chan")),),
    # vLLM's CPU backend: per (block, head), the block's K, then its V (t.view(blocks, heads, 2, block_size,
    # head_size)). Inside each, the kernel keeps its own order (K channel-major for its vec ISA), so the
    # connector registers it block-granular: block_size 1 and head_size block_size*head_size (vllm/kvlayout.py).
    "vllm-cpu": (TensorRoles(("block", "head", "kv", "slot", "chan"), ("k", "v")),),
    "vllm-mla": (TensorRoles(("block", "slot", "chan"), ("kv_c",)),),
    "ascend": (TensorRoles(_NHD4, ("k",)), TensorRoles(_NHD4, ("v",))),
    # vllm-ascend MLA: the latent (kv_lora_rank) and rope caches apart, each (blocks, block_size, 1, width)
    # (model_runner_v1's _reshape_kv_cache_tensors: the backend's 4-D shape with one kv head).
    "ascend-mla": (TensorRoles(_NHD4, ("latent",)), TensorRoles(_NHD4, ("rope",))),
    "sglang": (TensorRoles(("token", "head", "chan"), ("k",)), TensorRoles(("token", "head", "chan"), ("v",))),
    "sglang-mla": (TensorRoles(("token", "head", "chan"), ("kv_c",)),),
}

#: the names a tensor dimension may have
DIMS = ("kv", "block", "slot", "token", "head", "chan")

#: default part widths of the MLA presets (one latent row, or latent + rope)
MLA_WIDTHS: Dict[str, Tuple[int, ...]] = {"vllm-mla": (576,), "sglang-mla": (576,), "ascend-mla": (512, 64)}


def is_mla(preset: str) -> bool:
    """Whether ``preset`` is a multi-head latent attention cache: one latent row per token, the same on every
    tensor-parallel rank (no kv heads to split), so each rank registers it as one head."""
    return preset in MLA_WIDTHS
