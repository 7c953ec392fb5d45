"""The KV requests of :class:`~stage_client.client.Client`: RegisterKV and SubmitKV.

Kept apart from client.py and the byte-range requests (regionclient.py,
transferclient.py; the connection and its reader live in connection.py);
:class:`KVRequests` is a base of Client and uses only its ``_call``. A KV
transfer's id is an ordinary transfer id: wait for it, ask its status or
cancel it with the Client's usual methods.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

from .errors import StageError
from .layout import DType, Layout, LayoutError, Part
from .protocol.grants import Grant, RevokeGrant
from .protocol.kvwire import DTYPE_CODES, MAX_GRANT_TTL_MS, MIN_GRANT_KEY, KVLayout, KVPart, RegisterKV, SubmitKV
from .protocol.wire import Code, Direction, Submitted, XferStatus, checksum_choice

__all__ = ["KVRequests", "grant_key", "wire_layout", "layout_of"]

_DTYPE_OF_CODE = {n: DType(name) for name, n in DTYPE_CODES.items()}


def wire_layout(lay: Layout) -> KVLayout:
    """Layout ``lay`` (validated first) as RegisterKV carries it (Go: kvsim.WireLayout)."""
    lay.validate()
    parts = tuple(KVPart(p.name, p.width, p.tensor, p.offset, p.block_stride, p.slot_stride, p.head_stride)
                  for p in lay.parts)
    return KVLayout(DTYPE_CODES[lay.dtype.value], lay.block_size, lay.blocks, lay.heads, lay.head_lo, lay.head_hi,
                    parts)


def layout_of(w: KVLayout) -> Layout:
    """The :class:`~stage_client.layout.Layout` of a wire layout (LayoutError for an unknown dtype number);
    not validated (Go: proxy's layoutFromWire)."""
    d = _DTYPE_OF_CODE.get(w.dtype)
    if d is None:
        raise LayoutError("unknown dtype number %d (known: %s)" % (w.dtype, sorted(_DTYPE_OF_CODE)))
    parts = tuple(Part(p.name, p.width, p.tensor, p.offset, p.block_stride, p.slot_stride, p.head_stride)
                  for p in w.parts)
    return Layout(d, w.block_size, w.blocks, w.heads, w.head_lo, w.head_hi, parts)


def grant_key() -> bytes:
    """A new transfer key for a grant: 16 bytes (128 bits) from :mod:`secrets`, unguessable; use it once."""
    return secrets.token_bytes(MIN_GRANT_KEY)


def _listed(table: Any) -> Any:
    """``table`` as it is when it can be read twice (a sequence, array or tensor); else its ids as a list."""
    if hasattr(table, "tolist") or hasattr(table, "__getitem__"):
        return table
    return list(table)


def _check_distinct(table: Any, what: str) -> None:
    """Raise ValueError naming the first block id ``table`` holds twice, and both its positions."""
    ids = table.tolist() if hasattr(table, "tolist") else table
    try:
        if len(set(ids)) == len(ids):
            return
    except TypeError:
        return  # ids that are not numbers: the encoder refuses them, saying which
    seen: Dict[Any, int] = {}
    for i, b in enumerate(ids):
        if b in seen:
            raise ValueError("%s names block %r twice, at positions %d and %d: each destination block holds one "
                             "range of tokens; give every position its own block" % (what, b, seen[b], i))
        seen[b] = i


class KVRequests:
    """KV caches and KV transfers (PROTOCOL.md section 12)."""

    _call: Callable[..., Any]

    def register_kv(self, name: str, layout: Union[Layout, KVLayout], layers: Sequence[Sequence[str]]) -> None:
        """Give regions already registered a KV layout, as KV cache ``name``.

        ``layers[l][t]`` is the region holding tensor ``t`` of layer ``l``
        (one name per tensor the layout's parts use); every layer has the
        same ``layout`` (a :class:`~stage_client.layout.Layout`, validated
        here, or its wire form). The sidecar checks the layout against each
        region's length; registering a name again replaces the cache (peers
        that cached its shape are refused once, then ask again).
        """
        wl = wire_layout(layout) if isinstance(layout, Layout) else layout
        ls = [[n] if isinstance(n, str) else list(n) for n in layers]
        self._call(lambda r: RegisterKV(req=r, name=name, layout=wl, layers=ls))

    def submit_kv(self, route: str, local: str, remote: str, layers: Sequence[int], local_blocks: Any,
                  remote_blocks: Any, tokens: int, local_first: int = 0, remote_first: int = 0,
                  heads: Optional[Tuple[int, int]] = None, direction: int = Direction.PUSH, tag: str = "",
                  peer: str = "", remote_layers: Optional[Sequence[int]] = None,
                  checksum: Union[None, bool, int] = None, key: bytes = b"") -> int:
        """Start a KV transfer on ``route``; returns its id on this sidecar.

        Moves the rows of ``tokens`` tokens of ``layers`` of KV cache
        ``local`` (here) to or from KV cache ``remote`` (the peer's):
        token ``i`` is token ``local_first + i`` of the block table
        ``local_blocks`` here and token ``remote_first + i`` of
        ``remote_blocks`` there. ``remote_layers`` pairs with ``layers``
        (default: the same indices); ``heads`` ``(lo, hi)`` narrows the
        heads (default: every head both sides hold). ``direction`` PUSH
        sends ours, PULL fetches the peer's. Block tables may be lists,
        arrays or tensors of ids. The destination's table (``remote_blocks``
        of a push, ``local_blocks`` of a pull) must not name a block twice:
        two token ranges would overwrite one block, so that raises
        ValueError before anything is sent (a source may repeat ids). ``checksum`` and ``peer`` (the route's
        peer: node name or host:port) as for :meth:`submit`.

        The sidecar learns the peer's shape first and refuses with
        StageError what either side would refuse (another dtype or row
        width, heads outside a side's slice, a block id past its cache, a
        layer it does not have); XferStatus counts canonical bytes. The
        peer's subscribers get a Notify with ``kv``, ``layers``, ``first``
        and ``tokens`` once the rows landed (push) or were sent (pull).
        ``key`` is the transfer key the peer's engine granted (:meth:`grant`):
        a peer whose cache is guarded refuses a request without it.
        """
        lo, hi = (0, 0) if heads is None else (int(heads[0]), int(heads[1]))
        d, ck = Direction(direction), checksum_choice(checksum)
        local_blocks, remote_blocks = _listed(local_blocks), _listed(remote_blocks)
        if d == Direction.PUSH:
            _check_distinct(remote_blocks, "push into %r: the remote (destination) block table" % remote)
        else:
            _check_distinct(local_blocks, "pull into %r: the local (destination) block table" % local)
        rl = [] if remote_layers is None else remote_layers
        a = self._call(lambda r: SubmitKV(req=r, route=route, peer=peer, direction=d, checksum=ck, tag=tag,
                                          local=local, remote=remote, layers=layers, remote_layers=rl,
                                          local_blocks=local_blocks, remote_blocks=remote_blocks,
                                          local_first=local_first, remote_first=remote_first, tokens=tokens,
                                          head_lo=lo, head_hi=hi, key=bytes(key)))
        if not isinstance(a, Submitted):
            raise StageError(Code.INTERNAL, "SubmitKV answered with %s" % type(a).__name__)
        return a.transfer

    def grant(self, cache: str, key: bytes, blocks: Any, ttl: float, *, write: bool = False, uses: int = 1) -> None:
        """Let the peer request naming ``key`` read (a pull, at most ``uses`` times) or write (``write``: pushes,
        until revoked or expired) exactly the block table ``blocks`` of this connection's KV cache ``cache``, for
        ``ttl`` seconds (at most an hour). From then on the cache is guarded: a peer request naming no live
        grant covering exactly its blocks is refused (PROTOCOL.md 9.20). ``key``: :func:`grant_key`."""
        ms = int(round(ttl * 1000))
        if not 1 <= ms <= MAX_GRANT_TTL_MS:
            raise ValueError("grant of %rs: want 1 ms to %d s" % (ttl, MAX_GRANT_TTL_MS // 1000))
        n = 0 if write else int(uses)
        self._call(lambda r: Grant(req=r, cache=cache, key=bytes(key), write=write, ttl_ms=ms, uses=n,
                                   blocks=_listed(blocks)))

    def guard_kv(self, cache: str) -> None:
        """Guard this connection's KV cache ``cache`` now, before any grant: from then on every peer pull or push
        must name a grant (a Grant of no blocks, which grants nothing)."""
        self.grant(cache, grant_key(), [], 0.001)

    def revoke_grant(self, cache: str, key: bytes) -> None:
        """End the grant ``key`` on ``cache`` (nothing when it ended already: spent, expired, or revoked)."""
        self._call(lambda r: RevokeGrant(req=r, cache=cache, key=bytes(key)))

    async def submit_kv_async(self, *args: Any, timeout: Optional[float] = None, **kw: Any) -> XferStatus:
        """:meth:`submit_kv` (in the default executor: the sidecar may first ask
        the peer for its shape), then await the transfer's end; its final
        XferStatus, or StageError as :meth:`wait` raises."""
        loop = asyncio.get_running_loop()
        tid = await loop.run_in_executor(None, functools.partial(self.submit_kv, *args, **kw))
        return await self.wait_async(tid, timeout)  # type: ignore[attr-defined]
