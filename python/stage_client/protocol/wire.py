"""Encoders and decoders for stage's local control-socket frames: sections
1-5 and 9 of ``docs/PROTOCOL.md`` (the engine <-> sidecar Unix-socket
protocol), every name in one module.

The names live in the modules this one re-exports, each a part of the
protocol; this module keeps the names importable from the one place they
all were before the split (``stage_client.wire`` and the rest of
stage_client import them from here):

* :mod:`.limits`: the header's magic, version and flags, and every limit;
* :mod:`.enums`: FrameType, Code, Access, Direction, State, Checksum,
  QueryKind, HandleKind;
* :mod:`.codec`: ProtocolError, the Message base, the body encoder and
  decoder, and the rules every encoder and decoder keeps;
* :mod:`.frame`: the 16-byte header, CRC32C, :func:`encode_frame`;
* :mod:`.regions`, :mod:`.transfers`, :mod:`.queries`: the messages of
  section 9, Register through Fail.

The KV frames (section 12) are in :mod:`stage_client.protocol.kvwire`, and
:mod:`stage_client.protocol.messages` decodes the body of any local frame
type from the one registry of both.
"""

from __future__ import annotations

# Every name the module had, the private ones too: the package's other
# modules and users' code imported them from here.
from .codec import Message, ProtocolError, _Dec, _Enc, _utf8  # noqa: F401
from .enums import (_CODE_TEXT, _KNOWN_TYPES, Access, Checksum, Code, Direction, FrameType, HandleKind,  # noqa: F401
                    QueryKind, State, _tname, checksum_choice, code_name, to_code, to_handle)
from .frame import (_CRC_TABLE, _HEADER, Header, _crc_table, crc32c, encode_frame, encode_header,  # noqa: F401
                    parse_header, verify_crc)
from .limits import (CHUNK_FIXED_SIZE, FLAG_CRC, FLAG_FD, HEADER_SIZE, LOCAL_OP_SIZE, MAGIC,  # noqa: F401
                     MAX_CHUNK_BODY, MAX_CHUNK_SEGS, MAX_CONTROL_BODY, MAX_HANDLE_BYTES, MAX_JSON, MAX_KV_BLOCKS,
                     MAX_KV_LAYERS, MAX_KV_PARTS, MAX_MESSAGE, MAX_NAME, MAX_NAMES, MAX_OPS, MAX_TAG, VERSION,
                     VERSION_MAX, VERSION_MIN, _KNOWN_FLAGS, _U16_MAX, _U32_MAX, _U64_MAX)
from .queries import OK, Fail, Query, QueryReply  # noqa: F401
from .regions import Register, Unregister  # noqa: F401
from .transfers import (_LOCAL_OP, Cancel, LocalOp, Notify, Status, Submit, Submitted, Subscribe,  # noqa: F401
                        Wait, XferStatus, pack_local_ops, unpack_local_ops)

# The public names as they were before the split, listed (not computed) so
# that a name moving between the modules above cannot drop out of them.
__all__ = [
    "HEADER_SIZE", "VERSION", "MAGIC", "FLAG_CRC", "FLAG_FD",
    "MAX_CONTROL_BODY", "MAX_CHUNK_BODY", "MAX_NAME", "MAX_TAG", "MAX_MESSAGE",
    "MAX_OPS", "MAX_NAMES", "MAX_HANDLE_BYTES", "MAX_JSON", "CHUNK_FIXED_SIZE",
    "FrameType", "Code", "Access", "Direction", "State", "Checksum", "QueryKind",
    "HandleKind", "ProtocolError", "Header", "LocalOp",
    "Register", "Unregister", "Submit", "Submitted", "Wait", "Status",
    "XferStatus", "Cancel", "Subscribe", "Notify", "Query", "QueryReply", "OK",
    "Fail", "Message", "crc32c", "encode_header", "parse_header", "encode_frame",
    "verify_crc", "code_name", "MAX_KV_PARTS", "MAX_KV_LAYERS", "MAX_KV_BLOCKS",
]
