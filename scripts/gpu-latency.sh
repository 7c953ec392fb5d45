#!/usr/bin/env bash
# Small-transfer latency and a throughput check on one GPU host, from what
# `make gpu-build` put in .dev/ (run from the repository root there).
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
{
nproc; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for i in 1 2; do
  .dev/stagectl bench --spawn --staged .dev/staged --stripes 1 --size 4KiB --block 4KiB --iters 5000 --warmup 500
done
.dev/stagectl bench --spawn --staged .dev/staged --device cuda:0 --stripes 1 --size 4KiB --block 4KiB --iters 5000 --warmup 500
.dev/stagectl bench --spawn --staged .dev/staged --stripes 1 --size 64KiB --block 4KiB --pattern blocks --iters 2000 --warmup 200
.dev/stagectl bench --spawn --staged .dev/staged --device cuda:0 --stripes 8 --slots 64 --size 1GiB --block 1MiB --iters 3 --verify --raw
} 2>&1 | tee "$out/latency.log"
