"""A prefill/decode router for two vLLM servers with the stage connector, following vLLM's convention.

``python -m stage_client.pdproxy --prefill http://P:8100 --decode http://D:8200 --port 8000``
serves ``/v1/completions`` and ``/v1/chat/completions``:

* ``pull`` (default): the prefill gets the request with ``max_tokens=1``
  and ``kv_transfer_params={"do_remote_decode": true}``; the
  ``kv_transfer_params`` of its answer go to the decode verbatim, whose
  answer is the client's. This is the flow of vLLM's own toy proxy and of
  llm-d, so any router that follows it works with stage too.
* ``push``: the router names the transfer (``stage_xfer``) and sends the
  decode its half first (``do_remote_prefill``, ``stage_rendezvous``: the
  prefill's rendezvous address), then the prefill its half
  (``do_remote_decode``); the prefill pushes layer by layer into the
  blocks the decode posted.

It is a reference and test router (one thread per request, no streaming,
no retries): stdlib only. An error from either engine is passed to the
client with the engine's status and body, and names which engine failed.
"""

from __future__ import annotations

import argparse
import json
import threading
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Optional, Tuple

__all__ = ["PDProxy", "route", "main"]

MAX_BODY = 64 << 20


class EngineError(Exception):
    """An engine answered with an error status (or could not be reached)."""

    def __init__(self, which: str, status: int, body: bytes) -> None:
        super().__init__("%s engine answered %d: %s" % (which, status, body[:500].decode("utf-8", "replace")))
        self.which, self.status, self.body = which, status, body


def _post(which: str, url: str, body: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise EngineError(which, e.code, e.read()) from None
    except (OSError, ValueError) as e:
        raise EngineError(which, 502, ("%s at %s: %s" % (which, url, e)).encode()) from None


def route(prefill: str, decode: str, path: str, body: Dict[str, Any], mode: str = "pull",
          rendezvous: str = "", timeout: float = 300.0) -> Dict[str, Any]:
    """One request through prefill then decode; the decode's answer (raises :class:`EngineError`)."""
    pre = dict(body, max_tokens=1, stream=False)
    pre.pop("max_completion_tokens", None)
    dec = dict(body, stream=False)
    if mode == "pull":
        pre["kv_transfer_params"] = {"do_remote_decode": True, "stage_mode": "pull"}
        answer = _post("prefill", prefill + path, pre, timeout)
        params = answer.get("kv_transfer_params")
        if not params:
            raise EngineError("prefill", 502, b"the prefill's answer has no kv_transfer_params: is its "
                                              b"kv-transfer-config the stage connector with kv_role kv_producer?")
        dec["kv_transfer_params"] = params
        return _post("decode", decode + path, dec, timeout)
    if mode != "push":
        raise ValueError("mode %r: pull or push" % mode)
    if not rendezvous:
        raise ValueError("push mode needs the prefill's rendezvous address (host:port)")
    xfer = "pd-" + uuid.uuid4().hex
    pre["kv_transfer_params"] = {"do_remote_decode": True, "stage_mode": "push", "stage_xfer": xfer}
    dec["kv_transfer_params"] = {"do_remote_prefill": True, "stage_mode": "push", "stage_xfer": xfer,
                                 "stage_rendezvous": rendezvous}
    out: Dict[str, Any] = {}

    def run_decode() -> None:
        try:
            out["answer"] = _post("decode", decode + path, dec, timeout)
        except EngineError as e:
            out["error"] = e

    t = threading.Thread(target=run_decode, name="pd-decode-" + xfer, daemon=True)
    t.start()
    try:
        _post("prefill", prefill + path, pre, timeout)
    finally:
        t.join(timeout)
    if "error" in out:
        raise out["error"]
    if "answer" not in out:
        raise EngineError("decode", 504, b"the decode did not answer within the timeout")
    return out["answer"]


class PDProxy(ThreadingHTTPServer):
    """The router as an HTTP server (``serve_forever`` / ``shutdown``)."""

    daemon_threads = True

    def __init__(self, addr: Tuple[str, int], prefill: str, decode: str, mode: str = "pull",
                 rendezvous: str = "", timeout: float = 300.0) -> None:
        super().__init__(addr, _Handler)
        self.prefill, self.decode = prefill.rstrip("/"), decode.rstrip("/")
        self.mode, self.rendezvous, self.timeout = mode, rendezvous, timeout

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return "http://%s:%d" % (host, port)


class _Handler(BaseHTTPRequestHandler):
    server: PDProxy

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: the engines log requests
        pass

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/health":
            self._send(200, b'{"status": "ok"}')
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self) -> None:  # noqa: N802
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._send(404, json.dumps({"error": "only /v1/completions and /v1/chat/completions"}).encode())
            return
        n = int(self.headers.get("Content-Length") or 0)
        if n <= 0 or n > MAX_BODY:
            self._send(400, json.dumps({"error": "body of %d B (1..%d)" % (n, MAX_BODY)}).encode())
            return
        try:
            body = json.loads(self.rfile.read(n))
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            self._send(400, json.dumps({"error": "request body: %s" % e}).encode())
            return
        s = self.server
        mode = str(body.pop("stage_mode", None) or s.mode)
        try:
            answer = route(s.prefill, s.decode, self.path, body, mode, s.rendezvous, s.timeout)
        except EngineError as e:
            self._send(e.status, json.dumps({"error": str(e), "engine": e.which}).encode())
            return
        except ValueError as e:
            self._send(400, json.dumps({"error": str(e)}).encode())
            return
        self._send(200, json.dumps(answer).encode())


def main(argv: Optional[list] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefill", required=True, help="the prefill server's base URL")
    ap.add_argument("--decode", required=True, help="the decode server's base URL")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--mode", choices=("pull", "push"), default="pull")
    ap.add_argument("--rendezvous", default="", help="push: the prefill's rendezvous host:port")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per engine request")
    a = ap.parse_args(argv)
    srv = PDProxy((a.host, a.port), a.prefill, a.decode, a.mode, a.rendezvous, a.timeout)
    print("stage pdproxy on %s: prefill %s, decode %s, %s" % (srv.url, a.prefill, a.decode, a.mode), flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()


if __name__ == "__main__":
    main()
