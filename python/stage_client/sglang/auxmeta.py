"""SGLang's aux (metadata) bytes of a request, from the prefill's slot to the decode's.

SGLang moves, with each request's KV, a slot of its metadata buffers (the
first output token, logprobs, hidden states: ``KVArgs.aux_data_ptrs``, one
slot per request at ``aux_index``). Two ways, chosen by the decode:

* **As a ticket** (PROTOCOL.md 9.19, kind ``TICKET_AUX``), where the
  decode's sidecar carries that kind: each decode rank opens an inbox
  (:class:`AuxInbox`, named :func:`inbox_name`) and the prefill posts the
  slot's bytes there, led by the room's grant key (:func:`ticket_body`).
  The decode keeps them only for a room it expects, under that key (a
  peer that was not handed the key cannot write a room's metadata), and
  copies them into its slot once the room's KV landed
  (:func:`store_slot`). No memory of the decode is writable by peers for
  this.
* **Into regions** (:class:`AuxSlots`), for a decode whose sidecar
  predates aux tickets: a small HostArena registered with the sidecar,
  writable by the route's peers without a grant. The prefill registers
  its own (read only by itself) for such decodes.
"""

from __future__ import annotations

import hmac
import logging
import threading
from typing import Any, Callable, List, Sequence, Tuple

from ..client import Client, Op
from ..errors import SidecarConnectionError, StageError
from ..kvcache import HostArena, unregister_all
from ..protocol.tickets import MAX_TICKET_BODY, TICKET_AUX, TicketItem
from ..protocol.wire import QueryKind

__all__ = ["AuxSlots", "AuxInbox", "aux_items", "inbox_name", "takes_aux_tickets", "ticket_body", "parse_ticket",
           "slot_bytes", "store_slot", "MAX_AUX_KEY"]

log = logging.getLogger(__name__)

#: the longest grant key an aux ticket leads with (PROTOCOL.md MaxGrantKey)
MAX_AUX_KEY = 64


def aux_items(buffers: Sequence[Any]) -> Tuple[List[int], int]:
    """Each buffer's bytes per slot, and the slots all of them have; ValueError for a buffer that is not a
    contiguous tensor of (slots, ...)."""
    items: List[int] = []
    slots = -1
    for i, b in enumerate(buffers):
        if not b.is_contiguous() or b.dim() < 1 or b.shape[0] < 1:
            raise ValueError("aux buffer %d: want a contiguous tensor of (slots, ...), got %s" % (i, tuple(b.shape)))
        items.append(b[0].numel() * b.element_size())
        slots = b.shape[0] if slots < 0 else min(slots, b.shape[0])
    return items, slots


def check_slot(slot: int, slots: int) -> int:
    if not 0 <= int(slot) < slots:
        raise ValueError("aux slot %d: the aux buffers have %d slots" % (slot, slots))
    return int(slot)


def inbox_name(cache: str) -> str:
    """The aux inbox of the decode rank whose KV cache is named ``cache``."""
    return cache + "-aux"


def takes_aux_tickets(client: Any) -> bool:
    """Whether ``client``'s sidecar carries aux tickets (its features list kind 3); one that predates them
    would close the peers' session on one."""
    try:
        f = client.query(QueryKind.FEATURES)
    except (StageError, OSError):  # a sidecar that predates features
        return False
    return isinstance(f, dict) and TICKET_AUX in (f.get("ticket_kinds") or [])


def slot_bytes(buffers: Sequence[Any], slot: int) -> bytes:
    """Slot ``slot`` of every buffer, concatenated (copied off the device where they live)."""
    import torch

    return b"".join(b[slot].reshape(-1).view(torch.uint8).cpu().numpy().tobytes() for b in buffers)


def store_slot(buffers: Sequence[Any], items: Sequence[int], slot: int, data: bytes) -> None:
    """Copy ``data`` (:func:`slot_bytes` of the prefill's) into slot ``slot`` of every buffer."""
    import torch

    off = 0
    for b, n in zip(buffers, items):
        b[slot].reshape(-1).view(torch.uint8).copy_(torch.frombuffer(bytearray(data[off:off + n]), dtype=torch.uint8))
        off += n


