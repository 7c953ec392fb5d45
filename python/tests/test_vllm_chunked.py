"""stage_client.vllm under chunked prefill, preemption, decode TP 2 and GQA replication (vllm_replay.py, two sidecars).

The prefill "model" writes known rows (random, seeded per request, layer
and token) into its paged cache chunk by chunk, calling ``save_kv_layer``
after each layer as vLLM's attention layers do; blocks are allocated as
chunks need them (``new_block_ids``), as vLLM's scheduler does. At the end
every decode rank's cache must hold, for every request, token and layer,
exactly the rows of the heads that rank holds.

* chunked prefill (several requests interleaved, 32-token chunks) from a
  vllm-ascend-shaped prefill of 2 ranks to a decode of 2 ranks (each half
  the kv heads), pushed layer by layer;
* GQA: 2 kv heads over 4 prefill ranks (each head held twice; only its
  first holder sends) pushed to 2 decode ranks, and pulled by 4 decode
  ranks from 1 prefill rank (each decode rank one replicated head);
* preemption, as vLLM does it: a request is preempted while its pushes are
  in flight (``preempted_req_ids``; each worker's ``handle_preemptions``
  runs before the forward that reuses its blocks, and must return only
  when no push still reads them: the decode's rows of the chunks pushed
  before are checked at that forward), its blocks are overwritten by the
  running requests, it comes back through the waiting queue
  (``get_num_new_matched_tokens``, ``update_state_after_alloc``) and is
  scheduled as resumed (``resumed_req_ids``, all its new blocks,
  ``num_computed_tokens`` 0), recomputed and pushed again.
"""

from __future__ import annotations

import os
import sys
import unittest
from typing import Any, Dict, List, Optional, Set, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchenv import tinylm, torch, TORCH_WHY as WHY  # noqa: E402

from test_e2e import HAVE_STAGED, SKIP_WHY, Staged, pair, stop_all  # noqa: E402
from stage_client import HostArena  # noqa: E402
from vllm_replay import (CachedRequestData, Engine, KVCacheBlocks, NewRequestData, Request,  # noqa: E402
                         SchedulerOutput, kv_caches)

LAYERS, D, CHUNK, BLOCKS = 3, 16, 32, 96



