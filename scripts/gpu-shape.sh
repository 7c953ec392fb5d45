#!/usr/bin/env bash
# Where one TCP transfer's time goes (issue 37, the one-transfer rows): the
# sending sidecar's "tcp push" debug lines (staging.Shape: the first gather,
# the ramp to the first write, the tail while streams ran out unevenly, the
# drain after the last write), for the rows of scripts/gpu-item37.sh, one
# transfer and two in flight, from what `make gpu-build` put in .dev/:
#
#   make gpu-build                                                   # here
#   ROUNDS=2 STAGE_GPU_SRC=0 STAGE_GPU_DST=1 bash scripts/gpu-shape.sh   # there
#
# Each row's logs stay in $OUT/logs-ROW.ROUND (the bench's --logs); the
# medians over every timed push (the warm-up's dropped; lost: the ramp, half
# the tail and the drain, as a share of the push) go to
# $OUT/shape.txt. NO_GPU=1 runs it on hostmem with SIZE (default 1GiB) for a
# dry run on a machine without a GPU, e.g. NO_GPU=1 SIZE=64MiB.
set -u
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
src=${STAGE_GPU_SRC:-0}; dst=${STAGE_GPU_DST:-1}
rounds=${ROUNDS:-2}; size=${SIZE:-1GiB}
G=(--device "cuda:$src" --remote-device "cuda:$dst")
[ "${NO_GPU:-0}" = 1 ] && G=()
bin=${BIN:-.dev}
row() { # name, bench flags...
  local name=$1; shift
  rm -rf "$out/logs-$name"
  STAGE_LOG_LEVEL=debug "$bin/stagectl" bench --spawn --staged "$bin/staged" "${G[@]}" --stripes 8 --slots 64 --size "$size" \
    --logs "$out/logs-$name" --json "$@" > "$out/$name.json" 2>> "$out/bench.log" ||
    { echo "bench $name failed (see $out/bench.log)"; tail -3 "$out/bench.log"; }
}
for i in $(seq 1 "$rounds"); do
  row "ranges.$i" --block 1MiB --iters 6 --verify-end
  row "blocks.$i" --block 16KiB --pattern blocks --iters 6 --verify-end
  row "ranges2.$i" --block 1MiB --iters 6 --verify-end --inflight 2
  row "blocks2.$i" --block 16KiB --pattern blocks --iters 6 --verify-end --inflight 2
done
OUT_DIR=$out python3 - <<'PY' | tee "$out/shape.txt"
import glob, json, os, re, statistics
d = os.environ["OUT_DIR"]
unit = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}
def ms(v):  # zap's console encoder writes durations as Go prints them
    total = 0.0
    for num, u in re.findall(r"([\d.]+)(ns|µs|us|ms|s)", v):
        total += float(num) * unit[u]
    return total
keys = ("gathered", "ramp", "tail", "drain", "total")
print("%-8s %6s %9s %9s %9s %9s %9s %8s %10s" % ("row", "pushes", "gather", "ramp", "tail", "drain", "total", "GB/s", "lost"))
for name in ("ranges", "blocks", "ranges2", "blocks2"):
    rows, gbs = [], []
    for f in sorted(glob.glob(os.path.join(d, "logs-%s.[0-9]*" % name, "prefill.log"))):
        lines = [l for l in open(f) if "\ttcp push\t" in l]
        for l in lines[-6:]:  # the timed pushes (--iters 6); the warm-up's came first
            rows.append(json.loads(l.split("\ttcp push\t", 1)[1]))
    for f in glob.glob(os.path.join(d, "%s.[0-9]*.json" % name)):
        try:
            gbs.append(json.load(open(f))["results"][0]["gb_per_s"])
        except Exception:
            pass
    if not rows:
        continue
    med = {k: statistics.median(ms(r[k]) for r in rows) for k in keys}
    # what the ramp, the tail (half of it: streams run out one by one) and
    # the drain cost against the whole push
    lost = (med["ramp"] + med["tail"] / 2 + med["drain"]) / med["total"] if med["total"] else 0
    print("%-8s %6d %7.2fms %7.2fms %7.2fms %7.2fms %7.2fms %8.2f %9.1f%%" % (
        name, len(rows), med["gathered"], med["ramp"], med["tail"], med["drain"], med["total"],
        statistics.median(gbs) if gbs else float("nan"), 100 * lost))
PY
