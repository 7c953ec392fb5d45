"""Layer-wise push against push-after-prefill through stage_client.vllm: how soon is the KV usable on the decode?

One request's prefill runs on a prefill engine (one worker) whose forward
takes ``--layer-ms`` per layer (simulated compute: the rows are already in
the cache); the decode engine allocated first and posted its ticket. The
figure is the time from the end of the prefill's last layer to the moment
the decode's connector reports the request received (``get_finished``),
all through two real sidecars and vLLM's call sequence (tests/vllm_replay.py):

* layer-wise: ``save_kv_layer`` pushes each layer as it is computed, so
  all but the last layer's transfer overlap the rest of the forward;
* after prefill: nothing moves until the request finished; the next step
  pushes every layer.

GPU (cuda sidecars on one GPU, bf16 CUDA tensors; the defaults are the
issue's 32 layers, 4,096 tokens, 8 kv heads of 128)::

    cd python && python3 examples/bench_connector.py --staged ../.dev/staged --device cuda

CPU (hostmem sidecars, memfd caches), small::

    cd python && python3 examples/bench_connector.py --device cpu --layers 4 --tokens 512 --kv-heads 2 \\
        --head-size 64 --layer-ms 2 --iters 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import torch  # noqa: E402

from stage_client import HostArena  # noqa: E402


def args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-size", type=int, default=128)
    p.add_argument("--block", type=int, default=16, help="tokens per block (both sides)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda, cuda:N or cpu")
    p.add_argument("--layer-ms", type=float, default=3.5,
                   help="simulated compute per layer (3.5 ms: an 8B model's 4,096-token prefill on an H100, ~110 ms)")
    p.add_argument("--iters", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--staged", default=os.environ.get("STAGED", ""), help="the staged binary (default $STAGED)")
    p.add_argument("--slots", type=int, default=32, help="staging slots (1 MiB each) of both sidecars")
    p.add_argument("--verify", action="store_true", help="check the decode's rows equal the prefill's after each run")
    return p.parse_args()


class Bench:
    def __init__(self, a: argparse.Namespace) -> None:
        if a.staged:
            os.environ["STAGED"] = os.path.abspath(a.staged)
        import test_e2e  # reads $STAGED
        from test_e2e import Staged
        if not test_e2e.HAVE_STAGED:
            raise SystemExit(test_e2e.SKIP_WHY)
        self.a = a
        self.cuda = a.device.startswith("cuda")
        self.dtype = getattr(torch, a.dtype)
        self.blocks = -(-a.tokens // a.block)
        ordinal = int(a.device.split(":")[1]) if ":" in a.device else 0
        extra = "device: {kind: cuda, ordinal: %d}\n" % ordinal if self.cuda else ""
        self.nodes: List[Any] = []
        self.arenas: List[HostArena] = []
        dec = Staged("decode", slots=a.slots, extra=extra)
        self.nodes.append(dec)
        pre = Staged("prefill", route_to=dec.peers, slots=a.slots, extra=extra)
        self.nodes.append(pre)
        pre.settle(1)
        self.pre, self.dec = pre, dec
        self.src = self.cache("prefill", seed=1)
        self.dst = self.cache("decode", seed=2)

    def cache(self, name: str, seed: int) -> Dict[str, Any]:
        """One rank's vLLM flash-layout cache, layer name -> (2, blocks, block, heads, head_size)."""
        from vllm_replay import layer_name
        a = self.a
        shape = (a.layers, 2, self.blocks, a.block, a.kv_heads, a.head_size)
        if self.cuda:
            t = torch.empty(shape, dtype=self.dtype, device=a.device)
        else:
            size = torch.tensor([], dtype=self.dtype).element_size()
            for n in shape:
                size *= n
            arena = HostArena(size + (1 << 20), "bench-" + name)
            self.arenas.append(arena)
            t = arena.empty(shape, self.dtype)
        g = torch.Generator(device=t.device).manual_seed(seed)
        t.copy_(torch.randn(shape, generator=g, device=t.device, dtype=torch.float32).to(self.dtype))
        if self.cuda:
            torch.cuda.synchronize(t.device)
        return {layer_name(i): t[i] for i in range(a.layers)}

    def engines(self, layerwise: bool, tag: str) -> Tuple[Any, Any]:
        from vllm_replay import Engine
        common = dict(mode="push", kv_heads=self.a.kv_heads, timeout_s=60.0, layerwise=layerwise)
        pe = Engine(self.pre.socket, dict(common, route="decode", peer_name="prefill",
                                          rendezvous_listen="127.0.0.1:0"), self.a.kv_heads, [self.src], "bp-" + tag)
        de = Engine(self.dec.socket, dict(common, route="prefill", peer_name="decode"), self.a.kv_heads,
                    [self.dst], "bd-" + tag)
        return pe, de

    def once(self, pe: Any, de: Any, rid: str) -> float:
        """One request; seconds from the end of the last layer's compute to the decode reporting it received."""
        from vllm_replay import NewRequestData, Request, SchedulerOutput, layer_name
        a = self.a
        table = list(range(self.blocks))
        prompt = list(range(a.tokens))
        rdv = pe.sched.scheduler.rendezvous.address
        dr = Request("d" + rid, prompt, {"do_remote_prefill": True, "stage_mode": "push", "stage_xfer": rid,
                                         "stage_rendezvous": rdv})
        de.admit(dr, lambda n: list(reversed(table)))  # the decode's blocks in another order than the prefill's
        de.step()
        pr = Request(rid, prompt, {"do_remote_decode": True, "stage_mode": "push", "stage_xfer": rid})
        pe.admit(pr, lambda n: table)
        so = SchedulerOutput([NewRequestData(rid, prompt, (table,), 0)], num_scheduled_tokens={rid: a.tokens})
        end: List[float] = []
        tick = a.layer_ms / 1000.0

        def forward(after_layer: Any) -> None:
            for i in range(a.layers):
                if self.cuda:  # the layer's rows are written on the stream; the event save_kv_layer records follows
                    self.src[layer_name(i)][0, 0, 0, 0, 0].add_(0)
                time.sleep(tick)
                if i == a.layers - 1:
                    if self.cuda:
                        torch.cuda.synchronize()
                    end.append(time.perf_counter())
                after_layer(i)

        pe.step(so, forward)
        pe.finish(pr, table)
        while "d" + rid not in de.recvd:
            pe.step()
            de.step()
            if time.perf_counter() - end[0] > 120:
                raise RuntimeError("request %s not received after 120 s" % rid)
        took = time.perf_counter() - end[0]
        if de.load_errors:
            raise RuntimeError("load errors: %s" % sorted(de.load_errors)[:8])
        pe.until(lambda: rid in pe.sent, 60, tick=0.001)
        if a.verify:
            self.verify(table)
        return took

    def verify(self, table: List[int]) -> None:
        from vllm_replay import layer_name
        rev = list(reversed(table))
        for i in (0, self.a.layers - 1):
            s, d = self.src[layer_name(i)], self.dst[layer_name(i)]
            if not torch.equal(s[:, table], d[:, rev]):
                raise RuntimeError("layer %d: the decode's rows differ from the prefill's" % i)

    def run(self, layerwise: bool) -> List[float]:
        tag = "lw" if layerwise else "af"
        pe, de = self.engines(layerwise, tag)
        try:
            out = []
            for it in range(self.a.warmup + self.a.iters):
                t = self.once(pe, de, "%s-%d" % (tag, it))
                if it >= self.a.warmup:
                    out.append(t)
            return out
        finally:
            pe.shutdown()
            de.shutdown()

    def close(self) -> None:
        for n in self.nodes:
            n.stop()
        for ar in self.arenas:
            ar.close()


