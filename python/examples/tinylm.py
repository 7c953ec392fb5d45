"""A tiny decoder-only transformer with paged attention over its own block tables.

What stage is for, in one file: a model prefills prompts with its KV cache
in one engine's layout (say vllm-ascend: K and V apart, 128-token blocks,
two tensor-parallel ranks holding half the kv heads each), the cache moves
row by row into another engine's layout (vLLM HND, 16-token blocks, one
rank with all heads), and decoding there gives exactly the tokens of a
model that never moved anything.

The weights are random (seeded); the architecture is the usual one: token
embedding, pre-norm blocks (RMSNorm, grouped-query attention with RoPE, a
SiLU MLP), a final norm and an output head. Each rank's cache is a set of
per-layer tensors in the engine's own shape, indexed the way that engine
indexes them (not through stage_client.layout), so a layout read wrongly
off those tensors shows as wrong tokens. Blocks come from an allocator that
hands out random ids.

Run it: ``python3 examples/tinylm.py`` (prefill in ascend/128/2 ranks, move,
decode in vllm-hnd/16 and compare with a run that moved nothing).
"""

from __future__ import annotations

import math
import os
import random
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stage_client.layout import Layout, sides  # noqa: E402
from stage_client.layout import gather_tensor, scatter  # noqa: E402
# Rank r's kv heads: an even split, or one replicated head when ranks exceed the heads (GQA), as the engines split them.
from stage_client.engines import head_slice  # noqa: E402,F401

#: presets a RankCache can hold (the MLA ones need a latent-attention model)
CACHE_PRESETS = ("vllm-flash", "vllm-hnd", "vllm-flashinfer", "vllm-packed", "ascend", "sglang")


@dataclass(frozen=True)
class Config:
    vocab: int = 256
    layers: int = 4
    q_heads: int = 8
    kv_heads: int = 4
    head_size: int = 64
    d_model: int = 256
    ffn: int = 512
    rope_theta: float = 10000.0


class RankCache:
    """One rank's paged KV cache for every layer, stored as engine ``preset`` stores it.

    ``tensors[layer]`` are the tensors the engine registers for a layer
    (views of one allocation for all layers). Unwritten rows hold noise, so
    a row a move forgot is visible in the output. ``alloc(shape, dtype)``
    gives the allocation (default ``torch.empty`` on ``device``), e.g. a
    HostArena's memfd that a hostmem sidecar maps.
    """

    def __init__(self, preset: str, layers: int, blocks: int, block_size: int, heads: int, head_lo: int,
                 head_hi: int, head_size: int, dtype: Any = torch.float32, device: Any = "cpu", seed: int = 0,
                 alloc: Optional[Callable[[Tuple[int, ...], Any], Any]] = None) -> None:
        if preset not in CACHE_PRESETS:
            raise ValueError("RankCache: preset %r (known: %s)" % (preset, ", ".join(CACHE_PRESETS)))
        self.preset, self.blocks, self.block_size = preset, blocks, block_size
        self.heads, self.head_lo, self.head_hi, self.head_size = heads, head_lo, head_hi, head_size
        h, d, B, S = head_hi - head_lo, head_size, blocks, block_size
        shape = {"vllm-flash": (layers, 2, B, S, h, d), "vllm-hnd": (layers, 2, B, h, S, d),
                 "vllm-flashinfer": (layers, B, 2, S, h, d), "vllm-packed": (layers, B, h, S, 2 * d),
                 "ascend": (layers, 2, B, S, h, d), "sglang": (layers, 2, B * S, h, d)}[preset]
        g = torch.Generator().manual_seed(seed)
        self.alloc = torch.empty(shape, dtype=dtype, device=device) if alloc is None else alloc(shape, dtype)
        self.alloc.copy_(torch.randn(shape, generator=g))
        if preset == "vllm-hnd":  # vLLM allocates HND and hands the engine an NHD-ordered view
            self.tensors = [[self.alloc[i].permute(0, 1, 3, 2, 4)] for i in range(layers)]
        elif preset in ("ascend", "sglang"):
            self.tensors = [[self.alloc[i][0], self.alloc[i][1]] for i in range(layers)]
        else:
            self.tensors = [[self.alloc[i]] for i in range(layers)]
        self._free = list(range(blocks))
        random.Random(seed ^ 0x5EED).shuffle(self._free)

    def take(self, n: int) -> List[int]:
        """``n`` free block ids, in random order."""
        if n > len(self._free):
            raise RuntimeError("RankCache: %d blocks wanted, %d free" % (n, len(self._free)))
        out, self._free = self._free[:n], self._free[n:]
        return out

    def layout(self) -> Layout:
        """The layer layout, read off layer 0's tensors (every layer has the same)."""
        return Layout.from_tensor(self.tensors[0], self.preset, self.head_lo, self.head_hi, self.heads,
                                  page_size=self.block_size if self.preset == "sglang" else None)

    def _kv(self, layer: int) -> Tuple[Any, Any]:
        """Views (blocks, block_size, held, head_size) of K and V: the engine's own indexing."""
        ts = self.tensors[layer]
        p, d = self.preset, self.head_size
        if p in ("vllm-flash", "vllm-hnd"):
            return ts[0][0], ts[0][1]
        if p == "vllm-flashinfer":
            return ts[0][:, 0], ts[0][:, 1]
        if p == "vllm-packed":
            t = ts[0].permute(0, 2, 1, 3)  # (blocks, slot, head, 2*head_size)
            return t[..., :d], t[..., d:]
        if p == "ascend":
            return ts[0], ts[1]
        s = self.block_size  # sglang: a token-indexed pool; a page is block_size tokens
        return (ts[0].reshape(self.blocks, s, *ts[0].shape[1:]), ts[1].reshape(self.blocks, s, *ts[1].shape[1:]))

    def write(self, layer: int, blk: Any, slot: Any, k: Any, v: Any) -> None:
        kc, vc = self._kv(layer)
        kc[blk, slot] = k
        vc[blk, slot] = v

    def read(self, layer: int, blk: Any, slot: Any) -> Tuple[Any, Any]:
        kc, vc = self._kv(layer)
        return kc[blk, slot], vc[blk, slot]


