"""The backend's core: KVPoll, AuxSlots and the manager, sender and receiver over stage (see the package doc)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Union

from .. import rendezvous as rdv
from ..client import Client
from ..connector_core import LiveGrants, Receive, Receives
from ..engines import Mover, Tag, grant_again, head_slice, make_tag, parse_tag, plan
from ..mover import RETRY_CODES
from ..errors import SidecarConnectionError, StageError
from ..client import Op
from ..kvcache import HostArena, register_kv_cache, unregister_all
from ..kvclient import grant_key
from ..protocol.wire import Access, Code

__all__ = ["KVPoll", "AuxSlots", "StageKVManager", "StageKVSender", "StageKVReceiver"]

log = logging.getLogger(__name__)


class KVPoll:
    """SGLang's transfer states (the same numbers)."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class AuxSlots:
    """SGLang's aux (metadata) buffers, staged through a HostArena registered with the sidecar.

    ``buffers`` are the engine's tensors, each ``(slots, ...)``, contiguous,
    on the CPU or a GPU; slot ``i`` of buffer ``b`` is ``items[b]`` bytes.
    Each buffer gets a region ``<name><b>`` of the same shape in bytes.
    :meth:`load` copies a slot from the engine's tensors into the regions
    (before a push), :meth:`store` back (after a push landed).
    """

    def __init__(self, client: Client, name: str, buffers: Sequence[Any], access: int) -> None:
        import torch

        self.client, self.buffers, self.name, self.access = client, list(buffers), name, access
        self.items: List[int] = []
        self.slots = -1
        size = 0
        for i, b in enumerate(self.buffers):
            if not b.is_contiguous() or b.dim() < 1 or b.shape[0] < 1:
                raise ValueError("aux buffer %d: want a contiguous tensor of (slots, ...), got %s" % (i, tuple(b.shape)))
            self.items.append(b[0].numel() * b.element_size())
            self.slots = b.shape[0] if self.slots < 0 else min(self.slots, b.shape[0])
            size += -(-b.shape[0] * self.items[-1] // 4096) * 4096
        self.arena = HostArena(max(size, 4096), name)
        self.stage = [self.arena.empty((b.shape[0], n), torch.uint8) for b, n in zip(self.buffers, self.items)]
        self.names: List[str] = []
        try:
            self.register(client)
        except BaseException:
            self.close()
            raise

    def register(self, client: Client) -> None:
        """Register each buffer's staging region on ``client`` (again, on a reconnected client)."""
        self.names = []
        for i, st in enumerate(self.stage):
            off = self.arena.offset_of(st.data_ptr(), st.numel())
            client.register_memfd("%s%d" % (self.name, i), self.arena.fd, self.arena.size, off, st.numel(),
                                  self.access)
            self.names.append("%s%d" % (self.name, i))

    def _check(self, slot: int) -> int:
        if not 0 <= int(slot) < self.slots:
            raise ValueError("aux slot %d: the aux buffers have %d slots" % (slot, self.slots))
        return int(slot)

    def load(self, slot: int) -> None:
        """Copy the engine's slot into the registered regions."""
        import torch

        slot = self._check(slot)
        for b, st in zip(self.buffers, self.stage):
            st[slot].copy_(b[slot].reshape(-1).view(torch.uint8))

    def store(self, slot: int) -> None:
        """Copy the registered regions' slot into the engine's tensors."""
        import torch

        slot = self._check(slot)
        for b, st in zip(self.buffers, self.stage):
            b[slot].reshape(-1).view(torch.uint8).copy_(st[slot])

    def ops(self, src: int, dst: int) -> List[Op]:
        """One op per buffer: slot ``src`` here to slot ``dst`` of the peer's regions of the same items."""
        return [Op(i, src * n, i, dst * n, n) for i, n in enumerate(self.items)]

    def close(self) -> None:
        names, self.names = self.names, []
        unregister_all(self.client, names)
        self.arena.close()


class StageKVManager:
    """One rank's KV pool registered with its sidecar, and the per-room state of its transfers.

    ``role`` is ``"prefill"`` (serves a rendezvous, ``bootstrap``, for the
    decodes' page tickets; default a :class:`~stage_client.rendezvous.RendezvousServer`
    on ``bootstrap_listen``) or ``"decode"`` (follows its sidecar's
    notifications). ``route`` leads to the other side's sidecar;
    ``peer_name`` is how the other side names this one's ("" : one-peer
    routes). ``secret`` signs the decode's tickets and is required of them
    by the prefill's rendezvous (needed to listen beyond loopback; see
    :mod:`stage_client.rendezvous`). ``aux_buffers``: SGLang's metadata
    buffers (``KVArgs.aux_data_ptrs`` as tensors), moved per request as
    :class:`AuxSlots` says; both sides must give them, of the same item sizes.
    """

    def __init__(self, client: Union[str, Client], name: str, k_buffers: Sequence[Any], v_buffers: Sequence[Any],
                 page_size: int, kv_heads: int, role: str, tp_rank: int = 0, tp_size: int = 1, route: str = "stage",
                 peer_name: str = "", bootstrap: Any = None, bootstrap_listen: str = "127.0.0.1:0",
                 timeout: float = 30.0, secret: Optional[bytes] = None,
                 aux_buffers: Optional[Sequence[Any]] = None) -> None:
        if role not in ("prefill", "decode"):
            raise ValueError("StageKVManager: role %r (prefill or decode)" % role)
        self.client = (Client(client, request_timeout=timeout, reconnect=True, reconnect_wait=min(2.0, timeout))
                       if isinstance(client, str) else client)  # a restarting sidecar: a short wait, not a failure
        self.role, self.rank, self.tp, self.heads = role, tp_rank, tp_size, kv_heads
        self.name, self.route, self.peer_name, self.timeout = name, route, peer_name, timeout
        self.page_size, self.secret = page_size, secret
        lo, hi = head_slice(kv_heads, tp_size, tp_rank)
        self.cache_name = "%s-tp%d" % (name, tp_rank)
        #: per layer [k_buffer, v_buffer], as registered
        self.buffers = [[k, v] for k, v in zip(k_buffers, v_buffers)]
        self._head_span = (lo, hi)
        self.kv = self._register_kv(self.client)
        self.aux: Optional[AuxSlots] = None
        if aux_buffers:
            access = Access.LOCAL_READ if role == "prefill" else Access.REMOTE_WRITE
            try:
                self.aux = AuxSlots(self.client, "%s-aux-tp%d-" % (name, tp_rank), aux_buffers, access)
            except BaseException:
                self.kv.close()
                raise
        self.mover = Mover(self.client, timeout, "stage-sglang-tp%d" % tp_rank)
        self.lock = threading.Lock()
        #: decode: the rooms arriving (their rows, aux slot and first error), by room; under ``lock``
        self.rooms = Receives(kv_heads, tp_size, tp_rank, self.kv.layers)
        #: decode: the grants of writes made for rooms and not revoked, made again after a sidecar restart
        self.grants = LiveGrants()
        self.bootstrap: Any = None
        self._sub: Any = None
        if role == "prefill":
            self.bootstrap = bootstrap
            if bootstrap is None:
                self.bootstrap = rdv.RendezvousServer(*rdv.parse_addr(bootstrap_listen), secret=secret,
                                                        insecure=rdv.insecure_env())
        else:
            self._sub = self.client.subscribe()
            self._reader = threading.Thread(target=self._read, name="stage-sglang-notes", daemon=True)
            self._reader.start()
        if hasattr(self.client, "on_reconnect"):
            self.client.on_reconnect(self._reconnected)
            self.client.on_disconnect(self._disconnected)

    def _register_kv(self, client: Client) -> Any:
        lo, hi = self._head_span
        return register_kv_cache(client, self.cache_name, self.buffers, "sglang", heads=self.heads, head_lo=lo,
                                 head_hi=hi, page_size=self.page_size, access=self.role)

    def _reconnected(self, client: Client) -> None:
        """The sidecar restarted and the client is back: register the pool (and aux regions) again, and make the
        live grants again (the new sidecar holds none)."""
        self.kv = self._register_kv(client)
        if self.aux is not None:
            self.aux.register(client)
        with self.lock:
            live = self.grants.live(time.monotonic())
        grant_again(client, self.cache_name, live, log)

    def grant_writes(self, pages: List[int]) -> bytes:
        """Decode: let the prefill's pushes naming the key returned write exactly ``pages`` of this rank's pool,
        for the timeout and 5 s more. The cache is guarded from then on: a push without a live grant is
        refused."""
        key = grant_key()
        ttl = min(self.timeout + 5.0, 3600.0)
        self.client.grant(self.cache_name, key, pages, ttl, write=True)
        with self.lock:
            self.grants.made(key, pages, True, ttl, 1, time.monotonic())
        return key

    def revoke(self, key: bytes) -> str:
        """Decode: end a room's grant; the sidecar answers once no push admitted under it can still write (it
        stops them), so SGLang may reuse the pages. Why it failed, else ""."""
        with self.lock:
            self.grants.ended(key)
        try:
            self.client.revoke_grant(self.cache_name, key)
        except (StageError, OSError, ValueError) as e:
            return str(e)
        return ""

    def _disconnected(self) -> None:
        """The sidecar closed the connection (it restarted): rooms still arriving keep waiting, to their
        deadline; the prefill's pushes cut short by the restart are pushed again (:mod:`stage_client.mover`)."""
        with self.lock:
            self.rooms.disconnected()

    def register_to_bootstrap(self) -> None:
        """SGLang's hook; the rendezvous is this manager's own, so nothing to register."""

    def expect(self, room: str, tokens: int, aux_slot: Optional[int] = None) -> None:
        with self.lock:
            r = self._room(room)
            r.tokens = r.cov.tokens = tokens
            if aux_slot is not None:
                r.aux = aux_slot

    def _room(self, room: str) -> Receive:
        """Room ``room``'s receive, made when a notification comes before SGLang asked for it (under the lock)."""
        return self.rooms.get(room) or self.rooms.add(Receive(room, room, 0, 0))

    def state(self, room: str) -> Optional[str]:
        """Decode: None while arriving, "" once complete (KV and aux), else the error."""
        with self.lock:
            r = self.rooms.get(room)
            if r is None:
                return None
            if r.error:
                return r.error
            if not r.cov.complete():
                return None
            return "" if r.aux is None or r.aux_landed else None

    def overdue(self, room: str) -> str:
        """Decode: why room ``room`` failed at its deadline."""
        with self.lock:
            r = self.rooms.get(room)
        return "not complete after %ss" % self.timeout if r is None else r.overdue(self.timeout)

    def forget(self, room: str) -> None:
        with self.lock:
            self.rooms.pop(room)

    def _read(self) -> None:
        while True:
            try:
                n = self._sub.get(1.0)
            except SidecarConnectionError:
                return
            t = None if n is None else parse_tag(n.tag)
            if t is not None and t.side == "a" and not n.kv:
                self._aux_note(t, n)
                continue
            if t is None or n.kv != self.cache_name or t.side != "p":
                continue
            with self.lock:
                self.rooms.file_note(self._room(t.key), t, n)

    def _aux_note(self, t: Tag, n: Any) -> None:
        """A prefill rank's aux push ended; its key is ``room@decode-rank``."""
        room, _, dst = t.key.rpartition("@")
        if dst != str(self.rank):
            return
        with self.lock:
            r = self.rooms.get(room)
            if n.code in RETRY_CODES:
                return  # cut short by a sidecar going away: the prefill pushes it again
            if n.code != Code.OK:
                r = r or self._room(room)
                r.error = r.error or "the aux push from prefill rank %d failed: %s" % (t.rank, n.message)
            elif r is not None and r.aux is not None:
                r.aux_landed = True

    def close(self) -> None:
        self.mover.close()
        if self._sub is not None:
            self._sub.close()
        if self.aux is not None:
            try:
                self.aux.close()
            except (StageError, OSError):
                pass
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
        self.keys: Dict[int, bytes] = {}  # decode rank -> the key its grant of writes names
        self.pages = 0
        self.sent = 0  # pages sent so far
        self.aux_index: Optional[int] = None
        self.error = ""
        self.t0 = time.monotonic()

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None) -> None:
        self.pages = int(num_kv_indices)
        self.aux_index = None if aux_index is None else int(aux_index)

    def _ticket(self) -> Optional[Dict[str, Any]]:
        """Decode rank 0's ticket once every decode rank this rank pushes to posted its own (each names the key
        of its grant); an older decode's one ticket under the room, without keys."""
        if self.ticket is None:
            boot, m = self.mgr.bootstrap, self.mgr
            t = boot.get("%s@0" % self.room)  # every prefill rank reads them; they expire
            per_rank = t is not None
            if t is None:
                t = boot.get(self.room)
            if t is None:
                return None
            try:
                ranks = [d for s, d, _, _ in plan(m.heads, m.tp, int(t["tp"])) if s == m.rank]
            except ValueError as e:
                self.error = "the decode's page ticket for room %s: %s" % (self.room, e)
                return None
            keys: Dict[int, bytes] = {}
            for d in ranks if per_rank else []:
                td = t if d == 0 else boot.get("%s@%d" % (self.room, d))
                if td is None:
                    return None  # that rank has not posted yet
                if td.get("grant"):
                    keys[d] = bytes.fromhex(td["grant"])
            self.ticket, self.keys = t, keys
        return self.ticket

    def send(self, kv_indices: Any, state_indices: Any = None, token_position_offset: int = 0) -> None:
        t = self._ticket()
        if t is None:
            self.error = "the decode's page ticket for room %s has not arrived" % self.room
            return
        ps = self.mgr.page_size
        local = [int(x) for x in (kv_indices.tolist() if hasattr(kv_indices, "tolist") else kv_indices)]
        first = self.sent * ps
        tokens = min(len(local) * ps, int(t["tokens"]) - first)
        self.sent += len(local)
        kw = {"peer": t["peer"]} if t.get("peer") else {}
        if tokens > 0:
            self._send_kv(t, local, first, tokens, kw)
        if self.sent >= self.pages and t.get("aux_index") is not None:
            self._send_aux(t, kw)

    def _send_kv(self, t: Dict[str, Any], local: List[int], first: int, tokens: int, kw: Dict[str, str]) -> None:
        m = self.mgr
        tag = make_tag(self.room, "p", m.rank, m.tp)
        for s, d, lo, hi in plan(m.heads, m.tp, int(t["tp"])):
            if s != m.rank:
                continue
            remote = "%s-tp%d" % (t["kv"], d)

            def fn(remote: str = remote, lo: int = lo, hi: int = hi, key: bytes = self.keys.get(d, b"")) -> List[int]:
                return [m.kv.push(m.route, remote, local, t["block_ids"], tokens, remote_first=first,
                                  heads=(lo, hi), tag=tag, key=key, **kw)]

            m.mover.submit(self.room, fn)

    def _send_aux(self, t: Dict[str, Any], kw: Dict[str, str]) -> None:
        """With the last chunk: this rank's aux slot to each decode rank it serves (decode rank d % prefill tp)."""
        m, aux = self.mgr, self.mgr.aux
        if aux is None or self.aux_index is None:
            self.error = "the decode wants aux bytes for room %s but this prefill has %s" % (
                self.room, "no aux_buffers" if aux is None else "no aux_index (init)")
            return
        if list(t.get("aux_items") or []) != aux.items:
            self.error = "aux buffers differ: the decode's items are %s B, this prefill's %s B" % (
                t.get("aux_items"), aux.items)
            return
        try:
            aux.load(self.aux_index)
            dst_slot = int(t["aux_index"])
        except (ValueError, TypeError) as e:
            self.error = "aux of room %s: %s" % (self.room, e)
            return
        for d in range(int(t["tp"])):
            if d % m.tp != m.rank:
                continue
            remote = ["%s-aux-tp%d-%d" % (t["kv"], d, i) for i in range(len(aux.items))]
            tag = make_tag("%s@%d" % (self.room, d), "a", m.rank, m.tp)

            def fn(remote: List[str] = remote, tag: str = tag) -> List[int]:
                return [m.client.push(m.route, aux.names, remote, aux.ops(self.aux_index, dst_slot), tag=tag, **kw)]

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
        self.key = b""  # the grant of writes the prefill's pushes name, until revoked
        self.posted = False
        self.error = ""
        self.deadline = 0.0
        self.aux_index: Optional[int] = None
        self.aux_stored = False

    def init(self, kv_indices: Any = None, aux_index: Optional[int] = None) -> None:
        """Newer SGLang passes a prefill dp rank (then send_metadata follows); older ones the pages."""
        if kv_indices is not None and not isinstance(kv_indices, int):
            self.send_metadata(kv_indices, aux_index)

    def send_metadata(self, kv_indices: Any, aux_index: Optional[int] = None, state_indices: Any = None,
                      decode_prefix_len: Optional[int] = None) -> None:
        self._send_metadata(kv_indices, aux_index)

    def _send_metadata(self, kv_indices: Any, aux_index: Optional[int], first: int = 0) -> None:
        """Post the ticket: ``kv_indices`` hold the request's tokens from ``first`` on (the decode has the rest)."""
        m = self.mgr
        pages = [int(x) for x in (kv_indices.tolist() if hasattr(kv_indices, "tolist") else kv_indices)]
        tokens = len(pages) * m.page_size
        ticket = {"peer": m.peer_name, "kv": m.name, "tp": m.tp, "block_ids": pages, "first": first, "tokens": tokens}
        if m.aux is not None and aux_index is not None:
            self.aux_index = int(aux_index)
            ticket.update(aux_index=self.aux_index, aux_items=m.aux.items)
        m.expect(self.room, tokens, self.aux_index)
        self.deadline = time.monotonic() + m.timeout
        try:
            self.key = m.grant_writes(pages)
        except (StageError, OSError, ValueError) as e:
            self.error = "granting the prefill's pushes into room %s: %s" % (self.room, e)
            return
        ticket["grant"] = self.key.hex()
        key = "%s@%d" % (self.room, m.rank)  # each rank's ticket names its own grant
        try:
            if isinstance(self.addr, str):
                rdv.post(self.addr, key, ticket, timeout=min(5.0, m.timeout), secret=m.secret)
            else:
                self.addr.post(key, ticket)
            self.posted = True
        except (OSError, ValueError) as e:
            self.error = "posting the page ticket to %s: %s" % (self.addr, e)
            self._end_grant()

    def _end_grant(self) -> None:
        """Revoke the room's grant (once): no push of the prefill's writes into these pages after this returns."""
        if self.key:
            key, self.key = self.key, b""
            why = self.mgr.revoke(key)
            if why:  # a sidecar that restarted holds no grant any more
                log.warning("stage: revoking the grant of room %s: %s", self.room, why)

    def poll(self) -> int:
        if self.error:
            return KVPoll.Failed
        if not self.posted:
            return KVPoll.WaitingForInput
        st = self.mgr.state(self.room)
        if st == "":
            if self.aux_index is not None and not self.aux_stored:
                self.mgr.aux.store(self.aux_index)  # type: ignore[union-attr]
                self.aux_stored = True
            self._end_grant()  # every row landed: nothing more may write these pages
            return KVPoll.Success
        if st or time.monotonic() > self.deadline:
            self.error = st or self.mgr.overdue(self.room)
            self._end_grant()  # SGLang frees the pages: a push still on its way must not land in them
            return KVPoll.Failed
        return KVPoll.Transferring

    def failure_exception(self) -> None:
        raise RuntimeError("stage KV receive of room %s failed: %s" % (self.room, self.error))

    def clear(self) -> None:
        self._end_grant()
        self.mgr.forget(self.room)

    def abort(self) -> None:
        self.error = self.error or "aborted"
        self._end_grant()
