#!/usr/bin/env bash
# Issue 37 items 3 and 5 on the GPU machine: loopback TCP, C raw against Go
# raw, by send path, with stage's memory footprint (bench/tcpmodes: what
# each mode does and how CPU is counted). From what `make gpu-build` put in
# .dev/bench (the Go probe built, tcpmodes.c as source; no Go there, gcc is):
#
#   make gpu-build                          # here
#   ROUNDS=3 bash scripts/gpu-tcpmodes.sh   # there, from the repository root
#
# The matrix, each cell once per round, rounds interleaved (the order of
# the paths reversed every other round, so drift does not favour one):
#   paths   C write, Go writev (stage's writev writer), C splice, Go splice
#           (stage's splice writer), C zerocopy, Go zerocopy, Go net
#           (net.Conn through Go's netpoller)
#   ring    hot (= one 4 MiB chunk, the old probes' case) and 16 MiB (stage's
#           32 slots of 4 MiB over 8 streams)
#   sndbuf  0 (autotuning) and 4 MiB (SO_SNDBUF and SO_RCVBUF both ends)
#   conns   8 and 1
# and, with the 16 MiB ring and autotuning only, Go net and Go writev with
# their goroutines not locked to threads (as stage's are; no per-side CPU
# then, bench/tcpmodes's doc says why), and Go writev with its receivers
# polling SPIN (default 100us) before each recv as stage's data readers do
# (staging.read_spin on 8+ CPUs): 62 runs a round. Totals per connection:
# TOTAL8 (default 2GiB) with 8 connections, 16 GiB in all, about 0.6 s at
# ~28 GB/s; TOTAL1 (default 4GiB) with one, about 0.5-0.9 s at 5-8 GB/s.
# 3 rounds: about 2.5-3 minutes (hot-ring zerocopy waits for each send's
# completion before the next one, so it runs longer). 4 GiB per connection
# for every cell would take ~6.
#
# Writes $OUT/tcpmodes.jsonl (one JSON result a run, "round" added),
# $OUT/tcpmodes-table.txt (medians and spread per cell, printed too) and
# $OUT/tcpmodes-failed.txt (runs that failed, with their error).
# CONNS, RINGS, SNDBUFS (space-separated lists) narrow the matrix; HEAD > 0
# writes a head of that many bytes before each chunk (stage's is 56 B for a
# one-segment chunk); TOTAL8 applies to every CONNS value but 1.
set -eu
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
rounds=${ROUNDS:-3}; total8=${TOTAL8:-2GiB}; total1=${TOTAL1:-4GiB}; head=${HEAD:-0}
spin=${SPIN:-100us}; conns_list=${CONNS:-8 1}; rings=${RINGS:-4MiB 16MiB}; sndbufs=${SNDBUFS:-0 4MiB}
gobin=$PWD/.dev/bench/tcpmodes; csrc=$PWD/.dev/bench/tcpmodes.c
[ -x "$gobin" ] && [ -f "$csrc" ] || { echo "gpu-tcpmodes: run 'make gpu-build' first ($gobin, $csrc missing)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gcc -O2 -pthread -Wall -o "$tmp/tcpmodes-c" "$csrc"
jsonl=$out/tcpmodes.jsonl; failed=$out/tcpmodes-failed.txt
: > "$jsonl"; : > "$failed"
{
  echo "host: $(nproc) CPUs, kernel $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown); gcc: $(gcc -dumpfullversion)"
  for k in net/core/wmem_max net/core/rmem_max net/core/optmem_max net/ipv4/tcp_wmem net/ipv4/tcp_rmem fs/pipe-max-size; do
    echo "$k: $(tr '\t' ' ' < /proc/sys/$k)"
  done
} | tee "$out/tcpmodes-host.txt"
paths=(c:write go:writev c:splice go:splice c:zerocopy go:zerocopy go:net)
start=$SECONDS
for ((r = 1; r <= rounds; r++)); do
  order=("${paths[@]}")
  if ((r % 2 == 0)); then order=(); for ((i = ${#paths[@]} - 1; i >= 0; i--)); do order+=("${paths[i]}"); done; fi
  for conns in $conns_list; do
    total=$total8; ((conns == 1)) && total=$total1
    for ring in $rings; do
      for sndbuf in $sndbufs; do
        cell=("${order[@]}")
        [ "$ring" = 16MiB ] && [ "$sndbuf" = 0 ] && cell+=(go:net:unlocked go:writev:unlocked go:writev:spin)
        for p in "${cell[@]}"; do
          IFS=: read -r impl mode variant <<< "$p"
          bin=$gobin; [ "$impl" = c ] && bin=$tmp/tcpmodes-c
          args=(--conns "$conns" --total "$total" --chunk 4MiB --ring "$ring" --sndbuf "$sndbuf" --head "$head" --mode "$mode" --json)
          case $variant in unlocked) args+=(--lock=false) ;; spin) args+=(--spin "$spin") ;; esac
          if line=$(timeout 60 "$bin" "${args[@]}" 2> "$tmp/err"); then
            echo "${line%\}},\"round\":$r}" >> "$jsonl"
          else
            echo "round $r $p ${args[*]}: $(tr '\n' ' ' < "$tmp/err")" | tee -a "$failed" >&2
          fi
        done
      done
    done
  done
  echo "round $r done at $((SECONDS - start)) s" >&2
done
command -v python3 > /dev/null || { echo "gpu-tcpmodes: no python3, no table; the runs are in $jsonl" >&2; exit 0; }
python3 - "$jsonl" <<'EOF' | tee "$out/tcpmodes-table.txt"
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
cells = {}
for r in runs:
    mode = r["mode"] + ("" if r["locked"] else "/unlocked") + (f"/spin{r['spin_us']}us" if r["spin_us"] else "")
    cells.setdefault((r["conns"], r["ring"], r["sndbuf"], r["impl"], mode), []).append(r)
def mib(n):
    return "0" if n == 0 else f"{n >> 20}MiB"
def med(rs, k):
    return statistics.median(r[k] for r in rs)
print(f"{len(runs)} runs; GB/s median (min..max over rounds); CPU s/GB medians; per core: GB per CPU-second of senders+receivers (unlocked: of the process)")
print(f"{'conns':>5} {'ring':>6} {'sndbuf':>6} {'path':<20} {'GB/s':>24} {'vs C write':>10} {'send s/GB':>9} {'recv s/GB':>9} {'proc s/GB':>9} {'host s/GB':>9} {'GB/s/core':>9}  zerocopy copied")
for key in sorted(cells, key=lambda k: (-k[0], k[1], k[2], k[3], k[4])):
    conns, ring, sndbuf, impl, mode = key
    rs = cells[key]
    g = [r["gbps"] for r in rs]
    base = cells.get((conns, ring, sndbuf, "c", "write"))
    vs = f"{med(rs, 'gbps') / med(base, 'gbps'):.3f}" if base else "-"
    spread = f"{med(rs, 'gbps'):6.2f} ({min(g):6.2f}..{max(g):6.2f})"
    zc = f"{sum(r['zc_copied'] for r in rs)}/{sum(r['zc_sends'] for r in rs)}" if mode == "zerocopy" else ""
    ringname = "hot" if ring == rs[0]["chunk"] else mib(ring)
    print(f"{conns:>5} {ringname:>6} {mib(sndbuf):>6} {impl + ' ' + mode:<20} {spread:>24} {vs:>10} {med(rs, 'send_cpu_s_per_gb'):9.4f} "
          f"{med(rs, 'recv_cpu_s_per_gb'):9.4f} {med(rs, 'proc_cpu_s_per_gb'):9.4f} {med(rs, 'host_cpu_s_per_gb'):9.4f} {med(rs, 'gbps_per_core'):9.2f}  {zc}")
EOF
[ -s "$failed" ] && echo "gpu-tcpmodes: $(wc -l < "$failed") runs failed: $failed" >&2
exit 0
