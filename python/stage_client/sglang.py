"""An SGLang-style disaggregation backend over stage: KVManager, KVSender, KVReceiver, KVPoll.

SGLang's transfer backends implement ``BaseKVManager``, ``BaseKVSender``
(``init(num_kv_indices, aux_index)``, ``send(kv_indices, ...)`` once per
prefill chunk, ``poll()``) and ``BaseKVReceiver`` (``init`` and
``send_metadata(kv_indices, ...)``, or the older ``init(kv_indices,
aux_index)``; ``poll()``) from ``sglang/srt/disaggregation/base/conn.py``,
with ``KVPoll`` states Failed, Bootstrapping, WaitingForInput, Transferring,
Success. The decode allocates pages and tells the prefill their indices
(here: a ticket posted to the prefill's rendezvous, which plays the
bootstrap server); the prefill pushes each chunk's pages into them. These
classes have those names and calls, so a backend entry in SGLang is a few
lines (docs/ENGINES.md); they take the memory pool's tensors rather than
raw pointers, because the sidecar maps memory by handle, not by address.

The KV cache is SGLang's token pool: per layer ``k_buffer`` and
``v_buffer`` of shape (tokens, heads, head_dim), page ``p`` being tokens
[p * page_size, (p + 1) * page_size) (preset ``sglang``). Prefill and
decode may split heads differently; the sidecars convert.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Union

from . import rendezvous as rdv
from .client import Client
from .engines import Coverage, Mover, head_slice, make_tag, parse_tag, plan
from .errors import SidecarConnectionError, StageError
from .kvcache import register_kv_cache
from .wire import Code

__all__ = ["KVPoll", "StageKVManager", "StageKVSender", "StageKVReceiver"]


class KVPoll:
    """SGLang's transfer states (the same numbers)."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class StageKVManager:
    """One rank's KV pool registered with its sidecar, and the per-room state of its transfers.

    ``role`` is ``"prefill"`` (serves a rendezvous, ``bootstrap``, for the
    decodes' page tickets; default a :class:`~stage_client.rendezvous.RendezvousServer`
    on ``bootstrap_listen``) or ``"decode"`` (follows its sidecar's
    notifications). ``route`` leads to the other side's sidecar;
    ``peer_name`` is how the other side names this one's ("" : one-peer
    routes).
    """

    def __init__(self, client: Union[str, Client], name: str, k_buffers: Sequence[Any], v_buffers: Sequence[Any],
                 page_size: int, kv_heads: int, role: str, tp_rank: int = 0, tp_size: int = 1, route: str = "stage",
                 peer_name: str = "", bootstrap: Any = None, bootstrap_listen: str = "0.0.0.0:0",
                 timeout: float = 30.0) -> None:
        if role not in ("prefill", "decode"):
            raise ValueError("StageKVManager: role %r (prefill or decode)" % role)
        self.client = Client(client, request_timeout=timeout) if isinstance(client, str) else client
        self.role, self.rank, self.tp, self.heads = role, tp_rank, tp_size, kv_heads
        self.name, self.route, self.peer_name, self.timeout = name, route, peer_name, timeout
        self.page_size = page_size
        lo, hi = head_slice(kv_heads, tp_size, tp_rank)
        self.cache_name = "%s-tp%d" % (name, tp_rank)
        #: per layer [k_buffer, v_buffer], as registered
        self.buffers = [[k, v] for k, v in zip(k_buffers, v_buffers)]
        self.kv = register_kv_cache(self.client, self.cache_name, self.buffers, "sglang", heads=kv_heads,
                                    head_lo=lo, head_hi=hi, page_size=page_size)
        self.mover = Mover(self.client, timeout, "stage-sglang-tp%d" % tp_rank)
        self.lock = threading.Lock()
        self.bootstrap: Any = None
        self._rooms: Dict[str, Coverage] = {}
        self._errors: Dict[str, str] = {}
        self._sub: Any = None
        if role == "prefill":
            self.bootstrap = bootstrap
            if bootstrap is None:
                self.bootstrap = rdv.RendezvousServer(*rdv.parse_addr(bootstrap_listen))
        else:
            self._sub = self.client.subscribe()
            self._reader = threading.Thread(target=self._read, name="stage-sglang-notes", daemon=True)
            self._reader.start()

    def register_to_bootstrap(self) -> None:
        """SGLang's hook; the rendezvous is this manager's own, so nothing to register."""

    def expect(self, room: str, tokens: int) -> None:
        with self.lock:
            self._rooms.setdefault(room, Coverage(0, tokens)).tokens = tokens

    def state(self, room: str) -> Optional[str]:
        """Decode: None while arriving, "" once complete, else the error."""
        with self.lock:
            if room in self._errors:
                return self._errors[room]
            cov = self._rooms.get(room)
            return "" if cov is not None and cov.complete() else None

    def _read(self) -> None:
        while True:
            try:
                n = self._sub.get(1.0)
            except SidecarConnectionError:
                return
            t = None if n is None else parse_tag(n.tag)
            if t is None or n.kv != self.cache_name or t[1] != "p":
                continue
            room, _, src, src_tp = t
            with self.lock:
                if n.code != Code.OK:
                    self._errors.setdefault(room, "a push from prefill rank %d failed: %s" % (src, n.message))
                    continue
                cov = self._rooms.setdefault(room, Coverage(0, 0))
                if cov.expect is None:
                    srcs = {s for s, d, _, _ in plan(self.heads, src_tp, self.tp) if d == self.rank}
                    cov.expect = {(s, layer) for s in srcs for layer in range(self.kv.layers)}
                for layer in n.layers:
                    cov.add(src, int(layer), n.first, n.first + n.tokens)

    def close(self) -> None:
        self.mover.close()
        if self._sub is not None:
            self._sub.close()
        if self.bootstrap is not None and hasattr(self.bootstrap, "close"):
            self.bootstrap.close()
        try:
            self.kv.close()
        except (StageError, OSError):
            pass
        self.client.close()


