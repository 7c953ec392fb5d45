"""The decode side of one SGLang request over stage: grant and post its pages, then wait for the rows and the aux
bytes (:mod:`.auxmeta`)."""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

from .. import rendezvous as rdv
from ..errors import StageError
from .core import KVPoll, StageKVManager

__all__ = ["StageKVReceiver"]

log = logging.getLogger(__name__)


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
        try:
            if m.aux_buffers and aux_index is not None:
                self.aux_index = int(aux_index)
                ticket.update(aux_index=self.aux_index, aux_items=m.aux_items)
                if m.aux_inbox is not None:
                    ticket["aux_tickets"] = True  # to inbox <kv>-tp<rank>-aux, naming the grant
            m.expect(self.room, tokens, self.aux_index)
        except ValueError as e:
            self.error = "room %s: %s" % (self.room, e)
            return
        self.deadline = time.monotonic() + m.timeout
        try:
            self.key = m.grant_writes(self.room, pages)
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
                self.mgr.store_aux(self.room, self.aux_index)
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
