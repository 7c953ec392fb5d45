"""stage_client.vllm driven through vLLM's own call sequence (tests/vllm_replay.py), with two real sidecars.

The prefill engine is vllm-ascend-shaped: two tensor-parallel ranks, each
holding two of the tiny model's four kv heads, K and V as separate tensors,
128-token blocks. The decode engine is vLLM-GPU-shaped: one rank, HND,
16-token blocks. Both ranks' workers and the scheduler connector are
built by the same constructor vLLM uses, ``(vllm_config, role,
kv_cache_config)``. The tiny transformer (examples/tinylm.py) prefills six
prompts on the prefill engine, calling ``save_kv_layer`` after each layer
as vLLM's attention layers do; the KV reaches the decode engine through the
connector, and 64 greedy tokens decoded there must equal those of one
process that moved nothing.

* push, layer by layer: the decode is scheduled first and posts its
  tickets (block ids) over the sidecars' link (no rendezvous); the prefill pushes each
  layer as it is computed;
* push after prefill: the tickets arrive after the prefill finished; the
  rows go from the blocks vLLM holds for the connector;
* pull: the prefill finishes and returns kv_transfer_params; the decode
  pulls; the prefill frees its blocks once the pulls were served;
* failures (test_vllm_faults.py) come back as load errors within the deadline.

CPU: hostmem sidecars, float32 caches in HostArena memfds. CUDA (skipped
without a GPU): cuda sidecars, bfloat16 CUDA tensors::

    cd python && STAGED=$PWD/../bin/staged python3 -m unittest -v tests.test_vllm_connector.TestVLLMConnectorCUDA
"""

from __future__ import annotations

import os
import sys
import time
import unittest
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchenv import CUDA_WHY, HAVE_CUDA, tinylm, torch, TORCH_WHY as WHY  # noqa: E402

from test_e2e import HAVE_STAGED, SKIP_WHY, Staged, pair, stop_all  # noqa: E402
from test_tinylm import STEPS, prompts  # noqa: E402
from stage_client import Access, HostArena  # noqa: E402
from stage_client.vllm import HAVE_VLLM  # noqa: E402
from vllm_replay import Engine, NewRequestData, Request, SchedulerOutput, kv_caches  # noqa: E402

GPU = int(os.environ.get("STAGE_GPU", "0"))
PREFILL = ("ascend", 128, 2)
DECODE = ("vllm-hnd", 16, 1)



def started(e: Engine) -> int:
    """Transfers the engine's workers started or queued so far."""
    n = 0
    for w in e.workers:
        led = w.worker.mover.ledger
        with led.lock:
            n += sum(r.done + len(r.pending) + r.submitting for r in led._reqs.values())
    return n


def _block(cache: "tinylm.Cache", b: int) -> Any:
    """Every layer's K and V rows of block ``b`` of a DECODE-shaped cache (vllm-hnd: [layers, 2, blocks, ...])."""
    return cache.ranks[0].alloc[:, :, b]


