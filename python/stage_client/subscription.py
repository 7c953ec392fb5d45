"""One :meth:`Client.subscribe <stage_client.client.Client.subscribe>` call's queue of Notify frames.

Kept apart from client.py because it has a life of its own: the client's
reader thread only puts into it and ends it (connection.py), and the
caller's threads (or asyncio tasks) only read it; it touches the client
once, to take itself off the client's list when closed.
"""

from __future__ import annotations

import asyncio
import queue
from typing import Any, Iterator, Optional

from .errors import SidecarConnectionError
from .protocol.wire import Notify

__all__ = ["Subscription"]


class Subscription:
    """Notifications of one :meth:`Client.subscribe` call.

    Iterate it (``for n in sub``: ends when the connection closes) or call
    :meth:`get`. Notifications arrive on the client's reader thread and wait
    in a queue of ``maxsize``; when the queue is full new ones are dropped
    and counted in :attr:`dropped` (a reader that stalls must not stall the
    answers to requests).
    """

    _END = object()

    # ``client`` is Any, not Client: naming Client here would make this module import client.py, which
    # imports it (tests/test_import_graph.py refuses the cycle); only its _unsubscribe is used.
    def __init__(self, client: Any, maxsize: int) -> None:
        self._client = client
        self._q: "queue.Queue[Any]" = queue.Queue(maxsize=maxsize + 1)  # +1: room for the end marker
        self._max = maxsize
        self._ended = False
        self.dropped = 0

    def _put(self, n: Notify) -> None:
        if self._q.qsize() >= self._max:
            self.dropped += 1
            return
        try:
            self._q.put_nowait(n)
        except queue.Full:
            self.dropped += 1

    def _end(self) -> None:
        try:
            self._q.put_nowait(self._END)
        except queue.Full:  # pragma: no cover - the +1 slot is kept free
            pass

    def get(self, timeout: Optional[float] = None) -> Optional[Notify]:
        """The next notification; None when ``timeout`` seconds passed first.

        Raises SidecarConnectionError once the connection closed and every
        queued notification was read.
        """
        if self._ended:
            raise SidecarConnectionError("the connection to the sidecar is closed; no more notifications")
        try:
            n = self._q.get(timeout=timeout)
        except queue.Empty:
            return None
        if n is self._END:
            self._ended = True
            self._end()  # for other readers of this subscription
            raise SidecarConnectionError("the connection to the sidecar is closed; no more notifications")
        return n

    async def get_async(self, timeout: Optional[float] = None) -> Optional[Notify]:
        """:meth:`get` for asyncio (runs the blocking get in the default executor)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.get, timeout)

    def __iter__(self) -> Iterator[Notify]:
        while True:
            try:
                n = self.get()
            except SidecarConnectionError:
                return
            if n is not None:
                yield n

    def close(self) -> None:
        """Stop collecting notifications here (the sidecar keeps sending them
        to the connection; other subscriptions still get them)."""
        self._client._unsubscribe(self)
        self._end()
