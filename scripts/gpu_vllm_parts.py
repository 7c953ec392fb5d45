"""The pure parts of scripts/gpu_vllm_pair.py (issue 34): prompts, token comparison, timings, the
sidecars' config and metrics, the summary table. No I/O; tested by python/tests/test_gpu_vllm.py."""

from __future__ import annotations

import json
import math
import random
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple



def prompt_lengths(n: int, lo: int, hi: int) -> List[int]:
    """``n`` lengths from ``lo`` to ``hi`` (both included), log-spaced, rising, distinct where room allows."""
    if n < 2 or lo < 1 or hi <= lo:
        raise ValueError("want n >= 2 and 1 <= lo < hi, got n=%d lo=%d hi=%d" % (n, lo, hi))
    out: List[int] = []
    for i in range(n):
        v = int(round(math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * i / (n - 1))))
        if out and v <= out[-1]:
            v = out[-1] + 1
        out.append(v)
    out[-1] = max(out[-1], hi)
    return out


def make_prompts(lengths: Sequence[int], vocab: int, seed: int, shared: int = 0) -> List[List[int]]:
    """Token ids in [4, vocab) (0-3 are the tokenizer's specials); the last two prompts share their
    first ``shared`` tokens when both are longer than that (the decode's prefix cache meets them)."""
    rnd = random.Random(seed)
    ps = [[rnd.randrange(4, vocab) for _ in range(n)] for n in lengths]
    if shared and len(ps) >= 2 and min(len(ps[-1]), len(ps[-2])) > shared:
        ps[-2][:shared] = ps[-1][:shared]
    return ps


