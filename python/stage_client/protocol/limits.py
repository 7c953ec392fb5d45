"""The protocol's numbers (``docs/PROTOCOL.md`` sections 2 and 4): the
header's magic, version and flags, and the limit on every body, count and
field.

Every other module of the package checks against these, the decoders when
they read and the encoders before they send (:mod:`.codec` says why); the
Go package ``wire`` (frame.go, kv.go) holds the same numbers.
"""

__all__ = [
    "HEADER_SIZE", "VERSION", "VERSION_MIN", "VERSION_MAX", "MAGIC", "FLAG_CRC", "FLAG_FD",
    "MAX_CONTROL_BODY", "MAX_CHUNK_BODY", "MAX_CHUNK_SEGS", "MAX_NAME", "MAX_TAG", "MAX_MESSAGE",
    "MAX_OPS", "MAX_NAMES", "MAX_HANDLE_BYTES", "MAX_JSON", "MAX_KV_PARTS", "MAX_KV_LAYERS", "MAX_KV_BLOCKS",
    "CHUNK_FIXED_SIZE", "LOCAL_OP_SIZE",
]

MAGIC = b"SG"
VERSION = 1
VERSION_MIN = 1
VERSION_MAX = 1
HEADER_SIZE = 16

FLAG_CRC = 0x0001
FLAG_FD = 0x0002
_KNOWN_FLAGS = FLAG_CRC | FLAG_FD

MAX_CONTROL_BODY = 16 << 20
MAX_CHUNK_BODY = 257 << 20
MAX_CHUNK_SEGS = 1 << 16
MAX_NAME = 255
MAX_TAG = 1024
MAX_MESSAGE = 4096
MAX_OPS = 1 << 20
MAX_NAMES = 4096
MAX_HANDLE_BYTES = 65528  # an acl-vmm chunk list of 4094 chunks: 24 + 16 * 4094
MAX_JSON = 8 << 20
MAX_KV_PARTS = 8
MAX_KV_LAYERS = 4096
MAX_KV_BLOCKS = 1 << 20
CHUNK_FIXED_SIZE = 24

# The largest value of each unsigned width: the encoders check a field against
# it, so a value that does not fit is refused rather than wrapped.
_U16_MAX = 0xFFFF
_U32_MAX = 0xFFFFFFFF
_U64_MAX = 0xFFFFFFFFFFFFFFFF

#: Bytes of one LocalOp on the wire (u32 local, u32 remote, u64 offsets, u64 length).
LOCAL_OP_SIZE = 32