class Prefill:
    """A prefill engine that runs prompts in chunks of CHUNK tokens and writes known rows."""

    def __init__(self, test: "TestChunked", eng: Engine, cache: "tinylm.Cache", reqs: List[Request],
                 rows: List[Tuple[Any, Any]]) -> None:
        self.t, self.eng, self.cache, self.reqs, self.rows = test, eng, cache, reqs, rows
        self.done = [0] * len(reqs)  # tokens computed per request
        self.seen: Set[int] = set()  # scheduled before (cached from now on)
        self.resumed: Set[int] = set()
        self.paused: Set[int] = set()  # preempted, waiting
        self.finished: Set[int] = set()
        self.params: Dict[int, Any] = {}  # request_finished's answer per request

    def admit(self, s: int) -> None:
        r = self.reqs[s]
        n, load = self.eng.sched.get_num_new_matched_tokens(r, 0)
        self.t.assertEqual((n or 0, load), (0, False))
        self.cache.reserve(s, min(CHUNK, len(r.prompt_token_ids)))
        self.eng.sched.update_state_after_alloc(r, KVCacheBlocks(self.cache.tables[0][s]), 0)

    def step(self, during: Optional[Any] = None, preempt: Optional[Set[int]] = None) -> None:
        """One step: every running request's next chunk; ``preempt`` are preempted in it (not run)."""
        preempt = preempt or set()
        so = SchedulerOutput(preempted_req_ids={self.reqs[s].request_id for s in preempt})
        so.scheduled_cached_reqs = CachedRequestData()
        work = []
        for s in range(len(self.reqs)):
            if s in self.paused or s in self.finished or s in preempt:
                continue
            r, a = self.reqs[s], self.done[s]
            b = min(a + CHUNK, len(r.prompt_token_ids))
            had = len(self.cache.tables[0][s]) if s in self.seen else 0
            self.cache.reserve(s, b)
            self.cache.lens[s] = b
            ids = list(self.cache.tables[0][s])
            if s not in self.seen:
                so.scheduled_new_reqs.append(NewRequestData(r.request_id, r.prompt_token_ids, (ids,), a))
                self.seen.add(s)
            else:
                c = so.scheduled_cached_reqs
                c.req_ids.append(r.request_id)
                if s in self.resumed:
                    c.resumed_req_ids.add(r.request_id)
                    c.new_block_ids.append((ids,))
                    self.resumed.discard(s)
                else:
                    c.new_block_ids.append((ids[had:],) if len(ids) > had else None)
                c.num_computed_tokens.append(a)
            so.num_scheduled_tokens[r.request_id] = b - a
            work.append((s, a, b))
        for s in preempt:
            self.paused.add(s)

        def forward(after_layer: Any) -> None:
            if during is not None:
                during()
            for i in range(LAYERS):
                for s, a, b in work:
                    pos = torch.arange(a, b)
                    seq = torch.full_like(pos, s)
                    k, v = self.rows[s]
                    self.cache.write(i, seq, pos, k[i, a:b], v[i, a:b])
                after_layer(i)

        self.eng.step(so, forward)
        for s, a, b in work:
            self.done[s] = b
            if b == len(self.reqs[s].prompt_token_ids):  # max_tokens=1: it ends with its prompt
                self.finished.add(s)
                self.params[s] = self.eng.finish(self.reqs[s], self.cache.tables[0][s])

    def resume(self, s: int, scribble: bool = True) -> None:
        """vLLM frees a preempted request's blocks (others reuse them) and schedules it again from token 0."""
        old = [list(t[s]) for t in self.cache.tables]
        for t in self.cache.tables:
            t[s] = []
        self.cache._tab = [None] * len(self.cache.ranks)
        if scribble:
            for r, rc in enumerate(self.cache.ranks):
                for i in range(LAYERS):
                    for kv in rc._kv(i):
                        kv[old[r]] = torch.randn(kv[old[r]].shape, dtype=kv.dtype)
        self.paused.discard(s)
        self.done[s] = 0
        self.resumed.add(s)
        self.admit(s)


def rows(n: int, heads: int, seed: int) -> Tuple[Any, Any]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn((LAYERS, n, heads, D), generator=g), torch.randn((LAYERS, n, heads, D), generator=g))


