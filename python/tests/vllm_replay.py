"""A replay of vLLM's calls into a KV connector, for tests without vLLM.

The objects vLLM hands a connector (VllmConfig, Request, KVCacheBlocks,
SchedulerOutput with its new and cached request data) are stood in for by
small classes with the same attribute names, and :class:`Engine` makes
the calls in the order vLLM v1 makes them (checked against vLLM's
scheduler, gpu_model_runner and kv_connector_model_runner_mixin):

* scheduling a waiting request: ``get_num_new_matched_tokens``, block
  allocation, ``update_state_after_alloc``; then ``build_connector_meta``
  once per step;
* each worker, per step: ``handle_preemptions``, ``bind_connector_metadata``,
  ``start_load_kv``, per layer ``wait_for_layer_load`` / attention /
  ``save_kv_layer``, ``wait_for_save``, ``get_finished(finished_req_ids)``,
  ``get_block_ids_with_load_errors``, ``clear_connector_metadata``;
* a request that ends: ``request_finished(request, block_ids)``; its
  blocks stay while it returned True, until every worker reported it in
  get_finished (vLLM's KVOutputAggregator waits for all of them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from stage_client.vllm import KVConnectorRole, StageConnector


@dataclass
class KVTransferConfig:
    kv_connector_extra_config: Dict[str, Any]
    kv_role: str = "kv_both"
    engine_id: str = ""
    kv_connector: str = "StageConnector"
    kv_connector_module_path: str = "stage_client.vllm"


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1


class ModelConfig:
    def __init__(self, kv_heads: int) -> None:
        self.kv_heads = kv_heads

    def get_total_num_kv_heads(self) -> int:
        return self.kv_heads


@dataclass
class VllmConfig:
    kv_transfer_config: KVTransferConfig
    parallel_config: ParallelConfig
    model_config: ModelConfig


@dataclass
class Request:
    request_id: str
    prompt_token_ids: List[int]
    kv_transfer_params: Optional[Dict[str, Any]] = None
    status: str = "WAITING"
    num_computed_tokens: int = 0


class KVCacheBlocks:
    def __init__(self, ids: List[int]) -> None:
        self.ids = list(ids)

    def get_block_ids(self) -> Tuple[List[int], ...]:
        return (list(self.ids),)


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: List[int]
    block_ids: Tuple[List[int], ...]
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    req_ids: List[str] = field(default_factory=list)
    resumed_req_ids: Set[str] = field(default_factory=set)
    new_block_ids: List[Optional[Tuple[List[int], ...]]] = field(default_factory=list)
    num_computed_tokens: List[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: List[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    num_scheduled_tokens: Dict[str, int] = field(default_factory=dict)
    finished_req_ids: Set[str] = field(default_factory=set)
    preempted_req_ids: Set[str] = field(default_factory=set)


def layer_name(i: int) -> str:
    return "model.layers.%d.self_attn.attn" % i


def kv_caches(cache: Any, rank: int) -> Dict[str, Any]:
    """What vLLM hands register_kv_caches: layer name -> that rank's layer cache (a (K, V) pair for ascend);
    ``cache`` is an examples/tinylm.py Cache."""
    rc = cache.ranks[rank]
    return {layer_name(i): (tuple(ts) if len(ts) > 1 else ts[0]) for i, ts in enumerate(rc.tensors)}


class Engine:
    """One vLLM instance: the scheduler's connector and one worker connector per TP rank."""

    def __init__(self, socket: str, extra: Dict[str, Any], heads: int, caches: List[Dict[str, Any]],
                 engine_id: str, kv_role: str = "kv_both") -> None:
        tp = len(caches)
        base = dict(socket=socket, **extra)
        self.sched = StageConnector(self._cfg(base, heads, tp, engine_id, kv_role), KVConnectorRole.SCHEDULER)
        self.workers = [StageConnector(self._cfg(dict(base, tp_rank=r), heads, tp, engine_id, kv_role),
                                       KVConnectorRole.WORKER) for r in range(tp)]
        self.caches = caches
        for w, c in zip(self.workers, caches):
            w.register_kv_caches(c)
        #: vLLM passes handle_preemptions the step's metadata, or (some releases) the set of preempted ids
        self.preemptions_as_ids = False
        self.finished: Set[str] = set()  # finished_req_ids for the next step
        self._count: Dict[Tuple[str, str], int] = {}
        self.sent: Set[str] = set()
        self.recvd: Set[str] = set()
        self.load_errors: Set[int] = set()

    @staticmethod
    def _cfg(extra: Dict[str, Any], heads: int, tp: int, engine_id: str, kv_role: str) -> VllmConfig:
        return VllmConfig(KVTransferConfig(extra, kv_role, engine_id=engine_id), ParallelConfig(tp), ModelConfig(heads))

    # scheduler

    def admit(self, req: Request, blocks: Callable[[int], List[int]]) -> Tuple[int, bool]:
        """Schedule a waiting request: ask the connector, allocate, tell it. ``blocks(n_tokens)`` allocates."""
        n, load_async = self.sched.get_num_new_matched_tokens(req, 0)
        n = n or 0
        total = len(req.prompt_token_ids)
        ids = blocks(total)
        self.sched.update_state_after_alloc(req, KVCacheBlocks(ids), n)
        req.status = "WAITING_FOR_REMOTE_KVS" if load_async else "RUNNING"
        return n, load_async

    def finish(self, req: Request, block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        req.status = "FINISHED_LENGTH_CAPPED"
        self.finished.add(req.request_id)
        return self.sched.request_finished(req, block_ids)

    # workers

    def step(self, so: Optional[SchedulerOutput] = None,
             forward: Optional[Callable[[Callable[[int], None]], Any]] = None) -> Any:
        """One engine step; ``forward(after_layer)`` runs the model, calling after_layer(i) per layer."""
        so = so or SchedulerOutput()
        so.finished_req_ids, self.finished = self.finished, set()
        meta = self.sched.build_connector_meta(so)
        out = None
        for w in self.workers:
            w.handle_preemptions(set(so.preempted_req_ids) if self.preemptions_as_ids else meta)
            w.bind_connector_metadata(meta)
            w.start_load_kv(None)
        if forward is not None:
            def after_layer(i: int) -> None:
                name = layer_name(i)
                for w, c in zip(self.workers, self.caches):
                    w.wait_for_layer_load(name)
                    w.save_kv_layer(name, c[name], None)
            out = forward(after_layer)
        for w in self.workers:
            w.wait_for_save()
            sending, recving = w.get_finished(so.finished_req_ids)
            self.load_errors |= w.get_block_ids_with_load_errors()
            self._aggregate("send", sending, self.sent)
            self._aggregate("recv", recving, self.recvd)
            w.clear_connector_metadata()
        return out

    def _aggregate(self, kind: str, ids: Optional[Set[str]], into: Set[str]) -> None:
        for rid in ids or ():
            k = (kind, rid)
            self._count[k] = self._count.get(k, 0) + 1
            if self._count[k] == len(self.workers):
                into.add(rid)

    def tickets_in(self, n: int, limit: float = 20.0) -> None:
        """Wait (no step) until this prefill's scheduler holds ``n`` push tickets. A decode's ticket travels
        over the sidecars' link; a test whose step must find its pushes' destinations waits for it first (on
        a loaded machine it can land after the step, and the pushes then start one step later)."""
        rdv, t0 = self.sched.scheduler.rendezvous, time.monotonic()
        while len(rdv) < n:
            if time.monotonic() - t0 > limit:
                raise AssertionError("%d of %d push tickets reached the prefill in %.0fs" % (len(rdv), n, limit))
            time.sleep(0.01)

    def until(self, what: Callable[[], bool], limit: float, tick: float = 0.01) -> float:
        """Step (without a forward) until ``what()``; the seconds it took. Raises AssertionError at ``limit``."""
        t0 = time.monotonic()
        while not what():
            if time.monotonic() - t0 > limit:
                raise AssertionError("still waiting after %.1fs (sent %s, received %s)" % (limit, sorted(self.sent),
                                                                                         sorted(self.recvd)))
            self.step()
            time.sleep(tick)
        return time.monotonic() - t0

    def shutdown(self) -> None:
        for c in self.workers + [self.sched]:
            c.shutdown()
