"""A vLLM KV connector (V1 interface) that moves KV caches through stage.

Load it in vLLM (or vllm-ascend) by module path::

    --kv-transfer-config '{"kv_connector": "StageConnector",
                           "kv_connector_module_path": "stage_client.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"socket": "/run/stage/staged.sock",
                                                         "route": "decode", "mode": "pull"}}'

vLLM builds the class twice: ``role=SCHEDULER`` in the scheduler process
(:class:`~stage_client.vllm_scheduler.StageScheduler` does the work) and
``role=WORKER`` once per worker (:class:`~stage_client.vllm_worker.StageWorker`).
When vLLM is importable the class subclasses its ``KVConnectorBase_V1``;
otherwise a stand-in with the same method names, so the connector is
testable without vLLM (docs/ENGINES.md says what was tested how).

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

Layouts: each worker registers its KV caches with the layout read off the
tensors vLLM hands it (``kv_layout`` preset, detected when not given), so
a vllm-ascend prefill (K and V apart, 128-token blocks) and a vLLM GPU
decode (HND, 16-token blocks) exchange rows; the sidecars convert.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["StageConnector", "StageConnectorMetadata", "StageConfig", "PushChunk", "RecvReq", "HAVE_VLLM",
           "KVConnectorRole", "KVConnectorBase_V1", "KVConnectorMetadata"]

try:  # pragma: no cover - vLLM cannot be installed where these tests run
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
    HAVE_VLLM = True
except Exception:  # noqa: BLE001 - any import failure means: no usable vLLM
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):  # type: ignore[no-redef]
        """vLLM's roles: the scheduler process, or a worker."""

        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:  # type: ignore[no-redef]
        """What the scheduler side hands the workers each step."""

    class KVConnectorBase_V1:  # type: ignore[no-redef]
        """A stand-in for vLLM's base class: the same constructor and metadata handling."""

        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
            if getattr(vllm_config, "kv_transfer_config", None) is None:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._connector_metadata: Optional[KVConnectorMetadata] = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self) -> Any:
            return self._role

        def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self) -> KVConnectorMetadata:
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None


@dataclass
class StageConfig:
    """The connector's settings, from ``kv_connector_extra_config`` (keys as the field names)."""

    socket: str = "/run/stage/staged.sock"
    route: str = "stage"
    peer_name: str = ""  # how the other side's sidecar names ours ("" : one-peer routes)
    mode: str = "pull"
    kv_name: str = "vllm"
    kv_layout: str = ""  # a stage_client preset; "" : detected from the tensors
    timeout_s: float = 30.0
    lease_s: float = 120.0
    layerwise: bool = True
    rendezvous: str = ""  # push: the prefill's rendezvous host:port (a request's stage_rendezvous wins)
    rendezvous_listen: str = ""  # push, prefill scheduler: where to listen ("" : in-process only)
    kv_heads: int = 0  # total kv heads (0: from the model config)
    tp_rank: int = -1  # -1: from vLLM's parallel state
    tp_size: int = 0  # 0: from the parallel config
    kv_role: str = "kv_both"

    @classmethod
    def from_vllm(cls, vllm_config: Any) -> "StageConfig":
        ktc = vllm_config.kv_transfer_config
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        known = set(cls.__dataclass_fields__)
        bad = sorted(set(extra) - known)
        if bad:
            raise ValueError("stage connector: unknown kv_connector_extra_config keys %s (known: %s)"
                             % (bad, ", ".join(sorted(known))))
        cfg = cls(**extra)
        cfg.socket = os.environ.get("STAGE_SOCKET", cfg.socket) if "socket" not in extra else cfg.socket
        if "kv_name" not in extra and getattr(ktc, "engine_id", None):
            cfg.kv_name = str(ktc.engine_id)
        cfg.kv_role = str(getattr(ktc, "kv_role", cfg.kv_role) or cfg.kv_role)
        if cfg.mode not in ("pull", "push"):
            raise ValueError("stage connector: mode %r (pull or push)" % cfg.mode)
        if not cfg.kv_heads:
            mc = getattr(vllm_config, "model_config", None)
            cfg.kv_heads = int(mc.get_total_num_kv_heads()) if mc is not None else 0
        if not cfg.tp_size:
            pc = getattr(vllm_config, "parallel_config", None)
            cfg.tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        if cfg.kv_heads < 1:
            raise ValueError("stage connector: the number of kv heads is unknown; set kv_heads")
        return cfg

    def rank(self) -> int:
        if self.tp_rank >= 0:
            return self.tp_rank
        try:  # pragma: no cover - vLLM only
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank  # type: ignore
            return int(get_tensor_model_parallel_rank())
        except Exception:  # noqa: BLE001
            return 0

    def cache_name(self, rank: int, prefix: Optional[str] = None) -> str:
        """The KV cache a rank registers: ``<kv_name>-tp<rank>``."""
        return "%s-tp%d" % (self.kv_name if prefix is None else prefix, rank)


@dataclass
class PushChunk:
    """Tokens [first, first + tokens) of a request to push (prefill), into the decode's ticket."""

    req_id: str
    xfer: str
    blocks: List[int]
    first: int
    tokens: int
    ticket: Dict[str, Any]


@dataclass
class RecvReq:
    """A request whose KV the decode receives: tokens [first, first + tokens) into ``blocks``."""

    req_id: str
    xfer: str
    mode: str
    blocks: List[int]
    first: int
    tokens: int
    peer: str = ""
    remote_kv: str = ""
    remote_tp: int = 1
    remote_blocks: List[int] = field(default_factory=list)
    lease_expires: float = 0.0  # wall clock (time.time()), pull only
    error: str = ""  # set when the scheduler already knows it cannot arrive


class StageConnectorMetadata(KVConnectorMetadata):
    """One step's instructions from the scheduler side to every worker."""

    def __init__(self) -> None:
        self.push: List[PushChunk] = []  # layer by layer during this forward (prefill)
        self.catchup: List[PushChunk] = []  # every layer, before this forward (prefill)
        self.seal: Dict[str, str] = {}  # req -> xfer: nothing more will be pushed (prefill)
        self.hold: Dict[str, Tuple[str, float]] = {}  # req -> (xfer, lease seconds) (prefill, pull)
        self.recv: List[RecvReq] = []  # (decode)
        self.preempted: List[str] = []


class StageConnector(KVConnectorBase_V1):  # type: ignore[misc,valid-type]
    """vLLM's V1 KV connector over stage; see the module doc."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.cfg = StageConfig.from_vllm(vllm_config)
        self.scheduler: Any = None
        self.worker: Any = None
        if role == KVConnectorRole.SCHEDULER:
            from .vllm_scheduler import StageScheduler
            self.scheduler = StageScheduler(self.cfg)
        else:
            from .vllm_worker import StageWorker
            self.worker = StageWorker(self.cfg)

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
        self.worker.save_kv_layer(self._meta(), layer_name, kv_layer)

    def wait_for_save(self) -> None:
        self.worker.wait_for_save()

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        self.worker.handle_preemptions(kv_connector_metadata)

    def get_finished(self, finished_req_ids: Any) -> Tuple[Optional[set], Optional[set]]:
        return self.worker.get_finished(self._meta(), set(finished_req_ids or ()))

    def get_block_ids_with_load_errors(self) -> set:
        return self.worker.take_load_errors()

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
        if self.scheduler is not None:
            self.scheduler.shutdown()

    def _meta(self) -> Optional[StageConnectorMetadata]:
        m = self._connector_metadata
        return m if isinstance(m, StageConnectorMetadata) else None
