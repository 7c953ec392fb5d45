"""What the scheduler side tells the workers each step (one :class:`StageConnectorMetadata` per step)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

from .compat import KVConnectorMetadata

__all__ = ["PushChunk", "RecvReq", "StageConnectorMetadata"]


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
    key: bytes = b""  # the transfer key: the prefill's grant (pull) or ours, in the ticket (push)


class StageConnectorMetadata(KVConnectorMetadata):
    """One step's instructions from the scheduler side to every worker."""

    def __init__(self) -> None:
        self.push: List[PushChunk] = []  # layer by layer during this forward (prefill)
        self.catchup: List[PushChunk] = []  # every layer, before this forward (prefill)
        self.seal: Dict[str, str] = {}  # req -> xfer: nothing more will be pushed (prefill)
        self.hold: Dict[str, Tuple[str, float]] = {}  # req -> (xfer, lease seconds) (prefill, pull)
        self.recv: List[RecvReq] = []  # (decode)
        self.preempted: List[str] = []
        self.failed: Dict[str, str] = {}  # req -> why its push ticket could not be posted (decode)
        self.grant: Dict[str, Tuple[bytes, List[int]]] = {}  # req -> (key, blocks) the decode may pull (prefill, pull)
        self.revoke: List[Tuple[str, bytes]] = []  # (req, key): grants that end (prefill, pull)
