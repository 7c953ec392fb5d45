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

Tickets are JSON objects of fixed keys (:func:`check_ticket`); nothing
here executes them. Because a ticket tells the prefill where to write,
the TCP server authenticates them: with a shared ``secret`` each line is
``stage1 <hmac> <body>``, the HMAC-SHA256 of the body under the secret,
and the body carries a timestamp (refused outside ``max_skew`` seconds)
and a nonce (refused when seen again), so a ticket can be neither forged
nor replayed. Without a secret the server binds loopback addresses only,
and only when asked to (``insecure=True``): an unsigned line can be
replayed by anyone who can reach the port.

Deprecated for vLLM: its push tickets travel over the sidecars' own link
(:mod:`stage_client.vllm.tickets`, PROTOCOL.md 9.19); the connector's
rendezvous keys go in the next release and log a warning when used. The
SGLang adapter still uses this server as its bootstrap.
Every line, key, ticket and connection count is bounded, and malformed
input is answered ``error ...`` and dropped, never raised in the server.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import socket
import socketserver
import threading
import time
from typing import Any, Dict, Optional, Tuple, Union

from .engines import MAX_TP

__all__ = ["LocalRendezvous", "RendezvousServer", "post", "parse_addr", "check_ticket", "load_secret",
           "MAX_LINE", "MAX_KEY", "insecure_env"]

MAX_LINE = 4 << 20  # a 1M-token request's block table at 16 tokens per block, as JSON
MAX_KEY = 512  # bytes of a transfer key (it becomes part of a transfer tag)
MAX_BLOCKS = 1 << 20
MAX_NAME = 256  # bytes of a peer or KV cache name
PROTO = "stage1"
_TICKET_KEYS = {"peer": str, "kv": str, "tp": int, "block_ids": list, "first": int, "tokens": int}
#: optional, together: an SGLang decode's metadata slot and its buffers' bytes per slot
_AUX_KEYS = {"aux_index": int, "aux_items": list}
MAX_AUX = 64  # aux buffers per ticket
MAX_GRANT = 256  # bytes of a ticket's optional grant (a capability for the decode's blocks; carried, not checked)
MAX_AUX_ITEM = 1 << 26  # bytes of one aux buffer's slot


def check_ticket(t: Any) -> Dict[str, Any]:
    """``t`` if it is a well-formed ticket; else ValueError saying what is wrong."""
    if not isinstance(t, dict):
        raise ValueError("a ticket is an object")
    aux = "aux_index" in t or "aux_items" in t
    keys = dict(_TICKET_KEYS, **_AUX_KEYS) if aux else _TICKET_KEYS
    if aux and "aux_tickets" in t:  # the decode takes the aux bytes as tickets (kind 3), naming its grant
        if t["aux_tickets"] is not True or "grant" not in t:
            raise ValueError("ticket aux_tickets: true, with a grant")
        keys = dict(keys, aux_tickets=bool)
    if "grant" in t:  # the decode's grant of writes into block_ids (PROTOCOL.md 9.20): 16..64 bytes, hex
        g = t["grant"]
        if type(g) is not str or not 32 <= len(g) <= 128 or len(g) % 2 or any(c not in "0123456789abcdef" for c in g):
            raise ValueError("ticket grant: 16 to 64 bytes in lower-case hex")
        keys = dict(keys, grant=str)
    if set(t) != set(keys):
        raise ValueError("ticket keys %s, want %s (aux_index and aux_items go together)" % (
            sorted(map(str, t))[:10], sorted(keys)))
    for k, typ in keys.items():
        if type(t[k]) is not typ:  # bool is an int to isinstance
            raise ValueError("ticket %s: %s, want %s" % (k, type(t[k]).__name__, typ.__name__))
    if aux:
        items = t["aux_items"]
        if not 0 <= t["aux_index"] < 1 << 31 or not 0 < len(items) <= MAX_AUX or any(
                type(n) is not int or not 0 < n <= MAX_AUX_ITEM for n in items):
            raise ValueError("ticket aux: index 0..2^31-1 and 1..%d item sizes of 1..%d bytes" % (MAX_AUX, MAX_AUX_ITEM))
    if len(t["peer"].encode()) > MAX_NAME or not 0 < len(t["kv"].encode()) <= MAX_NAME:
        raise ValueError("ticket peer or kv name empty or over %d bytes" % MAX_NAME)
    if not 1 <= t["tp"] <= MAX_TP:
        raise ValueError("ticket tp %d, want 1..%d" % (t["tp"], MAX_TP))
    if t["first"] < 0 or not 1 <= t["tokens"] <= 1 << 40:
        raise ValueError("ticket token range first %d, tokens %d" % (t["first"], t["tokens"]))
    ids = t["block_ids"]
    if not 0 < len(ids) <= MAX_BLOCKS or any(type(b) is not int or not 0 <= b < 1 << 31 for b in ids):
        raise ValueError("ticket block_ids: 1..%d non-negative 32-bit integers" % MAX_BLOCKS)
    return t


