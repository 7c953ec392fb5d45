#!/usr/bin/env bash
# UCX over TCP on loopback, host memory, beside stage's hostmem push with one
# stream, at the block sizes of `stagectl bench --sweep`, in one run. Needs
# ucx_perftest (Debian: ucx-utils) and a built stagectl/staged (make build).
#
#   bash scripts/ucx-compare.sh            # prints one table
#
# UCX here is the TCP transport on host memory (the build Debian ships has
# no CUDA support), so this compares the network paths only.
set -u
BIN=${BIN:-bin}
command -v ucx_perftest >/dev/null || { echo "ucx-compare: ucx_perftest not found (apt-get install ucx-utils)"; exit 0; }
[ -x "$BIN/stagectl" ] || { echo "ucx-compare: $BIN/stagectl missing; run make build"; exit 1; }
export UCX_TLS=tcp UCX_NET_DEVICES=lo
ucx() { # test size -> GB/s (UCX reports MB/s of 2^20 bytes)
  local t=$1 size=$2 iters=$(( (256 << 20) / $2 )); [ $iters -lt 100 ] && iters=100; [ $iters -gt 20000 ] && iters=20000
  local port=$(( 20000 + RANDOM % 20000 ))
  ucx_perftest -p $port -t "$t" -s "$size" -n $iters >/dev/null 2>&1 &
  local srv=$!; sleep 0.5
  local out; out=$(timeout 120 ucx_perftest 127.0.0.1 -p $port -t "$t" -s "$size" -n $iters 2>&1 | awk '/^Final:/{print $7}')
  kill $srv 2>/dev/null; wait $srv 2>/dev/null
  [ -n "$out" ] && awk -v m="$out" 'BEGIN{printf "%.3f", m*1048576/1e9}' || printf "n/a"
}
stage=$("$BIN/stagectl" bench --spawn --sweep --raw --stripes 1 --size 256MiB --iters 3 --json 2>/dev/null)
printf '%-8s %14s %16s\n' BLOCK "stage GB/s" "UCX tag_bw GB/s"
for kib in 4 16 64 256 1024 4096 16384 65536; do
  size=$((kib * 1024))
  s=$(printf '%s' "$stage" | python3 -c "import json,sys; r=[x for x in json.load(sys.stdin)['results'] if x['block_bytes']==$size]; print('%.3f'%r[0]['gb_per_s'] if r else 'n/a')")
  printf '%-8s %14s %16s\n' "${kib}KiB" "$s" "$(ucx tag_bw $size)"
done
printf 'raw TCP, 1 stream, same run: %s GB/s\n' "$(printf '%s' "$stage" | python3 -c "import json,sys; print('%.3f'%json.load(sys.stdin)['raw_tcp']['gb_per_s'])")"
echo "stage: push between two local sidecars (hostmem, 1 stream, scattered blocks, 256 MiB per transfer); UCX: ucx_perftest over tcp on lo, host memory"
