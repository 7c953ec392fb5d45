"""A prefill/decode router for two vLLM servers with the stage connector, following vLLM's convention.

``python -m stage_client.pdproxy --prefill http://P:8100 --decode http://D:8200 --port 8000``
serves ``/v1/completions`` and ``/v1/chat/completions`` (and ``GET /health``):

* ``pull`` (default): the prefill gets the request with ``max_tokens=1``,
  no streaming and ``kv_transfer_params={"do_remote_decode": true}``; the
  ``kv_transfer_params`` of its answer go to the decode verbatim, whose
  answer is the client's. This is the flow of vLLM's own toy proxy and of
  llm-d, so any router that follows it works with stage too.
* ``push``: the router names the transfer (``stage_xfer``) and sends the
  decode its half first (``do_remote_prefill``; the decode's ticket then
  travels to the prefill over the sidecars' link; ``--rendezvous``, the
  deprecated alternative, adds ``stage_rendezvous``), then the prefill its half
  (``do_remote_decode``); the prefill pushes layer by layer into the
  blocks the decode posted. A request may pick its mode with
  ``"stage_mode"`` in its body.

A request with ``"stream": true`` gets the decode's server-sent events as
they come. It is a reference and test router (no retries, no load
balancing) on aiohttp, the package's ``proxy`` extra
(``pip install 'stage-client[proxy]'``; Debian: ``python3-aiohttp``).

Every failure is answered with a status and a JSON body ``{"error": ...}``
(plus ``"engine"`` when an engine failed); the whole request has one
deadline (``--timeout``, 504). docs/ENGINES.md, "The router", has the
flags, limits and statuses.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import logging
import socket
import sys
import threading
import uuid
from http import HTTPStatus
from typing import Any, Dict, List, Optional, Tuple

try:
    import aiohttp
    from aiohttp import web
    _WHY = ""
except ImportError as _e:  # the router alone needs it; the rest of stage_client does not
    aiohttp = web = None  # type: ignore[assignment]
    _WHY = ("stage_client.pdproxy needs aiohttp (%s): pip install 'stage-client[proxy]' "
            "(from a checkout: pip install './python[proxy]'); Debian's python3: apt-get install python3-aiohttp" % _e)

__all__ = ["PDProxy", "EngineError", "Failure", "halves", "parse_object", "main", "MAX_BODY", "MAX_DEPTH",
           "BACKLOG"]

MAX_BODY = 64 << 20  # bytes of a request body, and of an engine's (non-streamed) answer
MAX_DEPTH = 128  # nesting of JSON arrays and objects, in a request and in an engine's answer
BACKLOG = 1024  # the listen queue (the kernel caps it at net.core.somaxconn)
MAX_CONNECTIONS = 1024  # open connections to the two engines together; more requests wait for one
SHUTDOWN_S = 3.0  # what requests in flight get at shutdown
IDLE_S = 3.0  # how long a connection to an engine is kept idle for the next request
PATHS = ("/v1/completions", "/v1/chat/completions")
_IN_THREAD = 1 << 20  # bodies this big are parsed off the event loop
_log = logging.getLogger("stage_client.pdproxy")


class Failure(Exception):
    """An answer other than the decode's: an HTTP status and what went wrong (the JSON body's ``error``)."""

    def __init__(self, status: int, message: str, engine: str = "") -> None:
        super().__init__(message)
        self.status, self.engine = status, engine

    def body(self) -> bytes:
        doc: Dict[str, Any] = {"error": str(self)}
        if self.engine:
            doc["engine"] = self.engine
        return json.dumps(doc).encode()


class EngineError(Failure):
    """An engine answered with an error status (passed on with its body), or, with ``why``, could not be
    reached or answered something unusable (502)."""

    def __init__(self, which: str, status: int, body: bytes = b"", why: str = "") -> None:
        text = "%s engine: %s" % (which, why) if why else "%s engine answered %d: %s" % (
            which, status, body[:500].decode("utf-8", "replace"))
        super().__init__(status, text, which)
        self.which, self.answer = which, body


def nested_deeper(doc: Any, limit: int) -> bool:
    """Whether ``doc`` (parsed JSON) nests arrays and objects more than ``limit`` deep (a scalar: 0)."""
    stack: List[Tuple[Any, int]] = [(doc, 1)] if isinstance(doc, (dict, list)) else []
    while stack:
        obj, depth = stack.pop()
        if depth > limit:
            return True
        for v in obj.values() if isinstance(obj, dict) else obj:
            if isinstance(v, (dict, list)):
                stack.append((v, depth + 1))
    return False


def parse_object(data: bytes, max_depth: int = MAX_DEPTH) -> Dict[str, Any]:
    """``data`` as a JSON object; ValueError saying why not (not JSON, too deep, not an object)."""
    too_deep = "JSON nested deeper than %d levels" % max_depth
    try:
        doc = json.loads(data)
    except RecursionError:  # deeper than Python's parser goes (about 1,000)
        raise ValueError(too_deep) from None
    except ValueError as e:  # UnicodeDecodeError included
        raise ValueError("not JSON: %s" % e) from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object (%s)" % type(doc).__name__.replace("NoneType", "null"))
    if nested_deeper(doc, max_depth):
        raise ValueError(too_deep)
    return doc


def halves(body: Dict[str, Any], mode: str, rendezvous: str = "", xfer: str = "", peer: str = "",
           kv: str = "") -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The prefill's and the decode's request bodies for the client's ``body`` (pure; ValueError for a bad mode).

    Pull: the decode's kv_transfer_params are the prefill's answer's, set by the caller. Push: ``peer`` and
    ``kv``, where given, name the prefill's sidecar (``stage_peer``; ``{rank}`` in it is its rank 0 under TP)
    and its engine's ``kv_name`` (``stage_kv``) for the decode's ticket."""
    pre = dict(body, max_tokens=1, stream=False)
    for k in ("max_completion_tokens", "stream_options"):  # vLLM refuses stream_options without stream
        pre.pop(k, None)
    dec = dict(body)
    if mode == "pull":
        pre["kv_transfer_params"] = {"do_remote_decode": True, "stage_mode": "pull"}
        return pre, dec
    if mode != "push":
        raise ValueError("stage_mode %r: pull or push" % (mode,))
    xfer = xfer or "pd-" + uuid.uuid4().hex
    pre["kv_transfer_params"] = {"do_remote_decode": True, "stage_mode": "push", "stage_xfer": xfer}
    dec["kv_transfer_params"] = {"do_remote_prefill": True, "stage_mode": "push", "stage_xfer": xfer}
    if rendezvous:  # deprecated: without it the decode's ticket travels over the sidecars' link
        dec["kv_transfer_params"]["stage_rendezvous"] = rendezvous
    for key, v in (("stage_peer", peer), ("stage_kv", kv)):
        if v:
            dec["kv_transfer_params"][key] = v
    return pre, dec


