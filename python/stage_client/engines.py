"""What the engine connectors (``stage_client.vllm``, ``stage_client.sglang``) share.

* Which rank moves which kv heads: :func:`head_slice` (a rank's heads, as
  vLLM and SGLang split them over tensor-parallel ranks), :func:`primary`
  (the heads a rank is the first holder of: with more ranks than kv heads a
  head is replicated, and only its first holder sends it, so no row moves
  twice) and :func:`plan` (every (source rank, destination rank, heads)
  pair of a transfer). Both sides compute the same plan from the tensor
  parallel sizes, so neither has to ask the other.
* Tags: a transfer's tag names the request's transfer key and the rank
  that started it (``key|p0/2``: prefill rank 0 of 2), so the side that
  did not start it knows from the notification what arrived and what is
  still to come.
* :class:`Coverage`: the token ranges each (source rank, layer) delivered,
  so a request is complete when every expected pair covers the tokens
  asked for, however the sender cut its pushes (layer by layer, chunk by
  chunk, again after a preemption).
* :class:`~stage_client.mover.Mover` (re-exported here): the threads that
  start the connectors' transfers and follow them (:mod:`stage_client.mover`).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Dict, List, NamedTuple, Optional, Set, Tuple

from .errors import StageError
from .mover import MOVER_THREADS, Ledger, Mover
from .protocol.wire import MAX_TAG

__all__ = ["head_slice", "primary", "plan", "Tag", "make_tag", "parse_tag", "Coverage", "Mover", "Ledger",
           "layer_index", "MAX_TP", "MOVER_THREADS", "grant_again"]

log = logging.getLogger("stage_client.engines")

#: the largest tensor-parallel size a tag may name: plan() walks every rank, so a
#: tag (which comes from the other side) must not make it walk a billion
MAX_TP = 1024

_TAIL = re.compile(r"([pda])([0-9]{1,4})/([0-9]{1,4})")


def head_slice(heads: int, tp: int, rank: int) -> Tuple[int, int]:
    """Rank ``rank``'s kv heads out of ``heads`` over ``tp`` ranks: an even split,
    or one replicated head per rank when the ranks outnumber the heads."""
    if not 0 <= rank < tp or heads < 1:
        raise ValueError("rank %d of %d ranks, %d kv heads" % (rank, tp, heads))
    if tp <= heads:
        if heads % tp:
            raise ValueError("%d kv heads do not split over %d ranks" % (heads, tp))
        n = heads // tp
        return rank * n, (rank + 1) * n
    if tp % heads:
        raise ValueError("%d ranks do not replicate %d kv heads evenly" % (tp, heads))
    h = rank * heads // tp
    return h, h + 1


def primary(heads: int, tp: int, rank: int) -> Optional[Tuple[int, int]]:
    """The heads ``rank`` sends: those of its slice no lower rank holds (None: none)."""
    lo, hi = head_slice(heads, tp, rank)
    for r in range(rank):
        plo, phi = head_slice(heads, tp, r)
        if plo <= lo < phi:
            lo = phi
    return (lo, hi) if lo < hi else None


def plan(heads: int, src_tp: int, dst_tp: int) -> List[Tuple[int, int, int, int]]:
    """Every (src rank, dst rank, head_lo, head_hi) of a transfer from ``src_tp`` to ``dst_tp`` ranks.

    Each destination rank gets every head it holds exactly once, from the
    source rank that is that head's first holder.
    """
    out = []
    for s in range(src_tp):
        p = primary(heads, src_tp, s)
        if p is None:
            continue
        for d in range(dst_tp):
            dlo, dhi = head_slice(heads, dst_tp, d)
            lo, hi = max(p[0], dlo), min(p[1], dhi)
            if lo < hi:
                out.append((s, d, lo, hi))
    return out


class Tag(NamedTuple):
    """A parsed tag: transfer ``key``, ``side`` (``p``, ``d`` or ``a``), and the ``rank`` of ``tp`` ranks
    that started the transfer."""

    key: str
    side: str
    rank: int
    tp: int


def make_tag(key: str, side: str, rank: int, tp: int) -> str:
    """``key|<side><rank>/<tp>``: side ``p`` (prefill started it), ``d`` (decode did), or ``a`` (a prefill's aux bytes)."""
    if side not in ("p", "d", "a") or not 0 <= rank < tp <= MAX_TP:
        raise ValueError("tag side %r, rank %d of %d (at most %d ranks)" % (side, rank, tp, MAX_TP))
    tag = "%s|%s%d/%d" % (key, side, rank, tp)
    if len(tag.encode()) > MAX_TAG:
        raise ValueError("transfer key %r makes a tag over %d bytes" % (key[:64], MAX_TAG))
    return tag


def parse_tag(tag: str) -> Optional[Tag]:
    """The :class:`Tag` (key, side, rank, tp) of a tag :func:`make_tag` made; None for any other tag.

    Tags come from the other side's sidecar: only ASCII digits count (not
    every character str.isdigit accepts parses as an int), and the ranks
    are bounded by :data:`MAX_TP`.
    """
    if not isinstance(tag, str):
        return None
    key, sep, tail = tag.rpartition("|")
    m = _TAIL.fullmatch(tail) if sep else None
    if m is None:
        return None
    r, t = int(m.group(2)), int(m.group(3))
    if not 0 <= r < t <= MAX_TP:
        return None
    return Tag(key, m.group(1), r, t)


def layer_index(name: str, order: int) -> int:
    """A layer's index from its name (the last integer in ``model.layers.7.self_attn.attn``), else ``order``."""
    digits = [p for p in name.replace("_", ".").split(".") if p.isdigit()]
    return int(digits[0]) if digits else order


class Coverage:
    """Which tokens of [first, first + tokens) each (source rank, layer) delivered.

    ``expect`` is the set of (source rank, layer) pairs that must each cover
    the whole range; it may be set later (when the first notification says
    how many source ranks there are).
    """

    __slots__ = ("first", "tokens", "expect", "got")

    def __init__(self, first: int, tokens: int, expect: Optional[Set[Tuple[int, int]]] = None) -> None:
        self.first, self.tokens = first, tokens
        self.expect = expect
        self.got: Dict[Tuple[int, int], List[Tuple[int, int]]] = {}

    def add(self, src: int, layer: int, lo: int, hi: int) -> None:
        iv = self.got.setdefault((src, layer), [])
        iv.append((lo, hi))
        iv.sort()
        merged: List[Tuple[int, int]] = []
        for a, b in iv:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
            else:
                merged.append((a, b))
        self.got[(src, layer)] = merged

    def complete(self) -> bool:
        if self.expect is None:
            return False
        lo, hi = self.first, self.first + self.tokens
        for k in self.expect:
            if hi <= lo:
                continue
            if not any(a <= lo and hi <= b for a, b in self.got.get(k, ())):
                return False
        return True


def now() -> float:
    return time.monotonic()


def grant_again(client: Any, cache: str, grants: List[Any], log: logging.Logger) -> None:
    """Make ``grants`` (:class:`~stage_client.connector_core.LiveGrant`: key, blocks, write, the time left,
    uses) again on KV cache ``cache`` of ``client``'s sidecar, which restarted and holds none (after the cache
    was registered anew); one it refuses is logged, and that request's transfer is refused and recomputed."""
    for g in grants:
        try:
            client.grant(cache, g.key, g.blocks, min(max(g.ttl, 0.001), 3600.0), write=g.write, uses=g.uses)
        except (StageError, OSError, ValueError) as e:
            log.warning("stage: granting %s of %d blocks of %s again after the restart: %s",
                        "writes" if g.write else "reads", len(g.blocks), cache, e)
    if grants:
        log.info("stage: %d grants on %s made again", len(grants), cache)
