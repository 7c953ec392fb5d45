"""What SGLang builds: the manager, sender, receiver and bootstrap server from SGLang's own KVArgs.

SGLang's interfaces (sglang/srt/disaggregation/base/conn.py) as SGLang
builds and calls them, over the core of :mod:`.core`. Nothing here
imports sglang until SGLang itself calls in.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

from .. import rendezvous as rdv
from .core import KVPoll, StageKVManager
from .receiver import StageKVReceiver
from .sender import StageKVSender

__all__ = ["BACKEND", "SGLangKVManager", "SGLangKVSender", "SGLangKVReceiver", "SGLangBootstrapServer"]


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
# default 30), STAGE_RENDEZVOUS_SECRET / STAGE_RENDEZVOUS_SECRET_FILE (the
# bootstrap's secret; without one, STAGE_RENDEZVOUS_INSECURE=1 lets it start
# unsigned on a loopback address).
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
            boot = _ForwardingRendezvous(host, port + rank, secret=secret, insecure=rdv.insecure_env())
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
