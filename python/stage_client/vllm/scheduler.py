"""The scheduler side of :class:`stage_client.vllm.StageConnector`.

It runs in vLLM's scheduler process and only decides; the workers move
bytes. Per step, :meth:`build_connector_meta` tells the workers which
requests' rows to push during this forward (layer by layer), which to push
before it (rows computed before the decode's ticket arrived), which
prefill requests are held for the decode's pulls, and which decode
requests receive. kv_transfer_params keys (all but vLLM's own
``do_remote_prefill`` / ``do_remote_decode`` start with ``stage_``):

* to the prefill: ``stage_mode``, ``stage_xfer`` (the router's transfer
  key; default the request id), push only: ``stage_ticket`` (the decode's
  ticket, when the router has it already);
* to the decode in push mode: ``stage_mode``, ``stage_xfer``, and where
  its ticket goes over the sidecars' link (:mod:`.tickets`): ``stage_peer``
  (the prefill's sidecar; "" : the route's only peer) and ``stage_kv`` (the
  prefill engine's kv_name; "" : the only engine taking tickets there);
  deprecated: ``stage_rendezvous`` (a prefill's rendezvous host:port);
* from the prefill at its end in pull mode (for the decode):
  ``stage_peer``, ``stage_kv``, ``stage_tp``, ``stage_block_ids``,
  ``stage_tokens``, ``stage_lease_expires`` (wall clock), ``stage_grant``
  (the transfer key, hex: the prefill's sidecar serves these blocks only to
  a pull naming it, PROTOCOL.md 9.20).

Push tickets carry ``grant`` the same way: the decode's sidecar takes the
prefill's pushes into the ticket's blocks only with that key.
"""

from __future__ import annotations

import json
import logging
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from .. import rendezvous as rdv
from ..connector_core import Receive, Receives
from ..engines import plan
from ..errors import StageError
from .compat import LOGGER
from .config import StageConfig
from .metadata import PushChunk, RecvReq, StageConnectorMetadata
from .tickets import TICKET_FAILURE, TicketItem, TicketLink

__all__ = ["StageScheduler", "block_ids_of", "scheduled"]

log = logging.getLogger(LOGGER)


def block_ids_of(x: Any) -> List[int]:
    """Block ids of one KV-cache group from what vLLM passes: KVCacheBlocks, a tuple of lists, or a list."""
    if x is None:
        return []
    if hasattr(x, "get_block_ids"):
        x = x.get_block_ids()
    x = list(x)
    if x and isinstance(x[0], (list, tuple)):
        return [int(b) for b in x[0]]
    return [int(b) for b in x]


def scheduled(so: Any) -> Iterator[Tuple[str, Optional[List[int]], int, bool]]:
    """(req_id, block ids (all for new and resumed requests, the new ones otherwise, None for none),
    num_computed_tokens, replaces) for every request of a SchedulerOutput, in both of vLLM's forms."""
    for r in getattr(so, "scheduled_new_reqs", ()) or ():
        yield r.req_id, block_ids_of(r.block_ids), int(r.num_computed_tokens), True
    c = getattr(so, "scheduled_cached_reqs", None)
    if c is None:
        return
    if isinstance(c, (list, tuple)):  # older vLLM: one CachedRequestData per request
        for r in c:
            nb = getattr(r, "new_block_ids", None)
            res = bool(getattr(r, "resumed_from_preemption", False))
            yield r.req_id, (None if nb is None else block_ids_of(nb)), int(r.num_computed_tokens), res
        return
    resumed = set(getattr(c, "resumed_req_ids", None) or ())
    flags = getattr(c, "resumed_from_preemption", None)
    for i, rid in enumerate(c.req_ids):
        nb = c.new_block_ids[i]
        res = rid in resumed or bool(flags[i] if flags else False)
        yield rid, (None if nb is None else block_ids_of(nb)), int(c.num_computed_tokens[i]), res


#: Bytes of a transfer key (128 bits from secrets): what forging a transfer means guessing.
GRANT_KEY_BYTES = 16


