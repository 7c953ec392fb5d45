"""The connector's figures for vLLM's stats: KV loads that failed, sidecar reconnects, transfers retried.

A worker counts, between two of vLLM's ``get_kv_connector_stats`` calls,
the requests whose KV did not arrive (vLLM then recomputes them, or fails
them, per ``kv_load_failure_policy``), the times its sidecar connection
was brought back after the sidecar closed it, and the transfers it started
again after a sidecar going away cut them short (:mod:`stage_client.mover`).
vLLM sums the workers' figures (:meth:`StageKVStats.aggregate`) and logs
them with its throughput line ("KV Transfer metrics: kv_loads_failed=...,
sidecar_reconnects=..., kv_transfers_retried=...").
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

__all__ = ["StageKVStats", "Counters", "KEYS"]

#: the figures, in the order vLLM logs them
KEYS = ("kv_loads_failed", "sidecar_reconnects", "kv_transfers_retried")

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats  # type: ignore
except Exception:  # noqa: BLE001 - no usable vLLM: a stand-in with the same shape

    @dataclass
    class KVConnectorStats:  # type: ignore[no-redef]
        """A stand-in for vLLM's KVConnectorStats (a ``data`` dict)."""

        data: Dict[str, Any] = field(default_factory=dict)


@dataclass
class StageKVStats(KVConnectorStats):  # type: ignore[misc,valid-type]
    """vLLM's KVConnectorStats for this connector: ``data`` holds a count per key of :data:`KEYS`."""

    def __post_init__(self) -> None:
        for k in KEYS:
            self.data.setdefault(k, 0)

    def reset(self) -> None:
        self.data = {k: 0 for k in KEYS}

    def aggregate(self, other: Any) -> "StageKVStats":
        for k in KEYS:
            self.data[k] = int(self.data.get(k, 0)) + int((getattr(other, "data", None) or {}).get(k, 0))
        return self

    def reduce(self) -> Dict[str, Any]:
        return {k: int(self.data.get(k, 0)) for k in KEYS}

    def is_empty(self) -> bool:
        return not any(self.data.get(k) for k in KEYS)


class Counters:
    """A worker's counts since vLLM last took them (thread-safe), and in all (``total``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = {k: 0 for k in KEYS}
        self.total = {k: 0 for k in KEYS}

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._now[key] += n
            self.total[key] += n

    def take(self) -> Optional[StageKVStats]:
        """The counts since the last take (None when all are 0), and start again."""
        with self._lock:
            now, self._now = self._now, {k: 0 for k in KEYS}
        return StageKVStats(data=now) if any(now.values()) else None
