"""Register an engine's KV cache, as torch tensors, with its sidecar.

:func:`register_kv_cache` takes the tensors the engine uses for each layer
(in the shape its attention kernels index, views and permutations
included), registers the memory each one spans as a region, reads the
layout off layer 0 with :meth:`Layout.from_tensor <stage_client.layout.Layout.from_tensor>`,
checks every other layer has the same, and registers the KV cache
(RegisterKV). Then :meth:`KVCache.push` / :meth:`KVCache.pull` (or
:meth:`Client.submit_kv <stage_client.kvclient.KVRequests.submit_kv>`) move
a request's rows by block table; the sidecars convert between the two
engines' layouts.

Where the memory lives decides how the sidecar reaches it:

* torch CUDA tensors (a ``cuda`` sidecar): by CUDA IPC handle, as
  :meth:`Client.register_tensor` does;
* CPU tensors (a ``hostmem`` sidecar): they must live in a memfd, which the
  sidecar maps. :class:`HostArena` is such a memfd, handing out tensors
  (``torch.frombuffer`` over its mapping); allocate the cache there.

Needs torch (imported when called).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import time
import weakref
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

from .client import DEFAULT_UNREGISTER_WAIT
from .errors import StageError
from .layout import Layout, LayoutError
from .protocol.wire import Access, Code, Direction

__all__ = ["HostArena", "KVCache", "register_kv_cache", "unregister_all", "KV_ACCESS", "kv_access", "sealed_memfd"]

_LOCAL = Access.LOCAL_READ | Access.LOCAL_WRITE

#: What ``register_kv_cache(access=role)`` grants the cache's regions, by
#: role. Every role lets the engine's own sidecar read the cache (its
#: pushes) and write it (its pulls); peers get what the role needs and no
#: more: a prefill's cache is read by the decodes that pull it, a decode's
#: written by the prefills that push into it. "local" (the default) lets
#: no peer in. vLLM's kv_role and SGLang's mode name the same roles.
KV_ACCESS = {
    "local": _LOCAL,
    "prefill": _LOCAL | Access.REMOTE_READ,
    "kv_producer": _LOCAL | Access.REMOTE_READ,
    "decode": _LOCAL | Access.REMOTE_WRITE,
    "kv_consumer": _LOCAL | Access.REMOTE_WRITE,
    "kv_both": Access.ALL,
}


def kv_access(access: Union[int, str]) -> Access:
    """The region rights ``access`` stands for: a role of :data:`KV_ACCESS`, or Access bits as they are.

    Raises ValueError for an unknown role, or bits that grant nothing or
    that no Access flag names.
    """
    if isinstance(access, str):
        try:
            return KV_ACCESS[access]
        except KeyError:
            raise ValueError("register_kv_cache: access %r is no role; give one of %s, or Access bits"
                             % (access, ", ".join(KV_ACCESS))) from None
    if isinstance(access, bool) or not isinstance(access, int) or not 0 < access <= Access.ALL:
        raise ValueError("register_kv_cache: access %r: give a role (%s) or Access bits (at least one of "
                         "LOCAL_READ, LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ, none other)"
                         % (access, ", ".join(KV_ACCESS)))
    return Access(access)

def sealed_memfd(name: str, size: int) -> int:
    """A memfd of ``size`` bytes (close-on-exec) that can neither shrink nor grow.

    A sidecar maps only memfds sealed with ``F_SEAL_SHRINK``: one its owner
    could truncate would fault the sidecar's copies. The caller owns the fd.
    """
    fd = os.memfd_create(name.replace("/", "_"), os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    except BaseException:
        os.close(fd)
        raise
    return fd


_ARENAS: "weakref.WeakSet[HostArena]" = weakref.WeakSet()


class HostArena:
    """A memfd of ``size`` bytes, mapped here, that hands out CPU torch tensors.

    The hostmem sidecar maps the same memfd (it travels with Register), so
    rows it writes show in the tensors and rows the engine writes are what
    it sends. :meth:`empty` allocates (bump allocation, ``align``-byte
    aligned; nothing is freed before :meth:`close`).
    """

    def __init__(self, size: int, name: str = "stage-kv", align: int = 4096) -> None:
        import torch

        if size <= 0 or align <= 0 or align & (align - 1):
            raise ValueError("HostArena: size %d, align %d (a power of two)" % (size, align))
        self.size, self.align, self.name = size, align, name
        self.fd = sealed_memfd(name, size)
        try:
            self.mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        #: the whole memfd as a uint8 tensor
        self.bytes = torch.frombuffer(self.mm, dtype=torch.uint8)
        self.base = self.bytes.data_ptr()
        self._next = 0
        _ARENAS.add(self)

    def empty(self, shape: Sequence[int], dtype: Any) -> Any:
        """An uninitialized contiguous tensor of ``shape`` and ``dtype`` inside the memfd."""
        import torch

        n = 1
        for x in shape:
            n *= int(x)
        nbytes = n * torch.tensor([], dtype=dtype).element_size()
        off = -(-self._next // self.align) * self.align
        if nbytes > self.size - off:
            raise MemoryError("HostArena %r: %d B wanted at offset %d, the memfd has %d B" % (self.name, nbytes, off, self.size))
        self._next = off + nbytes
        return self.bytes[off:off + nbytes].view(dtype).view(tuple(int(x) for x in shape))

    def offset_of(self, ptr: int, nbytes: int) -> Optional[int]:
        """The memfd offset of ``nbytes`` at address ``ptr``; None when they are not all inside it."""
        off = ptr - self.base
        if 0 <= off <= self.size and nbytes <= self.size - off:
            return off
        return None

    def close(self) -> None:
        """Unmap and close the memfd (the sidecar keeps its own mapping until it unregisters)."""
        _ARENAS.discard(self)
        self.bytes = None
        try:
            self.mm.close()
        except BufferError:
            pass  # tensors over it are still alive; the mapping goes with them
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "HostArena":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _arena_of(ptr: int, nbytes: int, arena: Optional[HostArena]) -> Tuple[HostArena, int]:
    for a in ([arena] if arena is not None else list(_ARENAS)):
        off = a.offset_of(ptr, nbytes)
        if off is not None:
            return a, off
    raise ValueError("a CPU tensor (%d B at %#x) is not inside a HostArena: the hostmem sidecar can only map "
                     "memory in a memfd; allocate the KV cache with HostArena.empty" % (nbytes, ptr))


class KVCache:
    """A KV cache registered with a sidecar: its name, layout and regions.

    ``regions[l][t]`` names the region of tensor ``t`` of layer ``l``;
    ``access`` is the rights its regions were registered with.
    :meth:`close` unregisters the regions (the sidecar then refuses
    transfers of the cache).
    """

    def __init__(self, client: Any, name: str, layout: Layout, regions: List[List[str]], keep: List[Any],
                 access: int = Access.ALL) -> None:
        self.client, self.name, self.layout, self.regions = client, name, layout, regions
        self._keep = keep  # the region tensors (and arenas): alive while registered
        self.access = Access(access)

    @property
    def layers(self) -> int:
        return len(self.regions)

    def _move(self, direction: int, route: str, remote: str, local_blocks: Any, remote_blocks: Any, tokens: int,
              layers: Optional[Sequence[int]], **kw: Any) -> int:
        ls = list(range(self.layers)) if layers is None else list(layers)
        return self.client.submit_kv(route, self.name, remote, ls, local_blocks, remote_blocks, tokens,
                                     direction=direction, **kw)

    def push(self, route: str, remote: str, local_blocks: Any, remote_blocks: Any, tokens: int,
             layers: Optional[Sequence[int]] = None, **kw: Any) -> int:
        """Push ``tokens`` tokens of every layer (or ``layers``) into the peer's KV cache ``remote``.

        Keywords as :meth:`Client.submit_kv` (local_first, remote_first,
        heads, tag, remote_layers, checksum, peer). ``peer=`` names the
        route's decode (node name or host:port); a route of several refuses
        a transfer naming none. Returns the transfer id.
        """
        return self._move(Direction.PUSH, route, remote, local_blocks, remote_blocks, tokens, layers, **kw)

    def pull(self, route: str, remote: str, local_blocks: Any, remote_blocks: Any, tokens: int,
             layers: Optional[Sequence[int]] = None, **kw: Any) -> int:
        """Pull ``tokens`` tokens of the peer's KV cache ``remote`` into this one (as :meth:`push`)."""
        return self._move(Direction.PULL, route, remote, local_blocks, remote_blocks, tokens, layers, **kw)

    def close(self) -> None:
        """Unregister every region (regions already gone are skipped)."""
        names = [n for ns in reversed(self.regions) for n in ns]
        self.regions, self._keep = [], []
        unregister_all(self.client, names)

    def __enter__(self) -> "KVCache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def unregister_all(client: Any, names: Iterable[str], wait: Optional[float] = None) -> None:
    """Unregister every region of ``names``; then raise the first failure other than UNKNOWN_REGION.

    Confirmed unregisters (tensor regions: :meth:`Client.unregister`) share
    one wait of ``wait`` seconds (default DEFAULT_UNREGISTER_WAIT) for the
    transfers holding them, so a transfer that holds every layer does not
    make each layer wait in turn.
    """
    err: Optional[BaseException] = None
    deadline = time.monotonic() + (DEFAULT_UNREGISTER_WAIT if wait is None else wait)
    for n in names:
        try:
            client.unregister(n, wait=max(0.0, deadline - time.monotonic()))
        except StageError as e:
            if e.code != Code.UNKNOWN_REGION and err is None:
                err = e
    if err is not None:
        raise err


