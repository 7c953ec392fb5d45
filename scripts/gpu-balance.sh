#!/usr/bin/env bash
# Issue 37 item 2 on the GPU machine: the one-transfer rows (1 MiB ranges
# and 65,536 x 16 KiB blocks, 8 stripes, GPU to GPU) with
# staging.balance_sockets and staging.tail_chunk off (the defaults) and on,
# interleaved round by round on one lease (scripts/bench-compare.sh), from
# what `make gpu-build` put in .dev/ (no Go there).
#
#   make gpu-build                                               # here
#   ROUNDS=3 STAGE_GPU_SRC=0 STAGE_GPU_DST=1 bash scripts/gpu-balance.sh   # there
#
# VARIANT picks what "new" turns on: both (default), balance (only
# balance_sockets) or tail (only tail_chunk); TAIL is the smallest tail
# chunk (default 256KiB). "old" is the same binary with its defaults, so
# only the knobs differ. Prints bench-compare's medians; every line goes to
# $OUT/balance.txt (or ./gpu-out).
set -eu
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
src=${STAGE_GPU_SRC:-0}; dst=${STAGE_GPU_DST:-1}
rounds=${ROUNDS:-3}; tail=${TAIL:-256KiB}; variant=${VARIANT:-both}
case $variant in
both) env="STAGE_STAGING_BALANCE_SOCKETS=true STAGE_STAGING_TAIL_CHUNK=$tail" ;;
balance) env="STAGE_STAGING_BALANCE_SOCKETS=true" ;;
tail) env="STAGE_STAGING_TAIL_CHUNK=$tail" ;;
*) echo "gpu-balance: VARIANT must be both, balance or tail (got $variant)" >&2; exit 2 ;;
esac
new=$(mktemp -d)
trap 'rm -rf "$new"' EXIT
printf '#!/bin/sh\n%s exec %s "$@"\n' "$env" "$PWD/.dev/staged" > "$new/staged"
chmod +x "$new/staged"
ln -s "$PWD/.dev/stagectl" "$new/stagectl"
G=(--device "cuda:$src" --remote-device "cuda:$dst" --slots 64)
{
  echo "new: $env; $rounds rounds each, old first in each round"
  for shape in ranges blocks; do
    echo "== $shape"
    bash scripts/bench-compare.sh .dev "$new" "$rounds" "$shape" "${G[@]}"
  done
} 2>&1 | tee "$out/balance.txt"
