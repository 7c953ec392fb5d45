"""Python client for stage's sidecar (``staged``) local control socket.

Stdlib only; torch is optional (for :meth:`Client.register_tensor` and
:meth:`PagedKV.from_tensors`). See ``python/README.md``.
"""

from .client import DEFAULT_REQUEST_TIMEOUT, Block, Client, Op, Subscription, make_ops
from .errors import ProtocolError, SidecarConnectionError, StageError, StageTimeout
from .kv import PagedKV, coalesce
from .wire import Access, Checksum, Code, Direction, HandleKind, LocalOp, Notify, QueryKind, State, XferStatus

#: What :meth:`Client.wait` and :meth:`Client.status` return (wire.XferStatus).
Status = XferStatus

__version__ = "0.1.0"

__all__ = [
    "Client", "Subscription", "Op", "Block", "LocalOp", "make_ops", "DEFAULT_REQUEST_TIMEOUT",
    "StageError", "StageTimeout", "SidecarConnectionError", "ProtocolError",
    "Access", "Checksum", "Code", "Direction", "HandleKind", "QueryKind", "State",
    "Status", "XferStatus", "Notify", "PagedKV", "coalesce", "__version__",
]
