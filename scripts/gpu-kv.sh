#!/usr/bin/env bash
# KV-transfer figures in one job on the GPU machine, with their ceilings
# measured in the same job. Runs from the repository root with what
# `make gpu-build` put in .dev/ (no Go there).
#
#   make gpu-build                                         # here
#   STAGE_GPU_SRC=0 STAGE_GPU_DST=0 bash scripts/gpu-kv.sh  # there
#
# Writes ceilings.txt, kv.log (every bench's table), kv-*.json and
# kernel.txt (the conversion alone beside plain D2H) to $OUT (or ./gpu-out).
set -u
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
src=${STAGE_GPU_SRC:-0}; dst=${STAGE_GPU_DST:-0}
layers=${STAGE_KV_LAYERS:-32}; tokens=${STAGE_KV_TOKENS:-4096}
B=".dev/stagectl bench --spawn --staged .dev/staged --device cuda:$src --remote-device cuda:$dst --stripes 8 --slots 64"

CONNS=8 bash .dev/bench/ceilings.sh > "$out/ceilings.txt" 2>&1
for kv in ascend:vllm-hnd vllm-hnd:ascend ascend:vllm-packed/16 vllm-flash:vllm-flashinfer vllm-mla:ascend-mla; do
  name=$(echo "$kv" | tr ':/' '__')
  echo "== $kv" >> "$out/kv.log"
  $B --kv "$kv" --kv-layers "$layers" --kv-tokens "$tokens" --iters 5 --json > "$out/kv-$name.json" 2>> "$out/kv.log" ||
    { echo "bench --kv $kv failed"; tail -5 "$out/kv.log"; }
done
(cd cuda && ../.dev/cuda.test -test.run '^TestGPUKVRoundTrip$' -test.v &&
  ../.dev/cuda.test -test.run '^$' -test.bench 'GPUKV|GPUD2H4MiB|GPUH2D4MiB' -test.benchtime 2s) > "$out/kernel.txt" 2>&1
CONNS=8 bash .dev/bench/ceilings.sh 2>/dev/null | grep loopback > "$out/ceilings-after.txt"
grep -h "tcp loopback\|D2H pinned\|H2D pinned" "$out/ceilings.txt" "$out/ceilings-after.txt"
cat "$out/kv.log" | grep -v '^\s*$'
grep -E "^(Benchmark|--- |ok|PASS|FAIL)" "$out/kernel.txt"