class Cache:
    """The KV cache of a batch over ``ranks`` tensor-parallel ranks, each with its own block tables."""

    def __init__(self, cfg: Config, preset: str, block_size: int, blocks: int, ranks: int = 1,
                 dtype: Any = torch.float32, device: Any = "cpu", seed: int = 0,
                 alloc: Optional[Callable[[Tuple[int, ...], Any], Any]] = None) -> None:
        self.cfg, self.preset, self.block_size, self.device = cfg, preset, block_size, device
        self.ranks = []
        for r in range(ranks):
            lo, hi = head_slice(cfg.kv_heads, ranks, r)
            self.ranks.append(RankCache(preset, cfg.layers, blocks, block_size, cfg.kv_heads, lo, hi, cfg.head_size,
                                        dtype, device, seed * 1000 + r, alloc))
        #: per rank, per sequence: block ids in token order
        self.tables: List[List[List[int]]] = [[] for _ in range(ranks)]
        self.lens: List[int] = []
        self._tab: List[Optional[Any]] = [None] * ranks

    def reserve(self, seq: int, tokens: int) -> None:
        """Make room for ``tokens`` tokens of sequence ``seq`` (a new one when seq == len(lens))."""
        if seq == len(self.lens):
            self.lens.append(0)
            for t in self.tables:
                t.append([])
        need = -(-tokens // self.block_size)
        for rc, t in zip(self.ranks, self.tables):
            if need > len(t[seq]):
                t[seq].extend(rc.take(need - len(t[seq])))
                self._tab = [None] * len(self.ranks)

    def _where(self, r: int, seq: Any, pos: Any) -> Tuple[Any, Any]:
        tab = self._tab[r]
        if tab is None:  # built once per change of the tables, not per layer
            tabs = self.tables[r]
            width = max(len(t) for t in tabs)
            tab = torch.tensor([t + [0] * (width - len(t)) for t in tabs], dtype=torch.int64, device=self.device)
            self._tab[r] = tab
        return tab[seq, pos // self.block_size], pos % self.block_size

    def write(self, layer: int, seq: Any, pos: Any, k: Any, v: Any) -> None:
        """Store rows (N, kv_heads, head_size) of token ``pos[i]`` of sequence ``seq[i]``; each rank its heads."""
        for r, rc in enumerate(self.ranks):
            blk, slot = self._where(r, seq, pos)
            rc.write(layer, blk, slot, k[:, rc.head_lo:rc.head_hi], v[:, rc.head_lo:rc.head_hi])

    def read(self, layer: int, seq: Any, pos: Any) -> Tuple[Any, Any]:
        """Rows (N, kv_heads, head_size), each head from the first rank holding it."""
        ks: Dict[int, Any] = {}
        vs: Dict[int, Any] = {}
        for r, rc in enumerate(self.ranks):
            if all(h in ks for h in range(rc.head_lo, rc.head_hi)):
                continue
            k, v = rc.read(layer, *self._where(r, seq, pos))
            for i, h in enumerate(range(rc.head_lo, rc.head_hi)):
                ks.setdefault(h, k[:, i])
                vs.setdefault(h, v[:, i])
        return (torch.stack([ks[h] for h in range(self.cfg.kv_heads)], 1),
                torch.stack([vs[h] for h in range(self.cfg.kv_heads)], 1))


def _rms(x: Any) -> Any:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class TinyLM:
    """Random-weight decoder; all math in ``dtype`` on ``device``."""

    def __init__(self, cfg: Config = Config(), seed: int = 0, dtype: Any = torch.float32, device: Any = "cpu") -> None:
        self.cfg, self.dtype, self.device = cfg, dtype, device
        g = torch.Generator().manual_seed(seed)

        def w(*shape: int) -> Any:
            return (torch.randn(shape, generator=g) / math.sqrt(shape[0])).to(dtype=dtype, device=device)

        c = cfg
        qd, kd = c.q_heads * c.head_size, c.kv_heads * c.head_size
        self.embed = torch.randn((c.vocab, c.d_model), generator=g).to(dtype=dtype, device=device)
        self.blocks = [dict(wq=w(c.d_model, qd), wk=w(c.d_model, kd), wv=w(c.d_model, kd), wo=w(qd, c.d_model),
                            w1=w(c.d_model, c.ffn), w2=w(c.ffn, c.d_model)) for _ in range(c.layers)]
        self.head = w(c.d_model, c.vocab)
        half = c.head_size // 2
        self.inv_freq = (1.0 / (c.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))).to(device)

    def _rope(self, x: Any, pos: Any) -> Any:
        """Rotate (..., heads, head_size) rows at positions ``pos`` (broadcast over heads)."""
        ang = pos.to(torch.float64)[..., None] * self.inv_freq
        cos, sin = ang.cos().to(self.dtype)[..., None, :], ang.sin().to(self.dtype)[..., None, :]
        a, b = x.chunk(2, -1)
        return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)

    def _attend(self, q: Any, k: Any, v: Any, mask: Any) -> Any:
        """q (B, Tq, QH, D), k/v (B, Tk, KVH, D), mask (B, Tq, Tk) -> (B, Tq, QH*D)."""
        rep = self.cfg.q_heads // self.cfg.kv_heads
        k = k.repeat_interleave(rep, 2)
        v = v.repeat_interleave(rep, 2)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.cfg.head_size)
        s = s.masked_fill(~mask[:, None], float("-inf"))
        o = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)
        return o.reshape(o.shape[0], o.shape[1], -1)

    def _layer(self, i: int, x: Any, pos: Any, cache: Cache, seq: Any, valid: Any, kpos: Any, mask: Any) -> Any:
        """One block over x (B, T, d): writes the new K/V rows, then attends over the paged cache."""
        c, p = self.cfg, self.blocks[i]
        B, T = x.shape[0], x.shape[1]
        h = _rms(x)
        q = self._rope((h @ p["wq"]).view(B, T, c.q_heads, c.head_size), pos)
        k = self._rope((h @ p["wk"]).view(B, T, c.kv_heads, c.head_size), pos)
        v = (h @ p["wv"]).view(B, T, c.kv_heads, c.head_size)
        cache.write(i, seq[valid], pos[valid], k[valid], v[valid])
        Tk = kpos.shape[1]
        kseq = torch.arange(B, device=self.device)[:, None].expand(B, Tk)
        K, V = cache.read(i, kseq.reshape(-1), kpos.reshape(-1))
        K, V = K.view(B, Tk, c.kv_heads, c.head_size), V.view(B, Tk, c.kv_heads, c.head_size)
        x = x + self._attend(q, K, V, mask) @ p["wo"]
        return x + torch.nn.functional.silu(_rms(x) @ p["w1"]) @ p["w2"]

    def _logits(self, x: Any) -> Any:
        return _rms(x) @ self.head

    def _kpos(self, lens: Any, Tk: int) -> Any:
        # positions past a sequence's end read its token 0 (masked out): every index stays in its table
        kp = torch.arange(Tk, device=self.device)[None, :].expand(len(lens), Tk)
        return torch.where(kp < lens[:, None], kp, torch.zeros_like(kp))

    def prefill(self, prompts: Sequence[Sequence[int]], cache: Cache,
                after_layer: Optional[Callable[[int], None]] = None) -> Any:
        """Run the prompts, filling ``cache`` (block tables included); logits (B, vocab) of each last token.

        ``after_layer(i)`` is called once layer ``i``'s K/V rows are in the
        cache (where vLLM calls a KV connector's ``save_kv_layer``).
        """
        B, T = len(prompts), max(len(p) for p in prompts)
        for i, pr in enumerate(prompts):
            cache.reserve(i, len(pr))
            cache.lens[i] = len(pr)
        lens = torch.tensor([len(p) for p in prompts], device=self.device)
        toks = torch.tensor([list(p) + [0] * (T - len(p)) for p in prompts], device=self.device)
        pos = torch.arange(T, device=self.device)[None, :].expand(B, T)
        seq = torch.arange(B, device=self.device)[:, None].expand(B, T)
        valid = pos < lens[:, None]
        kpos = self._kpos(lens, T)
        mask = (pos[:, :, None] >= torch.arange(T, device=self.device)[None, None, :]) & valid[:, None, :]
        x = self.embed[toks]
        for i in range(self.cfg.layers):
            x = self._layer(i, x, pos, cache, seq, valid, kpos, mask)
            if after_layer is not None:
                after_layer(i)
        return self._logits(x[torch.arange(B), lens - 1])

    def decode(self, cache: Cache, logits: Any, n_steps: int) -> Tuple[Any, Any]:
        """Greedy decoding from the prefill's ``logits``: (tokens (B, n_steps), logits (B, n_steps, vocab)).

        The first token fed is argmax(logits); token i is the argmax after
        step i. Each step appends one row per sequence to ``cache``.
        """
        B = len(cache.lens)
        toks, outs = [], []
        tok = logits.argmax(-1)
        for _ in range(n_steps):
            lens = torch.tensor(cache.lens, device=self.device)
            for b in range(B):
                cache.reserve(b, cache.lens[b] + 1)
            pos = lens[:, None]
            seq = torch.arange(B, device=self.device)[:, None]
            valid = torch.ones((B, 1), dtype=torch.bool, device=self.device)
            Tk = int(lens.max()) + 1
            kpos = self._kpos(lens + 1, Tk)
            mask = (torch.arange(Tk, device=self.device)[None, :] <= lens[:, None])[:, None, :]
            x = self.embed[tok][:, None]
            for i in range(self.cfg.layers):
                x = self._layer(i, x, pos, cache, seq, valid, kpos, mask)
            for b in range(B):
                cache.lens[b] += 1
            lg = self._logits(x[:, 0])
            outs.append(lg)
            tok = lg.argmax(-1)
            toks.append(tok)
        return torch.stack(toks, 1), torch.stack(outs, 1)