class StageKVSender:
    """The prefill side of one request (``bootstrap_room``): push each chunk's pages into the decode's."""

    def __init__(self, mgr: StageKVManager, bootstrap_addr: str, bootstrap_room: Any,
                 dest_tp_ranks: Optional[List[int]] = None, pp_rank: int = 0, **_: Any) -> None:
        self.mgr, self.room = mgr, str(bootstrap_room)
        self.ticket: Optional[Dict[str, Any]] = None
        self.pages = 0
        self.sent = 0  # pages sent so far
        self.error = ""
        self.t0 = time.monotonic()

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None) -> None:
        self.pages = int(num_kv_indices)

    def _ticket(self) -> Optional[Dict[str, Any]]:
        if self.ticket is None:
            self.ticket = self.mgr.bootstrap.get(self.room)  # every rank reads it; it expires
        return self.ticket

    def send(self, kv_indices: Any, state_indices: Any = None, token_position_offset: int = 0) -> None:
        t = self._ticket()
        if t is None:
            self.error = "the decode's page ticket for room %s has not arrived" % self.room
            return
        m, ps = self.mgr, self.mgr.page_size
        local = [int(x) for x in (kv_indices.tolist() if hasattr(kv_indices, "tolist") else kv_indices)]
        first = self.sent * ps
        tokens = min(len(local) * ps, int(t["tokens"]) - first)
        self.sent += len(local)
        if tokens <= 0:
            return
        kw = {"peer": t["peer"]} if t.get("peer") else {}
        tag = make_tag(self.room, "p", m.rank, m.tp)
        for s, d, lo, hi in plan(m.heads, m.tp, int(t["tp"])):
            if s != m.rank:
                continue
            remote = "%s-tp%d" % (t["kv"], d)

            def fn(remote: str = remote, lo: int = lo, hi: int = hi) -> List[int]:
                return [m.kv.push(m.route, remote, local, t["block_ids"], tokens, remote_first=first,
                                  heads=(lo, hi), tag=tag, **kw)]

            m.mover.submit(self.room, fn)

    def poll(self) -> int:
        led = self.mgr.mover.ledger
        if self.error or led.error(self.room) is not None:
            return KVPoll.Failed
        if self._ticket() is None:
            if time.monotonic() - self.t0 > self.mgr.timeout:
                self.error = "no page ticket for room %s within %ss" % (self.room, self.mgr.timeout)
                return KVPoll.Failed
            return KVPoll.Bootstrapping
        if self.sent == 0:
            return KVPoll.WaitingForInput
        if self.sent >= self.pages and led.idle(self.room):
            return KVPoll.Success
        return KVPoll.Transferring

    def failure_exception(self) -> None:
        err = self.error or self.mgr.mover.ledger.error(self.room)
        raise RuntimeError("stage KV send of room %s failed: %s" % (self.room, err))

    def get_transfer_metric(self) -> Any:
        return None

    def clear(self) -> None:
        self.mgr.mover.ledger.forget(self.room)

    def abort(self) -> None:
        self.error = self.error or "aborted"


class StageKVReceiver:
    """The decode side of one request: post its pages to the prefill's rendezvous, then wait for the rows."""

    def __init__(self, mgr: StageKVManager, bootstrap_addr: Any, bootstrap_room: Any = None, **_: Any) -> None:
        self.mgr, self.addr, self.room = mgr, bootstrap_addr, str(bootstrap_room)
        self.posted = False
        self.error = ""
        self.deadline = 0.0

    def init(self, kv_indices: Any = None, aux_index: Optional[int] = None) -> None:
        """Newer SGLang passes a prefill dp rank (then send_metadata follows); older ones the pages."""
        if kv_indices is not None and not isinstance(kv_indices, int):
            self.send_metadata(kv_indices, aux_index)

    def send_metadata(self, kv_indices: Any, aux_index: Optional[int] = None, state_indices: Any = None,
                      decode_prefix_len: Optional[int] = None) -> None:
        m = self.mgr
        pages = [int(x) for x in (kv_indices.tolist() if hasattr(kv_indices, "tolist") else kv_indices)]
        tokens = len(pages) * m.page_size
        ticket = {"peer": m.peer_name, "kv": m.name, "tp": m.tp, "block_ids": pages, "first": 0, "tokens": tokens}
        m.expect(self.room, tokens)
        self.deadline = time.monotonic() + m.timeout
        try:
            if isinstance(self.addr, str):
                rdv.post(self.addr, self.room, ticket, timeout=min(5.0, m.timeout))
            else:
                self.addr.post(self.room, ticket)
            self.posted = True
        except (OSError, ValueError) as e:
            self.error = "posting the page ticket to %s: %s" % (self.addr, e)

    def poll(self) -> int:
        if self.error:
            return KVPoll.Failed
        if not self.posted:
            return KVPoll.WaitingForInput
        st = self.mgr.state(self.room)
        if st == "":
            return KVPoll.Success
        if st or time.monotonic() > self.deadline:
            self.error = st or "not complete after %ss" % self.mgr.timeout
            return KVPoll.Failed
        return KVPoll.Transferring

    def failure_exception(self) -> None:
        raise RuntimeError("stage KV receive of room %s failed: %s" % (self.room, self.error))

    def clear(self) -> None:
        with self.mgr.lock:
            self.mgr._rooms.pop(self.room, None)
            self.mgr._errors.pop(self.room, None)

    def abort(self) -> None:
        self.error = self.error or "aborted"