@unittest.skipIf(torch is None, WHY)
@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestChunked(unittest.TestCase):
    name_prefill = False  # push: the decode's request names no prefill (the route's only peer)

    @classmethod
    def setUpClass(cls) -> None:
        torch.set_num_threads(1)
        cls.nodes: List[Staged] = []
        try:
            cls.pre, cls.dec = pair(pulls=True)
            cls.nodes += [cls.dec, cls.pre]
            # each engine's connector: socket and peer_name (test_vllm_rank_sockets: one sidecar per rank)
            cls.sides = {"prefill": (cls.pre.socket, "prefill"), "decode": (cls.dec.socket, "decode")}
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        why = stop_all(cls.nodes)
        if why:
            raise AssertionError(why)

    def cache(self, heads: int, kind: Tuple[str, int, int], seed: int) -> "tinylm.Cache":
        preset, bs, ranks = kind
        arena = HostArena(24 << 20, "chunked-%d" % seed)
        self.addCleanup(arena.close)
        cfg = tinylm.Config(layers=LAYERS, kv_heads=heads, head_size=D, q_heads=heads)
        c = tinylm.Cache(cfg, preset, bs, BLOCKS, ranks, torch.float32, "cpu", seed, arena.empty)
        for rc in c.ranks[1:]:  # vLLM's ranks share one block table
            rc._free = list(c.ranks[0]._free)
        return c

    def engines(self, name: str, mode: str, heads: int, pkind: tuple, dkind: tuple, lens: List[int]) -> tuple:
        src, dst = self.cache(heads, pkind, 2), self.cache(heads, dkind, 3)
        common = dict(mode=mode, kv_heads=heads, timeout_s=20.0)
        (psock, ppeer), (dsock, dpeer) = self.sides["prefill"], self.sides["decode"]
        pe = Engine(psock, dict(common, route="decode", peer_name=ppeer), heads,
                    [kv_caches(src, r) for r in range(pkind[2])], name + "-pre")
        self.addCleanup(pe.shutdown)
        de = Engine(dsock, dict(common, route="prefill", peer_name=dpeer), heads,
                    [kv_caches(dst, r) for r in range(dkind[2])], name + "-dec")
        self.addCleanup(de.shutdown)
        want = [rows(n, heads, 100 + s) for s, n in enumerate(lens)]
        preqs = [Request("%s-%d" % (name, s), list(range(n)), {"do_remote_decode": True, "stage_mode": mode,
                                                               "stage_xfer": "%s-x%d" % (name, s)})
                 for s, n in enumerate(lens)]
        return src, dst, pe, de, Prefill(self, pe, src, preqs, want)

    def admit_decode_push(self, pf: Prefill, de: Engine, dst: "tinylm.Cache") -> None:
        for e in (pf.eng, de):  # the tickets go over the sidecars' link, to the prefill engine's inbox
            self.assertTrue(e.sched.scheduler.link.wait_ready(10))
        for s, r in enumerate(pf.reqs):
            p = {"do_remote_prefill": True, "stage_mode": "push", "stage_kv": pf.eng.sched.scheduler.cfg.kv_name,
                 "stage_xfer": r.kv_transfer_params["stage_xfer"]}
            if self.name_prefill:  # a router that names the prefill's sidecar(s) for the ticket
                p["stage_peer"] = self.sides["prefill"][1]
            dr = Request("d" + r.request_id, list(r.prompt_token_ids), p)
            self.assertEqual(de.admit(dr, lambda n, s=s: self._reserve(dst, s, n)), (len(r.prompt_token_ids), True))
        de.step()
        self.assertTrue(de.sched.scheduler.tickets_posted(10))  # posted off the scheduler's step

    @staticmethod
    def _reserve(cache: "tinylm.Cache", s: int, n: int) -> List[int]:
        cache.reserve(s, n)
        cache.lens[s] = n
        return list(cache.tables[0][s])

    def mismatches(self, dst: "tinylm.Cache", want: List[Tuple[Any, Any]], upto: Optional[List[int]] = None) -> List[str]:
        """Where a decode rank's rows differ from the prefill's: [] when every rank holds its heads' rows."""
        bad = []
        for s, (k, v) in enumerate(want):
            n = k.shape[1] if upto is None else upto[s]
            if n == 0:
                continue
            pos = torch.arange(n)
            for r, rc in enumerate(dst.ranks):
                blk, slot = dst._where(r, torch.full_like(pos, s), pos)
                for i in range(LAYERS):
                    gk, gv = rc.read(i, blk, slot)
                    lo, hi = rc.head_lo, rc.head_hi
                    if not (torch.equal(gk, k[i, :n, lo:hi]) and torch.equal(gv, v[i, :n, lo:hi])):
                        bad.append("request %d rank %d layer %d" % (s, r, i))
        return bad

    def run_push(self, pf: Prefill, pe: Engine, de: Engine, dst: "tinylm.Cache", steps: int = 100) -> None:
        for _ in range(steps):
            if len(pf.finished) == len(pf.reqs):
                break
            pf.step()
        pe.until(lambda: len(pe.sent) == len(pf.reqs), 30)
        de.until(lambda: len(de.recvd) == len(pf.reqs), 30)
        self.assertEqual(de.load_errors, set())
        self.assertEqual(self.mismatches(dst, pf.rows), [])

    def test_chunked_decode_tp2(self) -> None:
        lens = [70, 100, 45]
        src, dst, pe, de, pf = self.engines("chk", "push", 4, ("ascend", 32, 2), ("vllm-hnd", 16, 2), lens)
        self.admit_decode_push(pf, de, dst)
        for s in range(len(lens)):
            pf.admit(s)
        steps = 0
        while len(pf.finished) < len(lens):
            pf.step()
            steps += 1
        self.assertEqual(steps, 4, "100 tokens in chunks of 32")
        self.run_push(pf, pe, de, dst)

    def test_gqa_push_4_to_2(self) -> None:
        lens = [50, 33]
        src, dst, pe, de, pf = self.engines("gqa", "push", 2, ("vllm-flash", 16, 4), ("vllm-hnd", 16, 2), lens)
        pushes = [0] * 4
        for r, w in enumerate(pe.workers):  # count each rank's pushes
            def counted(*a: Any, r: int = r, push: Any = w.worker.kv.push, **kw: Any) -> int:
                pushes[r] += 1
                return push(*a, **kw)
            w.worker.kv.push = counted
        self.admit_decode_push(pf, de, dst)
        for s in range(len(lens)):
            pf.admit(s)
        self.run_push(pf, pe, de, dst)
        # only the first holder of each head pushed: prefill ranks 1 and 3 started nothing
        self.assertEqual([n > 0 for n in pushes], [True, False, True, False])

    def test_gqa_pull_1_to_4(self) -> None:
        lens = [60, 17]
        src, dst, pe, de, pf = self.engines("gqp", "pull", 2, ("vllm-flash", 16, 1), ("vllm-hnd", 16, 4), lens)
        for s in range(len(lens)):
            pf.admit(s)
        while len(pf.finished) < len(lens):
            pf.step()
        for s, r in enumerate(pf.reqs):
            delay, p = pf.params[s]
            self.assertTrue(delay)
            dr = Request("d" + r.request_id, list(r.prompt_token_ids), dict(p))
            self.assertEqual(de.admit(dr, lambda n, s=s: self._reserve(dst, s, n)), (len(r.prompt_token_ids), True))
        de.until(lambda: len(de.recvd) == len(lens), 30)
        self.assertEqual(de.load_errors, set())
        self.assertEqual(self.mismatches(dst, pf.rows), [])
        pe.until(lambda: len(pe.sent) == len(lens), 30)  # every decode rank's pull was served

    def test_preempt_push_in_flight(self) -> None:
        self.preempt("pre", False)

    def test_preempt_push_in_flight_ids(self) -> None:
        self.preempt("pri", True)

    def preempt(self, name: str, as_ids: bool) -> None:
        lens = [120, 90]
        src, dst, pe, de, pf = self.engines(name, "push", 4, ("ascend", 32, 2), ("vllm-hnd", 16, 2), lens)
        pe.preemptions_as_ids = as_ids
        self.admit_decode_push(pf, de, dst)
        # The premise below is that request 0's pushes are in flight when it is preempted, so its ticket must
        # have reached the prefill's scheduler first: it travels over the sidecars' link and, on a loaded
        # machine, can land after the two steps (the pushes then start after the preemption, not during it).
        pf.eng.tickets_in(len(lens))
        for s in range(len(lens)):
            pf.admit(s)
        pf.step()
        pf.step()  # request 0 has 64 tokens computed; their pushes were just queued
        pushed = [pf.done[0], 0]
        seen: List[List[str]] = []

        def check() -> None:  # in the forward that reuses request 0's blocks, after handle_preemptions
            seen.append(self.mismatches(dst, pf.rows, pushed))
            for w in pe.workers:
                self.assertTrue(w.worker.mover.ledger.idle(name + "-0"))

        pf.step(during=check, preempt={0})
        self.assertEqual(seen, [[]], "handle_preemptions returned while pushes of the preempted request were running")
        pf.resume(0)  # its old blocks get other rows; it comes back with new blocks
        self.run_push(pf, pe, de, dst)
        self.assertEqual(pf.done, lens)


if __name__ == "__main__":
    unittest.main()
