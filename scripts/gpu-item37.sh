#!/usr/bin/env bash
# Issue 37 items 3-5 on the GPU machine, with the ceilings in the same job,
# from what `make gpu-build` put in .dev/ (no Go there). PARTS picks what
# runs (default: all of them, in this order):
#
#   ipc      same-node ipc 4 GiB, one transfer, each checked and back to
#            back, with node.copy_streams 1, 2 and 4 (CS narrows the list),
#            interleaved by round
#   tcp      bench/tcpmodes' matrix: C and Go raw sockets, each write path
#            (scripts/gpu-tcpmodes.sh), when .dev/bench/tcpmodes is there
#   rows     the one-transfer rows (1 MiB ranges, 65,536 x 16 KiB blocks, 8
#            stripes), 1 and 2 in flight, and 64 GiB back to back, with each
#            side's CPU per GB (item 5) and raw TCP beside; raw C's one
#            1 GiB burst (bench/idletcp) before and after them
#   latency  4 KiB pushes until landed, each checked and back to back, with
#            the readers' default (adaptive where the binary has it), a fixed
#            100 us window and none, interleaved by round; host memory as in
#            gpu-targets.sh, and each checked between the GPUs too (not with
#            NO_GPU_LAT=1)
#
#   make gpu-build                                                 # here
#   ROUNDS=3 STAGE_GPU_SRC=0 STAGE_GPU_DST=1 bash scripts/gpu-item37.sh  # there
#
# All four parts with 3 rounds take about 10-11 minutes on 2 x H200, more
# than one device call may run: split them, e.g. PARTS="ipc latency" and
# then PARTS="tcp rows" (each call measures its own ceilings).
#
# Every JSON, the ceilings and bench.log go to $OUT (or ./gpu-out); the
# table is printed and kept in $OUT/item37.txt. NO_GPU=1 runs the same on
# hostmem, to try the script on a machine without a GPU (with TOTAL8 and
# TOTAL1 small for the tcp part: scripts/gpu-tcpmodes.sh).
set -u
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
src=${STAGE_GPU_SRC:-0}; dst=${STAGE_GPU_DST:-1}
rounds=${ROUNDS:-3}
parts=${PARTS:-ipc tcp rows latency}
G=(--device "cuda:$src" --remote-device "cuda:$dst")
[ "${NO_GPU:-0}" = 1 ] && G=() # a dry run of the script on hostmem (CPU machine)

# staged with settings: a wrapper that sets the environment and runs .dev/staged
wrap() { # name, env assignments...
  local d=$out/bin-$1; shift
  mkdir -p "$d"
  printf '#!/bin/sh\n%s exec %s "$@"\n' "$*" "$PWD/.dev/staged" > "$d/staged"
  chmod +x "$d/staged"
  echo "$d/staged"
}
run() { # name, staged, bench flags...
  local name=$1 staged=$2; shift 2
  echo "== $name: $*" >> "$out/bench.log"
  .dev/stagectl bench --spawn --staged "$staged" "$@" --json > "$out/$name.json" 2>> "$out/bench.log" ||
    { echo "bench $name failed (see $out/bench.log)"; tail -3 "$out/bench.log"; }
}