class _Exchange:
    """One client request's state: what it waits for (names a timeout) and its stream, once begun."""

    def __init__(self) -> None:
        self.waiting = "client"
        self.out: Any = None  # web.StreamResponse once the decode's stream is being passed on


class _Router:
    """The request handler and the session to the engines (one event loop)."""

    def __init__(self, cfg: "PDProxy") -> None:
        self.cfg = cfg
        self.session = aiohttp.ClientSession(
            # idle connections closed before vLLM's server closes them (uvicorn: 5 s), so that no request
            # goes out on a connection the engine is closing
            connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, keepalive_timeout=IDLE_S),
            timeout=aiohttp.ClientTimeout(total=None))  # the whole request's deadline is ours

    async def close(self) -> None:
        await self.session.close()

    async def handle(self, request: Any) -> Any:
        if request.path == "/health":
            if request.method in ("GET", "HEAD"):
                return _json(200, b'{"status": "ok"}')
            return _json(405, Failure(405, "/health takes GET").body(), allow="GET")
        if request.path not in PATHS:
            return _json(404, Failure(404, "only /v1/completions and /v1/chat/completions (POST) "
                                           "and /health (GET)").body())
        if request.method != "POST":
            return _json(405, Failure(405, "%s takes POST" % request.path).body(), allow="POST")
        ex = _Exchange()
        work = asyncio.ensure_future(asyncio.wait_for(self._exchange(request, ex), self.cfg.timeout))
        watch = None if _CANCELS else asyncio.ensure_future(_watch(request, work))
        try:
            return await work
        except asyncio.TimeoutError:
            if ex.waiting == "client":
                fail = Failure(408, "the request's body did not arrive within the deadline of %g s (--timeout)"
                               % self.cfg.timeout)
            else:
                fail = Failure(504, "%s engine: no answer within the deadline of %g s for the whole request "
                                    "(--timeout)" % (ex.waiting, self.cfg.timeout), ex.waiting)
        except Failure as e:
            fail = e
        except OSError as e:  # the client left while its stream was being written
            if ex.out is None or not ex.out.prepared:
                raise
            _log.info("pdproxy: %s %s: the client left mid-stream: %s", request.method, request.path, e)
            return ex.out
        finally:
            if watch is not None:
                watch.cancel()
        return await _fail(request, ex, fail)

    async def _exchange(self, request: Any, ex: _Exchange) -> Any:
        body = await self._read_request(request)
        mode = str(body.pop("stage_mode", None) or self.cfg.mode)
        try:
            pre, dec = halves(body, mode, self.cfg.rendezvous, peer=self.cfg.prefill_peer, kv=self.cfg.prefill_kv)
        except ValueError as e:
            raise Failure(400, str(e)) from None
        stream = body.get("stream") is True
        if mode == "pull":
            ex.waiting = "prefill"
            answer = await self._answer("prefill", request.path, pre)
            params = answer.get("kv_transfer_params")
            if not isinstance(params, dict) or not params:
                raise EngineError("prefill", 502, why="its answer has no kv_transfer_params object: is its kv-transfer-"
                                                      "config the stage connector with kv_role kv_producer?")
            dec["kv_transfer_params"] = params
            ex.waiting = "decode"
            return await self._decode(request, ex, dec, stream, None)
        return await self._push(request, ex, pre, dec, stream)

    async def _push(self, request: Any, ex: _Exchange, pre: Dict[str, Any], dec: Dict[str, Any],
                    stream: bool) -> Any:
        """Both halves at once; the decode's answer is passed on once the prefill's came (a prefill error wins)."""
        gate = asyncio.get_running_loop().create_future()
        dec_task = asyncio.ensure_future(self._decode(request, ex, dec, stream, gate))
        await asyncio.sleep(0)  # the decode's half goes out first
        pre_task = asyncio.ensure_future(self._answer("prefill", request.path, pre))
        ex.waiting = "prefill"
        try:
            await asyncio.wait({pre_task, dec_task}, return_when=asyncio.FIRST_COMPLETED)
            if not pre_task.done():  # the decode ended before its gate opened: it failed
                return dec_task.result()
            pre_task.result()
            gate.set_result(None)
            ex.waiting = "decode"
            return await dec_task
        finally:
            for t in (pre_task, dec_task):
                t.cancel()
            await asyncio.gather(pre_task, dec_task, return_exceptions=True)

    async def _read_request(self, request: Any) -> Dict[str, Any]:
        limit = self.cfg.max_body
        n = request.content_length
        if n is not None and n > limit:
            raise Failure(413, "request body of %d B is over the limit of %d B (--max-body)" % (n, limit))
        try:
            data = await _read_bounded(request.content, limit)
        except web.RequestPayloadError as e:  # a broken chunked encoding, a body cut short
            raise Failure(400, "reading the request body: %s" % (e.__cause__ or e)) from None
        if data is None:
            raise Failure(413, "request body over the limit of %d B (--max-body)" % limit)
        if not data:
            raise Failure(400, "empty request body: send the completion request as a JSON object")
        try:
            return await self._parse(data)
        except ValueError as e:
            raise Failure(400, "request body: %s" % e) from None

    async def _parse(self, data: bytes) -> Dict[str, Any]:
        if len(data) < _IN_THREAD:
            return parse_object(data, self.cfg.max_depth)
        return await asyncio.get_running_loop().run_in_executor(None, parse_object, data, self.cfg.max_depth)

    async def _post(self, which: str, path: str, body: Dict[str, Any]) -> Any:
        url = (self.cfg.prefill if which == "prefill" else self.cfg.decode) + path
        try:
            return await self.session.post(url, data=json.dumps(body).encode(),
                                           headers={"Content-Type": "application/json"})
        except (aiohttp.ClientError, OSError) as e:
            raise EngineError(which, 502, why="%s: %s" % (url, e or type(e).__name__)) from None

    async def _read(self, which: str, resp: Any) -> bytes:
        """The engine's whole answer, bounded; a status of 400 or more raises its :class:`EngineError`."""
        limit = self.cfg.max_body
        try:
            data = await _read_bounded(resp.content, limit)
        except (aiohttp.ClientError, OSError) as e:
            raise EngineError(which, 502, why="%s: reading its answer: %s" % (resp.url, e)) from None
        if data is None:
            raise EngineError(which, 502, why="%s: its answer is over the limit of %d B (--max-body)"
                                              % (resp.url, limit))
        if resp.status >= 400:
            raise EngineError(which, resp.status, data)
        return data

    async def _answer(self, which: str, path: str, body: Dict[str, Any]) -> Dict[str, Any]:
        resp = await self._post(which, path, body)
        try:
            data = await self._read(which, resp)
        finally:
            resp.close()
        try:
            return await self._parse(data)
        except ValueError as e:
            raise EngineError(which, 502, why=_unusable(resp, e)) from None

    async def _decode(self, request: Any, ex: _Exchange, dec: Dict[str, Any], stream: bool,
                      gate: Optional["asyncio.Future[None]"]) -> Any:
        """The decode's answer as the client's: passed through as it comes when it streams events."""
        resp = await self._post("decode", request.path, dec)
        try:
            if gate is not None:
                await gate
            if not (stream and resp.status < 400 and resp.content_type == "text/event-stream"):
                data = await self._read("decode", resp)
                try:
                    await self._parse(data)
                except ValueError as e:
                    raise EngineError("decode", 502, why=_unusable(resp, e)) from None
                return _json(resp.status, data)
            ex.out = web.StreamResponse(status=resp.status, headers={
                "Content-Type": resp.headers.get("Content-Type", "text/event-stream"), "Cache-Control": "no-cache"})
            await ex.out.prepare(request)
            while True:
                try:
                    chunk = await resp.content.readany()
                except (aiohttp.ClientError, OSError) as e:
                    raise EngineError("decode", 502, why="%s: its stream broke: %s" % (resp.url, e)) from None
                if not chunk:
                    break
                await ex.out.write(chunk)
            await ex.out.write_eof()
            return ex.out
        finally:
            resp.close()