@unittest.skipIf(torch is None, WHY)
@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestVLLMConnector(unittest.TestCase):
    device: Any = "cpu"
    dtype: Any = None
    sidecar = ""

    @classmethod
    def setUpClass(cls) -> None:
        torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
        cls.dtype = cls.dtype or torch.float32
        cls.cfg = tinylm.Config()
        cls.model = tinylm.TinyLM(cls.cfg, seed=7, dtype=cls.dtype, device=cls.device)
        cls.prompts = prompts(11)
        ref = cls.cache(DECODE, seed=1)
        cls.ref_tokens, _ = cls.model.decode(ref, cls.model.prefill(cls.prompts, ref), STEPS)
        cls.arenas: List[HostArena] = []
        cls.nodes: List[Staged] = []
        try:
            cls.pre, cls.dec = pair(cls.sidecar, pulls=True)
            cls.nodes += [cls.dec, cls.pre]
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        why = stop_all(cls.nodes)
        for a in cls.arenas:
            a.close()
        if why:
            raise AssertionError(why)

    @classmethod
    def alloc(cls, node: Staged) -> Any:
        a = HostArena(96 << 20, "vllm-" + node.name)
        cls.arenas.append(a)
        return a.empty

    @classmethod
    def sync(cls) -> None:
        """Rows the engine wrote are in memory before a sidecar copies them (the connector's events do this on CUDA)."""

    @classmethod
    def cache(cls, kind: tuple, seed: int, alloc: Any = None) -> "tinylm.Cache":
        preset, bs, ranks = kind
        blocks = sum(-(-(len(p) + STEPS) // bs) for p in cls.prompts) + 8
        c = tinylm.Cache(cls.cfg, preset, bs, blocks, ranks, cls.dtype, cls.device, seed, alloc)
        for rc in c.ranks[1:]:  # vLLM's ranks share one block table: the same ids on every rank
            rc._free = list(c.ranks[0]._free)
        return c

    def engines(self, name: str, mode: str, layerwise: bool = True, timeout: float = 30.0) -> tuple:
        """A prefill engine (2 ranks) and a decode engine (1 rank), with fresh caches registered."""
        src = self.cache(PREFILL, seed=2, alloc=self.alloc(self.pre))
        dst = self.cache(DECODE, seed=3, alloc=self.alloc(self.dec))
        self.sync()
        common = dict(mode=mode, kv_heads=self.cfg.kv_heads, timeout_s=timeout, layerwise=layerwise)
        # Each side names the other's sidecar by its node name (the peer field of every transfer).
        # Each engine's role, as vLLM's kv_role: its cache grants peers only what that role needs.
        pe = Engine(self.pre.socket, dict(common, route="decode", peer_name="prefill"),
                    self.cfg.kv_heads, [kv_caches(src, r) for r in range(2)], "%s-pre" % name, "kv_producer")
        self.addCleanup(pe.shutdown)
        de = Engine(self.dec.socket, dict(common, route="prefill", peer_name="decode"), self.cfg.kv_heads,
                    [kv_caches(dst, 0)], "%s-dec" % name, "kv_consumer")
        self.addCleanup(de.shutdown)
        return src, dst, pe, de

    def reqs(self, name: str, params: Dict[str, Any]) -> List[Request]:
        return [Request("%s-%d" % (name, s), list(p), dict(params, stage_xfer="%s-x%d" % (name, s)))
                for s, p in enumerate(self.prompts)]

    def prefill_step(self, pe: Engine, src: "tinylm.Cache", reqs: List[Request]) -> Any:
        """Admit every request and run its whole prompt in one step, saving layer by layer."""
        for s, r in enumerate(reqs):
            pe.admit(r, lambda n, s=s: self._reserve(src, s, n))
        so = SchedulerOutput([NewRequestData(r.request_id, r.prompt_token_ids, (src.tables[0][s],), 0)
                              for s, r in enumerate(reqs)],
                             num_scheduled_tokens={r.request_id: len(r.prompt_token_ids) for r in reqs})

        def forward(after_layer: Any) -> Any:
            logits = self.model.prefill(self.prompts, src, after_layer=after_layer)
            return logits

        return pe.step(so, forward)

    @staticmethod
    def _reserve(cache: "tinylm.Cache", s: int, n: int) -> List[int]:
        cache.reserve(s, n)
        cache.lens[s] = n
        return list(cache.tables[0][s])

    def decode_and_compare(self, dst: "tinylm.Cache", logits: Any, what: str) -> None:
        tokens, _ = self.model.decode(dst, logits, STEPS)
        self.assertTrue(torch.equal(tokens, self.ref_tokens),
                        "%s: tokens differ from the unmoved run\n%s\n%s" % (what, tokens, self.ref_tokens))

    def push(self, name: str, layerwise: bool, decode_first: bool) -> None:
        src, dst, pe, de = self.engines(name, "push", layerwise)
        # no rendezvous: the tickets travel over the sidecars' link, to the prefill engine's inbox
        for e in (pe, de):
            self.assertTrue(e.sched.scheduler.link.wait_ready(10))
        preqs = self.reqs(name, {"do_remote_decode": True, "stage_mode": "push"})
        dreqs = self.reqs(name, {"do_remote_prefill": True, "stage_mode": "push", "stage_kv": "%s-pre" % name})

        def admit_decode() -> None:
            for s, r in enumerate(dreqs):
                n, load_async = de.admit(r, lambda n, s=s: self._reserve(dst, s, n))
                self.assertEqual((n, load_async), (len(r.prompt_token_ids), True))
            de.step()  # the decode's workers learn what they receive
            # A router starts the prefill once the decode took the request; the ticket is posted off the
            # scheduler's step, so let it land first, as it has by then in a real deployment.
            self.assertTrue(de.sched.scheduler.tickets_posted(10))

        if decode_first:
            admit_decode()
            pe.tickets_in(len(dreqs))  # posted is queued at the prefill's sidecar; its link's thread takes them
        logits = self.prefill_step(pe, src, preqs)
        # layer by layer: one push per layer and request from each prefill rank, started during the forward
        want = self.cfg.layers * len(preqs) * 2 if layerwise and decode_first else 0
        self.assertEqual(started(pe), want)
        for s, r in enumerate(preqs):  # max_tokens=1: the prefill requests end after this step
            self.assertEqual(pe.finish(r, src.tables[0][s]), (True, None))
        if not decode_first:
            pe.step()  # the prefill engine keeps stepping: it has push work pending
            self.assertTrue(pe.sched.has_pending_push_work())
            admit_decode()
        pe.until(lambda: len(pe.sent) == len(preqs), 30)
        de.until(lambda: len(de.recvd) == len(dreqs), 30)
        self.assertEqual(de.load_errors, set())
        self.assertFalse(pe.sched.has_pending_push_work())
        self.decode_and_compare(dst, logits, name)

    def test_cache_access_by_role(self) -> None:
        # kv_producer: peers may read its cache (the decode's pulls), not write it; kv_consumer the reverse;
        # kv_both either. The engines of the other tests run as producer and consumer and move KV both ways.
        local = Access.LOCAL_READ | Access.LOCAL_WRITE
        for role, want in [("kv_producer", local | Access.REMOTE_READ), ("kv_consumer", local | Access.REMOTE_WRITE),
                           ("kv_both", Access.ALL)]:
            with self.subTest(role):
                cache = self.cache(DECODE, seed=4, alloc=self.alloc(self.dec))
                e = Engine(self.dec.socket, dict(mode="push", kv_heads=self.cfg.kv_heads, route="prefill",
                                                 peer_name="decode"), self.cfg.kv_heads, [kv_caches(cache, 0)],
                           "role-" + role, role)
                try:
                    name = e.workers[0].worker.kv.name
                    # the worker's own connection: a connection lists its own regions only
                    got = {r["name"]: r["access"] for r in e.workers[0].worker.client.regions()
                           if r["name"].startswith(name + "/")}
                finally:
                    e.shutdown()
                self.assertEqual(len(got), self.cfg.layers)
                self.assertEqual(set(got.values()), {int(want)}, got)

    def test_push_layerwise(self) -> None:
        self.push("pushlw", layerwise=True, decode_first=True)

    def test_push_after_prefill(self) -> None:
        self.push("pushaf", layerwise=False, decode_first=True)

    def test_push_ticket_late(self) -> None:
        self.push("pushlate", layerwise=True, decode_first=False)

    def test_pull(self) -> None:
        src, dst, pe, de = self.engines("pull", "pull")
        preqs = self.reqs("pull", {"do_remote_decode": True})
        logits = self.prefill_step(pe, src, preqs)
        params = []
        for s, r in enumerate(preqs):
            delay, p = pe.finish(r, src.tables[0][s])
            self.assertTrue(delay)
            self.assertEqual((p["stage_peer"], p["stage_kv"], p["stage_tp"], p["stage_block_ids"], p["stage_tokens"]),
                             ("prefill", "pull-pre", 2, src.tables[0][s], len(r.prompt_token_ids)))
            params.append(p)
        pe.step()
        self.assertEqual(pe.sent, set(), "the prefill freed blocks before the decode pulled them")
        self.pull_all("pull", params, pe, de, dst, logits)

    def pull_all(self, name: str, params: List[Dict[str, Any]], pe: Engine, de: Engine, dst: Any, logits: Any) -> None:
        """The decode takes every request with its prefill's params: all KV arrives, and the prefill frees it."""
        dreqs = [Request("%s-d%d" % (name, s), list(p), dict(params[s])) for s, p in enumerate(self.prompts)]
        for s, r in enumerate(dreqs):
            self.assertEqual(de.admit(r, lambda n, s=s: self._reserve(dst, s, n)), (len(r.prompt_token_ids), True))
        de.until(lambda: len(de.recvd) == len(dreqs), 30)
        self.assertEqual(de.load_errors, set())
        pe.until(lambda: len(pe.sent) == len(dreqs), 30)
        self.decode_and_compare(dst, logits, name)

    def test_pull_forged(self) -> None:
        # Issue 33 item 4: kv_transfer_params sent straight to a decode's API. The prefill's connector grants its
        # sidecar each request's blocks under a fresh 128-bit key (stage_grant); the sidecar serves a pull only
        # with that key, on exactly those blocks, until the decode's pull or the blocks' release. Forged params
        # load nothing: the request ends with a load error (vLLM recomputes it) and the cache is untouched.
        src, dst, pe, de = self.engines("pullf", "pull")
        atk = self.cache(DECODE, seed=5, alloc=self.alloc(self.dec))
        self.sync()
        ae = Engine(self.dec.socket, dict(mode="pull", kv_heads=self.cfg.kv_heads, timeout_s=30.0, route="prefill",
                                          peer_name="decode"), self.cfg.kv_heads, [kv_caches(atk, 0)], "pullf-atk",
                    "kv_consumer")
        self.addCleanup(ae.shutdown)
        preqs = self.reqs("pullf", {"do_remote_decode": True})
        logits = self.prefill_step(pe, src, preqs)
        params = [pe.finish(r, src.tables[0][s])[1] for s, r in enumerate(preqs)]
        for p in params:
            self.assertEqual(len(bytes.fromhex(p["stage_grant"])), 16)
        pe.step()  # the prefill's workers grant
        made_up = "%032x" % 0x5eed
        forged = {
            "made-up key, another request's blocks": dict(params[0], stage_grant=made_up),
            "another request's params without their key": {k: v for k, v in params[1].items() if k != "stage_grant"},
            "random block ids": dict(params[2], stage_grant=made_up, stage_block_ids=[5, 1, 2, 3]),
        }
        attempt = [0]

        def forge(what: str, p: Dict[str, Any]) -> None:
            s = attempt[0]
            attempt[0] += 1
            r = Request("pullf-atk-%d" % s, list(self.prompts[s % len(self.prompts)]), dict(p, stage_xfer="atk%d" % s))
            ae.admit(r, lambda n, s=s: self._reserve(atk, s, n))
            blocks = set(atk.tables[0][s])
            before = {b: _block(atk, b).clone() for b in blocks}
            ae.until(lambda: r.request_id in ae.recvd, 30)
            self.assertTrue(blocks <= ae.load_errors, "%s: loaded without a load error" % what)
            for b, old in before.items():
                self.assertTrue(torch.equal(_block(atk, b), old), "%s: block %d of the forger's cache was written" % (what, b))

        for what, p in forged.items():
            with self.subTest(what):
                forge(what, p)
        # The legitimate decode still gets every request's KV: refused requests took no use of its grant.
        dreqs = [Request("pullf-d%d" % s, list(p), dict(params[s])) for s, p in enumerate(self.prompts)]
        for s, r in enumerate(dreqs):
            self.assertEqual(de.admit(r, lambda n, s=s: self._reserve(dst, s, n)), (len(r.prompt_token_ids), True))
        de.until(lambda: len(de.recvd) == len(dreqs), 30)
        self.assertEqual(de.load_errors, set())
        self.decode_and_compare(dst, logits, "pull after forged requests")
        # The prefill revokes a grant as soon as the pulls it expects were served (its notifications), before
        # vLLM's next step frees the blocks: the same params again load nothing, then or after.
        t0 = time.monotonic()
        while any(h.key for w in pe.workers for h in w.worker.core.held.values()) and time.monotonic() - t0 < 10:
            time.sleep(0.01)
        time.sleep(0.05)  # the revoke's round trip
        with self.subTest("the same params after the pull, blocks still held"):
            forge("replayed params", params[3])
        pe.until(lambda: len(pe.sent) == len(preqs), 30)
        with self.subTest("the same params after the blocks were freed"):
            forge("replayed params", params[4])

    def test_push_forged(self) -> None:
        # The decode grants writes into the blocks it allocated for a ticket, under the key the ticket carries:
        # a push into them without that key (a prefill that made up the ticket, or replays another's) is refused.
        from stage_client import StageError
        from stage_client.wire import Code
        src, dst, pe, de = self.engines("pushf", "push")
        dreqs = self.reqs("pushf", {"do_remote_prefill": True, "stage_mode": "push", "stage_kv": "pushf-pre"})
        for s, r in enumerate(dreqs[:1]):
            de.admit(r, lambda n, s=s: self._reserve(dst, s, n))
        de.step()  # the decode's worker grants the ticket's blocks
        self.assertTrue(de.sched.scheduler.tickets_posted(10))
        ticket, t0 = None, time.monotonic()
        while ticket is None and time.monotonic() - t0 < 10:  # over the sidecars' link to the prefill's inbox
            ticket = pe.sched.scheduler.rendezvous.take("pushf-x0")
            time.sleep(0.01)
        self.assertIsNotNone(ticket, "the push ticket did not reach the prefill")
        self.assertEqual(len(bytes.fromhex(ticket["grant"])), 16)
        blocks = dst.tables[0][0]
        before = {b: _block(dst, b).clone() for b in blocks}
        w = pe.workers[0].worker
        n = len(self.prompts[0])
        local = self._reserve(src, 0, n)
        for what, key in (("no key", b""), ("a made-up key", b"\x01" * 16)):
            with self.subTest(what):
                tid = w.kv.push("decode", de.workers[0].worker.name, local, blocks, n, heads=(0, 2),
                                peer="decode", key=key)
                with self.assertRaises(StageError) as cm:
                    w.client.wait(tid, 30)
                self.assertEqual(cm.exception.code, Code.ACCESS_DENIED, str(cm.exception))
                self.assertIn("no live grant", str(cm.exception))
        for b, old in before.items():
            self.assertTrue(torch.equal(_block(dst, b), old), "block %d of the decode's cache was written" % b)
        tid = w.kv.push("decode", de.workers[0].worker.name, local, blocks, n, heads=(0, 2),
                        peer="decode", key=bytes.fromhex(ticket["grant"]))
        w.client.wait(tid, 30)  # with the ticket's key: written

    def test_stand_in(self) -> None:
        # Without vLLM the connector stands on the stand-in base; with it, on vLLM's own.
        from stage_client import vllm as sv
        self.assertEqual(HAVE_VLLM, sv.KVConnectorBase_V1.__module__.startswith("vllm."))
        for m in ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta", "request_finished",
                  "register_kv_caches", "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
                  "get_finished", "get_block_ids_with_load_errors", "shutdown", "bind_connector_metadata",
                  "clear_connector_metadata", "handle_preemptions"):
            self.assertTrue(callable(getattr(sv.StageConnector, m, None)), m)


@unittest.skipUnless(HAVE_CUDA, CUDA_WHY)
class TestVLLMConnectorCUDA(TestVLLMConnector):
    """The same on the GPU: torch CUDA tensors, cuda sidecars, bfloat16; save_kv_layer records CUDA events."""

    device = "cuda:%d" % GPU
    sidecar = "device: {kind: cuda, ordinal: %d}\n" % GPU

    @classmethod
    def setUpClass(cls) -> None:
        cls.dtype = torch.bfloat16
        super().setUpClass()

    @classmethod
    def alloc(cls, node: Staged) -> Any:
        return None

    @classmethod
    def sync(cls) -> None:
        torch.cuda.synchronize(cls.device)


if __name__ == "__main__":
    unittest.main()
