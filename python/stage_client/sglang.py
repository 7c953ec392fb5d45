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

SGLang also moves each request's *aux* bytes (its metadata buffers: the
first output token, logprobs, hidden states; ``KVArgs.aux_data_ptrs``,
one slot per request at ``aux_index``) after the last chunk, and the
decode cannot start without them. Given ``aux_buffers`` (those tensors),
a manager stages them through a small HostArena registered with its
sidecar (:class:`AuxSlots`): the prefill copies its slot there and pushes
it with the last chunk, each decode rank from one prefill rank; the
decode reports Success once the KV and the aux bytes landed, and copies
them into its own slot first.
"""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import rendezvous as rdv
from .client import Client
from .engines import Coverage, Mover, head_slice, make_tag, parse_tag, plan
from .errors import SidecarConnectionError, StageError
from .client import Op
from .kvcache import HostArena, register_kv_cache, unregister_all
from .wire import Access, Code

__all__ = ["KVPoll", "AuxSlots", "StageKVManager", "StageKVSender", "StageKVReceiver", "BACKEND",
           "SGLangKVManager", "SGLangKVSender", "SGLangKVReceiver", "SGLangBootstrapServer", "sglang_plugin"]


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

        self.client, self.buffers = client, list(buffers)
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
            for i, st in enumerate(self.stage):
                off = self.arena.offset_of(st.data_ptr(), st.numel())
                client.register_memfd("%s%d" % (name, i), self.arena.fd, self.arena.size, off, st.numel(), access)
                self.names.append("%s%d" % (name, i))
        except BaseException:
            self.close()
            raise

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
        self.client = Client(client, request_timeout=timeout) if isinstance(client, str) else client
        self.role, self.rank, self.tp, self.heads = role, tp_rank, tp_size, kv_heads
        self.name, self.route, self.peer_name, self.timeout = name, route, peer_name, timeout
        self.page_size, self.secret = page_size, secret
        lo, hi = head_slice(kv_heads, tp_size, tp_rank)
        self.cache_name = "%s-tp%d" % (name, tp_rank)
        #: per layer [k_buffer, v_buffer], as registered
        self.buffers = [[k, v] for k, v in zip(k_buffers, v_buffers)]
        self.kv = register_kv_cache(self.client, self.cache_name, self.buffers, "sglang", heads=kv_heads,
                                    head_lo=lo, head_hi=hi, page_size=page_size, access=role)
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
        self._aux_want: Dict[str, int] = {}  # decode: rooms waiting for aux bytes, with their slot
        self._aux_landed: set = set()
        self.bootstrap: Any = None
        self._rooms: Dict[str, Coverage] = {}
        self._errors: Dict[str, str] = {}
        self._sub: Any = None
        if role == "prefill":
            self.bootstrap = bootstrap
            if bootstrap is None:
                self.bootstrap = rdv.RendezvousServer(*rdv.parse_addr(bootstrap_listen), secret=secret)
        else:
            self._sub = self.client.subscribe()
            self._reader = threading.Thread(target=self._read, name="stage-sglang-notes", daemon=True)
            self._reader.start()

    def register_to_bootstrap(self) -> None:
        """SGLang's hook; the rendezvous is this manager's own, so nothing to register."""

    def expect(self, room: str, tokens: int, aux_slot: Optional[int] = None) -> None:
        with self.lock:
            self._rooms.setdefault(room, Coverage(0, tokens)).tokens = tokens
            if aux_slot is not None:
                self._aux_want[room] = aux_slot

    def state(self, room: str) -> Optional[str]:
        """Decode: None while arriving, "" once complete (KV and aux), else the error."""
        with self.lock:
            if room in self._errors:
                return self._errors[room]
            cov = self._rooms.get(room)
            if cov is None or not cov.complete():
                return None
            return "" if room not in self._aux_want or room in self._aux_landed else None

    def forget(self, room: str) -> None:
        with self.lock:
            self._rooms.pop(room, None)
            self._errors.pop(room, None)
            self._aux_want.pop(room, None)
            self._aux_landed.discard(room)

    def _read(self) -> None:
        while True:
            try:
                n = self._sub.get(1.0)
            except SidecarConnectionError:
                return
            t = None if n is None else parse_tag(n.tag)
            if t is not None and t[1] == "a" and not n.kv:
                self._aux_note(t, n)
                continue
            if t is None or n.kv != self.cache_name or t[1] != "p":
                continue
            room, _, src, src_tp = t
            with self.lock:
                if n.code != Code.OK:
                    self._errors.setdefault(room, "a push from prefill rank %d failed: %s" % (src, n.message))
                    continue
                cov = self._rooms.setdefault(room, Coverage(0, 0))
                if cov.expect is None:
                    try:
                        srcs = {s for s, d, _, _ in plan(self.heads, src_tp, self.tp) if d == self.rank}
                    except ValueError as e:  # the tag names a split of the heads this side cannot make
                        self._errors.setdefault(room, "a push from prefill rank %d of %d: %s" % (src, src_tp, e))
                        continue
                    cov.expect = {(s, layer) for s in srcs for layer in range(self.kv.layers)}
                for layer in n.layers:
                    cov.add(src, int(layer), n.first, n.first + n.tokens)

    def _aux_note(self, t: Any, n: Any) -> None:
        """A prefill rank's aux push ended; its key is ``room@decode-rank``."""
        room, _, dst = t[0].rpartition("@")
        if dst != str(self.rank):
            return
        with self.lock:
            if n.code != Code.OK:
                self._errors.setdefault(room, "the aux push from prefill rank %d failed: %s" % (t[2], n.message))
            elif room in self._aux_want:
                self._aux_landed.add(room)

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
        self.pages = 0
        self.sent = 0  # pages sent so far
        self.aux_index: Optional[int] = None
        self.error = ""
        self.t0 = time.monotonic()

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None) -> None:
        self.pages = int(num_kv_indices)
        self.aux_index = None if aux_index is None else int(aux_index)

    def _ticket(self) -> Optional[Dict[str, Any]]:
        if self.ticket is None:
            t = self.mgr.bootstrap.get(self.room)  # every rank reads it; it expires
            if t is not None:
                try:
                    plan(self.mgr.heads, self.mgr.tp, int(t["tp"]))
                except ValueError as e:
                    self.error = "the decode's page ticket for room %s: %s" % (self.room, e)
                    return None
            self.ticket = t
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

            def fn(remote: str = remote, lo: int = lo, hi: int = hi) -> List[int]:
                return [m.kv.push(m.route, remote, local, t["block_ids"], tokens, remote_first=first,
                                  heads=(lo, hi), tag=tag, **kw)]

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
            if isinstance(self.addr, str):
                rdv.post(self.addr, self.room, ticket, timeout=min(5.0, m.timeout), secret=m.secret)
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
            if self.aux_index is not None and not self.aux_stored:
                self.mgr.aux.store(self.aux_index)  # type: ignore[union-attr]
                self.aux_stored = True
            return KVPoll.Success
        if st or time.monotonic() > self.deadline:
            self.error = st or "not complete after %ss" % self.mgr.timeout
            return KVPoll.Failed
        return KVPoll.Transferring

    def failure_exception(self) -> None:
        raise RuntimeError("stage KV receive of room %s failed: %s" % (self.room, self.error))

    def clear(self) -> None:
        self.mgr.forget(self.room)

    def abort(self) -> None:
        self.error = self.error or "aborted"


