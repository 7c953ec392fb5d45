"""A sidecar that refuses a connection says why, and the client reports that (issue 35, item 4).

The sidecar writes a Fail with Req 0 (limits.max_clients reached, or no
request within limits.client_first_request_timeout) and closes the
connection. Whether the client's first request still went out (the reader
takes the Fail) or met the closed socket (a broken pipe), the call fails
with SidecarConnectionError carrying the sidecar's code and message.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from stage_client import Client, Code, wire  # noqa: E402
from stage_client.errors import SidecarConnectionError  # noqa: E402

WHY = "the sidecar has limits.max_clients (1) control connections open"


class TestRefusal(unittest.TestCase):
    def setUp(self) -> None:
        d = tempfile.mkdtemp()
        self.path = os.path.join(d, "c.sock")
        self.ln = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ln.bind(self.path)
        self.ln.listen(64)
        frame = wire.encode_frame(wire.Fail(req=0, code=Code.BUSY, message=WHY))

        def serve() -> None:
            while True:
                try:
                    c, _ = self.ln.accept()
                except OSError:
                    return
                c.sendall(frame)
                c.close()

        self.t = threading.Thread(target=serve, daemon=True)
        self.t.start()

        def stop() -> None:
            self.ln.shutdown(socket.SHUT_RDWR)
            self.ln.close()
            self.t.join()
            os.unlink(self.path)
            os.rmdir(d)

        self.addCleanup(stop)

    def test_reason_reported(self) -> None:
        for i in range(40):
            c = Client(self.path)
            try:
                if i % 2:
                    time.sleep(0.001)  # let the refusal land first, on some tries
                with self.assertRaises(SidecarConnectionError) as cm:
                    c.stats()
                self.assertEqual(cm.exception.code, Code.BUSY, "try %d: %s" % (i, cm.exception))
                self.assertIn(WHY, str(cm.exception))
            finally:
                c.close()


if __name__ == "__main__":
    unittest.main()
