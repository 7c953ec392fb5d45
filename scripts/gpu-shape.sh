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
#
# VARIANTS (default "default") also runs the rows with the knobs that act
# on a transfer's ends, each as NAME=ENV (space-separated, interleaved by
# round), to see which part of the shape each moves, e.g.
#   VARIANTS="default balance=STAGE_STAGING_BALANCE_SOCKETS=true,STAGE_STAGING_TAIL_CHUNK=256KiB sockbuf=STAGE_STAGING_SOCKET_BUFFER=4MiB"
# (commas separate a variant's variables). STAGED_<NAME>=path and
# STAGECTL_<NAME>=path run a variant on other binaries (an older build).
#
# CHECKED=1 checks every transfer (--verify, as gpu-item37.sh's rows do:
# each push then starts after the sidecars sat idle through the check)
# instead of once at the end; ROWS narrows the rows (default "ranges blocks
# ranges2 blocks2"). PAUSE=D instead sits idle D before each push
# (stagectl bench --pause) and checks once at the end: the idle without
# the check's memory traffic.
set -u
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
rounds=${ROUNDS:-2}; size=${SIZE:-1GiB}
bin=${BIN:-.dev}; bin=$(cd "$bin" && pwd)
. "$(dirname "$0")/gpu-variants.sh"
rows=${ROWS:-ranges blocks ranges2 blocks2}
verify=--verify-end; [ "${CHECKED:-0}" = 1 ] && verify=--verify
[ -n "${PAUSE:-}" ] && verify="--verify-end --pause $PAUSE"
row() { # name, staged, bench flags...
  local name=$1 staged=$2; shift 2
  rm -rf "$out/logs-$name"
  echo "== $name: $*" >> "$out/bench.log"
  STAGE_LOG_LEVEL=debug "$ctl" bench --spawn --staged "$staged" "${G[@]}" --stripes 8 --slots 64 --size "$size" \
    --logs "$out/logs-$name" --json "$@" > "$out/$name.json" 2>> "$out/bench.log" ||
    { echo "bench $name failed (see $out/bench.log)"; tail -3 "$out/bench.log"; }
}
for i in $(seq 1 "$rounds"); do
  for v in $variants; do
    n=${v%%=*}; st=$(staged_of "$v"); p=""; [ "$n" = default ] || p="$n-"
    ctl=$(stagectl_of "$n")
    for r in $rows; do
      case $r in
      ranges) row "${p}ranges.$i" "$st" --block 1MiB --iters 6 $verify ;;
      blocks) row "${p}blocks.$i" "$st" --block 16KiB --pattern blocks --iters 6 $verify ;;
      ranges2) row "${p}ranges2.$i" "$st" --block 1MiB --iters 6 $verify --inflight 2 ;;
      blocks2) row "${p}blocks2.$i" "$st" --block 16KiB --pattern blocks --iters 6 $verify --inflight 2 ;;
      *) echo "gpu-shape: unknown row $r (ranges, blocks, ranges2, blocks2)" >&2; exit 2 ;;
      esac
    done
  done
done
OUT_DIR=$out VARIANTS="$variants" python3 - <<'PY' | tee "$out/shape.txt"
import glob, json, os, re, statistics
d = os.environ["OUT_DIR"]
unit = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}
def ms(v):  # zap's console encoder writes durations as Go prints them
    total = 0.0
    for num, u in re.findall(r"([\d.]+)(ns|µs|us|ms|s)", v):
        total += float(num) * unit[u]
    return total
keys = ("gathered", "ramp", "tail", "drain", "total")
# p50: the bench's own median transfer (from its Submit to the answer), so
# p50 - total is the engine socket both ways and the wake-ups around it
print("%-16s %6s %9s %9s %9s %9s %9s %9s %8s %10s" % ("row", "pushes", "gather", "ramp", "tail", "drain", "total", "p50",
                                                     "GB/s", "lost"))
prefixes = ["" if v.split("=")[0] == "default" else v.split("=")[0] + "-" for v in os.environ["VARIANTS"].split()]
for name in [p + r for r in ("ranges", "blocks", "ranges2", "blocks2") for p in prefixes]:
    rows, gbs, p50 = [], [], []
    for f in sorted(glob.glob(os.path.join(d, "logs-%s.[0-9]*" % name, "prefill.log"))):
        lines = [l for l in open(f) if "\ttcp push\t" in l]
        for l in lines[-6:]:  # the timed pushes (--iters 6); the warm-up's came first
            rows.append(json.loads(l.split("\ttcp push\t", 1)[1]))
    for f in glob.glob(os.path.join(d, "%s.[0-9]*.json" % name)):
        try:
            r = json.load(open(f))["results"][0]
            gbs.append(r["gb_per_s"])
            p50.append(r["p50_us"] / 1e3)
        except Exception:
            pass
    if not rows:
        continue
    med = {k: statistics.median(ms(r[k]) for r in rows) for k in keys}
    # what the ramp, the tail (half of it: streams run out one by one) and
    # the drain cost against the whole push
    lost = (med["ramp"] + med["tail"] / 2 + med["drain"]) / med["total"] if med["total"] else 0
    print("%-16s %6d %7.2fms %7.2fms %7.2fms %7.2fms %7.2fms %7.2fms %8.2f %9.1f%%" % (
        name, len(rows), med["gathered"], med["ramp"], med["tail"], med["drain"], med["total"],
        statistics.median(p50) if p50 else float("nan"),
        statistics.median(gbs) if gbs else float("nan"), 100 * lost))
PY
