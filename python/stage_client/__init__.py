"""Python client for stage's sidecar (``staged``) local control socket.

Stdlib only; torch is optional (for :meth:`Client.register_tensor`,
:meth:`PagedKV.from_tensors`, :meth:`Layout.from_tensor`,
:func:`register_kv_cache`, :class:`HostArena` and the reference KV mapper in
``stage_client.layout.tensors``). See ``python/README.md``.
"""

from .client import DEFAULT_REQUEST_TIMEOUT, Block, Client, Op, Subscription, TransfersFailed, make_ops
from .errors import ProtocolError, SidecarConnectionError, StageError, StageTimeout
from .kv import HostArena, KVCache, PagedKV, coalesce, register_kv_cache
from .layout import DType, Layout, LayoutError, Part, Side, check, columns, preset, sides
from .protocol.kvwire import KVLayout, RegisterKV, SubmitKV
from .protocol.wire import Access, Checksum, Code, Direction, HandleKind, LocalOp, Notify, QueryKind, State, XferStatus

#: What :meth:`Client.wait` and :meth:`Client.status` return (protocol.XferStatus).
Status = XferStatus

__version__ = "0.1.0"

__all__ = [
    "Client", "Subscription", "Op", "Block", "LocalOp", "make_ops", "DEFAULT_REQUEST_TIMEOUT",
    "StageError", "StageTimeout", "SidecarConnectionError", "ProtocolError", "TransfersFailed",
    "Access", "Checksum", "Code", "Direction", "HandleKind", "QueryKind", "State",
    "Status", "XferStatus", "Notify", "PagedKV", "coalesce", "__version__",
    "HostArena", "KVCache", "register_kv_cache", "KVLayout", "RegisterKV", "SubmitKV",
    "DType", "Layout", "LayoutError", "Part", "Side", "check", "columns", "preset", "sides",
]