def _check_key(key: Any) -> str:
    if not isinstance(key, str) or not 0 < len(key.encode()) <= MAX_KEY:
        raise ValueError("a key is a string of 1..%d bytes" % MAX_KEY)
    return key


def load_secret(secret: str = "", secret_file: str = "") -> Optional[bytes]:
    """The rendezvous secret: ``secret``, else the first line of ``secret_file``, else
    ``$STAGE_RENDEZVOUS_SECRET``; None when none is set."""
    if secret_file and not secret:
        with open(secret_file, "rb") as f:
            raw = f.read(4096).splitlines()
        secret = raw[0].decode() if raw else ""
        if not secret:
            raise ValueError("rendezvous secret file %s is empty" % secret_file)
    secret = secret or os.environ.get("STAGE_RENDEZVOUS_SECRET", "")
    return secret.encode() if secret else None


def insecure_env() -> bool:
    """Whether ``$STAGE_RENDEZVOUS_INSECURE`` is 1: a rendezvous without a secret may start (loopback only)."""
    return os.environ.get("STAGE_RENDEZVOUS_INSECURE", "") == "1"


def _mac(secret: bytes, body: bytes) -> str:
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


class LocalRendezvous:
    """Tickets by key, in this process; each kept ``ttl`` seconds at most, ``max_tickets`` at once."""

    max_tickets = 1 << 16

    def __init__(self, ttl: float = 600.0) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._tickets: Dict[str, Tuple[float, Dict[str, Any]]] = {}

    def post(self, key: str, ticket: Dict[str, Any]) -> None:
        """Keep ``ticket`` under ``key``; ValueError for a malformed one, or when full."""
        _check_key(key)
        check_ticket(ticket)
        with self._lock:
            if len(self._tickets) >= self.max_tickets and key not in self._tickets:
                self._expire()
                if len(self._tickets) >= self.max_tickets:
                    raise ValueError("rendezvous full: %d tickets waiting" % len(self._tickets))
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


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        srv: "_Server" = self.server  # type: ignore[assignment]
        try:
            key, ticket = srv.store.verify(_read_line(self.request, srv.read_timeout))
            srv.store.post(key, ticket)
        except ValueError as e:
            self._answer("error %s" % e)
            return
        except OSError:
            return  # the poster went away
        self._answer("ok")

    def _answer(self, text: str) -> None:
        try:
            self.request.sendall((text.replace("\n", " ")[:512] + "\n").encode())
        except OSError:
            pass


