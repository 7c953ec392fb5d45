#!/usr/bin/env bash
# Issue 37 item 1 on the GPU machine: the blocks row (65,536 x 16 KiB, one
# transfer, and 2 in flight) with the Submit in one frame (--pieces 0) and
# in pieces (the client's default: PROTOCOL.md 9.5b), interleaved ROUNDS
# times on one lease, printed as medians with the spread. Runs from the
# repository root with what `make gpu-build` put in .dev/.
#
#   make gpu-build                                              # here
#   STAGE_GPU_SRC=0 STAGE_GPU_DST=1 ROUNDS=5 bash scripts/gpu-pieces.sh   # there
set -u
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
src=${STAGE_GPU_SRC:-0}; dst=${STAGE_GPU_DST:-1}
B=".dev/stagectl bench --spawn --staged .dev/staged --device cuda:$src --remote-device cuda:$dst"
BLOCKS="--stripes 8 --slots 64 --size 1GiB --block 16KiB --pattern blocks --verify"
run() { # name, bench flags...
  local name=$1; shift
  echo "== $name: $*" >> "$out/pieces.log"
  $B $BLOCKS "$@" --json > "$out/$name.json" 2>> "$out/pieces.log" || { echo "bench $name failed (see $out/pieces.log)"; tail -5 "$out/pieces.log"; }
}
for i in $(seq 1 "${ROUNDS:-5}"); do
  run pone.$i --iters 5 --pieces 0
  run pieces.$i --iters 5
  run pone2.$i --iters 6 --inflight 2 --pieces 0
  run pieces2.$i --iters 6 --inflight 2
done
OUT_DIR=$out python3 - <<'PY'
import glob, json, os, statistics
d = os.environ["OUT_DIR"]
def rows(name):
    out = []
    for f in sorted(glob.glob(os.path.join(d, name + ".[0-9]*.json"))):
        try:
            out.append(json.load(open(f))["results"][0])
        except Exception:
            pass
    return out
for name, what in (("pone", "one Submit"), ("pieces", "in pieces"), ("pone2", "one Submit, 2 in flight"), ("pieces2", "in pieces, 2 in flight")):
    xs = rows(name)
    if not xs:
        print(f"{what}: no results")
        continue
    gs, p50 = [x["gb_per_s"] for x in xs], [x["p50_us"] for x in xs]
    print(f"{what:<26} {statistics.median(gs):6.2f} GB/s (rounds {min(gs):.2f}-{max(gs):.2f}), p50 {statistics.median(p50)/1000:.2f} ms a transfer")
PY
