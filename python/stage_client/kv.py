"""A worked example for a KV connector: a paged KV cache on the sidecar.

:class:`PagedKV` registers a paged KV cache once, as one region per layer
(or per layer and K/V part) at its offset inside one allocation, and turns
a request's block ids into transfers: block ``i`` of every region is the
byte range ``[i * block_bytes, (i + 1) * block_bytes)`` of that region.
Consecutive block ids (source and destination both consecutive) become one
op, so a request whose blocks were allocated in order moves in a few large
ranges rather than thousands of 16 KiB ones.

Two ways to build one:

* :meth:`PagedKV.hostmem` allocates the cache in a memfd (the sidecar's
  ``hostmem`` device: CPU-only nodes, tests, demos);
* :meth:`PagedKV.from_tensors` registers torch CUDA tensors, one per
  region, each with the block id as its first dimension (for instance
  ``kv[layer]`` of a ``[layers, blocks, ...]`` cache, or ``kv[layer][0]``
  and ``kv[layer][1]`` for a layout with K and V apart). Views of one
  allocation share one IPC import in the sidecar.

The decode side registers the same layout under its own name; the prefill
side pushes with ``remote=<that name>``::

    kv = PagedKV.hostmem(client, "prefill-kv", layers=32, blocks=1024, block_bytes=64 << 10)
    ids = kv.push_blocks("decode", src_blocks=[3, 4, 5, 9], dst_blocks=[0, 1, 2, 7],
                         tag="req-42", remote="decode-kv")
    client.wait_all(ids)                      # or: await kv.push_blocks_async(...)
"""

from __future__ import annotations

import asyncio
import mmap
import os
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .client import Client
# KV caches with a layout (the sidecar converts between engines' layouts) are
# registered from torch tensors by kvcache; re-exported so both kinds of KV
# registration are found here.
from .kvcache import HostArena, KVCache, register_kv_cache, sealed_memfd, unregister_all
from .protocol.wire import MAX_NAMES, MAX_OPS, Access, Direction, LocalOp, XferStatus

__all__ = ["PagedKV", "coalesce", "HostArena", "KVCache", "register_kv_cache"]


def coalesce(src_blocks: Iterable[int], dst_blocks: Iterable[int]) -> List[Tuple[int, int, int]]:
    """Runs of (src_start, dst_start, count) from parallel block-id lists.

    A pair extends the current run when both its source and its destination
    id are one more than the previous pair's; the given order is kept (no
    sorting: a block table is usually in order already).
    """
    src = [int(b) for b in src_blocks]
    dst = [int(b) for b in dst_blocks]
    if len(src) != len(dst):
        raise ValueError("%d source blocks but %d destination blocks" % (len(src), len(dst)))
    runs: List[Tuple[int, int, int]] = []
    if not src:
        return runs
    s0, d0, n = src[0], dst[0], 1
    for s, d in zip(src[1:], dst[1:]):
        if s == s0 + n and d == d0 + n:
            n += 1
        else:
            runs.append((s0, d0, n))
            s0, d0, n = s, d, 1
    runs.append((s0, d0, n))
    return runs


