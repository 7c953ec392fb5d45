"""The local control socket's byte layouts (``docs/PROTOCOL.md``), pure Python.

* :mod:`.wire`: every name of sections 1 to 5 and 9 in one module, as
  before they were split into the seven below (and the name the rest of
  stage_client imports them by);
* :mod:`.limits`: the header's magic, version and flags, and every limit
  (sections 2 and 4);
* :mod:`.enums`: FrameType, Code, Access, Direction, State, Checksum,
  QueryKind, HandleKind (sections 3 and 5);
* :mod:`.codec`: ProtocolError, the Message base, and the body encoder and
  decoder every message uses;
* :mod:`.frame`: the 16-byte header, CRC32C, ``encode_frame``;
* :mod:`.regions`: Register and Unregister (9.3, 9.4);
* :mod:`.transfers`: LocalOp, Submit, Submitted, Wait, Status, XferStatus,
  Cancel, Subscribe and Notify (9.5 to 9.12);
* :mod:`.queries`: Query and QueryReply, and the plain answers OK and Fail
  (9.13 to 9.16);
* :mod:`.fields`: the codec of messages that are a plain run of fields;
* :mod:`.kvwire`: the KV frames RegisterKV and SubmitKV (12.5, 12.6);
* :mod:`.group`: Join (9.18), a connection joining an ownership group;
* :mod:`.tickets`: OpenInbox, PostTicket, TakeTickets, Tickets (9.19), short messages between engines;
* :mod:`.grants`: Grant and RevokeGrant (9.20), which peer request may read or write which blocks;
* :mod:`.pieces`: SubmitHead and SubmitMore (9.5b), a large Submit sent in pieces;
* :mod:`.messages`: the one registry of every local message type, built
  once, with :func:`decode_body` and :func:`decode_frame`.

``stage_client.wire`` and ``stage_client.kvwire`` re-export these under
their old names, for users; nothing in stage_client imports those. This
package imports nothing outside itself but the standard library (as the Go
package ``wire``): a KV layout travels as its own plain types
(:class:`KVLayout`, :class:`KVPart`), which ``stage_client.kvclient``
converts to and from :class:`stage_client.layout.Layout`.
"""

from .group import *  # noqa: F401,F403
from .grants import *  # noqa: F401,F403
from .grants import __all__ as _grants_all
from .group import __all__ as _group_all
from .kvwire import *  # noqa: F401,F403
from .kvwire import __all__ as _kvwire_all
from .messages import *  # noqa: F401,F403
from .messages import __all__ as _messages_all
from .pieces import *  # noqa: F401,F403
from .pieces import __all__ as _pieces_all
from .wire import *  # noqa: F401,F403
from .wire import __all__ as _wire_all

__all__ = list(_wire_all) + list(_kvwire_all) + list(_group_all) + list(_grants_all) + list(_messages_all) + list(_pieces_all)
