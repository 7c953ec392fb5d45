"""The processes of scripts/gpu_vllm_pair.py: sidecars with fixed sockets and ports, vLLM API servers
with stage's connector or vLLM's own NixlConnector, and the HTTP client that streams completions and
reads /metrics (issue 34)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYDIR = os.path.join(ROOT, "python")

from test_e2e import Staged, sidecar_env  # noqa: E402 - gpu_vllm_pair put python/tests on sys.path
from gpu_vllm_parts import metric_sums, sidecar_config, top2_gap  # noqa: E402




def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def note_pid(workdir: str, pid: int) -> None:
    """Each process group this run starts, one per line in WORK/pids: gpu-vllm.sh ends those left over
    (they run in sessions of their own, which the device machine leaves running after a call)."""
    with open(os.path.join(workdir, "pids"), "a") as f:
        f.write("%d\n" % pid)


def log(msg: str) -> None:
    print("[gpu_vllm_pair %s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


class Sidecar:
    """One staged with a fixed socket, port and config file, so that a restart comes back the same."""

    def __init__(self, staged: str, name: str, workdir: str, device: str, visible: str, pids: str,
                 ordinal: int = 0) -> None:
        # The connector registers its cache with the tensor's device index, which is the engine's own
        # numbering (vLLM runs with CUDA_VISIBLE_DEVICES=<gpu>: index 0; under TP rank r on index r of its
        # GPUs); so the sidecar sees the GPUs its engine sees and serves that index (gpu_vllm_parts.sidecar_specs).
        self.staged, self.name, self.device, self.visible, self.pids = staged, name, device, visible, pids
        self.ordinal = ordinal
        self.dir = os.path.join(workdir, name)
        os.makedirs(os.path.join(self.dir, "s"), exist_ok=True)
        self.socket = os.path.join(self.dir, "s", name + ".sock")
        self.addr = "127.0.0.1:%d" % free_port()
        self.metrics = "127.0.0.1:%d" % free_port()
        self.config = os.path.join(self.dir, name + ".yaml")
        self.log = os.path.join(self.dir, name + ".log")
        self.routes: List[Tuple[str, str]] = []
        self.transport = "tcp"
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0

    def write(self) -> None:
        with open(self.config, "w") as f:
            f.write(sidecar_config(self.name, self.addr, self.socket, self.metrics, self.device, self.ordinal,
                                   self.routes, self.transport))

    def start(self, timeout: float = 60) -> None:
        self.write()
        self.starts += 1
        logf = open(self.log, "ab")
        env = sidecar_env()
        if self.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = self.visible
        self.proc = subprocess.Popen([self.staged, "--config", self.config], stdout=logf, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        logf.close()
        note_pid(self.pids, self.proc.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("staged %s exited %s at start:\n%s" % (self.name, self.proc.returncode, self.tail()))
            if os.path.exists(self.socket) and self.healthy():
                return
            time.sleep(0.2)
        raise RuntimeError("staged %s not ready after %ss:\n%s" % (self.name, timeout, self.tail()))

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen("http://%s/healthz" % self.metrics, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def reload(self, transport: Optional[str] = None) -> None:
        """Routes (and their transport) rewritten, then SIGHUP: staged reloads them in place."""
        if transport is not None:
            self.transport = transport
        self.write()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGHUP)

    def metric_sums(self) -> Dict[str, float]:
        try:
            with urllib.request.urlopen("http://%s/metrics" % self.metrics, timeout=10) as r:
                text = r.read().decode("utf-8", "replace")
        except OSError as e:
            return {"error": 1.0, "error_" + type(e).__name__: 1.0}
        return metric_sums(text, ("stage_bytes_total", "stage_transfers_total", "stage_transfer_duration_seconds_sum",
                                  "stage_transfer_duration_seconds_count", "stage_errors_total",
                                  "stage_transport_fallbacks_total", "stage_copy_seconds_total",
                                  "stage_network_seconds_total"))

    def stats(self, stagectl: str) -> Dict[str, Any]:
        out = subprocess.run([stagectl, "stats", "--json", "--socket", self.socket], capture_output=True, timeout=30)
        if out.returncode != 0:
            return {"error": out.stderr.decode("utf-8", "replace")[-500:]}
        return json.loads(out.stdout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    tail = Staged.tail  # the last lines of self.log


NIXL_UCX_TLS = os.environ.get("NIXL_UCX_TLS", "tcp,cuda_copy")


def nixl_transfer_config(side_port: int) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """vLLM's own NixlConnector as the issue asks for it beside stage (issue 34 item 4): UCX over TCP on the
    loopback with cuda_copy staging (no cuda_ipc, so no same-node shortcut stage's ``tcp`` rows do not
    take either), KV buffers in GPU memory; the side channel (NIXL's handshake) on a port of its own.
    Returns the --kv-transfer-config and the engine's added environment."""
    ktc = {"kv_connector": "NixlConnector", "kv_role": "kv_both",
           "kv_buffer_device": "cuda", "kv_load_failure_policy": "recompute"}
    env = {"UCX_TLS": NIXL_UCX_TLS, "UCX_NET_DEVICES": "lo", "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
           "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port), "UCX_RCACHE_MAX_UNRELEASED": "1024"}
    return ktc, env


NIXL_METRICS = ("vllm:nixl_xfer_time_seconds_sum", "vllm:nixl_xfer_time_seconds_count",
                "vllm:nixl_bytes_transferred_sum", "vllm:nixl_bytes_transferred_count",
                "vllm:nixl_num_failed_transfers_total", "vllm:nixl_num_failed_transfers",
                "vllm:nixl_num_failed_notifications_total", "vllm:nixl_num_kv_expired_reqs_total")


def engine_metrics(url: str, names: Sequence[str]) -> Dict[str, float]:
    """An engine's /metrics, ``names`` summed over their labels (an error key when unreachable)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode("utf-8", "replace")
    except OSError as e:
        return {"error_" + type(e).__name__: 1.0}
    return metric_sums(text, names)


def engine_class() -> Any:
    """tests/test_vllm_real.Engine's waiting, logs and stop, with the argv and environment of this run."""
    from test_vllm_real import Engine

    class PairEngine(Engine):  # type: ignore[misc, valid-type]
        def __init__(self, name: str, model: str, role: str, sock: str, route: str, block: int,
                     extra: Dict[str, Any], args: argparse.Namespace, gpus: List[int], eager: bool,
                     connector: str = "stage") -> None:
            self.name, self.model = name, model
            self.port = free_port()
            self.url = "http://127.0.0.1:%d" % self.port
            more: Dict[str, str] = {}
            if connector == "nixl":
                ktc, more = nixl_transfer_config(free_port())
            else:
                ktc = {"kv_connector": "StageConnector", "kv_connector_module_path": "stage_client.vllm",
                       "kv_role": role, "kv_load_failure_policy": "recompute",
                       "kv_connector_extra_config": dict({"socket": sock, "route": route,
                                                          "timeout_s": args.timeout_s, "lease_s": 60}, **extra)}
            self.argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                         "--port", str(self.port), "--host", "127.0.0.1", "--seed", "0",
                         "--max-model-len", str(args.max_model_len), "--max-num-seqs", "32",
                         "--block-size", str(block), "--kv-transfer-config", json.dumps(ktc)] + args.engine_args.split()
            if len(gpus) > 1:  # one worker process per GPU, rank r on device index r
                self.argv += ["--tensor-parallel-size", str(len(gpus))]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                [PYDIR] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                VLLM_LOGGING_LEVEL="INFO", TOKENIZERS_PARALLELISM="false", VLLM_SERVER_DEV_MODE="1",
                VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", VLLM_USE_FLASHINFER_SAMPLER="0",
                NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
            if args.cpu:
                self.argv += ["--dtype", "float32", "--enforce-eager"]
                env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=str(gpus[0]), OMP_NUM_THREADS="1")
            else:
                self.argv += ["--dtype", "bfloat16", "--gpu-memory-utilization", str(args.gpu_mem)]
                if eager:
                    self.argv.append("--enforce-eager")
                env.update(CUDA_VISIBLE_DEVICES=",".join(str(g) for g in gpus),
                           PYTORCH_CUDA_ALLOC_CONF="expandable_segments:False")
            env.pop("STAGE_SOCKET", None)
            env.update(more)
            self.log = open(os.path.join(args.out, "vllm-%s.log" % name), "wb")
            self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
            note_pid(args.work, self.proc.pid)

    return PairEngine


