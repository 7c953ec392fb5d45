"""Registration at scale (issue 27): how long registering a whole KV cache takes, and whether cycles leak.

Engines register one pool as per-layer views (vLLM: one tensor per layer
inside one allocation). This allocates ``--gib`` GiB (a CUDA tensor on a
``cuda`` sidecar, or a sparse memfd on a ``hostmem`` one: its pages are
never touched), registers it as ``--layers`` layer views with
``register_kv_cache`` (regions plus RegisterKV), and prints the time and
the time per GiB. Then ``--cycles`` register/unregister cycles of one
layer's cache: the mean time of the first and the last 10%, and the
sidecar's fds, mappings, RSS and goroutines before and after (all from
``Stats``). Growth in any of them is a leak.

    STAGED=bin/staged python3 examples/bench_register.py --device cpu --gib 64
    STAGED=.dev/staged python3 examples/bench_register.py --device cuda --gib 128   # on an H200
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import torch  # noqa: E402
from test_e2e import Staged  # noqa: E402

from stage_client import HostArena, register_kv_cache  # noqa: E402

GiB = 1 << 30


def args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda, cuda:N or cpu")
    p.add_argument("--gib", type=float, action="append", help="pool sizes in GiB (repeatable; default 64 and 128)")
    p.add_argument("--layers", type=int, default=64)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-size", type=int, default=128)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--cycles", type=int, default=1000)
    p.add_argument("--json", default="", help="also write the figures here")
    return p.parse_args()


def snapshot(client: Any) -> Dict[str, int]:
    """The sidecar's counts, and this (engine) process's fds and CUDA memory held by torch."""
    st = client.stats()
    out = {k: int(st.get(k, 0)) for k in ("fds", "mappings", "peer_mappings", "regions", "rss_bytes", "goroutines")}
    out["engine_fds"] = len(os.listdir("/proc/self/fd"))
    out["engine_cuda_reserved"] = int(torch.cuda.memory_reserved()) if torch.cuda.is_available() else 0
    return out


def layer_views(buf: Any, layers: int, blocks: int, block: int, heads: int, hs: int) -> List[Any]:
    """vLLM's per-layer packed views (blocks, heads, block, 2*hs) inside one pool, layer-major."""
    per = blocks * heads * block * 2 * hs
    return [buf[i * per:(i + 1) * per].view(blocks, heads, block, 2 * hs) for i in range(layers)]


def main() -> None:
    a = args()
    sizes = a.gib or [64.0, 128.0]
    cuda = a.device.startswith("cuda")
    ordinal = int(a.device.split(":")[1]) if ":" in a.device else 0
    extra = "device: {kind: cuda, ordinal: %d}\n" % ordinal if cuda else ""
    node = Staged("register", slots=8, extra=extra)
    out: Dict[str, Any] = {"device": a.device, "layers": a.layers, "pools": [], "cycles": {}}
    try:
        dtype, esize = torch.bfloat16, 2
        row = a.kv_heads * a.block * 2 * a.head_size * esize  # bytes of one block of one layer
        for gib in sizes:
            blocks = int(gib * GiB) // (a.layers * row)
            nbytes = blocks * a.layers * row
            if cuda:
                pool = torch.empty(nbytes // esize, dtype=dtype, device=a.device)
                arena = None
            else:
                arena = HostArena(nbytes, name="bench-register")
                pool = arena.bytes.view(dtype)
            views = layer_views(pool, a.layers, blocks, a.block, a.kv_heads, a.head_size)
            before = snapshot(node.client)
            t0 = time.perf_counter()
            kv = register_kv_cache(node.client, "pool", views, "vllm-packed", heads=a.kv_heads, head_size=a.head_size,
                                   access="kv_both", arena=arena)
            took = time.perf_counter() - t0
            t1 = time.perf_counter()
            kv.close()
            closed = time.perf_counter() - t1
            after = snapshot(node.client)
            res = {"gib": nbytes / GiB, "regions": a.layers, "register_ms": took * 1e3,
                   "ms_per_gib": took * 1e3 / (nbytes / GiB), "unregister_ms": closed * 1e3,
                   "before": before, "after": after}
            out["pools"].append(res)
            print("pool %.1f GiB, %d layer views: register %.1f ms (%.2f ms/GiB), unregister %.1f ms; sidecar fds %d->%d, "
                  "mappings %d->%d; engine fds %d->%d" % (res["gib"], a.layers, res["register_ms"], res["ms_per_gib"],
                                                    res["unregister_ms"], before["fds"], after["fds"], before["mappings"],
                                                    after["mappings"], before["engine_fds"], after["engine_fds"]),
                  flush=True)
            del views, kv
            del pool
            if arena is not None:
                arena.close()
            if cuda:
                torch.cuda.empty_cache()
                print("  after unregistering and dropping the pool, torch still reserves %.2f GiB of CUDA memory"
                      % (torch.cuda.memory_reserved() / GiB), flush=True)
        if a.cycles <= 0:
            return
        # cycles: one layer's cache (of a 1 GiB pool) registered and unregistered again and again
        blocks = GiB // row
        if cuda:
            pool = torch.empty(blocks * row // esize, dtype=dtype, device=a.device)
            arena = None
        else:
            arena = HostArena(blocks * row, name="bench-register-cycles")
            pool = arena.bytes.view(dtype)
        views = layer_views(pool, 1, blocks, a.block, a.kv_heads, a.head_size)
        start = snapshot(node.client)
        times: List[float] = []
        for i in range(a.cycles):
            t0 = time.perf_counter()
            kv = register_kv_cache(node.client, "cycle", views, "vllm-packed", heads=a.kv_heads,
                                   head_size=a.head_size, access="kv_both", arena=arena)
            kv.close()
            times.append(time.perf_counter() - t0)
            if i % 100 == 99:
                print("  %d cycles, last %.3f ms" % (i + 1, times[-1] * 1e3), flush=True)
        end = snapshot(node.client)
        k = max(1, a.cycles // 10)
        first, last = statistics.mean(times[:k]) * 1e3, statistics.mean(times[-k:]) * 1e3
        out["cycles"] = {"n": a.cycles, "first10pct_ms": first, "last10pct_ms": last, "start": start, "end": end}
        print("%d register/unregister cycles of a 1 GiB layer: first 10%% %.3f ms, last 10%% %.3f ms (%.2fx); "
              "fds %d->%d, mappings %d->%d, peer_mappings %d->%d, regions %d->%d, rss %.1f->%.1f MiB, goroutines %d->%d; "
              "engine fds %d->%d, engine CUDA reserved %.2f->%.2f GiB"
              % (a.cycles, first, last, last / first, start["fds"], end["fds"], start["mappings"], end["mappings"],
                 start["peer_mappings"], end["peer_mappings"], start["regions"], end["regions"],
                 start["rss_bytes"] / 2**20, end["rss_bytes"] / 2**20, start["goroutines"], end["goroutines"],
                 start["engine_fds"], end["engine_fds"], start["engine_cuda_reserved"] / GiB,
                 end["engine_cuda_reserved"] / GiB), flush=True)
        if arena is not None:
            arena.close()
    finally:
        rc = node.stop()
        if rc != 0:
            print("staged exited %d:\n%s" % (rc, node.tail()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