async def _watch(request: Any, work: "asyncio.Future[Any]") -> None:
    """Cancels ``work`` once the client's connection is gone (aiohttp 3.8; later ones cancel the handler)."""
    while not work.done():
        await asyncio.sleep(0.25)
        if request.transport is None or request.transport.is_closing():
            work.cancel()


def _unusable(resp: Any, e: ValueError) -> str:
    return "%s: its answer (status %d) is %s" % (resp.url, resp.status, e)


async def _read_bounded(content: Any, limit: int) -> Optional[bytes]:
    """All of a body stream, or None once it is past ``limit`` bytes."""
    buf = bytearray()
    while True:
        chunk = await content.read(1 << 16)
        if not chunk:
            return bytes(buf)
        buf += chunk
        if len(buf) > limit:
            return None


def _json(status: int, body: bytes, allow: str = "") -> Any:
    resp = web.Response(status=status, body=body, content_type="application/json")
    if allow:
        resp.headers["Allow"] = allow
    if status in (408, 413):  # the rest of the body is not read
        resp.force_close()
    return resp


async def _fail(request: Any, ex: _Exchange, fail: Failure) -> Any:
    if ex.out is None or not ex.out.prepared:
        return _json(fail.status, fail.body())
    try:  # the stream began: the status is sent; say it in one last event
        await asyncio.wait_for(ex.out.write(b"data: " + fail.body() + b"\n\n"), 1.0)
    except (asyncio.TimeoutError, OSError, RuntimeError) as e:
        _log.info("pdproxy: could not tell the client its stream failed (%s): %s", e, fail)
    ex.out.force_close()
    return ex.out