def stream(url: str, body: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    """One streamed completion: status, token ids (or text pieces), TTFT and total seconds, error."""
    req = urllib.request.Request(url, json.dumps(dict(body, stream=True)).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    res: Dict[str, Any] = {"status": None, "tokens": None, "ttft": None, "total": None, "gaps": []}
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            res["status"] = r.status
            toks: List[Any] = []
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                ch = json.loads(data)
                if "error" in ch:
                    res["error"] = str(ch["error"])[:300]
                    break
                c = (ch.get("choices") or [{}])[0]
                piece = list(c.get("token_ids") or []) or ([c["text"]] if c.get("text") else [])
                res["gaps"] += [top2_gap(t) for t in ((c.get("logprobs") or {}).get("top_logprobs") or [])]
                if piece and res["ttft"] is None:
                    res["ttft"] = time.monotonic() - t0
                toks += piece
                if c.get("finish_reason") in ("error", "abort"):
                    res["error"] = "finish_reason %s" % c["finish_reason"]
            res["tokens"] = None if "error" in res else toks
    except urllib.error.HTTPError as e:
        res["status"], res["error"] = e.code, e.read()[:300].decode("utf-8", "replace")
    except (OSError, ValueError) as e:
        res["error"] = "%s: %s" % (type(e).__name__, e)
    res["total"] = time.monotonic() - t0
    return res


def batch(url: str, prompts: Sequence[List[int]], model: str, args: argparse.Namespace,
          mode: Optional[str] = None, max_tokens: Optional[int] = None,
          concurrency: Optional[int] = None) -> Tuple[List[Dict[str, Any]], float]:
    """All prompts, ``concurrency`` (default ``args.concurrency``) at a time; (results in prompt order,
    wall seconds). Each asks for its tokens' top-2 logprobs, so a difference can be told from a tie."""
    out: List[Dict[str, Any]] = [{} for _ in prompts]
    todo = list(range(len(prompts)))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            body: Dict[str, Any] = {"model": model, "prompt": prompts[i], "temperature": 0, "ignore_eos": True,
                                    "max_tokens": max_tokens or args.max_tokens, "return_token_ids": True,
                                    "logprobs": 2}
            if mode:
                body["stage_mode"] = mode
            out[i] = stream(url + "/v1/completions", body, args.request_timeout)

    t0 = time.monotonic()
    n = min(concurrency or args.concurrency, len(prompts))
    ts = [threading.Thread(target=worker, daemon=True) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(args.request_timeout + 30)
    return out, time.monotonic() - t0


def reset_prefix_cache(url: str) -> str:
    """vLLM's dev route (VLLM_SERVER_DEV_MODE=1): {"success": false} while blocks are held, so a few tries."""
    last = ""
    for _ in range(10):
        try:
            req = urllib.request.Request(url + "/reset_prefix_cache", b"", method="POST")
            with urllib.request.urlopen(req, timeout=30) as r:
                last = r.read().decode("utf-8", "replace")[:200]
                if json.loads(last).get("success") is not False:
                    return "ok"
        except (OSError, ValueError) as e:
            last = "%s: %s" % (type(e).__name__, e)
        time.sleep(0.5)
    return "failed: %s" % last
