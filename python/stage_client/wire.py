"""Encoders and decoders of the local control socket's frames: the names of
:mod:`stage_client.protocol` (its ``wire``, ``kvwire`` and ``messages``),
kept importable here as they were before that package existed, for users.
Nothing in stage_client imports this module.
"""

from .protocol.kvwire import KVLayout, KVPart, RegisterKV, SubmitKV
from .protocol.messages import decode_body, decode_frame
from .protocol.wire import *  # noqa: F401,F403
# Public, not in __all__, imported by name elsewhere.
from .protocol.wire import (LOCAL_OP_SIZE, MAX_CHUNK_SEGS, VERSION_MAX, VERSION_MIN, checksum_choice,  # noqa: F401
                            to_code, to_handle)

# The same names as before the move, listed (not computed) for type checkers.
__all__ = [
    "HEADER_SIZE", "VERSION", "MAGIC", "FLAG_CRC", "FLAG_FD",
    "MAX_CONTROL_BODY", "MAX_CHUNK_BODY", "MAX_NAME", "MAX_TAG", "MAX_MESSAGE",
    "MAX_OPS", "MAX_NAMES", "MAX_HANDLE_BYTES", "MAX_JSON", "CHUNK_FIXED_SIZE",
    "FrameType", "Code", "Access", "Direction", "State", "Checksum", "QueryKind",
    "HandleKind", "ProtocolError", "Header", "LocalOp",
    "Register", "Unregister", "Submit", "Submitted", "Wait", "Status",
    "XferStatus", "Cancel", "Subscribe", "Notify", "Query", "QueryReply", "OK",
    "Fail", "Message", "crc32c", "encode_header", "parse_header", "encode_frame",
    "decode_body", "decode_frame", "verify_crc", "code_name",
    "MAX_KV_PARTS", "MAX_KV_LAYERS", "MAX_KV_BLOCKS", "RegisterKV", "SubmitKV", "KVLayout", "KVPart",
]