# aiohttp >= 3.9 cancels a handler whose client left when asked to; 3.8 does not (_watch does it there)
_CANCELS = web is not None and "handler_cancellation" in inspect.signature(web.Server.__init__).parameters

if web is not None:

    class _Protocol(web.RequestHandler):
        """aiohttp's connection handler, whose own answers (a request it cannot parse) are JSON too."""

        def handle_error(self, request: Any, status: int = 500, exc: Optional[BaseException] = None,
                         message: Optional[str] = None) -> Any:
            if status >= 500:
                super().handle_error(request, status, exc, message)  # logs the traceback; raises if answering
                text = "internal error in the router (its log has the details)"
            else:  # a client's bad request: one line in the log, not a traceback
                if request.writer is not None and request.writer.output_size > 0:
                    raise ConnectionError("an answer was under way: cannot answer %d as well" % status)
                said = str(message or exc or HTTPStatus(status).phrase).splitlines()
                text = "bad HTTP request: %s" % (said[0] if said else HTTPStatus(status).phrase)
                _log.info("pdproxy: %s from %s", text, request.remote)
            resp = web.Response(status=status, body=Failure(status, text).body(), content_type="application/json")
            resp.force_close()
            return resp

    class _Server(web.Server):
        """Makes each connection's handler a _Protocol: aiohttp has no hook for its parser's answers, and its
        Server builds a RequestHandler from ``_loop`` and ``_kwargs`` alike in 3.8 to 3.14."""

        def __call__(self) -> Any:
            return _Protocol(self, loop=self._loop, **self._kwargs)


