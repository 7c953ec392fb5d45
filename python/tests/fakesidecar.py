"""A scripted stand-in for staged's control socket, for client unit tests."""

from __future__ import annotations

import array
import os
import socket
import sys
import tempfile
import threading
import time
from typing import Callable, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stage_client import wire  # noqa: E402

# handler(server, header, message, fd) -> frames (bytes) to send back, in order
Handler = Callable[["FakeSidecar", wire.Header, wire.Message, int], List[bytes]]


class FakeSidecar:
    """Listens on a Unix socket in a temporary directory, accepts one
    connection, reads frames (with SCM_RIGHTS fds) and answers what the
    handler returns. Every received (header, message, fd) is recorded."""

    def __init__(self, handler: Handler, path: Optional[str] = None) -> None:
        # path: listen there (a restarted sidecar at its old socket); else in a temporary directory of its own
        self.dir = tempfile.TemporaryDirectory(prefix="stage-fake-") if path is None else None
        self.path = path or os.path.join(self.dir.name, "s.sock")  # type: ignore[union-attr]
        if path is not None and os.path.exists(path):
            os.unlink(path)
        self.handler = handler
        self.ln = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ln.bind(self.path)
        self.ln.listen(1)
        self.conn: Optional[socket.socket] = None
        self.got: List[Tuple[wire.Header, wire.Message, int]] = []
        self.wlock = threading.Lock()
        self.error: Optional[BaseException] = None
        self.connected = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def send(self, frame: bytes) -> None:
        assert self.conn is not None
        with self.wlock:
            self.conn.sendall(frame)

    def _recv_exact(self, n: int, fds: List[int]) -> Optional[bytes]:
        assert self.conn is not None
        buf = b""
        while len(buf) < n:
            data, anc, _, _ = self.conn.recvmsg(n - len(buf), socket.CMSG_SPACE(4 * 4))
            for level, typ, d in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(d[: len(d) - len(d) % a.itemsize])
                    fds.extend(a)
            if not data:
                return None
            buf += data
        return buf

    def _serve(self) -> None:
        try:
            self.conn, _ = self.ln.accept()
            self.connected.set()
            while True:
                fds: List[int] = []
                hb = self._recv_exact(16, fds)
                if hb is None:
                    return
                h = wire.parse_header(hb)
                body = self._recv_exact(h.length, fds) if h.length else b""
                assert body is not None
                m = wire.decode_body(h.type, body)
                fd = fds[0] if fds else -1
                for extra in fds[1:]:
                    os.close(extra)
                self.got.append((h, m, fd))
                for f in self.handler(self, h, m, fd):
                    self.send(f)
        except (OSError, wire.ProtocolError) as e:
            self.error = e

    def close(self) -> None:
        # The serving thread may have accepted a connection and still wait for the GIL to store it (a loaded
        # machine): closing only what is stored would leave that connection open and the thread in recv, and
        # the client would never see the end. So close whatever the thread holds until it has ended.
        for _, _, fd in self.got:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        try:
            self.ln.shutdown(socket.SHUT_RDWR)  # wakes an accept() no client came to (Linux: EINVAL)
        except OSError:
            pass
        self.ln.close()
        shut = None
        deadline = time.monotonic() + 5
        while self.thread.is_alive() and time.monotonic() < deadline:
            conn = self.conn
            if conn is not None and conn is not shut:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                shut = conn
            self.thread.join(0.02)
        if self.conn is not None:
            self.conn.close()
        if self.dir is not None:
            self.dir.cleanup()


def ok(req: int) -> bytes:
    return wire.encode_frame(wire.OK(req=req))


def fail(req: int, code: int, msg: str) -> bytes:
    return wire.encode_frame(wire.Fail(req=req, code=code, message=msg))
