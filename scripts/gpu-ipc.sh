#!/usr/bin/env bash
# Where a same-node ipc push's time goes (issue 37, the checked ipc row):
# 4 GiB GPU SRC -> GPU DST, each transfer checked and back to back, with the
# peer-copy ceiling measured in the same job, from what `make gpu-build` put
# in .dev/. The sending sidecar's "same-node push" debug lines (prep,
# sched, conn, handles, copy_setup, copy_wait, done; since the link wake,
# "handles" includes making the copy's first stream and enqueueing the wake
# copy, and copy_setup only the other streams) are summarised beside
# the bench's own p50, whose remainder is the engine socket both ways, and
# the receiving sidecar's "direct done served" lines after them:
#
#   make gpu-build                                                   # here
#   ROUNDS=3 STAGE_GPU_SRC=0 STAGE_GPU_DST=1 bash scripts/gpu-ipc.sh    # there
#
# VARIANTS (default "default") runs the rows again with settings, each
# NAME=ENV[,ENV...], interleaved by round, e.g.
#   VARIANTS="default cs2=STAGE_NODE_COPY_STREAMS=2"
# STAGED_<NAME>=path and STAGECTL_<NAME>=path run a variant on other
# binaries (an older build, say) instead.
# PEERCOPY=1 also builds and runs bench/peercopy (the copy alone: in one
# process, after idle, by a kernel, between VMM allocations, and between
# memory another process shares) in the same job, into peercopy.txt.
# Output: $OUT (or ./gpu-out): each JSON, logs-ROW.ROUND/, bench.log and
# ipc.txt (the table). NO_GPU=1 runs on host memory (no ipc: a dry run of
# the script only).
set -u
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
rounds=${ROUNDS:-3}; size=${SIZE:-4GiB}
bin=${BIN:-.dev}; bin=$(cd "$bin" && pwd)
. "$(dirname "$0")/gpu-variants.sh"

row() { # name, staged, bench flags...
  local name=$1 staged=$2; shift 2
  rm -rf "$out/logs-$name"
  echo "== $name: $*" >> "$out/bench.log"
  STAGE_LOG_LEVEL=debug "$ctl" bench --spawn --staged "$staged" "${G[@]}" --transport auto --size "$size" \
    --block 1GiB --logs "$out/logs-$name" --json "$@" > "$out/$name.json" 2>> "$out/bench.log" ||
    { echo "bench $name failed (see $out/bench.log)"; tail -3 "$out/bench.log"; }
}

if [ "${NO_GPU:-0}" = 1 ]; then echo "peer copy 0->1 512MiB  0 GB/s (no GPU)" > "$out/ceilings.txt"
else bash "$bin/bench/ceilings.sh" > "$out/ceilings.txt" 2>&1; fi
if [ "${PEERCOPY:-0}" = 1 ]; then
  { nvcc -O2 -o "$out/peercopy" "$bin/bench/peercopy.cu" -lcuda && "$out/peercopy"; } > "$out/peercopy.txt" 2>&1 ||
    echo "peercopy failed (see $out/peercopy.txt)"
fi
for i in $(seq 1 "$rounds"); do
  for v in $variants; do
    n=${v%%=*}; st=$(staged_of "$v"); ctl=$(stagectl_of "$n")
    row "$n-checked.$i" "$st" --iters 5 --verify
    row "$n-b2b.$i" "$st" --iters 10 --verify-end
  done
done

[ -f "$out/peercopy.txt" ] && cat "$out/peercopy.txt"
OUT_DIR=$out VARIANTS="$variants" python3 - <<'PY' | tee "$out/ipc.txt"
import glob, json, os, re, statistics
d = os.environ["OUT_DIR"]
ceil = open(os.path.join(d, "ceilings.txt")).read()
peer = [float(x) for x in re.findall(r"peer copy 0->1 512MiB\s+([\d.]+)", ceil)]
pk = statistics.mean(peer) if peer and peer[0] > 0 else None
print("peer copy ceiling: %s GB/s" % peer)
unit = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3, "s": 1e6}
def us(v):  # zap's console encoder writes durations as Go prints them
    return sum(float(n) * unit[u] for n, u in re.findall(r"([\d.]+)(ns|µs|us|ms|s)", str(v)))
keys = ("prep", "sched", "conn", "handles", "copy_setup", "copy_wait", "done")
print("%-16s %7s %8s %7s  %s  %s" % ("row", "GB/s", "ceiling", "p50 ms", "  ".join("%9s" % k for k in keys), "dialed  engine-socket"))
for v in os.environ["VARIANTS"].split():
    n = v.split("=")[0]
    for m in ("checked", "b2b"):
        name = "%s-%s" % (n, m)
        res, pushes = [], []
        for f in sorted(glob.glob(os.path.join(d, name + ".[0-9]*.json"))):
            try:
                res.append(json.load(open(f))["results"][0])
            except Exception:
                pass
        for f in sorted(glob.glob(os.path.join(d, "logs-%s.[0-9]*" % name, "prefill.log"))):
            ls = [l for l in open(f) if "\tsame-node push\t" in l]
            for l in ls[1:]:  # the warm-up's first
                p = json.loads(l.split("\tsame-node push\t", 1)[1])
                p.setdefault("copy_wait", p.get("copy", 0))  # older builds time the copy whole
                pushes.append(p)
        if not res:
            continue
        gb = statistics.median(r["gb_per_s"] for r in res)
        p50 = statistics.median(r["p50_us"] for r in res) / 1e3
        med = {k: statistics.median(us(p.get(k, 0)) for p in pushes) if pushes else float("nan") for k in keys}
        inside = sum(med.values()) / 1e3
        dialed = sum(1 for p in pushes if p.get("dialed"))
        # the receiving sidecar's side of DirectDone: how its reader waited
        # (planned sleep and poll, when the DirectDone was due) and answered
        served = []
        for f in sorted(glob.glob(os.path.join(d, "logs-%s.[0-9]*" % name, "decode.log"))):
            ls = [l for l in open(f) if "\tdirect done served\t" in l]
            served += [json.loads(l.split("\tdirect done served\t", 1)[1]) for l in ls[1:]]
        srv = ""
        if served:
            sm = {k: statistics.median(us(x.get(k, 0)) for x in served) for k in ("planned_sleep", "planned_poll", "answer")}
            srv = "  peer: slept %.0f us, polled %.0f us, answered in %.0f us" % (sm["planned_sleep"], sm["planned_poll"], sm["answer"])
        print("%-16s %7.2f %7.1f%% %7.2f  %s  %3d/%-3d %6.0f us%s" % (
            name, gb, 100 * gb / pk if pk else float("nan"), p50, "  ".join("%7.0fus" % med[k] for k in keys),
            dialed, len(pushes), (p50 - inside) * 1e3, srv))
PY
