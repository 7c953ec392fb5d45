"""Tiny transformers models (seeded random weights) whose prefill KV fills engine-layout caches (no tests here).

Three attention kinds, each a real transformers model class run on the CPU
in float32, eager attention:

* ``gqa``: LlamaForCausalLM as tests/tinyllama.py makes it (4 query heads
  over 2 kv heads of 32 channels, 2 layers, vocab 512);
* ``mha``: the same with 4 kv heads;
* ``mla``: DeepseekV3ForCausalLM with DeepSeek-V3's latent widths
  (kv_lora_rank 512, qk_rope_head_dim 64), every layer dense.

:func:`prefill` runs a batch of prompts (one length: no padding) and hands
each layer's KV rows to ``on_layer`` as soon as the layer ran, in the form
the engine caches keep: ``(K, V)`` rows ``(B, T, kv_heads, head_size)``
for gqa/mha; for mla the normalised latent ``(B, T, 512)`` and the rotated
rope key ``(B, T, 64)`` (what vLLM and vllm-ascend cache for MLA; the model
itself caches the up-projected K and V). :func:`rebuild` turns rows read
back from a decode cache into the model's own cache (for mla through the
model's own ``kv_b_proj``, as its attention does), and :func:`decode`
continues greedily from it.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

VOCAB = 512
KINDS = ("mha", "gqa", "mla")
INIT = 0.2  # weights wider than the default 0.02, so that greedy decoding does not repeat one token


def make(kind: str, seed: int = 0) -> Any:
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if kind == "mla":
        cfg = DeepseekV3Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                               n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=2,
                               kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=32,
                               v_head_dim=32, max_position_embeddings=1024, rope_scaling=None,
                               bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                               initializer_range=INIT)
        cls = DeepseekV3ForCausalLM
    else:
        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4 if kind == "mha" else 2, head_dim=32,
                          max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                          tie_word_embeddings=False, initializer_range=INIT)
        cls = LlamaForCausalLM
    cfg._attn_implementation = "eager"
    model = cls(cfg).to(torch.float32).eval()
    model.stage_kind = kind
    return model


def kv_heads(model: Any) -> int:
    """The kv heads an engine cache holds: the model's, or one latent head for MLA."""
    return 1 if model.stage_kind == "mla" else int(model.config.num_key_value_heads)


def head_size(model: Any) -> int:
    return 0 if model.stage_kind == "mla" else int(model.config.head_dim)


def prefill(model: Any, prompts: Sequence[Sequence[int]], on_layer: Optional[Callable[[int, Any, Any], None]] = None
            ) -> Tuple[Any, Any]:
    """(logits of each prompt's last token (B, vocab), the model's cache); ``on_layer(i, a, b)`` per layer."""
    import torch
    from transformers import DynamicCache

    ids = torch.tensor([list(p) for p in prompts], dtype=torch.long)
    attn = [layer.self_attn for layer in model.model.layers]
    latent: List[Any] = [None] * len(attn)
    hooks = []
    if on_layer is not None:
        mla = model.stage_kind == "mla"
        for i, a in enumerate(attn):
            if mla:
                def grab(_m: Any, _in: Any, out: Any, i: int = i) -> None:
                    latent[i] = out.detach().clone()
                hooks.append(a.kv_a_layernorm.register_forward_hook(grab))

            def after(_m: Any, _a: Any, kw: Any, _out: Any, i: int = i, a: Any = a) -> None:
                lay = kw["past_key_values"].layers[i]
                if mla:  # the rope part is the same for every head: head 0's
                    on_layer(i, latent[i], lay.keys[:, 0, :, a.qk_nope_head_dim:])
                else:
                    on_layer(i, lay.keys.transpose(1, 2), lay.values.transpose(1, 2))
            hooks.append(a.register_forward_hook(after, with_kwargs=True))
    try:
        with torch.no_grad():
            out = model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True)
    finally:
        for h in hooks:
            h.remove()
    return out.logits[:, -1], out.past_key_values


def rebuild(model: Any, rows: Sequence[Tuple[Any, Any]]) -> Any:
    """The model's cache from each layer's rows as :func:`prefill` gave them to ``on_layer``."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        for i, (a, b) in enumerate(rows):
            if model.stage_kind == "mla":  # as DeepseekV3Attention.forward builds K and V from the latent
                at = model.model.layers[i].self_attn
                B, T = a.shape[0], a.shape[1]
                kv = at.kv_b_proj(a).view(B, T, -1, at.qk_nope_head_dim + at.v_head_dim).transpose(1, 2)
                k_pass, v = torch.split(kv, [at.qk_nope_head_dim, at.v_head_dim], dim=-1)
                k_rot = b.reshape(B, 1, T, at.qk_rope_head_dim).expand(*k_pass.shape[:-1], -1)
                cache.update(torch.cat((k_pass, k_rot), dim=-1), v, i)
            else:
                cache.update(a.transpose(1, 2).contiguous(), b.transpose(1, 2).contiguous(), i)
    return cache


def decode(model: Any, logits: Any, cache: Any, steps: int) -> Any:
    """Greedy tokens (B, steps) from the prefill's last logits and the model's cache."""
    import torch

    tok = logits.argmax(-1)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            lg = model(input_ids=tok[:, None], past_key_values=cache, use_cache=True).logits[:, -1]
            tok = lg.argmax(-1)
            out.append(tok)
    return torch.stack(out, 1)