def register_kv_cache(client: Any, name: str, tensors_per_layer: Sequence[Union[Any, Sequence[Any]]], preset: Any, *,
                      heads: int, head_lo: int = 0, head_hi: Optional[int] = None, access: Union[int, str] = "local",
                      arena: Optional[HostArena] = None, ordinal: Optional[int] = None, acl: Any = None,
                      **layout_kw: Any) -> KVCache:
    """Register an engine's KV cache (torch tensors) as regions plus a KV layout.

    ``tensors_per_layer[l]``: layer ``l``'s tensors as the engine indexes
    them (one tensor, or one per tensor of ``preset``: ascend's K and V).
    ``preset`` is a preset name or explicit TensorRoles; the rank holds kv
    heads [head_lo, head_hi) of ``heads`` (head_hi default: all).
    ``layout_kw`` go to :meth:`Layout.from_tensor` (head_size, widths,
    page_size, dtype). Each tensor's region is the memory it spans (the
    whole ``kv[layer]`` of a permuted view), named ``f"{name}/{l}/{t}"``.
    CUDA tensors register by IPC handle (``ordinal`` overrides the device
    index); CPU tensors must lie in a :class:`HostArena` (``arena``, else
    any live one). With ``acl`` (a :class:`stage_client.ascend.ACL`), the
    tensors are NPU memory from ``aclrtMalloc`` and register by ACL export
    key with an ``acl`` sidecar. Every layer must have the same layout. Returns a
    :class:`KVCache`; on any failure what was registered is unregistered.

    ``access``: what peers may do with the cache, least privilege by role
    (:data:`KV_ACCESS`): ``"prefill"`` (or vLLM's ``"kv_producer"``) lets
    peers read it (decodes that pull), ``"decode"`` (``"kv_consumer"``)
    lets peers write it (prefills that push), ``"kv_both"`` both. The
    default, ``"local"``, lets no peer read or write it: only this engine's
    own transfers use it. Access bits are taken as they are. The rights
    cover byte-range transfers naming the cache's regions as well as KV
    transfers.
    """
    from .layout.tensors import region_bytes

    rights = kv_access(access)
    layers = [list(ts) if isinstance(ts, (list, tuple)) else [ts] for ts in tensors_per_layer]
    if not layers:
        raise LayoutError("register_kv_cache %r: no layers" % name)
    hi = heads if head_hi is None else head_hi
    bases = [[region_bytes(t) for t in ts] for ts in layers]
    layout: Optional[Layout] = None
    for i, (ts, bs) in enumerate(zip(layers, bases)):
        lay = Layout.from_tensor(ts, preset, head_lo, hi, heads, base=bs, **layout_kw)
        if layout is None:
            layout = lay
        elif lay != layout:
            raise LayoutError("register_kv_cache %r: layer %d's layout %s differs from layer 0's %s"
                              % (name, i, lay.to_dict(), layout.to_dict()))
    assert layout is not None
    cache = KVCache(client, name, layout, [], [], rights)
    try:
        for i, bs in enumerate(bases):
            names = []
            cache.regions.append(names)
            for t, b in enumerate(bs):
                rname = "%s/%d/%d" % (name, i, t)
                _register_region(client, rname, b, rights, arena, ordinal, cache._keep, acl)
                names.append(rname)
        client.register_kv(name, layout, cache.regions)
    except BaseException:
        try:
            cache.close()
        except StageError:
            pass  # the first error is the one to report
        raise
    return cache


def _register_region(client: Any, rname: str, b: Any, access: int, arena: Optional[HostArena],
                     ordinal: Optional[int], keep: List[Any], acl: Any = None) -> None:
    """Register the uint8 tensor ``b`` (a region's bytes) by IPC handle, ACL key, or as part of its memfd."""
    if acl is not None:
        from .ascend import register_npu_tensor

        register_npu_tensor(client, acl, rname, b, access, ordinal=ordinal)
        keep.append(b)
        return
    if getattr(b, "is_cuda", False):
        client.register_tensor(rname, b, access, ordinal=ordinal)
        keep.append(b)
        return
    if b.device.type != "cpu":
        raise ValueError("register_kv_cache: tensors on %s; CUDA and CPU (in a HostArena) are supported" % b.device)
    a, off = _arena_of(b.data_ptr(), b.numel(), arena)
    client.register_memfd(rname, a.fd, a.size, off, b.numel(), access, ordinal=ordinal or 0)
    keep.extend((b, a))