CONNS=8 bash .dev/bench/ceilings.sh > "$out/ceilings.txt" 2>&1
for part in $parts; do
  case $part in
  ipc)
    for k in ${CS:-1 2 4}; do eval "s$k=\$(wrap cs$k STAGE_NODE_COPY_STREAMS=$k)"; done
    for i in $(seq 1 "$rounds"); do
      for k in ${CS:-1 2 4}; do
        eval "st=\$s$k"
        run "ipc-cs$k-checked.$i" "$st" "${G[@]}" --transport auto --size 4GiB --block 1GiB --iters 5 --verify
        run "ipc-cs$k-b2b.$i" "$st" "${G[@]}" --transport auto --size 4GiB --block 1GiB --iters 10 --verify-end
      done
    done ;;
  tcp)
    if [ -x .dev/bench/tcpmodes ] && [ -f scripts/gpu-tcpmodes.sh ]; then
      OUT=$out/tcpmodes ROUNDS=$rounds bash scripts/gpu-tcpmodes.sh > "$out/tcpmodes.txt" 2>&1 || echo "tcpmodes failed (see $out/tcpmodes.txt)"
    else
      echo "tcp: no .dev/bench/tcpmodes, skipped" | tee -a "$out/bench.log"
    fi ;;
  rows)
    # raw C's one burst (bench/idletcp): 1 GiB over 8 connections after 1 s
    # idle (as each checked row sits idle through its check) and back to
    # back, shared in 1 MiB chunks as stage's streams share a transfer,
    # and split evenly; before the rows and after them
    if [ -f .dev/bench/idletcp.c ] && gcc -O2 -pthread -o "$out/idletcp" .dev/bench/idletcp.c; then
      oneburst() { for m in shared split; do for g in 1000 0; do "$out/idletcp" 8 1073741824 $g 6 $m | tail -1; done; done >> "$out/oneburst.txt"; }
    else
      oneburst() { echo "rows: no .dev/bench/idletcp.c, no one-burst ceiling" | tee -a "$out/bench.log"; }
    fi
    oneburst
    for i in $(seq 1 "$rounds"); do
      run "ranges.$i" .dev/staged "${G[@]}" --stripes 8 --slots 64 --size 1GiB --block 1MiB --iters 5 --verify --raw
      run "blocks.$i" .dev/staged "${G[@]}" --stripes 8 --slots 64 --size 1GiB --block 16KiB --pattern blocks --iters 5 --verify --raw
      run "ranges2.$i" .dev/staged "${G[@]}" --stripes 8 --slots 64 --size 1GiB --block 1MiB --iters 6 --verify --inflight 2
      run "blocks2.$i" .dev/staged "${G[@]}" --stripes 8 --slots 64 --size 1GiB --block 16KiB --pattern blocks --iters 6 --verify --inflight 2
    done
    run gib64 .dev/staged "${G[@]}" --stripes 8 --slots 64 --size 8GiB --block 1MiB --iters 8 --raw
    oneburst ;;
  latency)
    fixed=$(wrap spin100 STAGE_STAGING_READ_SPIN=100us)
    off=$(wrap spin0 STAGE_STAGING_READ_SPIN=0s)
    L=(--stripes 1 --size 4KiB --block 4KiB --iters 5000 --warmup 300)
    for i in $(seq 1 "$rounds"); do
      run "lat-auto-checked.$i" .dev/staged "${L[@]}" --verify
      run "lat-100us-checked.$i" "$fixed" "${L[@]}" --verify --spin 100us
      run "lat-off-checked.$i" "$off" "${L[@]}" --verify --spin 0s
      run "lat-auto-b2b.$i" .dev/staged "${L[@]}" --verify-end
      run "lat-100us-b2b.$i" "$fixed" "${L[@]}" --verify-end --spin 100us
      # the same between the GPUs (the rows above are host memory, as gpu-targets.sh's)
      [ "${NO_GPU_LAT:-0}" = 1 ] || run "lat-gpu-auto-checked.$i" .dev/staged "${G[@]}" "${L[@]}" --verify
      [ "${NO_GPU_LAT:-0}" = 1 ] || run "lat-gpu-100us-checked.$i" "$fixed" "${G[@]}" "${L[@]}" --verify --spin 100us
    done ;;
  *) echo "gpu-item37: unknown part $part (ipc, tcp, rows, latency)" >&2; exit 2 ;;
  esac
done
CONNS=8 bash .dev/bench/ceilings.sh 2>/dev/null | grep loopback > "$out/ceilings-after.txt"

OUT_DIR=$out python3 - <<'PY' | tee "$out/item37.txt"
import glob, json, os, re, statistics
d = os.environ["OUT_DIR"]
ceil = open(os.path.join(d, "ceilings.txt")).read() + open(os.path.join(d, "ceilings-after.txt")).read()
def nums(pat):
    return [float(x) for x in re.findall(pat, ceil)]
tcpbw, gotcp = nums(r"tcp loopback\s+8 conns:\s+([\d.]+)"), nums(r"go net loopback\s+8 conns:\s+([\d.]+)")
d2h, peer = nums(r"D2H pinned 512MiB\s+([\d.]+)"), nums(r"peer copy 0->1 512MiB\s+([\d.]+)")
print("ceilings: C tcpbw 8 %s GB/s, Go gotcp 8 %s, D2H %s, peer copy %s" % (tcpbw, gotcp, d2h, peer))
ceiling = min(statistics.mean(tcpbw or [float("nan")]), statistics.mean(d2h or [float("nan")]))
def rounds(name):
    out = []
    for f in sorted(glob.glob(os.path.join(d, name + ".[0-9]*.json"))) or glob.glob(os.path.join(d, name + ".json")):
        try:
            doc = json.load(open(f))
            r = doc["results"][0]
            if doc.get("raw_tcp"):  # --raw: plain TCP measured after the row
                r["raw_tcp_beside_gb_per_s"] = doc["raw_tcp"]["gb_per_s"]
            out.append(r)
        except Exception:
            pass
    return out
