"""A tiny Llama checkpoint from seeded random weights, written by transformers: nothing from a model hub.

``write(path)`` makes ``config.json`` + ``model.safetensors`` (2 layers,
hidden 128, 4 query heads over 2 kv heads of 32 channels, vocab 512) and a
word-level tokenizer (``<pad> <s> </s> <unk> w4 .. w511``, split on
whitespace) that vLLM loads from the same directory. The same seed gives
the same bytes. Run as a script: ``python tinyllama.py DIR``.
"""

from __future__ import annotations

import os
import sys

VOCAB = 512
LAYERS = 2
KV_HEADS = 2
HEAD_SIZE = 32


def write(path: str, seed: int = 0, vocab: int = VOCAB, layers: int = LAYERS, heads: int = 4,
          kv_heads: int = KV_HEADS, head_size: int = HEAD_SIZE, hidden: int = 128, intermediate: int = 256,
          max_positions: int = 1024, dtype: str = "float32") -> str:
    """The checkpoint and tokenizer in ``path``; the defaults are the shape above (scripts/gpu_vllm_pair.py
    asks for a GPU-shaped one: head size 128, bf16)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(path, exist_ok=True)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      head_dim=head_size, max_position_embeddings=max_positions, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(getattr(torch, dtype))
    model.save_pretrained(path, safe_serialization=True)
    words = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    words.update(("w%d" % i, i) for i in range(4, vocab))
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            pad_token="<pad>").save_pretrained(path)
    return path


if __name__ == "__main__":
    print(write(sys.argv[1]))
