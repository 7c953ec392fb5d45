"""Exceptions raised by the stage client."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from .protocol.wire import Code, ProtocolError, code_name, to_code

if TYPE_CHECKING:  # pragma: no cover
    from .protocol.wire import XferStatus

__all__ = ["StageError", "StageTimeout", "SidecarConnectionError", "ProtocolError"]


class StageError(Exception):
    """A failure the sidecar reported (Fail, or a failed transfer), with its code.

    ``code`` is a :class:`~stage_client.wire.Code` (an ``int``; a code this
    client does not know stays a plain ``int``); ``message`` is the
    sidecar's text. ``status`` is the transfer's XferStatus when the error
    came from a failed transfer, else None.
    """

    def __init__(self, code: int, message: str = "", status: "Optional[XferStatus]" = None) -> None:
        self.code = to_code(code)
        self.message = message
        self.status = status
        super().__init__("stage: %s: %s" % (code_name(self.code), message))

    @property
    def code_name(self) -> str:
        """The code's enum name (``"UNKNOWN_ROUTE"``), or ``code(N)``."""
        return self.code.name if isinstance(self.code, Code) else "code(%d)" % self.code


class StageTimeout(StageError, TimeoutError):
    """A wait or request ran past its time limit (code TIMEOUT).

    For :meth:`Client.wait`, ``status`` holds the transfer's state when the
    limit passed (still queued or running). The transfer goes on; wait
    again, or cancel it.
    """

    def __init__(self, message: str, status: "Optional[XferStatus]" = None) -> None:
        super().__init__(Code.TIMEOUT, message, status)


class SidecarConnectionError(StageError, ConnectionError):
    """The connection to the sidecar could not be made, or is gone.

    Every call in flight on a connection that closes fails with this. When
    the sidecar ended the connection with a connection-level Fail (Req 0),
    ``code`` and ``message`` are that Fail's; otherwise ``code`` is
    INTERNAL.
    """

    def __init__(self, message: str, code: int = Code.INTERNAL) -> None:
        super().__init__(code, message)