def med(xs, k):
    v = [x[k] for x in xs if k in x]
    return (statistics.median(v), min(v), max(v)) if v else None
def line(name, base=None, what="gb_per_s"):
    xs = rounds(name)
    m = med(xs, what)
    if not m:
        return
    s = "%-22s %8.2f GB/s (%.2f..%.2f, %d rounds)" % (name, m[0], m[1], m[2], len(xs))
    if base:
        s += " = %.1f%% of %.2f" % (100 * m[0] / base, base)
    for k in ("cpu_s_per_gb_local", "cpu_s_per_gb_remote", "cpu_s_per_gb_client"):
        c = med(xs, k)
        if c:
            s += "  %s %.3f" % (k[len("cpu_s_per_gb_"):], c[0])
    rb = med(xs, "raw_tcp_beside_gb_per_s")
    if rb:
        s += "  raw beside %.2f" % rb[0]
    print(s)
# Item 3's ceilings at stage's footprint (16 MiB of distinct memory per
# connection, 8 connections, autotuned buffers), from the tcp part's runs.
foot = {}
jl = os.path.join(d, "tcpmodes", "tcpmodes.jsonl")
if os.path.exists(jl):
    for l in open(jl):
        if not l.strip():
            continue
        r = json.loads(l)
        if r.get("conns") == 8 and r.get("ring") == 16 << 20 and r.get("sndbuf") == 0 and r.get("locked", True) \
                and not r.get("spin_us"):
            foot.setdefault("%s %s" % (r["impl"], r["mode"]), []).append(r["gbps"])
    foot = {k: statistics.median(v) for k, v in foot.items()}
    print("raw TCP at stage's footprint (8 conns, 16 MiB each): " +
          ", ".join("%s %.2f GB/s" % (k, v) for k, v in sorted(foot.items())))
pk = statistics.mean(peer) if peer else None
for k in (1, 2, 4):
    for m in ("checked", "b2b"):
        line("ipc-cs%d-%s" % (k, m), pk)
# raw C's one 1 GiB burst on 8 connections (the rows part's idletcp runs)
burst = {}
ob = os.path.join(d, "oneburst.txt")
if os.path.exists(ob):
    for mode, gap, gbs in re.findall(r"conns (\w+), \d+ B a burst, (\d+) ms idle before each: median ([\d.]+)", open(ob).read()):
        burst.setdefault((mode, gap), []).append(float(gbs))
    print("raw C one 1 GiB burst, 8 conns (medians of 6, each run): " + ", ".join(
        "%s %s %s" % (m, "after 1 s idle" if g == "1000" else "back to back", v) for (m, g), v in sorted(burst.items())))
    burst = {k: statistics.mean(v) for k, v in burst.items()}
for n in ("ranges", "blocks", "ranges2", "blocks2", "gib64"):
    line(n, ceiling)
    xs = rounds(n)
    if xs and ("shared", "1000") in burst and n in ("ranges", "blocks"):
        print("%-22s = %.1f%% of raw C's one burst after idle, shared in chunks (%.2f); %.1f%% of it split evenly (%.2f)" % (
            "", 100 * med(xs, "gb_per_s")[0] / burst[("shared", "1000")], burst[("shared", "1000")],
            100 * med(xs, "gb_per_s")[0] / burst[("split", "1000")], burst[("split", "1000")]))
    for k in ("c write", "go writev"):
        xs = rounds(n)
        if k in foot and xs:
            print("%-22s = %.1f%% of %s at stage's footprint" % ("", 100 * med(xs, "gb_per_s")[0] / foot[k], k))
for n in ("lat-auto-checked", "lat-100us-checked", "lat-off-checked", "lat-auto-b2b", "lat-100us-b2b",
          "lat-gpu-auto-checked", "lat-gpu-100us-checked"):
    xs = rounds(n)
    if xs:
        p50, p99 = med(xs, "p50_us"), med(xs, "p99_us")
        idle = med(xs, "idle_cpu_pct")
        cpx = med(xs, "cpu_us_per_transfer")
        print("%-22s p50 %.0f us p99 %.0f us (p99 %.0f..%.0f)  sidecars %.0f us CPU a push, idle after %.1f%% of a core"
              % (n, p50[0], p99[0], p99[1], p99[2], cpx[0] if cpx else 0, idle[0] if idle else 0))
PY