# ---------------------------------------------------------------------------
# SGLang's own interfaces (sglang/srt/disaggregation/base/conn.py), as SGLang
# builds and calls them. The classes below take what SGLang gives a transfer
# backend (its KVArgs, DisaggregationMode, ServerArgs, is_mla_backend) and
# :func:`sglang_plugin` (entry point group ``sglang.srt.plugins``) makes
# ``--disaggregation-transfer-backend stage`` resolve to them. Nothing here
# imports sglang until SGLang itself calls in.
#
# Settings SGLang has no flag for come from the environment of each SGLang
# process: STAGE_SOCKET (this host's sidecar control socket), STAGE_ROUTE (the
# route to the other side's sidecar, default "stage"), STAGE_PEER_NAME (how the
# prefill's sidecar names the decode's; "" for one-peer routes), STAGE_KV_NAME
# (this side's KV cache name, default sglang-<mode>), STAGE_TIMEOUT (seconds,
# default 30), STAGE_RENDEZVOUS_SECRET / STAGE_RENDEZVOUS_SECRET_FILE (needed
# when the prefill's bootstrap host is not a loopback address).
#
# Bootstrap: each prefill attention-TP rank serves the decodes' page tickets
# itself (a RendezvousServer in its scheduler process) on
# ``--disaggregation-bootstrap-port`` + rank; rank 0 forwards every ticket to
# the others. The decode posts its ticket to the address SGLang gives it
# (the prefill's host and bootstrap port). SGLang's bootstrap-server slot is
# therefore only a placeholder (:class:`SGLangBootstrapServer`).

