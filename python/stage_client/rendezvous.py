"""Where a decode tells a prefill which blocks to push a request's KV into.

In push mode the decode allocates first and the prefill writes into the
decode's blocks, so the decode's block table (a *ticket*: its sidecar's
peer name, its KV cache name, its tensor-parallel size, the block ids and
the token range) must reach the prefill. vLLM's connector interface has no
channel for that (kv_transfer_params flow from the router into a request
and out at its end), and SGLang's has a bootstrap server; this module is
that channel, keyed by a transfer key both sides know (the router's
``stage_xfer`` in vLLM, the bootstrap room in SGLang):

* :class:`RendezvousServer`: a small TCP server in the prefill process (the
  vLLM scheduler, the SGLang prefill) that keeps tickets until taken or
  until they expire; :func:`post` sends one from the decode, one JSON line
  per connection, answered ``ok``.
* :class:`LocalRendezvous`: the same in one process (tests, and a router
  that already put the ticket in the prefill's params).

Tickets are plain JSON objects; nothing here trusts or executes them, but
the server has no authentication: bind it to the cluster network only
(docs/ENGINES.md).
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from typing import Any, Dict, Optional, Tuple

__all__ = ["LocalRendezvous", "RendezvousServer", "post", "parse_addr"]

MAX_TICKET = 4 << 20  # a 1M-token request's block table at 16 tokens per block, as JSON


class LocalRendezvous:
    """Tickets by key, in this process; each kept ``ttl`` seconds at most."""

    def __init__(self, ttl: float = 600.0) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._tickets: Dict[str, Tuple[float, Dict[str, Any]]] = {}

    def post(self, key: str, ticket: Dict[str, Any]) -> None:
        with self._lock:
            self._expire()
            self._tickets[key] = (time.monotonic() + self.ttl, dict(ticket))

    def take(self, key: str) -> Optional[Dict[str, Any]]:
        """The ticket posted under ``key`` (removed), or None."""
        with self._lock:
            self._expire()
            t = self._tickets.pop(key, None)
        return None if t is None else t[1]

    def get(self, key: str) -> Optional[Dict[str, Any]]:
        """The ticket posted under ``key``, left for other readers (each tensor-parallel rank reads it), or None."""
        with self._lock:
            self._expire()
            t = self._tickets.get(key)
        return None if t is None else dict(t[1])

    def __len__(self) -> int:
        with self._lock:
            return len(self._tickets)

    def _expire(self) -> None:
        now = time.monotonic()
        for k in [k for k, (exp, _) in self._tickets.items() if exp < now]:
            del self._tickets[k]


class _Handler(socketserver.StreamRequestHandler):
    timeout = 10

    def handle(self) -> None:
        line = self.rfile.readline(MAX_TICKET + 1)
        try:
            if len(line) > MAX_TICKET:
                raise ValueError("ticket over %d bytes" % MAX_TICKET)
            msg = json.loads(line)
            key, ticket = msg["key"], msg["ticket"]
            if not isinstance(key, str) or not isinstance(ticket, dict):
                raise ValueError("key must be a string and ticket an object")
        except (ValueError, KeyError, TypeError) as e:
            self.wfile.write(("error %s\n" % e).encode())
            return
        self.server.store.post(key, ticket)  # type: ignore[attr-defined]
        self.wfile.write(b"ok\n")


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class RendezvousServer(LocalRendezvous):
    """A :class:`LocalRendezvous` that also takes tickets over TCP on ``host:port`` (port 0: any)."""

    def __init__(self, host: str = "0.0.0.0", port: int = 0, ttl: float = 600.0) -> None:
        super().__init__(ttl)
        self._srv = _Server((host, port), _Handler)
        self._srv.store = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._srv.serve_forever, name="stage-rendezvous", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """``host:port`` it listens on (the host as bound: 0.0.0.0 means every address)."""
        h, p = self._srv.server_address[:2]
        return "%s:%d" % (h, p)

    def close(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()
        self._thread.join(5)


def parse_addr(addr: str) -> Tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError("rendezvous address %r is not host:port" % addr)
    return host.strip("[]") or "127.0.0.1", int(port)


def post(addr: str, key: str, ticket: Dict[str, Any], timeout: float = 5.0) -> None:
    """Send ``ticket`` under ``key`` to the :class:`RendezvousServer` at ``addr``; raises OSError or ValueError."""
    body = (json.dumps({"key": key, "ticket": ticket}, separators=(",", ":")) + "\n").encode()
    if len(body) > MAX_TICKET:
        raise ValueError("ticket for %r is %d bytes, over %d" % (key, len(body), MAX_TICKET))
    with socket.create_connection(parse_addr(addr), timeout=timeout) as s:
        s.sendall(body)
        f = s.makefile("rb")
        ans = f.readline(4096).decode("utf-8", "replace").strip()
    if ans != "ok":
        raise OSError("rendezvous %s refused the ticket for %r: %s" % (addr, key, ans or "no answer"))