def ticket_body(key: bytes, data: bytes) -> bytes:
    """An aux ticket's body: the grant key's length (one byte), the key, the slot's bytes; ValueError when it
    does not fit a ticket."""
    if not 0 < len(key) <= MAX_AUX_KEY:
        raise ValueError("an aux ticket needs the room's grant key (1 to %d bytes), got %d" % (MAX_AUX_KEY, len(key)))
    body = bytes([len(key)]) + key + data
    if len(body) > MAX_TICKET_BODY:
        raise ValueError("aux bytes of %d B per request do not fit a ticket (%d B)" % (len(data), MAX_TICKET_BODY))
    return body


def parse_ticket(body: bytes) -> Tuple[bytes, bytes]:
    """The key and the slot's bytes of an aux ticket's body; ValueError when malformed."""
    if not body or not 0 < body[0] <= MAX_AUX_KEY or len(body) < 1 + body[0]:
        raise ValueError("a malformed aux ticket (%d bytes)" % len(body))
    n = body[0]
    return body[1:1 + n], body[1 + n:]


def key_matches(got: bytes, want: bytes) -> bool:
    """Whether an aux ticket's key is the room's (in constant time)."""
    return bool(want) and hmac.compare_digest(got, want)


class AuxInbox:
    """A decode rank's inbox for aux tickets on ``client``, taken by a thread of its own that hands each ticket
    to ``on_ticket``. :meth:`reopen` after the client reconnected (the new sidecar holds no inbox)."""

    def __init__(self, client: Client, name: str, on_ticket: Callable[[TicketItem], None]) -> None:
        self.client, self.name, self.on_ticket = client, name, on_ticket
        self._stop = threading.Event()
        client.open_inbox(name)
        self._thread = threading.Thread(target=self._run, name="stage-sglang-aux", daemon=True)
        self._thread.start()

    def reopen(self, client: Client) -> None:
        client.open_inbox(self.name)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                items = self.client.take_tickets(wait=0.5)
            except SidecarConnectionError as e:
                if not getattr(self.client, "restores", False):
                    return  # closed
                log.debug("stage: aux tickets of %s: %s; waiting for the sidecar", self.name, e)
                self._stop.wait(0.05)
                continue
            except (StageError, OSError) as e:
                log.warning("stage: taking aux tickets of %s: %s", self.name, e)
                self._stop.wait(0.5)
                continue
            for it in items:
                self.on_ticket(it)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


class AuxSlots:
    """SGLang's aux buffers staged through a HostArena registered with the sidecar (see the module doc).

    ``buffers`` are the engine's tensors, each ``(slots, ...)``, contiguous,
    on the CPU or a GPU; slot ``i`` of buffer ``b`` is ``items[b]`` bytes.
    Each buffer gets a region ``<name><b>`` of the same shape in bytes.
    :meth:`load` copies a slot from the engine's tensors into the regions
    (before a push), :meth:`store` back (after a push landed).
    """

    def __init__(self, client: Client, name: str, buffers: Sequence[Any], access: int) -> None:
        import torch

        self.client, self.buffers, self.name, self.access = client, list(buffers), name, access
        self.items, self.slots = aux_items(self.buffers)
        size = sum(-(-b.shape[0] * n // 4096) * 4096 for b, n in zip(self.buffers, self.items))
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

    def load(self, slot: int) -> None:
        """Copy the engine's slot into the registered regions."""
        import torch

        slot = check_slot(slot, self.slots)
        for b, st in zip(self.buffers, self.stage):
            st[slot].copy_(b[slot].reshape(-1).view(torch.uint8))

    def store(self, slot: int) -> None:
        """Copy the registered regions' slot into the engine's tensors."""
        import torch

        slot = check_slot(slot, self.slots)
        for b, st in zip(self.buffers, self.stage):
            b[slot].reshape(-1).view(torch.uint8).copy_(st[slot])

    def ops(self, src: int, dst: int) -> List[Op]:
        """One op per buffer: slot ``src`` here to slot ``dst`` of the peer's regions of the same items."""
        return [Op(i, src * n, i, dst * n, n) for i, n in enumerate(self.items)]

    def close(self) -> None:
        names, self.names = self.names, []
        unregister_all(self.client, names)
        self.arena.close()
