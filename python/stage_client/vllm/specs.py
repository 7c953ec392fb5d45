"""Which KV-cache groups the connector can move, asked of vLLM's spec classes.

vLLM describes each KV-cache group by a spec object; engines built on it
subclass those classes (vllm-ascend's ``AscendMLAAttentionSpec`` is an
``MLAAttentionSpec``), so a spec is judged by ``isinstance`` against the
installed vLLM's classes, never by its class name. Without vLLM (the
replay tests) the same question is asked of the class hierarchy's names.

:func:`refusal` is the pure decision: the reason a KV cache config cannot
be moved, naming the model feature and what to change, or None.
"""

from __future__ import annotations

from typing import Any, List, Optional

__all__ = ["SPARSE_MLA", "is_a", "refusal", "sparse_model", "specs_of"]


def _vllm_class(name: str) -> Any:
    try:
        import vllm.v1.kv_cache_interface as kvi  # type: ignore
    except Exception:  # noqa: BLE001 - no usable vLLM
        return None
    return getattr(kvi, name, None)


def is_a(spec: Any, name: str) -> bool:
    """``isinstance(spec, vllm.v1.kv_cache_interface.<name>)``; without that class, a class of that name in its MRO."""
    cls = _vllm_class(name)
    if cls is not None:
        return isinstance(spec, cls)
    return any(c.__name__ == name for c in type(spec).__mro__)


def specs_of(group_spec: Any) -> List[Any]:
    """The layer specs of one group (a UniformTypeKVCacheSpecs holds one per layer)."""
    inner = getattr(group_spec, "kv_cache_specs", None)
    if is_a(group_spec, "UniformTypeKVCacheSpecs") and isinstance(inner, dict):
        return list(inner.values())
    return [group_spec]


def _feature(spec: Any) -> Optional[str]:
    """The model feature a layer spec stands for when stage cannot move it; None for a full-attention (MLA) spec."""
    if is_a(spec, "MambaSpec"):
        return "Mamba"
    if is_a(spec, "SlidingWindowSpec"):
        return "sliding-window attention"
    if is_a(spec, "ChunkedLocalAttentionSpec"):
        return "chunked local attention"
    if is_a(spec, "HiddenStateCacheSpec"):
        return "hidden-state cache layers (extract_hidden_states)"
    if is_a(spec, "MLAAttentionSpec") and getattr(spec, "sparse_head_dim", None):
        return "sparse MLA"
    if is_a(spec, "MLAAttentionSpec") and (getattr(spec, "compress_ratio", 1) != 1 or getattr(spec, "model_version",
                                                                                             None)):
        return "compressed MLA (DeepSeek-V4's cache layout)"
    if getattr(spec, "tq_slot_size", 0):
        return "a TQ-quantized KV cache (TQFullAttentionSpec)"
    if is_a(spec, "FullAttentionSpec"):
        return None
    return type(spec).__name__


SPARSE_MLA = ("a sparse MLA model (DSA: each layer keeps an indexer cache beside its latent and rope, vllm-ascend's "
              "3- and 4-tensor caches); stage moves the dense latent + rope pair only, and the decode would "
              "attend without the indexer's keys. Serve a dense MLA or an attention model")


def sparse_model(vllm_config: Any) -> bool:
    """A DSA model, as vllm-ascend tells one (utils.model_uses_sfa_sparse): an indexer (``index_topk``), no
    DeepSeek-V4 compression (``compress_ratios``)."""
    mc = getattr(vllm_config, "model_config", None)
    text, hf = getattr(mc, "hf_text_config", None), getattr(mc, "hf_config", None)
    return (text is not None and hasattr(text, "index_topk") and not hasattr(text, "compress_ratios")
            and not hasattr(hf, "compress_ratios"))


def refusal(kv_cache_config: Any, vllm_config: Any = None) -> Optional[str]:
    """Why stage cannot move this KV cache config (the feature, what to change), or None."""
    if sparse_model(vllm_config):
        return SPARSE_MLA
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or ())
    feats = []
    for g in groups:
        spec = getattr(g, "kv_cache_spec", None)
        if spec is not None:
            feats += [f for f in (_feature(s) for s in specs_of(spec)) if f]
    if "Mamba" in feats:
        return ("an attention+Mamba model (Mamba / linear-attention layers keep a recurrent state, not paged "
                "rows per token); stage moves paged attention caches only, and the decode would run without the "
                "state. Serve a model whose layers all use full attention")
    if "sparse MLA" in feats:
        return SPARSE_MLA
    if len(groups) > 1:
        kinds = sorted(set(feats)) or ["full attention"]
        return ("a hybrid model (%d KV-cache groups: %s besides full attention); vllm-ascend then cuts every block "
                "into kernel blocks of 128 tokens, so the block ids no longer index the cache, and stage moves one "
                "full-attention group. Start vLLM with --disable-hybrid-kv-cache-manager (its sliding-window "
                "layers then keep whole blocks), or serve a model whose layers all use full attention"
                % (len(groups), ", ".join(kinds)))
    if feats:
        return ("a KV cache of %s; stage moves full-attention (or dense MLA) caches only" % feats[0])
    return None
