#!/usr/bin/env bash
# The data-plane and same-node targets in one job on the GPU machine, with
# their ceilings measured in the same job, printed as one table. Runs from
# the repository root with what `make gpu-build` put in .dev/ (no Go there).
#
#   make gpu-build                                        # here
#   STAGE_GPU_SRC=0 STAGE_GPU_DST=1 bash scripts/gpu-targets.sh   # there
#
# The JSON of every run, the ceilings and one log go to $OUT (or ./gpu-out)
# (tar them: the device tool brings back only a few files).
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
# The TCP rows move between runs by up to a fifth on one machine (loopback
# and memory bandwidth shared with the copies): each runs ROUNDS times,
# interleaved, and the table gives the median with the spread.
rounds=${ROUNDS:-3}
for i in $(seq 1 "$rounds"); do
  run ranges.$i $G --stripes 8 --slots 64 --size 1GiB --block 1MiB --iters 5 --verify --raw
  run blocks.$i $G --stripes 8 --slots 64 --size 1GiB --block 16KiB --pattern blocks --iters 5 --verify --raw
done
run gib64 $G --stripes 8 --slots 64 --size 8GiB --block 1MiB --iters 8 --raw
run ipc $G --transport auto --size 4GiB --block 1GiB --iters 5 --verify
# The same rows with two transfers in flight, as an engine pushing layer
# after layer keeps them (each between its own pair of buffers).
for i in $(seq 1 "$rounds"); do
  run ranges2.$i $G --stripes 8 --slots 64 --size 1GiB --block 1MiB --iters 6 --verify --inflight 2
  run blocks2.$i $G --stripes 8 --slots 64 --size 1GiB --block 16KiB --pattern blocks --iters 6 --verify --inflight 2
done
run ipc2 $G --transport auto --size 4GiB --block 1GiB --iters 10 --verify --inflight 2
# Back to back, one at a time: the destination is checked after the last
# transfer instead of after each (a check idles the GPUs for seconds, and
# the next copy then starts on a cold link).
run ipcb2b $G --transport auto --size 4GiB --block 1GiB --iters 10 --verify-end
# Default settings: on this machine's 8+ CPUs the readers poll 100 us
# (staging.read_spin auto, the Go client likewise). Each checked, then back
# to back (checked after the last), then with polling off as before.
run latency --stripes 1 --size 4KiB --block 4KiB --iters 5000 --warmup 300 --verify
run latb2b --stripes 1 --size 4KiB --block 4KiB --iters 5000 --warmup 300 --verify-end
run latoff --stripes 1 --size 4KiB --block 4KiB --iters 5000 --warmup 300 --verify --spin 0s
CONNS=8 bash .dev/bench/ceilings.sh 2>/dev/null | grep loopback > "$out/ceilings-after.txt"

OUT_DIR=$out python3 - <<'PY'
import glob, json, os, re, statistics
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
def rounds(name):
    """The results of every round of a row (name.1, name.2, ...), or of the one run."""
    out = [res(os.path.basename(f)[:-5]) for f in sorted(glob.glob(os.path.join(d, name + ".[0-9]*.json")))]
    out = [x for x in out if x]
    return out or [x for x in [res(name)] if x]
rows = []
def row(what, fig, target, ok):
    rows.append((what, fig, target, "met" if ok else "NOT met"))
def share(name, what, base, frac, note=""):
    """A throughput row: the median result's share of base (with the rounds' spread), against frac."""
    xs = rounds(name)
    if xs:
        gs = [x["results"][0]["gb_per_s"] for x in xs]
        g = statistics.median(gs)
        spread = f", rounds {100*min(gs)/base:.0f}-{100*max(gs)/base:.0f}%" if len(gs) > 1 else ""
        row(what, f"{g:.2f} GB/s = {100*g/base:.1f}%{note}{spread}", f">= {100*frac:.0f}%", g >= frac * base)
        return xs[len(xs) // 2]
    return None
def latency(name, what):
    x = res(name)
    if x:
        x = x["results"][0]
        cpu = f"; sidecars' CPU {x.get('cpu_us_per_transfer', 0):.0f} us a push, idle after {x.get('idle_cpu_pct', 0):.1f}% of a core (bench {x.get('idle_cpu_client_pct', 0):.1f}%)"
        row(what, f"p50 {x['p50_us']:.0f} us, p99 {x['p99_us']:.0f} us{cpu}", "p50 <= 40, p99 <= 100", x["p50_us"] <= 40 and x["p99_us"] <= 100)
r = share("ranges", "1 MiB ranges, 8 stripes", ceiling, 0.9, f" of min(tcpbw 8 {tcpbw:.2f}, D2H {d2h:.2f})")
if r:
    print(f"(1 MiB ranges: {100*r['results'][0]['gb_per_s']/r['raw_tcp']['gb_per_s']:.0f}% of raw TCP in the bench)")
share("ranges2", "  the same, 2 in flight", ceiling, 0.9)
share("blocks", "65,536 x 16 KiB blocks", ceiling, 0.85, " of the same")
share("blocks2", "  the same, 2 in flight", ceiling, 0.85)
latency("latency", "4 KiB push until landed (host memory), defaults, each checked")
latency("latb2b", "  the same, back to back, checked after the last")
latency("latoff", "  each checked, polling off (--spin 0s: the old default)")
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
