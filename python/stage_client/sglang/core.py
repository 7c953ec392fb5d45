"""The backend's core: KVPoll and the manager, one rank's pool and the state of its rooms (see the package doc;
the sides of a request in :mod:`.sender` and :mod:`.receiver`, the aux bytes' ways in :mod:`.auxmeta`)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Union

from .. import rendezvous as rdv
from ..client import Client
from ..connector_core import LiveGrants, Receive, Receives
from ..engines import Mover, Tag, grant_again, head_slice, parse_tag
from ..errors import SidecarConnectionError, StageError
from ..kvcache import register_kv_cache
from ..kvclient import grant_key
from ..mover import RETRY_CODES
from ..protocol.tickets import TICKET_AUX, TicketItem
from ..protocol.wire import Access, Code
from . import auxmeta
from .auxmeta import AuxInbox, AuxSlots

__all__ = ["KVPoll", "AuxSlots", "StageKVManager"]

log = logging.getLogger(__name__)


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
    routes). ``secret`` signs the decode's tickets and is required of them
    by the prefill's rendezvous (needed to listen beyond loopback; see
    :mod:`stage_client.rendezvous`). ``aux_buffers``: SGLang's metadata
    buffers (``KVArgs.aux_data_ptrs`` as tensors), moved per request as
    :mod:`.auxmeta` says; both sides must give them, of the same item sizes.
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
        self.aux_buffers = list(aux_buffers or [])
        self.aux_items: List[int] = []
        self.aux_slots = 0
        self.aux: Optional[AuxSlots] = None  # regions: a prefill's for older decodes, or a decode on an old sidecar
        self.aux_inbox: Optional[AuxInbox] = None  # decode: where its aux tickets come
        self.aux_tickets = False  # this rank's sidecar carries aux tickets
        self._aux_data: Dict[str, bytes] = {}  # decode: the aux bytes come for rooms, until stored; under ``lock``
        if self.aux_buffers:
            self.aux_items, self.aux_slots = auxmeta.aux_items(self.aux_buffers)
            self.aux_tickets = auxmeta.takes_aux_tickets(self.client)
            if role == "prefill" or not self.aux_tickets:
                access = Access.LOCAL_READ if role == "prefill" else Access.REMOTE_WRITE
                try:
                    self.aux = AuxSlots(self.client, "%s-aux-tp%d-" % (name, tp_rank), self.aux_buffers, access)
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
            if self.aux_buffers and self.aux is None:
                self.aux_inbox = AuxInbox(self.client, auxmeta.inbox_name(self.cache_name), self._aux_ticket)
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
        if self.aux_inbox is not None:
            self.aux_inbox.reopen(client)
        with self.lock:
            live = self.grants.live(time.monotonic())
        grant_again(client, self.cache_name, live, log)

    def grant_writes(self, room: str, pages: List[int]) -> bytes:
        """Decode: let the prefill's pushes naming the key returned write exactly ``pages`` of this rank's pool,
        for the timeout and 5 s more; room ``room``'s aux ticket must name it too. The cache is guarded from
        then on: a push without a live grant is refused."""
        key = grant_key()
        ttl = min(self.timeout + 5.0, 3600.0)
        self.client.grant(self.cache_name, key, pages, ttl, write=True)
        with self.lock:
            self.grants.made(key, pages, True, ttl, 1, time.monotonic())
            r = self.rooms.get(room)
            if r is not None:
                r.key = key
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
                r.aux = auxmeta.check_slot(aux_slot, self.aux_slots)

    def _aux_ticket(self, it: TicketItem) -> None:
        """Decode: an aux ticket came (the inbox's thread): kept for its room, when it names the room's key."""
        room, _, dst = it.key.rpartition("@")
        why = ""
        try:
            key, data = auxmeta.parse_ticket(it.body)
        except ValueError as e:
            key, data, why = b"", b"", str(e)
        with self.lock:
            r = self.rooms.get(room)
            if it.kind != TICKET_AUX:
                why = "a ticket of kind %d in the aux inbox" % it.kind
            elif dst != str(self.rank) or r is None or r.aux is None:
                why = why or "no room %s expects aux bytes on decode rank %d" % (room, self.rank)
            elif not auxmeta.key_matches(key, r.key):
                why = why or "it does not name room %s's grant" % room
            elif len(data) != sum(self.aux_items):
                why = "%d B, the aux slot has %d" % (len(data), sum(self.aux_items))
                r.error = r.error or "the aux bytes from %s: %s" % (it.sender, why)
            else:
                self._aux_data[room] = data
                r.aux_landed = True
                return
        log.warning("stage: an aux ticket from %s for %s is refused: %s", it.sender, it.key, why)

    def store_aux(self, room: str, slot: int) -> None:
        """Decode: copy room ``room``'s aux bytes into SGLang's slot ``slot`` (once its KV landed)."""
        if self.aux is not None:
            self.aux.store(slot)
            return
        with self.lock:
            data = self._aux_data.pop(room, b"")
        auxmeta.store_slot(self.aux_buffers, self.aux_items, auxmeta.check_slot(slot, self.aux_slots), data)

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
            self._aux_data.pop(room, None)

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
        if self.aux_inbox is not None:
            self.aux_inbox.close()
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