#: the name SGLang is given: ``--disaggregation-transfer-backend stage``
BACKEND = "stage"


def _env_secret() -> Optional[bytes]:
    return rdv.load_secret(os.environ.get("STAGE_RENDEZVOUS_SECRET", ""),
                           os.environ.get("STAGE_RENDEZVOUS_SECRET_FILE", ""))


def _byte_view(ptr: int, nbytes: int, device: str) -> Any:
    """A uint8 tensor over ``nbytes`` at ``ptr`` (engine memory, not copied)."""
    import torch

    if ptr <= 0 or nbytes <= 0:
        raise ValueError("KVArgs buffer at 0x%x of %d bytes" % (ptr, nbytes))
    if device.startswith("cuda"):
        class _Mem:  # __cuda_array_interface__: torch wraps the device pointer in place
            __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                        "version": 3, "strides": None}
        return torch.as_tensor(_Mem(), device=device)
    if device != "cpu":
        raise ValueError("stage's SGLang backend: KV on %r; cpu and cuda are supported" % device)
    import ctypes

    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), dtype=torch.uint8)


def _kv_tensors(args: Any, device: str) -> Tuple[List[Any], List[Any]]:
    """Per layer (rows, heads, head_bytes) int8 views of SGLang's MHA token pool from KVArgs.

    SGLang lists the K buffers of every layer, then the V buffers
    (``MHATokenToKVPool.get_contiguous_buf_infos``); an item is one page:
    ``page_size * kv_head_num * head_dim * element size`` bytes.
    """
    import torch

    ptrs, lens, items = list(args.kv_data_ptrs), list(args.kv_data_lens), list(args.kv_item_lens)
    if not ptrs or len(ptrs) % 2 or not len(ptrs) == len(lens) == len(items):
        raise ValueError("KVArgs: %d kv_data_ptrs, %d lens, %d item lens; want K then V buffers of each layer"
                         % (len(ptrs), len(lens), len(items)))
    heads, page = int(args.kv_head_num), int(args.page_size)
    out = []
    for i, (p, n, item) in enumerate(zip(ptrs, lens, items)):
        if heads < 1 or page < 1 or item % (page * heads) or n % (item // page):
            raise ValueError("KVArgs buffer %d: %d bytes, item %d bytes do not split into pages of %d tokens x %d heads"
                             % (i, n, item, page, heads))
        hb = item // (page * heads)
        # int8: bytes as a kv layout dtype of size 1 (both sides view them alike; nothing is converted)
        out.append(_byte_view(int(p), int(n), device).view(torch.int8).view(n // (heads * hb), heads, hb))
    half = len(out) // 2
    return out[:half], out[half:]


def _aux_tensors(args: Any) -> List[Any]:
    """SGLang's metadata buffers (MetadataBuffers.get_buf_infos; host memory) as (slots, item) uint8 views."""
    out = []
    for p, n, item in zip(args.aux_data_ptrs or [], args.aux_data_lens or [], args.aux_item_lens or []):
        if item <= 0 or n % item:
            raise ValueError("KVArgs aux buffer of %d bytes, item %d bytes" % (n, item))
        out.append(_byte_view(int(p), int(n), "cpu").view(n // item, item))
    return out


class _ForwardingRendezvous(rdv.RendezvousServer):
    """Prefill rank 0's rendezvous: keeps each ticket and hands it to the other ranks' rendezvous too."""

    forward: List[str] = []

    def post(self, key: str, ticket: Dict[str, Any]) -> None:
        super().post(key, ticket)
        for addr in self.forward:
            try:
                rdv.post(addr, key, ticket, timeout=5.0, secret=self.secret)
            except OSError as e:  # answered to the decode as "error ...", never raised in the server
                raise ValueError("forwarding the ticket to prefill rank at %s: %s" % (addr, e)) from None


def _mode(m: Any) -> str:
    return str(getattr(m, "value", m))


class SGLangKVManager(StageKVManager):
    """SGLang's ``KVManager`` slot: ``(kv_args, disaggregation_mode, server_args, is_mla_backend)``.

    Supports SGLang's MHA token pool (per layer K and V buffers, on the CPU
    in a HostArena or on CUDA), aux metadata buffers, any prefill and
    decode tensor-parallel sizes, one prefill data-parallel rank. Refuses,
    with the reason, what it cannot move: MLA pools, extra state (Mamba,
    SWA, DSA...), speculative draft KV, host destinations.
    """

    supports_host_destination = False
    supports_role_switch = False
    supports_deferred_decode_kv_release = False
    enable_deferred_decode_kv_release = False

    def __init__(self, args: Any, disaggregation_mode: Any, server_args: Any,
                 is_mla_backend: Optional[bool] = False, **_: Any) -> None:
        mode = _mode(disaggregation_mode)
        if mode not in ("prefill", "decode"):
            raise ValueError("stage's SGLang backend: disaggregation mode %r (prefill or decode)" % mode)
        what = ("an MLA KV pool" if is_mla_backend else
                "extra state buffers (%s)" % [_mode(t) for t in args.state_types] if getattr(args, "state_types", None) else
                "speculative draft KV" if getattr(args, "num_draft_entries", 0) else "")
        if what:
            raise NotImplementedError("stage's SGLang backend moves SGLang's MHA token pool only; this model has %s. "
                                      "Use another --disaggregation-transfer-backend for it" % what)
        sa = server_args
        device = str(getattr(sa, "device", None) or "cpu")
        if device.startswith("cuda") and ":" not in device:
            device = "cuda:%d" % int(getattr(args, "gpu_id", 0) or 0)
        ks, vs = _kv_tensors(args, device)
        tp = int(getattr(sa, "tp_size", 1) or 1)
        if getattr(sa, "enable_dp_attention", False):
            tp //= max(1, int(getattr(sa, "dp_size", 1) or 1))
        rank = int(args.engine_rank) % tp
        role, secret = mode, _env_secret()
        timeout = float(os.environ.get("STAGE_TIMEOUT", "30"))
        boot = None
        if role == "prefill":
            host = str(getattr(sa, "host", None) or "127.0.0.1")
            port = int(getattr(sa, "disaggregation_bootstrap_port", 8998))
            boot = _ForwardingRendezvous(host, port + rank, secret=secret)
            if rank == 0:
                near = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
                boot.forward = ["%s:%d" % (near, port + r) for r in range(1, tp)]
        self.kv_args, self.server_args, self.is_mla_backend = args, server_args, bool(is_mla_backend)
        self.disaggregation_mode = disaggregation_mode
        #: decode: prefill bootstrap address -> its parallel info, as SGLang's decode queue reads it
        self.prefill_info_table: Dict[str, Any] = {}
        try:
            super().__init__(os.environ.get("STAGE_SOCKET", "/run/stage/stage.sock"),
                             os.environ.get("STAGE_KV_NAME", "sglang-" + role), ks, vs, int(args.page_size),
                             int(args.total_kv_head_num or args.kv_head_num), role, tp_rank=rank, tp_size=tp,
                             route=os.environ.get("STAGE_ROUTE", "stage"),
                             peer_name=os.environ.get("STAGE_PEER_NAME", ""), bootstrap=boot, timeout=timeout,
                             secret=secret, aux_buffers=_aux_tensors(args) or None)
        except BaseException:
            if boot is not None:
                boot.close()
            raise

    def try_ensure_parallel_info(self, bootstrap_addr: str) -> bool:
        """Decode: the prefill's parallel info. Its ranks read the ticket themselves; one dp rank."""
        self.prefill_info_table.setdefault(bootstrap_addr, SimpleNamespace(dp_size=1, follow_bootstrap_room=True))
        return True

    def should_verify_kv_checksum(self, bootstrap_addr: str) -> bool:
        return True

    def teardown(self) -> None:
        raise NotImplementedError("stage's SGLang backend does not support PD role switch (supports_role_switch "
                                  "is False): restart the server in its new role")


class SGLangKVSender(StageKVSender):
    """SGLang's ``KVSender`` slot: ``(mgr, bootstrap_addr, bootstrap_room, req_has_disagg_prefill_dp_rank)``."""

    def __init__(self, mgr: SGLangKVManager, bootstrap_addr: str, bootstrap_room: int,
                 req_has_disagg_prefill_dp_rank: bool = False, **_: Any) -> None:
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        self.kv_mgr = mgr
        self.bytes = 0
        self.t_send: Optional[float] = None
        self.t_done: Optional[float] = None

    def pop_decode_prefix_len(self) -> int:
        """Tokens the decode already holds (its ticket's ``first``): SGLang sends only the rest."""
        t = self._ticket()
        return 0 if t is None else int(t["first"])

    def mark_prefill_complete(self) -> None:
        raise NotImplementedError("stage's SGLang backend supports --disaggregation-decode-allocation-policy early "
                                  "only (the decode allocates first and the prefill pushes into its pages)")

    def get_max_transfer_tokens(self) -> Optional[int]:
        return None

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        # the last chunk carries the aux bytes even when it brings no new page
        return num_pages > 0 or last_chunk

    def send(self, kv_indices: Any, state_indices: Optional[List] = None, num_kv_tokens: Optional[int] = None,
             **_: Any) -> None:
        if state_indices and any(x is not None for x in state_indices):
            self.error = "state indices for room %s: stage moves no extra state" % self.room
            return
        if self.t_send is None:
            self.t_send = time.monotonic()
        n = len(kv_indices)
        super().send(kv_indices)
        self.bytes += n * self.mgr.page_size * sum(int(b[0].numel() * b.element_size()) for layer in self.mgr.buffers
                                                   for b in layer)

    def poll(self) -> int:
        st = super().poll()
        if st == KVPoll.Success and self.t_done is None:
            self.t_done = time.monotonic()
        return st

    def get_transfer_metric(self) -> Any:
        from sglang.srt.disaggregation.base.conn import KVTransferMetric

        lat = None if self.t_send is None or self.t_done is None else self.t_done - self.t_send
        return KVTransferMetric(transfer_latency_s=lat, transfer_total_bytes=self.bytes or None)


class SGLangKVReceiver(StageKVReceiver):
    """SGLang's ``KVReceiver`` slot: ``(mgr, bootstrap_addr, bootstrap_room)``; ``init(prefill_dp_rank)``
    then ``send_metadata``."""

    require_staging = False

    def __init__(self, mgr: SGLangKVManager, bootstrap_addr: str, bootstrap_room: Optional[int] = None,
                 **_: Any) -> None:
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        self.kv_mgr = mgr
        self.conclude_state: Optional[int] = None
        self.abort_notified = False
        self.bootstrap_infos: List[Any] = []

    @property
    def supports_host_destination(self) -> bool:
        return False

    def is_abort_release_safe(self) -> bool:
        raise NotImplementedError("stage's SGLang backend receives into the device pool only (no host "
                                  "destinations, so no host drain to track)")

    def init(self, prefill_dp_rank: int) -> None:  # type: ignore[override]
        if int(prefill_dp_rank) != 0:
            self.error = "prefill dp rank %s: stage's SGLang backend serves one prefill dp rank" % prefill_dp_rank
            self.conclude_state = KVPoll.Failed

    def send_metadata(self, kv_indices: Any, aux_index: Optional[int] = None, state_indices: Optional[List] = None,
                      decode_prefix_len: Optional[int] = None, destination: Any = "device", **_: Any) -> None:
        prefix = int(decode_prefix_len or 0)
        if _mode(destination) != "device":
            self.error = "destination %s: stage's SGLang backend receives into the device pool only" % _mode(destination)
        elif state_indices and any(x is not None for x in state_indices):
            self.error = "state indices for room %s: stage moves no extra state" % self.room
        elif prefix % self.mgr.page_size:
            self.error = "decode_prefix_len %d is not a multiple of the page size %d" % (prefix, self.mgr.page_size)
        elif len(kv_indices) == 0:
            self.error = "room %s: no pages to receive into" % self.room
        if self.error:
            self.conclude_state = KVPoll.Failed
            return
        self._send_metadata(kv_indices, aux_index, first=prefix)

    def poll(self) -> int:
        st = super().poll()
        if st in (KVPoll.Success, KVPoll.Failed):
            self.conclude_state = st
        return st


class SGLangBootstrapServer:
    """SGLang's bootstrap-server slot, ``(host, port)``: a placeholder.

    The prefill ranks serve the tickets themselves on ``port`` + rank (see
    above), so this binds nothing and SGLang's main process leaves the port free.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, int(port)

    def close(self) -> None:
        pass


def sglang_classes() -> Dict[str, Any]:
    """SGLang's KVClassType values -> this module's classes (KVArgs stays SGLang's)."""
    return {"manager": SGLangKVManager, "sender": SGLangKVSender, "receiver": SGLangKVReceiver,
            "bootstrap_server": SGLangBootstrapServer}


def _get_kv_class(original: Any, transfer_backend: Any, class_type: Any) -> Any:
    """AROUND hook on sglang.srt.disaggregation.utils.get_kv_class."""
    if _mode(transfer_backend) != BACKEND or _mode(class_type) == "kvargs":
        return original(transfer_backend, class_type)
    return sglang_classes().get(_mode(class_type))


def _stage_member(enum_cls: Any) -> Any:
    """``TransferBackend("stage")``: a member added to SGLang's enum (it has no API for it)."""
    m = enum_cls._value2member_map_.get(BACKEND)
    if m is None:
        m = object.__new__(enum_cls)
        m._name_, m._value_ = "STAGE", BACKEND
        type.__setattr__(enum_cls, "STAGE", m)
        enum_cls._member_map_["STAGE"] = m
        enum_cls._value2member_map_[BACKEND] = m
    return m


def sglang_plugin() -> None:
    """Entry point ``stage`` of group ``sglang.srt.plugins``: run by SGLang's ``load_plugins()`` in every
    process, before its arguments are parsed. Adds ``stage`` to the transfer backend choices and to the
    TransferBackend enum, and hooks get_kv_class (SGLang's HookRegistry applies it)."""
    from sglang.srt.arg_groups.choices import DISAGG_TRANSFER_BACKEND_CHOICES, add_disagg_transfer_backend_choices
    from sglang.srt.disaggregation.utils import TransferBackend
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if BACKEND not in DISAGG_TRANSFER_BACKEND_CHOICES:
        add_disagg_transfer_backend_choices([BACKEND])
    _stage_member(TransferBackend)
    HookRegistry.register("sglang.srt.disaggregation.utils.get_kv_class", _get_kv_class, HookType.AROUND)