class PagedKV:
    """A paged KV cache registered with one sidecar as ``len(regions)`` regions.

    Each region holds ``num_blocks`` blocks of ``block_bytes``. Region names
    are ``f"{name}/{i}"``. Use the class methods to build one; :meth:`close`
    (or ``with``) unregisters the regions and frees what was allocated.
    """

    def __init__(self, client: Client, name: str, num_regions: int, num_blocks: int, block_bytes: int,
                 views: Optional[Sequence[Any]] = None, cleanup: Optional[Callable[[], None]] = None) -> None:
        if num_regions <= 0 or num_blocks <= 0 or block_bytes <= 0:
            raise ValueError("PagedKV: %d regions of %d blocks of %d B" % (num_regions, num_blocks, block_bytes))
        if num_regions > MAX_NAMES:
            raise ValueError("PagedKV: %d regions; at most %d" % (num_regions, MAX_NAMES))
        self.client = client
        self.name = name
        self.num_regions = num_regions
        self.num_blocks = num_blocks
        self.block_bytes = block_bytes
        self._views = list(views) if views is not None else []
        self._cleanup = cleanup
        self._registered: List[str] = []
        #: hostmem only: the memfd, its whole mapping, and the guard bytes before the first region
        self.fd: Optional[int] = None
        self.buffer: Optional[mmap.mmap] = None
        self.guard = 0

    # ------------------------------------------------------------------
    # construction

    @classmethod
    def hostmem(cls, client: Client, name: str, layers: int, blocks: int, block_bytes: int,
                access: int = Access.ALL, guard: int = 4096) -> "PagedKV":
        """Allocate the cache in a memfd and register one region per layer.

        The layers sit back to back after ``guard`` bytes (and ``guard``
        bytes follow them), so every region is at a non-zero offset inside
        one allocation and a write past a region shows. :meth:`layer` gives
        a layer's bytes; :attr:`buffer` the whole allocation.
        """
        layer_bytes = blocks * block_bytes
        size = 2 * guard + layers * layer_bytes
        fd = sealed_memfd(name, size)
        try:
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        views = [memoryview(mm)[guard + i * layer_bytes: guard + (i + 1) * layer_bytes] for i in range(layers)]

        def cleanup() -> None:
            for v in views:
                v.release()
            try:
                mm.close()
            except BufferError:
                pass  # a caller still holds a view of it; it closes when that goes
            os.close(fd)

        kv = cls(client, name, layers, blocks, block_bytes, views=views, cleanup=cleanup)
        kv.fd, kv.buffer, kv.guard = fd, mm, guard
        try:
            for i in range(layers):
                client.register_memfd(kv.region(i), fd, size, guard + i * layer_bytes, layer_bytes, access)
                kv._registered.append(kv.region(i))
        except BaseException:
            kv.close()
            raise
        return kv

    @classmethod
    def from_tensors(cls, client: Client, name: str, tensors: Sequence[Any], access: int = Access.ALL) -> "PagedKV":
        """Register torch CUDA tensors, one region each; dim 0 is the block id.

        Every tensor must be contiguous with the same shape and dtype; a
        block is ``tensor[i]``, ``tensor.stride(0) * element_size()`` bytes.
        """
        if not tensors:
            raise ValueError("PagedKV.from_tensors: no tensors")
        t0 = tensors[0]
        blocks = int(t0.shape[0])
        block_bytes = int(t0.stride(0)) * int(t0.element_size())
        for i, t in enumerate(tensors):
            if tuple(t.shape) != tuple(t0.shape) or t.dtype != t0.dtype:
                raise ValueError("tensor %d: shape %s %s, tensor 0 is %s %s" % (i, tuple(t.shape), t.dtype,
                                                                               tuple(t0.shape), t0.dtype))
        kv = cls(client, name, len(tensors), blocks, block_bytes, views=tensors)
        try:
            for i, t in enumerate(tensors):
                client.register_tensor(kv.region(i), t, access)
                kv._registered.append(kv.region(i))
        except BaseException:
            kv.close()
            raise
        return kv

    # ------------------------------------------------------------------
    # names and bytes

    def region(self, i: int, prefix: Optional[str] = None) -> str:
        """Region ``i``'s name (``prefix`` for the peer's cache, default this one's)."""
        return "%s/%d" % (self.name if prefix is None else prefix, i)

    def regions(self, prefix: Optional[str] = None) -> List[str]:
        """Every region's name."""
        return [self.region(i, prefix) for i in range(self.num_regions)]

    def layer(self, i: int) -> Any:
        """Region ``i``'s bytes: a memoryview (hostmem) or the tensor."""
        return self._views[i]

    # ------------------------------------------------------------------
    # ops

    def _check_blocks(self, blocks: Sequence[int], what: str) -> None:
        for b in blocks:
            if not 0 <= b < self.num_blocks:
                raise ValueError("%s block id %d out of range (0..%d)" % (what, b, self.num_blocks - 1))

    def plan(self, local_blocks: Iterable[int], remote_blocks: Iterable[int], layers: Optional[Iterable[int]] = None,
             max_ops: int = MAX_OPS) -> List[Tuple[List[int], List[LocalOp]]]:
        """Split a block move into transfers: a list of (region indices, ops).

        ``local_blocks[k]`` pairs with ``remote_blocks[k]``; the ops' local
        and remote indices point into the returned region indices (the same
        on both sides). Each transfer has at most ``max_ops`` ops and
        MAX_NAMES regions.
        """
        lb = [int(b) for b in local_blocks]
        rb = [int(b) for b in remote_blocks]
        self._check_blocks(lb, "local")
        self._check_blocks(rb, "remote")
        runs = coalesce(lb, rb)
        sel = list(range(self.num_regions)) if layers is None else [int(x) for x in layers]
        for x in sel:
            if not 0 <= x < self.num_regions:
                raise ValueError("region %d out of range (0..%d)" % (x, self.num_regions - 1))
        if max_ops <= 0:
            raise ValueError("max_ops %d" % max_ops)
        bb = self.block_bytes
        out: List[Tuple[List[int], List[LocalOp]]] = []
        names: List[int] = []
        index: Dict[int, int] = {}
        ops: List[LocalOp] = []
        for layer in sel:
            for ls, rs, n in runs:
                if len(ops) >= max_ops or (layer not in index and len(names) >= MAX_NAMES):
                    out.append((names, ops))
                    names, index, ops = [], {}, []
                j = index.get(layer)
                if j is None:
                    j = index[layer] = len(names)
                    names.append(layer)
                ops.append(LocalOp(j, j, ls * bb, rs * bb, n * bb))
        if ops:
            out.append((names, ops))
        return out

    def _move(self, direction: Direction, route: str, local_blocks: Sequence[int], remote_blocks: Sequence[int],
              tag: str, remote: Optional[str], layers: Optional[Iterable[int]], checksum: Union[None, bool, int],
              max_ops: int, peer: str = "") -> List[int]:
        ids: List[int] = []
        for sel, ops in self.plan(local_blocks, remote_blocks, layers, max_ops):
            ids.append(self.client.submit(route, direction, ops, [self.region(i) for i in sel],
                                          [self.region(i, remote) for i in sel], tag, checksum, peer))
        return ids

    def push_blocks(self, route: str, src_blocks: Sequence[int], dst_blocks: Sequence[int], tag: str = "", *,
                    remote: Optional[str] = None, layers: Optional[Iterable[int]] = None,
                    checksum: Union[None, bool, int] = None, max_ops: int = MAX_OPS, peer: str = "") -> List[int]:
        """Push local blocks ``src_blocks`` into the peer's ``dst_blocks``.

        ``remote`` is the peer cache's name (default: this one's); ``layers``
        picks regions (default all). ``peer`` names the route's decode (node
        name or host:port) on a route of several. Returns the transfer ids
        (usually one; more when the ops exceed ``max_ops``), each carrying
        ``tag``. The peer's subscribers get one Notify per transfer.
        """
        return self._move(Direction.PUSH, route, src_blocks, dst_blocks, tag, remote, layers, checksum, max_ops, peer)

    def pull_blocks(self, route: str, src_blocks: Sequence[int], dst_blocks: Sequence[int], tag: str = "", *,
                    remote: Optional[str] = None, layers: Optional[Iterable[int]] = None,
                    checksum: Union[None, bool, int] = None, max_ops: int = MAX_OPS, peer: str = "") -> List[int]:
        """Pull the peer's blocks ``src_blocks`` into local ``dst_blocks`` (``peer`` as for push)."""
        return self._move(Direction.PULL, route, dst_blocks, src_blocks, tag, remote, layers, checksum, max_ops, peer)

    def wait(self, transfer_ids: Iterable[int], timeout: Optional[float] = None) -> List[XferStatus]:
        """Wait for transfers; raises TransfersFailed (every transfer's status and error) when any failed."""
        return self.client.wait_all(transfer_ids, timeout)

    async def push_blocks_async(self, route: str, src_blocks: Sequence[int], dst_blocks: Sequence[int],
                                tag: str = "", **kw: Any) -> List[XferStatus]:
        """Submit like :meth:`push_blocks`, then await the end of every transfer."""
        timeout = kw.pop("timeout", None)
        ids = self.push_blocks(route, src_blocks, dst_blocks, tag, **kw)
        return list(await asyncio.gather(*(self.client.wait_async(i, timeout) for i in ids)))

    async def pull_blocks_async(self, route: str, src_blocks: Sequence[int], dst_blocks: Sequence[int],
                                tag: str = "", **kw: Any) -> List[XferStatus]:
        """Submit like :meth:`pull_blocks`, then await the end of every transfer."""
        timeout = kw.pop("timeout", None)
        ids = self.pull_blocks(route, src_blocks, dst_blocks, tag, **kw)
        return list(await asyncio.gather(*(self.client.wait_async(i, timeout) for i in ids)))

    def on_done(self, transfer_ids: Iterable[int], callback: Callable[[List[XferStatus], Optional[BaseException]], None],
                timeout: Optional[float] = None) -> None:
        """Call ``callback(statuses, error)`` once every transfer ended.

        ``error`` is the first failure (StageError) or None. The callback runs
        on the client's reader thread: hand work off, do not block there.
        """
        futs = [self.client.wait_future(i, timeout) for i in transfer_ids]
        if not futs:
            callback([], None)
            return
        left = [len(futs)]
        lock = threading.Lock()

        def one(_: Any) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if not last:
                return
            sts: List[XferStatus] = []
            err: Optional[BaseException] = None
            for f in futs:
                e = f.exception()
                if e is not None:
                    err = err or e
                else:
                    sts.append(f.result())
            callback(sts, err)

        for f in futs:
            f.add_done_callback(one)

    # ------------------------------------------------------------------

    def close(self) -> None:
        """Unregister every region and free the memory this object allocated."""
        names, self._registered = self._registered, []
        try:
            unregister_all(self.client, reversed(names))
        finally:
            if self._cleanup is not None:
                c, self._cleanup = self._cleanup, None
                c()
            self._views = []

    def __enter__(self) -> "PagedKV":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
