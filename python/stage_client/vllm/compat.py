"""vLLM's connector base classes, or stand-ins with the same names where vLLM is not installed.

Everything else in :mod:`stage_client.vllm` imports vLLM's types from here,
so the connector is importable (and testable through a replay of vLLM's
calls) on a machine without vLLM, and subclasses the real
``KVConnectorBase_V1`` and ``SupportsHMA`` where vLLM is installed
(docs/ENGINES.md says which versions ran).
"""

from __future__ import annotations

import enum
from typing import Any, Dict, Optional, Tuple

__all__ = ["LOGGER", "HAVE_VLLM", "KVConnectorBase_V1", "KVConnectorMetadata", "KVConnectorRole", "SupportsHMA",
           "StandInBase", "StandInHMA", "StandInMetadata", "StandInRole", "VLLM_VERSION"]

VLLM_VERSION = ""


class StandInRole(enum.Enum):
    """vLLM's roles: the scheduler process, or a worker."""

    SCHEDULER = 0
    WORKER = 1


class StandInMetadata:
    """What the scheduler side hands the workers each step."""


class StandInBase:
    """A stand-in for vLLM's base class: the same constructor and metadata handling (the conformance test
    compares each method with the installed vLLM's)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        if getattr(vllm_config, "kv_transfer_config", None) is None:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._connector_metadata: Optional[StandInMetadata] = None
        self._vllm_config = vllm_config
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role

    @property
    def role(self) -> Any:
        return self._role

    def bind_connector_metadata(self, connector_metadata: StandInMetadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> StandInMetadata:
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None


class StandInHMA:
    """A stand-in for vLLM's marker of connectors that work with the hybrid KV-cache manager."""

    def request_finished_all_groups(self, request: Any,
                                    block_ids: Tuple[Any, ...]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        raise NotImplementedError


try:  # vLLM is an optional dependency
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
    HAVE_VLLM = True
    try:
        import vllm as _vllm  # type: ignore

        VLLM_VERSION = str(getattr(_vllm, "__version__", ""))
    except Exception:  # noqa: BLE001 - the version is only reported
        pass
except Exception:  # noqa: BLE001 - any import failure means: no usable vLLM
    HAVE_VLLM = False
    KVConnectorRole = StandInRole  # type: ignore[misc,assignment]
    KVConnectorMetadata = StandInMetadata  # type: ignore[misc,assignment]
    KVConnectorBase_V1 = StandInBase  # type: ignore[misc,assignment]

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA  # type: ignore
except Exception:  # noqa: BLE001 - older vLLM, or none
    SupportsHMA = StandInHMA  # type: ignore[misc,assignment]

#: the connector's logger: under vLLM's own ("vllm." loggers share its handlers and format), else stage_client's
LOGGER = "vllm.stage_client" if HAVE_VLLM else "stage_client.vllm"