def _listen(addr: Tuple[str, int], backlog: int) -> socket.socket:
    host, port = addr[0], addr[1]
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    return socket.create_server((host, port), family=family, backlog=backlog)


class PDProxy:
    """The router: ``serve_forever()`` in a thread of its own, ``shutdown()`` and ``server_close()`` from another.

    The socket is bound and listening when this returns (``url``); ``serve_forever`` runs the event loop."""

    def __init__(self, addr: Tuple[str, int], prefill: str, decode: str, mode: str = "pull",
                 rendezvous: str = "", timeout: float = 300.0, *, max_body: int = MAX_BODY,
                 max_depth: int = MAX_DEPTH, backlog: int = BACKLOG, prefill_peer: str = "",
                 prefill_kv: str = "") -> None:
        if web is None:
            raise RuntimeError(_WHY)
        if mode not in ("pull", "push"):
            raise ValueError("mode %r: pull or push" % mode)
        if not timeout > 0 or max_body <= 0 or max_depth <= 0 or backlog <= 0:
            raise ValueError("timeout, max_body, max_depth and backlog must be positive")
        self.prefill, self.decode = prefill.rstrip("/"), decode.rstrip("/")
        self.mode, self.rendezvous, self.timeout = mode, rendezvous, float(timeout)
        self.max_body, self.max_depth, self.backlog = max_body, max_depth, backlog
        self.prefill_peer, self.prefill_kv = prefill_peer, prefill_kv  # push: where the decode's ticket goes
        self.socket = _listen(addr, backlog)
        self.server_address = self.socket.getsockname()
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stop: Optional[asyncio.Event] = None
        self._closing = False
        self._done = threading.Event()
        self._done.set()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return "http://%s:%d" % ("[%s]" % host if ":" in host else host, port)

    def serve_forever(self) -> None:
        """Serves until :meth:`shutdown` (once per PDProxy)."""
        with self._lock:
            if self._closing:
                return
            self._done.clear()
        try:
            asyncio.run(self._serve())
        finally:
            self._done.set()

    async def _serve(self) -> None:
        router = _Router(self)
        kw = {"handler_cancellation": True} if _CANCELS else {}  # a client that leaves ends its engines' requests
        runner_kw, site_kw = _shutdown_kw()
        runner = web.ServerRunner(_Server(router.handle, **kw), **runner_kw)
        await runner.setup()
        try:
            await web.SockSite(runner, self.socket, backlog=self.backlog, **site_kw).start()
            with self._lock:
                self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
                if self._closing:
                    self._stop.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()
            await router.close()

    def shutdown(self) -> None:
        """Stops :meth:`serve_forever` and waits for it to return (requests in flight get SHUTDOWN_S)."""
        with self._lock:
            self._closing = True
            loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # its loop has ended already
                pass
        self._done.wait()

    def server_close(self) -> None:
        self.socket.close()