def _read_line(sock: socket.socket, limit: float) -> bytes:
    """One line of at most MAX_LINE bytes within ``limit`` seconds in all (a slow poster holds no thread longer)."""
    deadline = time.monotonic() + limit
    buf = bytearray()
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ValueError("no complete line within %ss" % limit)
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            raise ValueError("no complete line within %ss" % limit) from None
        if not chunk:
            raise ValueError("connection closed before the end of the line")
        buf += chunk
        if len(buf) > MAX_LINE + 1:
            raise ValueError("line over %d bytes" % MAX_LINE)
    line = bytes(buf[:buf.index(b"\n")])
    if len(line) > MAX_LINE:
        raise ValueError("line over %d bytes" % MAX_LINE)
    return line


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # the listen backlog: a burst of posts waits here instead of being reset
    store: "RendezvousServer"
    read_timeout = 5.0
    max_conns = 64

    def server_bind(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_conns)
        super().server_bind()

    def process_request(self, request: Any, client_address: Any) -> None:
        # at most max_conns connections at a time: one more is refused at once, not given a thread
        if not self._slots.acquire(blocking=False):
            try:
                request.sendall(b"error busy\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class RendezvousServer(LocalRendezvous):
    """A :class:`LocalRendezvous` that also takes tickets over TCP on ``host:port`` (port 0: any).

    With ``secret`` (bytes) every ticket must carry its HMAC and a fresh
    timestamp and nonce; without, the server listens on loopback only.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, ttl: float = 600.0,
                 secret: Optional[bytes] = None, max_skew: float = 60.0, max_conns: int = 64,
                 insecure: bool = False) -> None:
        super().__init__(ttl)
        if not secret and not _loopback(host):
            raise ValueError("a rendezvous on %s takes tickets from the network: give it a secret "
                             "(rendezvous_secret or rendezvous_secret_file), or listen on 127.0.0.1" % host)
        if not secret and not insecure:
            raise ValueError("a rendezvous without a secret takes unsigned tickets, replayable by anyone who can "
                             "reach it: give it a secret (rendezvous_secret or rendezvous_secret_file), or pass "
                             "insecure=True (rendezvous_insecure) for a test on loopback")
        self.secret, self.max_skew = secret or None, max_skew
        self._nonces: Dict[str, float] = {}
        self._srv = _Server((host, port), _Handler, bind_and_activate=False)
        self._srv.store, self._srv.max_conns = self, max_conns
        try:
            self._srv.server_bind()
            self._srv.server_activate()
        except OSError:
            self._srv.server_close()
            raise
        self._thread = threading.Thread(target=self._srv.serve_forever, name="stage-rendezvous", daemon=True)
        self._thread.start()

    def verify(self, line: bytes) -> Tuple[str, Dict[str, Any]]:
        """(key, ticket) of one posted line; ValueError when it is malformed, forged, stale or replayed."""
        proto, _, rest = line.partition(b" ")
        mac, _, body = rest.partition(b" ")
        if proto != PROTO.encode() or not body:
            raise ValueError("not a %s line" % PROTO)
        if self.secret is None:
            if mac != b"-":
                raise ValueError("this rendezvous has no secret; the poster has one")
        elif not hmac.compare_digest(mac, _mac(self.secret, body).encode()):
            raise ValueError("bad ticket signature")
        try:
            msg = json.loads(body)
        except ValueError:
            raise ValueError("body is not JSON") from None
        except RecursionError:
            raise ValueError("body nested too deep") from None
        if not isinstance(msg, dict):
            raise ValueError("body is not an object")
        key, ticket = _check_key(msg.get("key")), check_ticket(msg.get("ticket"))
        if self.secret is not None:
            self._fresh(msg.get("ts"), msg.get("nonce"))
        return key, ticket

    def _fresh(self, ts: Any, nonce: Any) -> None:
        if type(ts) not in (int, float) or not abs(time.time() - ts) <= self.max_skew:
            raise ValueError("ticket timestamp missing or over %ss off this clock" % self.max_skew)
        if not isinstance(nonce, str) or not 16 <= len(nonce) <= 64:
            raise ValueError("ticket nonce missing")
        now = time.monotonic()
        with self._lock:
            for n in [n for n, exp in self._nonces.items() if exp < now]:
                del self._nonces[n]
            if nonce in self._nonces:
                raise ValueError("ticket replayed")
            if len(self._nonces) >= 4 * self.max_tickets:
                raise ValueError("too many tickets of late")
            self._nonces[nonce] = now + 2 * self.max_skew

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


def post(addr: str, key: str, ticket: Dict[str, Any], timeout: float = 5.0,
         secret: Optional[bytes] = None) -> None:
    """Send ``ticket`` under ``key`` to the :class:`RendezvousServer` at ``addr`` (signed with
    ``secret`` when given); raises OSError or ValueError."""
    _check_key(key)
    check_ticket(ticket)
    msg: Dict[str, Union[str, float, Dict[str, Any]]] = {"key": key, "ticket": ticket}
    if secret:
        msg["ts"], msg["nonce"] = time.time(), os.urandom(16).hex()
    body = json.dumps(msg, separators=(",", ":")).encode()
    line = b"%s %s %s\n" % (PROTO.encode(), _mac(secret, body).encode() if secret else b"-", body)
    if len(line) > MAX_LINE:
        raise ValueError("ticket for %r is %d bytes, over %d" % (key, len(line), MAX_LINE))
    with socket.create_connection(parse_addr(addr), timeout=timeout) as s:
        s.sendall(line)
        f = s.makefile("rb")
        ans = f.readline(4096).decode("utf-8", "replace").strip()
    if ans != "ok":
        raise OSError("rendezvous %s refused the ticket for %r: %s" % (addr, key, ans or "no answer"))
