"""The connector's settings: ``kv_connector_extra_config`` checked, with defaults from vLLM's config."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

from .compat import LOGGER

__all__ = ["StageConfig"]

log = logging.getLogger(LOGGER)


@dataclass
class StageConfig:
    """The connector's settings, from ``kv_connector_extra_config`` (keys as the field names)."""

    # "{rank}" in socket and peer_name stands for a TP rank: one sidecar per GPU, each rank's cache on its own
    # (the schedulers' ticket links use rank 0's); see for_rank
    socket: str = "/run/stage/staged.sock"
    route: str = "stage"
    peer_name: str = ""  # how the other side's sidecar names ours ("" : one-peer routes)
    mode: str = "pull"
    kv_name: str = "vllm"
    kv_layout: str = ""  # a stage_client preset; "" : detected from the tensors
    timeout_s: float = 30.0
    lease_s: float = 120.0
    layerwise: bool = True
    # Deprecated (one release): push tickets travel over the sidecars' link unless these name a rendezvous.
    rendezvous: str = ""  # push: the prefill's rendezvous host:port (a request's stage_rendezvous wins)
    rendezvous_listen: str = ""  # push, prefill scheduler: where to listen ("" : none)
    rendezvous_secret: str = ""  # push: the secret both sides sign tickets with (else the file's, else the env's)
    rendezvous_secret_file: str = ""  # push: a file whose first line is that secret (a k8s Secret mount)
    rendezvous_insecure: bool = False  # a rendezvous_listen without a secret (loopback only; tests)
    kv_heads: int = 0  # total kv heads (0: from the model config; 1 for MLA)
    acl_library: str = ""  # NPU caches: libascendcl's path ("" : libascendcl.so from the loader path)
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
            _warn_unstable_name(vllm_config, cfg.kv_name)
        cfg.kv_role = str(getattr(ktc, "kv_role", cfg.kv_role) or cfg.kv_role)
        if cfg.mode not in ("pull", "push"):
            raise ValueError("stage connector: mode %r (pull or push)" % cfg.mode)
        mc = getattr(vllm_config, "model_config", None)
        if bool(getattr(mc, "use_mla", False)):
            if cfg.kv_heads not in (0, 1):
                raise ValueError("stage connector: kv_heads %d for an MLA model; MLA caches hold one latent row per "
                                 "token (one head, on every rank): leave kv_heads unset" % cfg.kv_heads)
            cfg.kv_heads = 1
        if not cfg.kv_heads:
            cfg.kv_heads = int(mc.get_total_num_kv_heads()) if mc is not None else 0
        if not cfg.tp_size:
            pc = getattr(vllm_config, "parallel_config", None)
            cfg.tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        if cfg.kv_heads < 1:
            raise ValueError("stage connector: the number of kv heads is unknown; set kv_heads")
        return cfg

    def secret(self) -> Optional[bytes]:
        """The rendezvous secret (``$STAGE_RENDEZVOUS_SECRET`` when no key names one); None: unsigned."""
        from ..rendezvous import load_secret
        return load_secret(self.rendezvous_secret, self.rendezvous_secret_file)

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


RANK = "{rank}"


def for_rank(text: str, rank: int) -> str:
    """``text`` (a socket path or a peer name) with ``{rank}`` replaced by TP rank ``rank``: with one sidecar per
    GPU, rank r's cache is on the sidecar of socket ``for_rank(socket, r)``, named ``for_rank(peer_name, r)``
    by its peers; the schedulers' ticket links are rank 0's. Text without ``{rank}`` comes back unchanged."""
    return text.replace(RANK, str(int(rank)))


def _warn_unstable_name(vllm_config: Any, name: str) -> None:
    """vllm-ascend makes engine_id ``<engine_id>-<uuid>`` at every start: a cache named after it changes each time."""
    from .npu import under_vllm_ascend

    if under_vllm_ascend(vllm_config):
        log.warning("stage: kv_name is not set, so the KV cache is named after engine_id %r, which vllm-ascend "
                    "rewrites to <engine_id>-<uuid> at every start: the cache's name (%s-tp<rank>) changes with "
                    "each restart, and push tickets, routers and stagectl that name it go stale. Set kv_name in "
                    "kv_connector_extra_config", name, name)