def _shutdown_kw() -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The runner's and the site's keywords for SHUTDOWN_S: aiohttp >= 3.9 takes it on the runner, 3.8 on the site."""
    if "shutdown_timeout" in inspect.signature(web.BaseRunner.__init__).parameters:
        return {"shutdown_timeout": SHUTDOWN_S}, {}
    return {}, {"shutdown_timeout": SHUTDOWN_S}


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefill", required=True, help="the prefill server's base URL")
    ap.add_argument("--decode", required=True, help="the decode server's base URL")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--mode", choices=("pull", "push"), default="pull")
    ap.add_argument("--rendezvous", default="", help="push, deprecated: the prefill's rendezvous host:port (without "
                    "it the decode's ticket travels over the sidecars' link)")
    ap.add_argument("--prefill-peer", default="", help="push: the prefill's sidecar as the decode's names it "
                    "(stage_peer; {rank} stands for a rank, the ticket goes to rank 0's); needed when the decode's "
                    "route has several peers, as with one sidecar per GPU under TP")
    ap.add_argument("--prefill-kv", default="", help="push: the prefill engine's kv_name (stage_kv); needed when "
                    "several engines take tickets at its sidecar")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds for a whole request: both engines, the decode's stream included (504 past it)")
    ap.add_argument("--max-body", type=int, default=MAX_BODY,
                    help="bytes of a request body (413 past it) and of an engine's answer (502)")
    ap.add_argument("--backlog", type=int, default=BACKLOG, help="the listen queue (capped by net.core.somaxconn)")
    a = ap.parse_args(argv)
    if web is None:
        sys.exit("pdproxy: " + _WHY)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        srv = PDProxy((a.host, a.port), a.prefill, a.decode, a.mode, a.rendezvous, a.timeout,
                      max_body=a.max_body, backlog=a.backlog, prefill_peer=a.prefill_peer, prefill_kv=a.prefill_kv)
    except (ValueError, OSError) as e:
        sys.exit("pdproxy: %s" % e)
    print("stage pdproxy on %s: prefill %s, decode %s, %s" % (srv.url, a.prefill, a.decode, a.mode), flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()


if __name__ == "__main__":
    main()
