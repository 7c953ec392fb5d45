#!/usr/bin/env bash
# The data-plane and same-node targets in one job on the GPU machine, with
# their ceilings measured in the same job, printed as one table. Runs from
# the repository root with what `make gpu-build` put in .dev/ (no Go there).
#
#   make gpu-build                                        # here
#   STAGE_GPU_SRC=0 STAGE_GPU_DST=1 bash scripts/gpu-targets.sh   # there
#
# The JSON of every run, the ceilings and one log go to $OUT (or ./gpu-out):
# thirteen files.
set -u
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
src=${STAGE_GPU_SRC:-0}; dst=${STAGE_GPU_DST:-1}
B=".dev/stagectl bench --spawn --staged .dev/staged"
G="--device cuda:$src --remote-device cuda:$dst"

CONNS=8 bash .dev/bench/ceilings.sh > "$out/ceilings.txt" 2>&1
run() { # name, bench flags...
  local name=$1; shift
  echo "== $name: $*" >> "$out/bench.log"
  $B "$@" --json > "$out/$name.json" 2>> "$out/bench.log" || { echo "bench $name failed (see $out/bench.log)"; tail -5 "$out/bench.log"; }
}
run ranges $G --stripes 8 --slots 64 --size 1GiB --block 1MiB --iters 5 --verify --raw
run blocks $G --stripes 8 --slots 64 --size 1GiB --block 16KiB --pattern blocks --iters 5 --verify --raw
run gib64 $G --stripes 8 --slots 64 --size 8GiB --block 1MiB --iters 8 --raw
run ipc $G --transport auto --size 4GiB --block 1GiB --iters 5 --verify
# The same rows with two transfers in flight, as an engine pushing layer
# after layer keeps them (each between its own pair of buffers).
run ranges2 $G --stripes 8 --slots 64 --size 1GiB --block 1MiB --iters 6 --verify --inflight 2
run blocks2 $G --stripes 8 --slots 64 --size 1GiB --block 16KiB --pattern blocks --iters 6 --verify --inflight 2
run ipc2 $G --transport auto --size 4GiB --block 1GiB --iters 10 --verify --inflight 2
# Back to back, one at a time: the destination is checked after the last
# transfer instead of after each (a check idles the GPUs for seconds, and
# the next copy then starts on a cold link).
run ipcb2b $G --transport auto --size 4GiB --block 1GiB --iters 10 --verify-end
run latency --stripes 1 --size 4KiB --block 4KiB --iters 5000 --warmup 300 --verify
# The same with every reader polling for 100 us instead of sleeping (the
# sidecars' staging.read_spin, bench's client.WithSpin), back to back and
# checked after the last push: a check after each push makes the engine's
# own work (reads, garbage collection) part of every push's tail.
run latspin --stripes 1 --size 4KiB --block 4KiB --iters 5000 --warmup 300 --spin 100us --verify-end
CONNS=8 bash .dev/bench/ceilings.sh 2>/dev/null | grep loopback > "$out/ceilings-after.txt"

OUT_DIR=$out python3 - <<'PY'
import json, os, re
d = os.environ["OUT_DIR"]
ceil = open(os.path.join(d, "ceilings.txt")).read()
def num(pat, text=ceil):
    m = re.search(pat, text)
    return float(m.group(1)) if m else float("nan")
tcpbw = num(r"tcp loopback\s+8 conns:\s+([\d.]+)")
d2h = num(r"D2H pinned 512MiB\s+([\d.]+)")
peer = num(r"peer copy 0->1 512MiB\s+([\d.]+)")
ceiling = min(tcpbw, d2h)
def res(name):
    try:
        return json.load(open(os.path.join(d, name + ".json")))
    except Exception:
        return None
rows = []
def row(what, fig, target, ok):
    rows.append((what, fig, target, "met" if ok else "NOT met"))
def share(name, what, base, frac, note=""):
    """A throughput row: the result's share of base, against frac."""
    x = res(name)
    if x:
        g = x["results"][0]["gb_per_s"]
        row(what, f"{g:.2f} GB/s = {100*g/base:.1f}%{note}", f">= {100*frac:.0f}%", g >= frac * base)
    return x
def latency(name, what):
    x = res(name)
    if x:
        x = x["results"][0]
        row(what, f"p50 {x['p50_us']:.0f} us, p99 {x['p99_us']:.0f} us", "p50 <= 40, p99 <= 100", x["p50_us"] <= 40 and x["p99_us"] <= 100)
r = share("ranges", "1 MiB ranges, 8 stripes", ceiling, 0.9, f" of min(tcpbw 8 {tcpbw:.2f}, D2H {d2h:.2f})")
if r:
    print(f"(1 MiB ranges: {100*r['results'][0]['gb_per_s']/r['raw_tcp']['gb_per_s']:.0f}% of raw TCP in the bench)")
share("ranges2", "  the same, 2 in flight", ceiling, 0.9)
share("blocks", "65,536 x 16 KiB blocks", ceiling, 0.85, " of the same")
share("blocks2", "  the same, 2 in flight", ceiling, 0.85)
latency("latency", "4 KiB push until landed (host memory), each checked")
latency("latspin", "  the same, polling 100 us (read_spin, WithSpin)")
m = res("gib64")
if m:
    x = m["results"][0]
    extra = (x["max_rss_bytes"] - x["pool_bytes"]) / 2**20
    row("64 GiB: resident memory", f"{x['max_rss_bytes']/2**20:.0f} MiB, pool {x['pool_bytes']/2**20:.0f} MiB (+{extra:.0f} MiB)", "<= pool + 64 MiB", extra <= 64)
    ratio = x["cpu_s_per_gb"] / m["raw_tcp"]["cpu_s_per_gb"]
    row("64 GiB: CPU seconds per GB", f"{x['cpu_s_per_gb']:.3f} = {ratio:.2f}x raw TCP's two ends ({m['raw_tcp']['cpu_s_per_gb']:.3f})", "<= 1.3x", ratio <= 1.3)
share("ipc", "same-node ipc, 4 GiB, each checked", peer, 0.9, f" of the peer copy ({peer:.1f})")
share("ipcb2b", "  back to back, checked after the last", peer, 0.9)
share("ipc2", "  the same, 2 in flight", peer, 0.9)
w = max(len(r[0]) for r in rows)
for what, fig, target, ok in rows:
    print(f"{what:<{w}}  {fig}  [{target}: {ok}]")
after = open(os.path.join(d, "ceilings-after.txt")).read().strip().replace("\n", "; ")
print(f"ceilings in this job: tcpbw 8 {tcpbw:.2f} GB/s (after the rows: {after}), D2H {d2h:.2f}, peer copy {peer:.2f}")
PY
