"""The prefill/decode router (``stage_client.pdproxy``) against fake engines.

Two fake vLLM servers (aiohttp, on a loop thread of their own) stand in for
the prefill and the decode: the prefill answers ``kv_transfer_params`` made
from the prompt, the decode echoes what it was given, and a prompt's text
picks a misbehaviour (an answer that is a JSON list, HTML, an error status,
one byte every half second, ...). The router runs in a thread as
``test_vllm_real`` runs it; the clients are stdlib (``http.client``, raw
sockets), so nothing of the router's own stack judges its answers.

Issue 33 item 6: a burst of 64 concurrent requests, every bad input
answered with a clear status and a JSON error, a trickling engine cut at
the deadline for the whole request, streaming passed through as it comes,
and the kv_transfer_params hand-off unchanged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
import unittest
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
sys.path.insert(0, PYDIR)

try:
    from aiohttp import web

    WHY = ""
except ImportError as e:
    WHY = ("aiohttp is not installed (%s): pip install './python[proxy]' (stage-client[proxy]) "
           "or, for Debian's python3, apt-get install python3-aiohttp" % e)

if os.environ.get("STAGE_ENGINES_REQUIRED") == "1" and WHY:  # a skip would hide it
    raise RuntimeError(WHY)

from stage_client.pdproxy import PDProxy  # noqa: E402 - imports without aiohttp too

TRICKLE_S = 0.5  # a trickling engine's pause between bytes
EVENTS = 5  # the decode's SSE events per streamed answer
EVENT_GAP_S = 0.3
RENDEZVOUS = "10.0.0.9:7100"
TRICKLES_ENDED: List[float] = []  # when each trickling answer ended


def params_for(prompt: str) -> Dict[str, Any]:
    """What the fake prefill returns as kv_transfer_params for ``prompt`` (the router must not touch it)."""
    n = sum(map(ord, prompt))
    return {"do_remote_prefill": True, "stage_mode": "pull", "stage_xfer": "x-" + prompt, "stage_peer": "prefill-0",
            "stage_kv": "prefill-0.cpu-vec-tp0", "stage_tp": 1, "stage_block_ids": [[n % 97, n % 89, 2 ** 40 + n]],
            "stage_tokens": n % 1000, "stage_lease_expires": 1764300000.123456 + n, "note": "\u00fc\u2028\"\\",
            "nested": {"a": [None, False, 1.5e-7, {"b": []}]}}


class Engines:
    """A fake prefill and decode (aiohttp servers on one loop thread) and what each was sent.

    A prompt picks a misbehaviour (ODD); any other gets a good answer."""

    ODD = {
        ("prefill", "list"): lambda r: web.json_response([1, 2]),
        ("prefill", "html"): lambda r: web.Response(text="<html>oops</html>", content_type="text/html"),
        ("prefill", "boom"): lambda r: web.json_response({"error": "boom"}, status=500),
        ("prefill", "noparams"): lambda r: web.json_response({"choices": [{"text": "!"}]}),
        ("prefill", "trickle"): lambda r: Engines._trickle(r),
        ("prefill", "left"): lambda r: Engines._trickle(r),
        ("decode", "declist"): lambda r: web.json_response(["not", "an", "object"]),
        ("decode", "dtrickle"): lambda r: Engines._trickle(r),
    }

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.seen: Dict[str, List[Dict[str, Any]]] = {"prefill": [], "decode": []}
        self.sent_at: Dict[str, List[float]] = {}  # streamed prompt -> when each event was written
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-engines", daemon=True)
        self.thread.start()
        self.runners: List[Any] = []
        self.prefill = self._call(self._start("prefill"))
        self.decode = self._call(self._start("decode"))

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _start(self, which: str) -> str:
        async def handler(request: Any) -> Any:
            return await self._handle(which, request)

        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024).start()
        self.runners.append(runner)
        return "http://127.0.0.1:%d" % runner.addresses[0][1]

    def close(self) -> None:
        async def stop() -> None:
            for r in self.runners:
                await r.cleanup()
            left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in left:  # a trickle the router cut
                t.cancel()
            await asyncio.gather(*left, return_exceptions=True)

        self._call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _handle(self, which: str, request: Any) -> Any:
        body = await request.json()
        with self.lock:
            self.seen[which].append(body)
        if body.get("stream_options") and not body.get("stream"):  # vLLM's own rule
            return web.json_response({"error": "Stream options can only be defined when `stream=True`."}, status=400)
        prompt = str(body.get("prompt", ""))
        odd = self.ODD.get((which, prompt))
        if odd is not None:
            return await _awaited(odd(request))
        if which == "prefill":
            return web.json_response({"id": "pre-" + prompt, "choices": [{"text": "!"}],
                                      "kv_transfer_params": params_for(prompt)})
        if body.get("stream"):
            return await self._stream(request, prompt)
        return web.json_response({"id": "dec-" + prompt, "choices": [{"text": "answer to " + prompt}],
                                  "got_params": body.get("kv_transfer_params")})

    async def _stream(self, request: Any, prompt: str) -> Any:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        times = self.sent_at.setdefault(prompt, [])
        for i in range(EVENTS * (4 if prompt == "slowstream" else 1)):
            await out.write(b"data: " + json.dumps({"i": i, "text": "t%d" % i}).encode() + b"\n\n")
            times.append(time.monotonic())
            await asyncio.sleep(EVENT_GAP_S)
        await out.write(b"data: [DONE]\n\n")
        return out

    @staticmethod
    async def _trickle(request: Any, n: int = 40) -> Any:
        out = web.StreamResponse(headers={"Content-Type": "application/json"})
        await out.prepare(request)
        try:
            for c in (b'{"x": "' + b"y" * n)[:n]:
                await out.write(bytes([c]))
                await asyncio.sleep(TRICKLE_S)
        finally:  # the router closed the connection (aiohttp 3.8 cancels, later ones fail the write)
            TRICKLES_ENDED.append(time.monotonic())
        return out


async def _awaited(x: Any) -> Any:
    return await x if asyncio.iscoroutine(x) else x


def post(url: str, body: Any, path: str = "/v1/completions", timeout: float = 60) -> Tuple[int, str, bytes]:
    """POST ``body`` (bytes, or JSON-encoded); (status, content type, body)."""
    host, port = url.split("//")[1].split(":")
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    c = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        c.request("POST", path, data, {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.getheader("Content-Type") or "", r.read()
    finally:
        c.close()


def raw(url: str, request: bytes, timeout: float = 30) -> Tuple[int, str, bytes]:
    """Send ``request`` as it is (headers and all); the answer as :func:`post` gives it."""
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(request)
        r = http.client.HTTPResponse(s)
        r.begin()
        return r.status, r.getheader("Content-Type") or "", r.read()


def start(engines: Engines, decode: str = "", **kw: Any) -> PDProxy:
    p = PDProxy(("127.0.0.1", 0), engines.prefill, decode or engines.decode, "pull", RENDEZVOUS, **kw)
    threading.Thread(target=p.serve_forever, name="pdproxy", daemon=True).start()
    return p


def stop(p: PDProxy) -> None:
    p.shutdown()
    p.server_close()


@unittest.skipIf(WHY, WHY)
class TestPDProxy(unittest.TestCase):
    engines: Engines
    proxy: PDProxy

    @classmethod
    def setUpClass(cls) -> None:
        logging.getLogger("aiohttp").addHandler(logging.NullHandler())  # bad requests are logged; expected here
        logging.getLogger("aiohttp").propagate = False
        cls.engines = Engines()
        cls.proxy = start(cls.engines, timeout=30)

    @classmethod
    def tearDownClass(cls) -> None:
        stop(cls.proxy)
        cls.engines.close()

    def error(self, got: Tuple[int, str, bytes], status: int, words: str, engine: str = "") -> Dict[str, Any]:
        """``got`` is a JSON error of ``status`` whose message has ``words``."""
        code, ctype, body = got
        self.assertEqual(code, status, body[:300])
        self.assertIn("application/json", ctype)
        doc = json.loads(body)
        self.assertIsInstance(doc, dict)
        self.assertIn(words, doc["error"])
        if engine:
            self.assertEqual(doc.get("engine"), engine, doc)
        return doc

    def seen(self, which: str, prompt: str) -> List[Dict[str, Any]]:
        with self.engines.lock:
            return [b for b in self.engines.seen[which] if b.get("prompt") == prompt]

    def test_burst_of_64_all_answered_with_the_handoff_unchanged(self) -> None:
        n = 64
        gate = threading.Barrier(n)

        def one(i: int) -> Tuple[int, str, bytes]:
            body = {"model": "m", "prompt": "p%d" % i, "max_tokens": 7, "max_completion_tokens": 7,
                    "temperature": 0, "stage_mode": "push" if i % 4 == 3 else "pull"}
            gate.wait(30)
            return post(self.proxy.url, body)

        with concurrent.futures.ThreadPoolExecutor(n) as ex:
            futs = [ex.submit(one, i) for i in range(n)]
            got = []
            for f in futs:
                try:
                    got.append(f.result(120))
                except Exception as e:  # noqa: BLE001 - a dropped connection is the failure asserted on
                    got.append((0, "", repr(e).encode()))
        failed = [(i, g[0], g[2][:200]) for i, g in enumerate(got) if g[0] != 200]
        self.assertEqual(failed, [], "%d of %d requests failed" % (len(failed), n))
        for i, (_, ctype, body) in enumerate(got):
            prompt = "p%d" % i
            ans = json.loads(body)
            self.assertIn("application/json", ctype)
            self.assertEqual(ans["choices"][0]["text"], "answer to " + prompt)
            pre, dec = self.seen("prefill", prompt), self.seen("decode", prompt)
            self.assertEqual((len(pre), len(dec)), (1, 1), prompt)
            self.assertEqual(pre[0]["max_tokens"], 1)
            self.assertFalse(pre[0]["stream"])
            self.assertNotIn("max_completion_tokens", pre[0])
            self.assertNotIn("stage_mode", dec[0])
            self.assertEqual((dec[0]["max_tokens"], dec[0]["max_completion_tokens"]), (7, 7))
            if i % 4 == 3:  # push: the router names the transfer, both halves carry it
                xfer = pre[0]["kv_transfer_params"]["stage_xfer"]
                self.assertEqual(pre[0]["kv_transfer_params"],
                                 {"do_remote_decode": True, "stage_mode": "push", "stage_xfer": xfer})
                self.assertEqual(ans["got_params"], {"do_remote_prefill": True, "stage_mode": "push",
                                                     "stage_xfer": xfer, "stage_rendezvous": RENDEZVOUS})
            else:  # pull: the prefill's kv_transfer_params reach the decode unchanged
                self.assertEqual(pre[0]["kv_transfer_params"], {"do_remote_decode": True, "stage_mode": "pull"})
                self.assertEqual(dec[0]["kv_transfer_params"], params_for(prompt))
                self.assertEqual(ans["got_params"], params_for(prompt))

    def test_push_names_the_prefill(self) -> None:
        """--prefill-peer/--prefill-kv: a push's decode half names the prefill's sidecar and engine for the
        ticket (TP with a sidecar per GPU); a pull's halves are unchanged by them."""
        p = start(self.engines, timeout=30, prefill_peer="prefill-{rank}", prefill_kv="pre")
        try:
            for mode in ("push", "pull"):
                prompt = "named-" + mode
                code, _, body = post(p.url, {"model": "m", "prompt": prompt, "max_tokens": 3, "stage_mode": mode})
                self.assertEqual(code, 200, body[:300])
                got = json.loads(body)["got_params"]
                if mode == "push":
                    self.assertEqual((got["stage_peer"], got["stage_kv"]), ("prefill-{rank}", "pre"), got)
                else:
                    self.assertEqual(got, params_for(prompt))
        finally:
            stop(p)

    def test_bad_requests_answered(self) -> None:
        url = self.proxy.url
        deep = b"[" * 100000

        def req(body: bytes, length: Optional[str] = None, path: str = "/v1/completions",
                method: str = "POST") -> bytes:
            n = str(len(body)) if length is None else length
            return (("%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %s\r\n"
                     "Connection: close\r\n\r\n" % (method, path, n)).encode() + body)

        cases = [
            ("100,000 nested [", req(deep), 400, "nested"),
            ("200 nested objects", req(b'{"a":' * 200 + b"1" + b"}" * 200), 400, "nested"),
            ("Content-Length: abc", req(b"{}", "abc"), 400, "bad HTTP request"),
            ("Content-Length: -5", req(b"{}", "-5"), 400, "bad HTTP request"),
            ("no body", req(b""), 400, "empty"),
            ("not JSON", req(b"{nope"), 400, "not JSON"),
            ("not UTF-8", req(b'{"prompt": "\xff\xfe"}'), 400, "not JSON"),
            ("a JSON list", req(b"[1, 2]"), 400, "not a JSON object"),
            ("over the body limit", req(b"", str(100 << 20)), 413, "over the limit"),
            ("unknown stage_mode", req(b'{"prompt": "a", "stage_mode": "teleport"}'), 400, "teleport"),
            ("unknown path", req(b"{}", path="/v1/embeddings"), 404, "/v1/completions"),
            ("GET a completion", req(b"", path="/v1/completions", method="GET"), 405, "POST"),
        ]
        for name, request, status, words in cases:
            with self.subTest(name):
                self.error(raw(url, request), status, words)
        self.assertEqual(raw(url, req(b"", path="/health", method="GET"))[0], 200)

    def test_chunked_body_over_the_limit(self) -> None:
        p = start(self.engines, max_body=4096)
        try:
            chunk = b"x" * 1000
            body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(10)) + b"0\r\n\r\n"
            got = raw(p.url, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                             b"Connection: close\r\n\r\n" + body)
            self.error(got, 413, "over the limit")
            self.assertEqual(post(p.url, {"prompt": "small"})[0], 200)  # the limit leaves the good path alone
        finally:
            stop(p)

    def test_engine_failures_answered(self) -> None:
        url = self.proxy.url
        self.error(post(url, {"prompt": "list"}), 502, "not a JSON object", "prefill")
        self.error(post(url, {"prompt": "html"}), 502, "not JSON", "prefill")
        self.error(post(url, {"prompt": "noparams"}), 502, "kv_transfer_params", "prefill")
        self.error(post(url, {"prompt": "declist"}), 502, "not a JSON object", "decode")
        doc = self.error(post(url, {"prompt": "boom"}), 500, "boom", "prefill")  # the engine's own status
        self.assertIn("prefill engine answered 500", doc["error"])
        with socket.socket() as s:  # a port nothing listens on: held bound (refusing) so none can take it meanwhile
            s.bind(("127.0.0.1", 0))
            dead = "http://127.0.0.1:%d" % s.getsockname()[1]
            p = start(self.engines, decode=dead, timeout=10)
            try:
                for mode in ("pull", "push"):
                    with self.subTest(mode):
                        self.error(post(p.url, {"prompt": "down-" + mode, "stage_mode": mode}), 502, dead, "decode")
            finally:
                stop(p)

    def test_trickling_engine_cut_at_the_deadline(self) -> None:
        timeout = 1.0
        p = start(self.engines, timeout=timeout)
        try:
            for prompt, engine in (("trickle", "prefill"), ("dtrickle", "decode")):
                with self.subTest(engine):
                    t0 = time.monotonic()
                    got = post(p.url, {"prompt": prompt})
                    took = time.monotonic() - t0
                    self.error(got, 504, "deadline", engine)
                    # a correctness bound, not a benchmark: the engine would trickle for 20 s
                    self.assertLess(took, timeout + 2.0)
            with self.subTest("client"):  # a body that stops short of its Content-Length
                t0 = time.monotonic()
                got = raw(p.url, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
                self.error(got, 408, "did not arrive within the deadline")
                self.assertLess(time.monotonic() - t0, timeout + 2.0)
        finally:
            stop(p)

    def test_client_that_leaves_ends_the_engines_request(self) -> None:
        host, port = self.proxy.url.split("//")[1].split(":")
        before = len(TRICKLES_ENDED)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            body = json.dumps({"prompt": "left"}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            deadline = time.monotonic() + 10
            while not self.seen("prefill", "left") and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertTrue(self.seen("prefill", "left"), "the prefill never got the request")
        left = time.monotonic()
        while len(TRICKLES_ENDED) == before and time.monotonic() < left + 5:
            time.sleep(0.05)
        self.assertGreater(len(TRICKLES_ENDED), before, "the prefill's request outlived its client by 5 s")
        self.assertLess(TRICKLES_ENDED[-1] - left, 2 * TRICKLE_S + 1.0)

    def test_streaming_passed_through_in_order(self) -> None:
        prompt = "stream-me"
        host, port = self.proxy.url.split("//")[1].split(":")
        c = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            c.request("POST", "/v1/chat/completions",
                      json.dumps({"prompt": prompt, "stream": True, "stream_options": {"include_usage": True}}),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            self.assertEqual(r.status, 200, r.read(300) if r.status != 200 else b"")
            self.assertIn("text/event-stream", r.getheader("Content-Type") or "")
            events, first_at = [], 0.0
            while True:
                line = r.readline()
                if not line:
                    break
                if line.startswith(b"data: "):
                    events.append(line[6:].strip())
                    first_at = first_at or time.monotonic()
        finally:
            c.close()
        want = [json.dumps({"i": i, "text": "t%d" % i}).encode() for i in range(EVENTS)] + [b"[DONE]"]
        self.assertEqual(events, want)
        sent = self.engines.sent_at[prompt]
        self.assertLess(first_at, sent[-1], "the first event came only after the decode sent the last")
        pre, dec = self.seen("prefill", prompt), self.seen("decode", prompt)
        self.assertFalse(pre[0]["stream"])
        self.assertNotIn("stream_options", pre[0])
        self.assertTrue(dec[0]["stream"])
        self.assertEqual(dec[0]["stream_options"], {"include_usage": True})
        self.assertEqual(dec[0]["kv_transfer_params"], params_for(prompt))


    def test_stream_cut_at_the_deadline_ends_with_an_error_event(self) -> None:
        timeout = 1.0
        p = start(self.engines, timeout=timeout)
        try:
            t0 = time.monotonic()
            status, ctype, body = post(p.url, {"prompt": "slowstream", "stream": True})
            took = time.monotonic() - t0
        finally:
            stop(p)
        self.assertEqual(status, 200)  # sent with the stream's first bytes
        self.assertIn("text/event-stream", ctype)
        events = [json.loads(line[6:]) for line in body.split(b"\n") if line.startswith(b"data: ")]
        self.assertGreater(len(events), 1, body)
        self.assertEqual([e["i"] for e in events[:-1]], list(range(len(events) - 1)))
        self.assertIn("deadline", events[-1]["error"])
        self.assertEqual(events[-1]["engine"], "decode")
        self.assertLess(took, timeout + 2.0)  # a correctness bound: the decode would stream for 6 s


class TestPure(unittest.TestCase):
    """The router's pure parts: the two halves of a request, JSON checks."""

    def test_halves(self) -> None:
        from stage_client.pdproxy import halves

        body = {"prompt": "hi", "max_tokens": 9, "max_completion_tokens": 9, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": 0}
        pre, dec = halves(body, "pull")
        self.assertEqual(pre, {"prompt": "hi", "max_tokens": 1, "stream": False, "temperature": 0,
                               "kv_transfer_params": {"do_remote_decode": True, "stage_mode": "pull"}})
        self.assertEqual(dec, body)
        self.assertIsNot(dec, body)
        pre, dec = halves(body, "push", "h:1", "pd-x")
        self.assertEqual(pre["kv_transfer_params"],
                         {"do_remote_decode": True, "stage_mode": "push", "stage_xfer": "pd-x"})
        self.assertEqual(dec["kv_transfer_params"], {"do_remote_prefill": True, "stage_mode": "push",
                                                     "stage_xfer": "pd-x", "stage_rendezvous": "h:1"})
        self.assertTrue(halves(body, "push", "h:1")[0]["kv_transfer_params"]["stage_xfer"].startswith("pd-"))
        # without a rendezvous (deprecated) the decode's ticket goes over the sidecars' link: no address to pass
        self.assertEqual(halves(body, "push", "", "pd-y")[1]["kv_transfer_params"],
                         {"do_remote_prefill": True, "stage_mode": "push", "stage_xfer": "pd-y"})
        # TP with a sidecar per GPU: the decode's ticket names the prefill's rank-0 sidecar and its engine
        pre, dec = halves(body, "push", "", "pd-z", peer="prefill-{rank}", kv="pre")
        self.assertEqual(dec["kv_transfer_params"], {"do_remote_prefill": True, "stage_mode": "push", "stage_xfer": "pd-z",
                                                     "stage_peer": "prefill-{rank}", "stage_kv": "pre"})
        self.assertNotIn("stage_peer", pre["kv_transfer_params"])
        self.assertNotIn("stage_peer", halves(body, "pull", peer="prefill-{rank}")[0]["kv_transfer_params"])
        with self.assertRaisesRegex(ValueError, "pull or push"):
            halves(body, "teleport", "h:1")

    def test_parse_object(self) -> None:
        from stage_client.pdproxy import parse_object

        self.assertEqual(parse_object(b'{"a": [1, {"b": null}]}', 3), {"a": [1, {"b": None}]})
        cases = [
            (b'{"a": [1, {"b": []}]}', 3, "nested deeper than 3"),
            (b"[" * 100000, 128, "nested deeper than 128"),
            (b'{"a":' * 100000, 128, "nested deeper than 128"),
            (b"[1]", 8, "not a JSON object (list)"),
            (b"null", 8, "not a JSON object (null)"),
            (b'"s"', 8, "not a JSON object (str)"),
            (b"{", 8, "not JSON"),
            (b"", 8, "not JSON"),
            (b'{"a": "\xff"}', 8, "not JSON"),
        ]
        for data, depth, words in cases:
            with self.subTest(data=data[:20], depth=depth):
                with self.assertRaisesRegex(ValueError, re.escape(words)):
                    parse_object(data, depth)


class TestWithoutAiohttp(unittest.TestCase):
    def test_says_to_install_the_extra(self) -> None:
        code = ("import sys; sys.modules['aiohttp'] = None\n"
                "from stage_client import pdproxy\n"
                "pdproxy.main(['--prefill', 'http://127.0.0.1:1', '--decode', 'http://127.0.0.1:2', '--port', '0'])\n")
        try:
            r = subprocess.run([sys.executable, "-c", code], cwd=PYDIR, capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            self.fail("pdproxy served without aiohttp instead of saying what to install")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("stage-client[proxy]", r.stderr)
        self.assertNotIn("Traceback", r.stderr)


if __name__ == "__main__":
    unittest.main()
