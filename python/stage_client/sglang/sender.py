"""The prefill side of one SGLang request over stage: push each chunk's pages into the decode's, then the aux bytes
(:mod:`.auxmeta`)."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

from ..engines import make_tag, plan
from ..protocol.tickets import TICKET_AUX
from . import auxmeta
from .core import KVPoll, StageKVManager

__all__ = ["StageKVSender"]


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
        """With the last chunk: this rank's aux slot to each decode rank it serves (decode rank d % prefill tp): as
        a ticket naming the rank's grant, or into its regions (a decode whose sidecar predates aux tickets)."""
        m = self.mgr
        if not m.aux_buffers or self.aux_index is None:
            self.error = "the decode wants aux bytes for room %s but this prefill has %s" % (
                self.room, "no aux_buffers" if not m.aux_buffers else "no aux_index (init)")
            return
        if list(t.get("aux_items") or []) != m.aux_items:
            self.error = "aux buffers differ: the decode's items are %s B, this prefill's %s B" % (
                t.get("aux_items"), m.aux_items)
            return
        by_ticket = bool(t.get("aux_tickets"))  # else into the decode's regions (its sidecar predates tickets)
        if by_ticket and not m.aux_tickets:
            self.error = ("the decode takes aux bytes as tickets (kind 3), which this prefill's sidecar predates: "
                          "upgrade its staged")
            return
        try:
            slot, dst_slot = auxmeta.check_slot(self.aux_index, m.aux_slots), int(t["aux_index"])
            data = auxmeta.slot_bytes(m.aux_buffers, slot) if by_ticket else b""
            if not by_ticket and m.aux is not None:
                m.aux.load(slot)
        except (ValueError, TypeError) as e:
            self.error = "aux of room %s: %s" % (self.room, e)
            return
        for d in range(int(t["tp"])):
            if d % m.tp != m.rank:
                continue
            if by_ticket:
                try:
                    body = auxmeta.ticket_body(self.keys.get(d, b""), data)
                except ValueError as e:
                    self.error = "aux of room %s for decode rank %d: %s" % (self.room, d, e)
                    return
                inbox, key = auxmeta.inbox_name("%s-tp%d" % (t["kv"], d)), "%s@%d" % (self.room, d)

                def post(inbox: str = inbox, key: str = key, body: bytes = body) -> List[int]:
                    m.client.post_ticket(m.route, key, body, peer=kw.get("peer", ""), to=inbox, kind=TICKET_AUX,
                                         timeout=min(5.0, m.timeout) + 1.0)
                    return []

                m.mover.submit(self.room, post)
                continue
            aux = m.aux
            assert aux is not None  # a prefill always has its regions
            remote = ["%s-aux-tp%d-%d" % (t["kv"], d, i) for i in range(len(aux.items))]
            tag = make_tag("%s@%d" % (self.room, d), "a", m.rank, m.tp)

            def fn(remote: List[str] = remote, tag: str = tag) -> List[int]:
                return [m.client.push(m.route, aux.names, remote, aux.ops(slot, dst_slot), tag=tag, **kw)]

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