def compare(got: Sequence[Optional[List[Any]]], want: Sequence[Optional[List[Any]]],
            gaps: Optional[Sequence[Optional[List[Optional[float]]]]] = None, tie: float = 0.1) -> Dict[str, Any]:
    """Prompt by prompt: equal, or where the first difference is (None: the request failed).

    ``gaps``: per prompt of the reference, per generated token, the gap in nats between its top two
    logprobs. Where given, each difference says the reference's gap at that token, and ``ties`` counts
    the differences at a near tie (gap < ``tie``): greedy decoding flips there on numeric noise alone
    (another batch shape or kernel split), while KV that arrived wrong diverges at wide gaps too."""
    diff = []
    equal = ties = 0
    for i, (g, w) in enumerate(zip(got, want)):
        if g is None or w is None:
            diff.append({"prompt": i, "failed": "got" if g is None else "reference"})
        elif g == w:
            equal += 1
        else:
            pos = next((k for k, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            d: Dict[str, Any] = {"prompt": i, "first_diff": pos, "got_len": len(g), "want_len": len(w)}
            gp = gaps[i] if gaps is not None and i < len(gaps) else None
            if gp is not None and pos < len(gp) and gp[pos] is not None:
                d["ref_gap"] = round(gp[pos], 4)
                ties += gp[pos] < tie
            diff.append(d)
    out: Dict[str, Any] = {"equal": equal, "of": len(want), "diff": diff}
    if gaps is not None:
        out["near_ties"] = ties
    return out


def top2_gap(top: Optional[Dict[str, float]]) -> Optional[float]:
    """The gap between the two largest logprobs of one token's ``top_logprobs`` (None with fewer than 2)."""
    if not top or len(top) < 2:
        return None
    a, b = sorted(top.values(), reverse=True)[:2]
    return float(a) - float(b)


def percentile(xs: Sequence[float], q: float) -> Optional[float]:
    """The ``q`` (0..1) quantile by nearest rank; None for no values."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(math.ceil(q * len(s))) - 1))]


def metric_sums(text: str, names: Sequence[str]) -> Dict[str, float]:
    """Prometheus text: each sample of ``names`` summed over its labels, keyed ``name{label=value,...}``
    with the ``le`` label left out (so histograms give ``_sum`` and ``_count`` per series)."""
    out: Dict[str, float] = {}
    pat = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([^\s]+)")
    for line in text.splitlines():
        m = pat.match(line)
        if not m or m.group(1) not in names:
            continue
        labels = [kv for kv in re.findall(r'(\w+)="([^"]*)"', m.group(2) or "") if kv[0] not in ("le", "link")]
        key = m.group(1) + ("{%s}" % ",".join("%s=%s" % kv for kv in sorted(labels)) if labels else "")
        try:
            out[key] = out.get(key, 0.0) + float(m.group(3))
        except ValueError:
            continue
    return out


def delta(after: Dict[str, float], before: Dict[str, float]) -> Dict[str, float]:
    """Per key: after - before, keys that moved only."""
    return {k: after[k] - before.get(k, 0.0) for k in sorted(after) if after[k] != before.get(k, 0.0)}


def timing(results: Sequence[Dict[str, Any]], wall: float) -> Dict[str, Any]:
    """TTFT p50/p90 (s), generated tokens per second over the batch's wall time, failures."""
    ok = [r for r in results if r.get("status") == 200 and r.get("tokens") is not None]
    ttft = [r["ttft"] for r in ok if r.get("ttft") is not None]
    toks = sum(len(r["tokens"]) for r in ok)
    return {"requests": len(results), "ok": len(ok), "ttft_p50": percentile(ttft, 0.5),
            "ttft_p90": percentile(ttft, 0.9), "tokens": toks, "wall_s": round(wall, 3),
            "tok_per_s": round(toks / wall, 1) if wall > 0 else None}


MIB = 1 << 20


def sidecar_config(name: str, listen: str, sock: str, metrics: str, device: str, ordinal: int,
                   routes: Sequence[Tuple[str, Any]], transport: str) -> str:
    """staged's YAML: node, addresses, device, 4 MiB slots, routes (name, peer address or a list of them) of
    ``transport``."""
    if transport not in ("auto", "tcp", "ipc", "shm"):
        raise ValueError("transport %r: auto, tcp, ipc or shm" % transport)
    cfg = ("node: {name: %s}\nlisten: %s\ncontrol_socket: %s\nmetrics: {listen: %s}\n"
           "device: {kind: %s, ordinal: %d}\nstaging: {slot_size: 4MiB, slots: 64, window: 32}\n"
           % (name, listen, sock, metrics, device, ordinal))
    if routes:
        cfg += "routes:\n" + "".join("  - name: %s\n    peers: [%s]\n    transport: %s\n    stripes: 4\n"
                                     % (r, ", ".join('"%s"' % p for p in ([peer] if isinstance(peer, str) else peer)),
                                        transport) for r, peer in routes)
    return cfg


def parse_tp_runs(text: str) -> List[Tuple[int, int]]:
    """``"2:1,2:2"``: the (prefill TP, decode TP) of each run, in order; each TP 1 to 8."""
    runs = []
    for part in (x.strip() for x in text.split(",")):
        if not part:
            continue
        m = re.fullmatch(r"([1-8]):([1-8])", part)
        if not m:
            raise ValueError("tp run %r: want PREFILL_TP:DECODE_TP, each 1 to 8 (e.g. 2:1,2:2)" % part)
        runs.append((int(m.group(1)), int(m.group(2))))
    if not runs:
        raise ValueError("no tp run in %r (e.g. 2:1,2:2)" % text)
    return runs


def tp_plan(runs: Sequence[Tuple[int, int]], gpus: Sequence[int], share: bool = False) -> Dict[str, Any]:
    """The GPUs of each side and run: the prefill's group is the first (largest prefill TP) GPUs, the decode's
    the next (largest decode TP); a run's engine takes the first TP GPUs of its side's group. The sidecars
    serve the groups, so runs restart only the engines. ``share`` (fewer GPUs than both groups need, as on
    a 2-GPU machine when no 4-GPU one is lent): the decode's group is the last GPUs, overlapping the
    prefill's; ``shared`` says so (the engines then start one after the other)."""
    mp, md = max(p for p, _ in runs), max(d for _, d in runs)
    if len(gpus) < mp + md and not (share and len(gpus) >= max(mp, md)):
        raise ValueError("tp runs %s need %d GPUs (prefill %d + decode %d)%s, --gpus gives %d"
                         % (list(runs), mp + md, mp, md, " or, sharing, %d" % max(mp, md) if share else "",
                            len(gpus)))
    pre = list(gpus[:mp])
    dec = list(gpus[mp:mp + md]) if len(gpus) >= mp + md else list(gpus[len(gpus) - md:])
    return {"pre_group": pre, "dec_group": dec, "per_rank": mp + md > 2, "shared": bool(set(pre) & set(dec)),
            "runs": [{"pre_tp": p, "dec_tp": d, "pre": pre[:p], "dec": dec[:d]} for p, d in runs]}


def sidecar_specs(side: str, group: Sequence[int], per_rank: bool) -> List[Dict[str, Any]]:
    """The sidecars of one side: without TP one, named ``side``, seeing its GPU as ordinal 0 (the engine's
    numbering); per rank, ``side-r`` seeing the whole group (CUDA_VISIBLE_DEVICES as its engine has it) and
    serving ordinal r, the device index rank r's cache registers with (vLLM puts rank r on device r)."""
    if not per_rank:
        return [{"name": side, "visible": str(group[0]), "ordinal": 0, "rank": 0}]
    vis = ",".join(str(g) for g in group)
    return [{"name": "%s-%d" % (side, r), "visible": vis, "ordinal": r, "rank": r} for r in range(len(group))]


def tp_skip(mode: str, per_rank: bool) -> str:
    """Why a phase cannot run on this layout ("" : it can). A push with one sidecar per rank: the decode's ticket
    must reach the prefill's rank 0 sidecar, which a route of several peers only reaches by name, and
    stage_client.pdproxy names none (it would need to set stage_peer, as the connector's tests do)."""
    if mode == "push" and per_rank:
        return ("push with one sidecar per rank needs the router to name the prefill's sidecar (stage_peer) for the "
                "decode's ticket; stage_client.pdproxy does not yet")
    return ""


def _kv_line(kv: Dict[str, Dict[str, float]]) -> str:
    """Bytes in/out and transfer seconds (sum / count) per side, from the sidecars' /metrics deltas."""
    parts = []
    for side in ("prefill", "decode"):
        d = kv.get(side) or {}
        b_out = sum(v for k, v in d.items() if k.startswith("stage_bytes_total") and "direction=out" in k)
        b_in = sum(v for k, v in d.items() if k.startswith("stage_bytes_total") and "direction=in" in k)
        ts = sum(v for k, v in d.items() if k.startswith("stage_transfer_duration_seconds_sum"))
        tn = sum(v for k, v in d.items() if k.startswith("stage_transfer_duration_seconds_count"))
        fb = sum(v for k, v in d.items() if k.startswith("stage_transport_fallbacks_total"))
        parts.append("%s: out %.1f MiB, in %.1f MiB, %d transfers, %.3f s mean%s" % (
            side, b_out / MIB, b_in / MIB, tn, ts / tn if tn else 0.0,
            ", %d same-node fallbacks to TCP" % fb if fb else ""))
    return "; ".join(parts)


def _nixl_line(kv: Dict[str, Dict[str, float]]) -> str:
    """NixlConnector's transfers from the engines' /metrics deltas: MiB, count, mean seconds, failures."""
    parts = []
    for side in ("prefill", "decode"):
        d = kv.get(side) or {}
        n = sum(v for k, v in d.items() if k.startswith("vllm:nixl_xfer_time_seconds_count"))
        if not n:
            continue
        t = sum(v for k, v in d.items() if k.startswith("vllm:nixl_xfer_time_seconds_sum"))
        b = sum(v for k, v in d.items() if k.startswith("vllm:nixl_bytes_transferred_sum"))
        bad = sum(v for k, v in d.items() if k.startswith("vllm:nixl_num_failed"))
        parts.append("%s (NIXL): %.1f MiB in %d transfers, %.3f s mean%s" % (
            side, b / MIB, n, t / n, ", %d failed" % bad if bad else ""))
    return "; ".join(parts) or "no NIXL transfer counted in the engines' /metrics"


def _t(x: Optional[float]) -> str:
    return "-" if x is None else "%.3f" % x


def _equal_text(tk: Dict[str, Any]) -> str:
    """``14/16 (differ: #10@2 gap 0.031, ...; 2 at a near tie)``: prompt, first differing token, the
    reference's top-2 logprob gap there."""
    eq = "%s/%s" % (tk.get("equal"), tk.get("of"))
    if tk.get("diff"):
        eq += " (differ: %s" % ", ".join(
            "#%s@%s%s" % (d.get("prompt"), d.get("first_diff", d.get("failed")),
                          " gap %.3f" % d["ref_gap"] if d.get("ref_gap") is not None else "") for d in tk["diff"][:6])
        if tk.get("near_ties") is not None:
            eq += "; %d at a near tie" % tk["near_ties"]
        eq += ")"
    return eq


def summary_text(rows: Sequence[Dict[str, Any]]) -> str:
    out = ["phase | tokens equal | TTFT p50/p90 s (P/D vs one engine) | tok/s (P/D vs one engine) | KV moved"]
    for r in rows:
        ph = r.get("phase", "?")
        if r.get("skipped"):
            out.append("%s | not run: %s" % (ph, r["skipped"]))
        elif ph.startswith("pd-"):
            tk, pd, al = r.get("tokens") or {}, r.get("pd") or {}, r.get("alone") or {}
            eq = _equal_text(tk)
            ct = r.get("control")
            if ct:
                eq += "; control (the decode alone again, one at a time): " + _equal_text(ct)
            out.append("%s | %s | %s/%s vs %s/%s | %s vs %s | %s" % (
                ph, eq, _t(pd.get("ttft_p50")), _t(pd.get("ttft_p90")), _t(al.get("ttft_p50")),
                _t(al.get("ttft_p90")), pd.get("tok_per_s"), al.get("tok_per_s"),
                (_nixl_line if r.get("connector") == "nixl" else _kv_line)(r.get("kv") or {})))
        elif ph == "fault":
            st = [q.get("status") for q in r.get("requests") or []]
            out.append("fault | %s/%s | prefill's staged SIGKILLed at %.2fs (%s); statuses %s; within timeout_s+30: %s"
                       " | %s" % ((r.get("tokens") or {}).get("equal"), (r.get("tokens") or {}).get("of"),
                                  r.get("killed_at_s") or 0, "mid-transfer" if r.get("mid_transfer") else
                                  "before any KV reached the decode", st, r.get("within_timeout"),
                                  _kv_line(r.get("kv") or {})))
        elif ph == "fault-restart":
            out.append("fault-restart | %s | restarted: %s; KV moved again: %s; errors %s | %s" % (
                "%s/%s" % ((r.get("tokens") or {}).get("equal"), (r.get("tokens") or {}).get("of")),
                r.get("restarted"), r.get("kv_moved_again"), r.get("errors") or r.get("error"),
                _kv_line(r.get("kv") or {})))
        elif ph == "engines":
            tp = " TP %s on GPUs %s -> TP %s on GPUs %s," % (r["pre_tp"], r.get("pre_gpus"), r.get("dec_tp"), r.get(
                "dec_gpus")) if r.get("pre_tp", 1) > 1 or r.get("dec_tp", 1) > 1 else ""
            out.append("engines | attempt %s: %s,%s%s %s, blocks prefill %s / decode %s, start %ss%s" % (
                r.get("attempt"), "ok" if r.get("ok") else "FAILED", tp,
                " vLLM's NixlConnector," if r.get("connector") == "nixl" else "", "--enforce-eager" if r.get("eager") else
                "CUDA graphs on", r.get("pre_block"), r.get("dec_block"), r.get("start_s"),
                "" if r.get("ok") else ": " + str(r.get("error", ""))[-300:].replace("\n", " ")))
        elif ph.split(" ")[0] in ("start", "warmup", "sidecars"):  # "warmup tp2:1": a TP run's
            out.append("%s | %s" % (ph, json.dumps({k: v for k, v in r.items() if k not in ("phase", "at_s")})[:400]))
    return "\n".join(out) + "\n"


