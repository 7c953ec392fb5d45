"""The enumerations (``docs/PROTOCOL.md`` sections 3 and 5): frame types,
failure codes, access rights, directions, transfer states, checksum
choices, query kinds and handle kinds.

A field the receiver must not refuse (a failure code, a handle kind) may
carry a value this build does not know; :func:`to_code` and
:func:`to_handle` keep such a value as a plain ``int``, and
:func:`code_name` prints it as Go does.
"""

from __future__ import annotations

import enum
from typing import Dict, Union

__all__ = [
    "FrameType", "Code", "Access", "Direction", "State", "Checksum", "QueryKind", "HandleKind",
    "to_code", "code_name", "checksum_choice", "to_handle",
]


class FrameType(enum.IntEnum):
    """Frame types (section 3). 1..63 peer, 64 chunk, 128..141 and 151..155 local."""

    HELLO = 1
    CHALLENGE = 2
    AUTH = 3
    WELCOME = 4
    DATA_HELLO = 5
    DATA_ACCEPT = 6
    CATALOG_REQUEST = 7
    CATALOG = 8
    ANNOUNCE = 9
    PULL_REQUEST = 10
    ACCEPT = 11
    ACK = 12
    NACK = 13
    CREDIT = 14
    HEARTBEAT = 15
    GOODBYE = 16
    ERROR = 17
    CHUNK = 64
    REGISTER = 128
    UNREGISTER = 129
    SUBMIT = 130
    SUBMITTED = 131
    WAIT = 132
    STATUS = 133
    XFER_STATUS = 134
    CANCEL = 135
    SUBSCRIBE = 136
    NOTIFY = 137
    QUERY = 138
    QUERY_REPLY = 139
    OK = 140
    FAIL = 141
    REGISTER_KV = 151  # PROTOCOL.md 12.5; the message lives in kvwire
    SUBMIT_KV = 152  # 12.6
    JOIN = 153  # 9.18; the message lives in group
    OPEN_INBOX = 154  # 9.19; the messages live in tickets
    POST_TICKET = 155
    TAKE_TICKETS = 156
    TICKETS = 157
    GRANT = 158  # 9.20; the messages live in grants
    REVOKE_GRANT = 159
    SUBMIT_MORE = 160  # 9.5b; the messages live in pieces
    SUBMIT_HEAD = 161


_KNOWN_TYPES = frozenset(int(t) for t in FrameType)


def _tname(t: int) -> str:
    """A frame type's name for error text; ``type(N)`` for one this build does not know, since the error
    being built must not turn into a ValueError of its own."""
    try:
        return FrameType(t).name
    except ValueError:
        return "type(%d)" % t


class Code(enum.IntEnum):
    """Failure codes (u16), used by XferStatus, Notify and Fail.

    A receiver accepts any value; values not listed here are kept as plain
    ``int`` (see :func:`code_name`).
    """

    OK = 0
    BAD_REQUEST = 1
    UNKNOWN_ROUTE = 2
    UNKNOWN_REGION = 3
    OUT_OF_RANGE = 4
    ACCESS_DENIED = 5
    AUTH_FAILED = 6
    PEER_UNAVAILABLE = 7
    TIMEOUT = 8
    CANCELLED = 9
    CHECKSUM = 10
    INTERNAL = 11
    BUSY = 12
    EXISTS = 13
    UNSUPPORTED = 14
    MALFORMED = 15
    UNKNOWN_TRANSFER = 16
    DEVICE = 17
    SHUTDOWN = 18
    UNKNOWN_PEER = 19

    @property
    def text(self) -> str:
        """The code's text as the Go code prints it ("unknown route")."""
        return _CODE_TEXT[self]


_CODE_TEXT: Dict[int, str] = {
    0: "ok", 1: "bad request", 2: "unknown route", 3: "unknown region",
    4: "out of range", 5: "access denied", 6: "authentication failed",
    7: "peer unavailable", 8: "timeout", 9: "cancelled", 10: "checksum mismatch",
    11: "internal error", 12: "busy", 13: "already exists", 14: "unsupported",
    15: "malformed", 16: "unknown transfer", 17: "device error", 18: "shutting down", 19: "unknown peer",
}


def to_code(value: int) -> int:
    """Return ``Code(value)`` when the value is known, else the plain int."""
    try:
        return Code(value)
    except ValueError:
        return int(value)


def code_name(value: int) -> str:
    """The text for a code, ``code(N)`` for an unknown one (as Go prints it)."""
    return _CODE_TEXT.get(int(value), "code(%d)" % int(value))


class Access(enum.IntFlag):
    """Region access rights (u8 bit set); bits 4..7 must be 0."""

    NONE = 0
    LOCAL_READ = 0x01  # the local engine may push from the region
    LOCAL_WRITE = 0x02  # the local engine may pull into the region
    REMOTE_WRITE = 0x04  # peers may push into the region
    REMOTE_READ = 0x08  # peers may pull from the region
    ALL = 0x0F


class Direction(enum.IntEnum):
    """Transfer direction (u8): push local -> peer, pull peer -> local."""

    PUSH = 1
    PULL = 2


class State(enum.IntEnum):
    """Transfer state (u8), in XferStatus."""

    QUEUED = 1
    RUNNING = 2
    DONE = 3
    FAILED = 4


class Checksum(enum.IntEnum):
    """Per-transfer checksum choice (u8), in Submit."""

    ROUTE = 0  # as the route's configuration says
    ON = 1  # chunks carry a CRC32C
    OFF = 2


def checksum_choice(c: Union[None, bool, int]) -> "Checksum":
    """The Checksum of a caller's choice: None as the route says, True/False on/off, else the number."""
    if c is None:
        return Checksum.ROUTE
    if c is True:
        return Checksum.ON
    if c is False:
        return Checksum.OFF
    return Checksum(c)


class QueryKind(enum.IntEnum):
    """What a Query asks for; the answer is JSON."""

    STATS = 1
    ROUTES = 2
    REGIONS = 3
    CATALOG = 4  # Arg: route name
    DEVICE = 5  # the sidecar's device (bare_tgid, physical_id for acl)
    FEATURES = 6  # the optional requests it takes (submit_pieces: PROTOCOL.md 9.5b)


class HandleKind(enum.IntEnum):
    """Register.Handle: how the sidecar reaches the memory."""

    NONE = 0
    MEMFD = 1  # a memfd travels with the frame (FLAG_FD)
    CUDA_IPC = 2  # handle: CUDA legacy IPC handle, 64 bytes
    POSIX_FD = 3  # a VMM allocation exported as a POSIX fd (FLAG_FD)
    ACL_KEY = 4  # handle: Ascend IPC export key
    HIP_IPC = 5  # handle: HIP IPC handle, 64 bytes
    HOST_ADDR = 6  # an address in the sidecar's own process (refused on the socket)
    ACL_VMM = 7  # handle: Ascend VMM chunk list (PROTOCOL.md section 5)


def to_handle(v: int) -> int:
    """HandleKind(v) when known, else the plain int (wire carries any value)."""
    try:
        return HandleKind(v)
    except ValueError:
        return v