def move(src: Cache, dst: Cache) -> int:
    """Move every sequence's KV from ``src`` into ``dst`` (which allocates its own blocks).

    Each pair of ranks whose head slices overlap moves the intersection:
    the source side gathers its rows into the canonical stream, the
    destination scatters it into its own layout (the reference mapper,
    standing in for two sidecars). Returns the bytes moved.
    """
    moved = 0
    for s, n in enumerate(src.lens):
        dst.reserve(s, n)
        dst.lens[s] = n
    for rs, sc in enumerate(src.ranks):
        la = sc.layout()
        for rd, dc in enumerate(dst.ranks):
            lb = dc.layout()
            if max(la.head_lo, lb.head_lo) >= min(la.head_hi, lb.head_hi):
                continue
            for s, n in enumerate(src.lens):
                a, b = sides(la, src.tables[rs][s], lb, dst.tables[rd][s], n)
                data = gather_tensor(a, sc.tensors)
                scatter(b, dc.tensors, data)
                moved += data.numel()
    return moved


def main() -> None:
    torch.manual_seed(0)
    cfg = Config()
    model = TinyLM(cfg, seed=1)
    rng = random.Random(2)
    prompts = [[rng.randrange(cfg.vocab) for _ in range(rng.randint(5, 200))] for _ in range(6)]
    ref = Cache(cfg, "vllm-flash", 16, 256, seed=3)
    ref_tokens, _ = model.decode(ref, model.prefill(prompts, ref), 64)
    a = Cache(cfg, "ascend", 128, 16, ranks=2, seed=4)
    logits = model.prefill(prompts, a)
    b = Cache(cfg, "vllm-hnd", 16, 256, seed=5)
    n = move(a, b)
    tokens, _ = model.decode(b, logits, 64)
    same = bool(torch.equal(tokens, ref_tokens))
    print("moved %d bytes of KV: ascend/128 x 2 ranks -> vllm-hnd/16; 64 tokens x %d prompts %s"
          % (n, len(prompts), "equal the unmoved run" if same else "DIFFER from the unmoved run"))
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