def summary(name: str, xs: List[float]) -> str:
    ms = sorted(x * 1000 for x in xs)
    q = statistics.quantiles(ms, n=4) if len(ms) >= 2 else [ms[0]] * 3
    return ("%-14s median %8.2f ms  min %8.2f  max %8.2f  IQR %7.2f  (n=%d)"
            % (name, statistics.median(ms), ms[0], ms[-1], q[2] - q[0], len(ms)))


def main() -> None:
    a = args()
    b = Bench(a)
    try:
        elt = torch.tensor([], dtype=b.dtype).element_size()
        size = a.layers * 2 * a.tokens * a.kv_heads * a.head_size * elt
        print("stage connector bench: %s, %d layers x %d tokens x %d kv heads x %d, %s: %.1f MiB of KV; "
              "simulated compute %.1f ms per layer (%.0f ms per prefill); %d iterations after %d warm-up"
              % (a.device, a.layers, a.tokens, a.kv_heads, a.head_size, a.dtype, size / (1 << 20), a.layer_ms,
                 a.layer_ms * a.layers, a.iters, a.warmup))
        lw = b.run(True)
        af = b.run(False)
        print("time from the end of prefill to the KV usable on the decode:")
        print(summary("layer-wise", lw))
        print(summary("after prefill", af))
        print("ratio (after prefill / layer-wise, medians): %.2fx" % (statistics.median(af) / statistics.median(lw)))
    finally:
        b.close()


if __name__ == "__main__":
    main()