def _grant_key(v: Any) -> Tuple[bytes, str]:
    """(key, "") from a request's ``stage_grant``; (b"", "") when there is none (a prefill that predates
    grants); (b"", why) when it is not 16..64 bytes of hex (the load fails, the request recomputes)."""
    if v is None or v == "":
        return b"", ""
    try:
        k = bytes.fromhex(str(v))
    except ValueError:
        k = b""
    if not 16 <= len(k) <= 64:
        return b"", "kv_transfer_params stage_grant is not a transfer key (16 to 64 bytes of hex)"
    return k, ""


class _Poster:
    """Posts push tickets (and failure notices) on a thread of its own.

    A post is a round trip to the peer (up to ``timeout``): never inside
    vLLM's scheduler step. A ticket whose post fails is reported to the
    workers with the next step's metadata (``failed``), which ends the
    request as a load error at once instead of at ``timeout_s``."""

    def __init__(self, timeout: float, secret: Optional[bytes]) -> None:
        self.timeout, self.secret = timeout, secret
        self._q: "queue.Queue[Optional[Tuple[str, str, Callable[[], None]]]]" = queue.Queue()
        self._lock = threading.Lock()
        self._failed: Dict[str, str] = {}
        self._thread: Optional[threading.Thread] = None

    def post(self, rid: str, addr: str, xfer: str, ticket: Dict[str, Any]) -> None:
        """Post to the (deprecated) rendezvous at ``addr``."""
        self.send(rid, "the prefill's rendezvous %s" % addr,
                  lambda: rdv.post(addr, xfer, ticket, timeout=self.timeout, secret=self.secret))

    def send(self, rid: str, where: str, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the poster's thread; when it raises, ``rid`` (if any) fails with the next step."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="stage-ticket-poster", daemon=True)
            self._thread.start()
        self._q.put((rid, where, fn))

    def fail(self, rid: str, why: str) -> None:
        with self._lock:
            self._failed.setdefault(rid, why)

    def drain(self, timeout: float) -> bool:
        """Wait until every queued ticket was posted or failed (False at ``timeout``)."""
        end = time.monotonic() + timeout
        while self._q.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.002)
        return not self._q.unfinished_tasks

    def take_failed(self) -> Dict[str, str]:
        with self._lock:
            out, self._failed = self._failed, {}
        return out

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                self._q.task_done()
                return
            rid, where, fn = job
            try:
                fn()
            except (OSError, ValueError, StageError) as e:
                log.warning("stage: posting the push ticket of %s to %s: %s", rid or "?", where, e)
                if rid:
                    self.fail(rid, "posting the push ticket to %s: %s" % (where, e))
            finally:
                self._q.task_done()

    def close(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join(self.timeout + 1)
            self._thread = None


MAX_RECEIVES = 1 << 16  # push receives remembered for their failure notices


def _deprecated_rendezvous() -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("stage: posting push tickets to a rendezvous (rendezvous, stage_rendezvous) is deprecated and "
                    "goes in the next release: without it they travel over the sidecars' link")


_warned = False


@dataclass
class _Pull:
    prompt: int
    blocks: List[int] = field(default_factory=list)
    key: bytes = b""  # granted (the decode's pulls name it; nobody else can)


@dataclass
class _Push:
    xfer: str
    prompt: int
    ticket: Optional[Dict[str, Any]] = None
    blocks: List[int] = field(default_factory=list)
    computed: int = 0  # tokens computed so far
    pushed_to: int = 0  # tokens [0, pushed_to) pushed or handed to a worker
    finished_at: float = 0.0


class StageScheduler:
    """Scheduler-side state: push requests by id, and what the next step's metadata carries."""

    def __init__(self, cfg: StageConfig) -> None:
        self.cfg = cfg
        self._lock = threading.Lock()
        self._push: Dict[str, _Push] = {}
        self._recv: List[RecvReq] = []
        self._hold: Dict[str, Tuple[str, float]] = {}
        self._grant: Dict[str, Tuple[bytes, List[int]]] = {}  # grants for the next step's workers
        self._revoke: List[Tuple[str, bytes]] = []  # and grants they end
        self._pull: Dict[str, _Pull] = {}  # pull-mode prefill requests, until request_finished
        self._preempted: List[str] = []
        self.secret = cfg.secret()
        self._poster = _Poster(min(5.0, cfg.timeout_s), self.secret)
        #: tickets that arrived (push mode), by transfer key; tests and routers may post here directly
        self.rendezvous: Any = rdv.LocalRendezvous(ttl=cfg.lease_s)
        if cfg.rendezvous_listen:  # deprecated: tickets come over the sidecars' link
            log.warning("stage: rendezvous_listen is deprecated and goes in the next release: push tickets travel "
                        "over the sidecars' link; drop rendezvous_listen and the router's --rendezvous")
            self.rendezvous = rdv.RendezvousServer(*rdv.parse_addr(cfg.rendezvous_listen), ttl=cfg.lease_s,
                                                   secret=self.secret, insecure=cfg.rendezvous_insecure)
        #: push receives (decode), found by transfer key when a failure notice names one; the oldest forgotten
        self._receives = Receives(cfg.kv_heads, cfg.tp_size, 0, limit=MAX_RECEIVES)
        #: the sidecar connection push tickets and failure notices travel on (PROTOCOL.md 9.19)
        self.link = TicketLink(cfg, self._ticket_arrived)

    def _mode(self, p: Dict[str, Any]) -> str:
        return str(p.get("stage_mode") or self.cfg.mode)

    # ------------------------------------------------------------------
    # vLLM's calls

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[int, bool]:
        p = request.kv_transfer_params
        if p and p.get("do_remote_prefill"):
            total = int(p.get("stage_tokens") or len(request.prompt_token_ids or ()))
            n = total - num_computed_tokens
            if n > 0:
                return n, True
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        p = request.kv_transfer_params
        if not p:
            return
        rid = request.request_id
        xfer = str(p.get("stage_xfer") or rid)
        if p.get("do_remote_prefill"):
            p["do_remote_prefill"] = False  # one transfer per request
            if num_external_tokens <= 0:
                return
            total = int(p.get("stage_tokens") or len(request.prompt_token_ids or ()))
            rr = RecvReq(rid, xfer, self._mode(p), block_ids_of(blocks), total - num_external_tokens,
                         num_external_tokens)
            if rr.mode == "pull":
                rr.peer, rr.remote_kv = str(p.get("stage_peer") or ""), str(p.get("stage_kv") or "")
                rr.remote_tp = int(p.get("stage_tp") or 1)
                rr.remote_blocks = [int(b) for b in p.get("stage_block_ids") or ()]
                rr.lease_expires = float(p.get("stage_lease_expires") or 0)
                rr.key, why = _grant_key(p.get("stage_grant"))
                rr.error = rr.error or why
            else:
                rr.error = self._post_ticket(p, rr)
            with self._lock:
                self._recv.append(rr)
        elif p.get("do_remote_decode") and self._mode(p) == "pull":
            with self._lock:
                self._pull.setdefault(rid, _Pull(len(request.prompt_token_ids or ())))
        elif p.get("do_remote_decode") and self._mode(p) == "push":
            with self._lock:
                st = self._push.setdefault(rid, _Push(xfer, len(request.prompt_token_ids or ())))
                if p.get("stage_ticket"):
                    st.ticket = self._usable(rid, dict(p["stage_ticket"]))

    def _post_ticket(self, p: Dict[str, Any], rr: RecvReq) -> str:
        """Tell the prefill where to push: in this process at once, else queued for the poster thread.
        The error as text ("" when posted or queued)."""
        rr.key = secrets.token_bytes(GRANT_KEY_BYTES)  # our workers grant the prefill's pushes with it
        ticket = {"peer": self.cfg.peer_name, "kv": self.cfg.kv_name, "tp": self.cfg.tp_size,
                  "block_ids": rr.blocks, "first": rr.first, "tokens": rr.tokens, "grant": rr.key.hex()}
        addr = str(p.get("stage_rendezvous") or self.cfg.rendezvous)
        if addr:  # deprecated
            _deprecated_rendezvous()
            self._poster.post(rr.req_id, addr, rr.xfer, ticket)
            return ""
        # over the link: to the prefill named by stage_peer (its sidecar, "" : the route's only peer) and
        # stage_kv (its engine's kv_name, "" : the only engine taking tickets there)
        peer, to = str(p.get("stage_peer") or ""), str(p.get("stage_kv") or "")
        with self._lock:
            self._receives.add(Receive(rr.req_id, rr.xfer, rr.first, rr.tokens))
        self._poster.send(rr.req_id, "the prefill (route %s%s)" % (self.cfg.route, peer and ", peer " + peer),
                          lambda: self.link.post_ticket(rr.xfer, ticket, peer, to, self._poster.timeout))
        return ""

    def _ticket_arrived(self, it: TicketItem) -> None:
        """A ticket from a peer's engine (the link's thread): a push ticket is kept for its transfer (prefill);
        a failure notice fails its request at the next step (decode)."""
        if it.kind == TICKET_FAILURE:
            with self._lock:
                r = self._receives.pop_xfer(it.key)
            if r is not None:
                rid = r.req
                why = it.body.decode("utf-8", "replace")
                log.warning("stage: the prefill (%s) cannot push %s (%s): %s", it.sender, rid, it.key, why)
                self._poster.fail(rid, "the prefill %s cannot push: %s" % (it.sender, why))
            return
        t: Any = None
        try:
            t = json.loads(it.body)
            self.rendezvous.post(it.key, t)
        except (ValueError, RecursionError) as e:  # malformed, or too many tickets waiting: tell the decode
            log.warning("stage: a push ticket from %s for %s is refused: %s", it.sender, it.key, e)
            if isinstance(t, dict) and isinstance(t.get("kv"), str) and t["kv"]:
                why, peer, kv = "its ticket is refused: %s" % e, str(t.get("peer") or ""), t["kv"]
                self._poster.send("", "the decode %s" % kv, lambda: self.link.post_failure(it.key, why, peer, kv))

    def build_connector_meta(self, scheduler_output: Any) -> StageConnectorMetadata:
        meta = StageConnectorMetadata()
        nsched = dict(getattr(scheduler_output, "num_scheduled_tokens", None) or {})
        with self._lock:
            meta.recv, self._recv = self._recv, []
            meta.failed = self._poster.take_failed()
            meta.hold, self._hold = self._hold, {}
            for rid, blocks, computed, replaces in scheduled(scheduler_output):
                self._grant_early(rid, blocks, computed + int(nsched.get(rid, 0)), replaces)
                st = self._push.get(rid)
                if st is None:
                    continue
                if replaces:
                    st.blocks = list(blocks or [])
                    st.pushed_to = min(st.pushed_to, computed)  # resumed: recomputed rows go again
                elif blocks:
                    st.blocks.extend(blocks)
                end = computed + int(nsched.get(rid, 0))
                st.computed = max(st.computed, end)
                if self.cfg.layerwise:
                    self._emit(meta, rid, st, computed, end)
            now = time.monotonic()
            for rid, st in list(self._push.items()):
                if not st.finished_at:
                    continue
                self._emit(meta, rid, st, st.computed, st.computed)
                t = st.ticket
                if t is not None or now - st.finished_at > self.cfg.lease_s:
                    if t is None:
                        log.warning("stage: no push ticket for %s (%s) within the lease; its blocks are freed",
                                    rid, st.xfer)
                    meta.seal[rid] = st.xfer
                    del self._push[rid]
            pre = getattr(scheduler_output, "preempted_req_ids", None) or ()
            meta.preempted = list(pre) + self._preempted
            self._preempted = []
            for rid in meta.preempted:  # its blocks go back to vLLM: a grant on them ends
                pl = self._pull.get(rid)
                if pl is not None and pl.key:
                    self._revoke.append((rid, pl.key))
                    pl.key, pl.blocks = b"", []
            meta.grant, self._grant = self._grant, {}
            meta.revoke, self._revoke = self._revoke, []
        return meta

    def _grant_early(self, rid: str, blocks: Optional[List[int]], end: int, replaces: bool) -> None:
        """Track a pull-mode prefill request's blocks; in the step that computes its last prompt token, have the
        workers grant them under a fresh key (under the lock). The grant is on the sidecar before
        request_finished hands the key out, so the decode's pull never comes first."""
        pl = self._pull.get(rid)
        if pl is None:
            return
        if replaces:
            pl.blocks = list(blocks or [])
        elif blocks:
            pl.blocks.extend(blocks)
        if end >= pl.prompt and not pl.key and pl.blocks:
            pl.key = secrets.token_bytes(GRANT_KEY_BYTES)
            self._grant[rid] = (pl.key, list(pl.blocks))

    def _emit(self, meta: StageConnectorMetadata, rid: str, st: _Push, c0: int, c1: int) -> None:
        """Hand the workers rows [pushed_to, c0) to push before the forward and [c0, c1) during it."""
        if st.ticket is None:
            t = self.rendezvous.take(st.xfer)
            st.ticket = None if t is None else self._usable(rid, t)
        t = st.ticket
        if t is None:
            return
        lo, hi = int(t["first"]), int(t["first"]) + int(t["tokens"])
        a, b = max(st.pushed_to, lo), min(c0, hi)
        if a < b:
            meta.catchup.append(PushChunk(rid, st.xfer, list(st.blocks), a, b - a, t))
        a, b = max(c0, st.pushed_to, lo), min(c1, hi)
        if a < b:
            meta.push.append(PushChunk(rid, st.xfer, list(st.blocks), a, b - a, t))
        st.pushed_to = max(st.pushed_to, c1)

    def _usable(self, rid: str, t: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """``t`` when this prefill can push to it; else None (logged, and the decode told at once: a load error
        there, not a wait of timeout_s)."""
        try:
            rdv.check_ticket(t)
            plan(self.cfg.kv_heads, self.cfg.tp_size, t["tp"])
        except ValueError as e:
            log.warning("stage: the push ticket of %s is refused: %s", rid, e)
            st = self._push.get(rid)
            if st is not None and isinstance(t, dict) and isinstance(t.get("kv"), str):
                why, xfer, peer, kv = "its ticket is refused: %s" % e, st.xfer, str(t.get("peer") or ""), t["kv"]
                self._poster.send("", "the decode %s" % kv, lambda: self.link.post_failure(xfer, why, peer, kv))
            return None
        return t

    def request_finished(self, request: Any, block_ids: Any) -> Tuple[bool, Optional[Dict[str, Any]]]:
        p = request.kv_transfer_params
        if not p:
            return False, None
        rid = request.request_id
        if p.get("do_remote_prefill"):  # a decode request aborted before it was scheduled
            p["do_remote_prefill"] = False
            return False, None
        if not p.get("do_remote_decode"):
            return False, None
        blocks = block_ids_of(block_ids)
        if self._mode(p) == "push":
            with self._lock:
                st = self._push.get(rid)
                if st is None:
                    return False, None
                st.finished_at = time.monotonic()
            return True, None  # freed once the pushes from these blocks ended (get_finished)
        with self._lock:
            pl = self._pull.pop(rid, None)
            key = pl.key if pl is not None and pl.blocks == blocks else b""
            if pl is not None and pl.key and not key:
                self._revoke.append((rid, pl.key))  # granted on other blocks than vLLM holds now
        if not blocks or "ABORT" in str(getattr(request, "status", "")).upper():
            if key:
                with self._lock:
                    self._revoke.append((rid, key))
            return False, None
        xfer = str(p.get("stage_xfer") or rid)
        with self._lock:
            if not key:  # not granted early (a request vLLM did not schedule as we track): the next step grants
                key = secrets.token_bytes(GRANT_KEY_BYTES)
                self._grant[rid] = (key, blocks)
            self._hold[rid] = (xfer, self.cfg.lease_s)
        return True, {"do_remote_prefill": True, "do_remote_decode": False, "stage_mode": "pull",
                      "stage_xfer": xfer, "stage_peer": self.cfg.peer_name, "stage_kv": self.cfg.kv_name,
                      "stage_tp": self.cfg.tp_size, "stage_block_ids": blocks,
                      "stage_tokens": len(request.prompt_token_ids or ()),
                      "stage_lease_expires": time.time() + self.cfg.lease_s, "stage_grant": key.hex()}

    def preempted(self, req_ids: List[str]) -> None:
        """Requests vLLM preempted (for a vLLM whose SchedulerOutput lacks preempted_req_ids)."""
        with self._lock:
            self._preempted.extend(req_ids)

    def tickets_posted(self, timeout: float) -> bool:
        """Wait until the push tickets queued so far were posted or failed (False at ``timeout``)."""
        return self._poster.drain(timeout)

    def has_pending_push_work(self) -> bool:
        with self._lock:
            return any(st.finished_at for st in self._push.values())

    def shutdown(self) -> None:
        self._poster.close()
        self.link.close()
        close = getattr(self.rendezvous, "close", None)
        if close is not None:
            close()
