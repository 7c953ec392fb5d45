"""A vLLM KV connector (V1 interface) that moves KV caches through stage.

Load it in vLLM (or vllm-ascend) by module path::

    --kv-transfer-config '{"kv_connector": "StageConnector",
                           "kv_connector_module_path": "stage_client.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"socket": "/run/stage/staged.sock",
                                                         "route": "decode", "mode": "pull"}}'

vLLM builds the class twice: ``role=SCHEDULER`` in the scheduler process
(:class:`~stage_client.vllm.scheduler.StageScheduler` does the work) and
``role=WORKER`` once per worker (:class:`~stage_client.vllm.worker.StageWorker`).
When vLLM is importable the class subclasses its ``KVConnectorBase_V1`` and
``SupportsHMA``; otherwise stand-ins with the same names
(:mod:`~stage_client.vllm.compat`), so the connector is testable without
vLLM (docs/ENGINES.md says what ran against which vLLM).

The modules: :mod:`.config` (the extra-config keys), :mod:`.metadata` (what
the scheduler tells the workers each step), :mod:`.scheduler`,
:mod:`.worker`, and :mod:`.kvlayout` (which stage layout a vLLM layer's
tensor is, asked of its attention backend).

Two modes (``extra_config["mode"]``, or ``stage_mode`` in a request's
kv_transfer_params):

* ``pull`` (vLLM's usual flow, as NixlConnector): the prefill finishes,
  keeps the request's blocks and returns kv_transfer_params naming its
  sidecar peer, KV cache, tensor-parallel size and block ids; the router
  hands them to the decode, whose workers pull the rows. The prefill frees
  the blocks once every decode rank's pull was served, or when the lease
  (``lease_s``) runs out.
* ``push`` (the decode allocates first, as MooncakeConnector and NIXL's
  push variant): the decode posts its block ids to the prefill's
  rendezvous (``stage_client.rendezvous``) under the router's
  ``stage_xfer`` key; the prefill pushes each layer's rows as
  ``save_kv_layer`` is called, so the transfer overlaps the rest of the
  forward pass. Rows computed before the ticket arrived go after.

Either way the decode learns what landed from its sidecar's notifications
(the tag carries the transfer key), and a transfer that fails or outlives
``timeout_s`` makes the request's blocks show up in
``get_block_ids_with_load_errors`` (vLLM then recomputes, or fails the
request, per ``kv_load_failure_policy``); no request waits forever.

``kv_load_failure_policy`` (vLLM's, in the kv-transfer config) decides what
vLLM does with those blocks: ``recompute`` (the decode computes the prompt
itself: same tokens, slower) or ``fail`` (the request ends with an error the
client sees; vLLM's default). Set it explicitly.

Layouts: each worker registers its KV caches with the layout its attention
backend gives them (``kv_layout`` preset, detected when not given), so
a vllm-ascend prefill (K and V apart, 128-token blocks) and a vLLM GPU
decode (HND, 16-token blocks) exchange rows; the sidecars convert.
Under vllm-ascend the caches are NPU memory, registered with an ``acl``
sidecar without further settings; what differs there (NZ settings
refused, NPU events ordering layer-wise pushes, the engine id that changes
every start) is in :mod:`.npu`, which model features are refused in
:mod:`.specs`.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from .compat import HAVE_VLLM, VLLM_VERSION, KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, SupportsHMA
from .config import StageConfig
from .metadata import PushChunk, RecvReq, StageConnectorMetadata

__all__ = ["StageConnector", "StageConnectorMetadata", "StageConfig", "PushChunk", "RecvReq", "HAVE_VLLM",
           "VLLM_VERSION", "KVConnectorRole", "KVConnectorBase_V1", "KVConnectorMetadata", "SupportsHMA"]


class StageConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc,valid-type]
    """vLLM's V1 KV connector over stage; see the module doc."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.cfg = StageConfig.from_vllm(vllm_config)
        check_groups(kv_cache_config, vllm_config)
        self.scheduler: Any = None
        self.worker: Any = None
        if role == KVConnectorRole.SCHEDULER:
            from .scheduler import StageScheduler
            self.scheduler = StageScheduler(self.cfg)
        else:
            from .worker import StageWorker
            self.worker = StageWorker(self.cfg, vllm_config=vllm_config)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: Dict[str, Any]) -> bool:
        """True unless ``layerwise`` is off: vLLM skips ``save_kv_layer`` under full CUDA-graph
        replay, and a layer-wise push (any request may ask for push mode) would then never go."""
        return bool((extra_config or {}).get("layerwise", True))

    def request_finished_all_groups(self, request: Any,
                                    block_ids: Tuple[Any, ...]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """The hybrid KV-cache manager's request_finished: one full-attention group (checked at start)."""
        groups = tuple(block_ids or ())
        if len(groups) != 1:
            raise ValueError("stage connector: request %s finished with %d KV-cache groups; stage moves one "
                             "full-attention group (start vLLM with --disable-hybrid-kv-cache-manager)"
                             % (getattr(request, "request_id", "?"), len(groups)))
        return self.request_finished(request, groups[0])

    # -- scheduler side

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        return self.scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self.scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> StageConnectorMetadata:
        return self.scheduler.build_connector_meta(scheduler_output)

    def request_finished(self, request: Any, block_ids: Any) -> Tuple[bool, Optional[Dict[str, Any]]]:
        return self.scheduler.request_finished(request, block_ids)

    def has_pending_push_work(self) -> bool:
        return self.scheduler is not None and self.scheduler.has_pending_push_work()

    # -- worker side

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        self.worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self.worker.start_load_kv(self._meta())

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Loads are asynchronous (vLLM waits for get_finished), so no layer waits."""

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        self.worker.save_kv_layer(self._meta(), layer_name, kv_layer, attn_metadata)

    def wait_for_save(self) -> None:
        self.worker.wait_for_save()

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        self.worker.handle_preemptions(kv_connector_metadata)

    def get_finished(self, finished_req_ids: Any) -> Tuple[Optional[set], Optional[set]]:
        return self.worker.get_finished(self._meta(), set(finished_req_ids or ()))

    def get_block_ids_with_load_errors(self) -> set:
        return self.worker.take_load_errors()

    def get_kv_connector_stats(self) -> Any:
        """KV loads that failed and sidecar reconnects since the last call (:mod:`.stats`); None when none."""
        return None if self.worker is None else self.worker.take_stats()

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None) -> Any:
        from .stats import StageKVStats

        return StageKVStats(data=dict(data or {}))

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
        if self.scheduler is not None:
            self.scheduler.shutdown()

    def _meta(self) -> Optional[StageConnectorMetadata]:
        m = self._connector_metadata
        return m if isinstance(m, StageConnectorMetadata) else None


def check_groups(kv_cache_config: Any, vllm_config: Any = None) -> None:
    """Refuse, at start, a KV cache stage cannot move, naming the model feature (:func:`.specs.refusal`).

    stage moves one paged full-attention (or dense MLA) cache per layer;
    sliding-window, Mamba, sparse-MLA or other groups the hybrid KV-cache
    manager keeps apart would be left behind, and the decode would read
    stale state."""
    from .specs import refusal

    why = refusal(kv_cache_config, vllm_config)
    if why is not None:
        raise ValueError("stage connector: refused: " + why)
