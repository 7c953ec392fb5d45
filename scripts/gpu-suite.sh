#!/usr/bin/env bash
# The GPU job: runs on the GPU machine from the repository root, with what
# `make gpu-build` put in .dev/ (that machine has no Go). Writes every log
# under $OUT (or ./gpu-out) and prints a summary at the end.
#
#   make gpu-build                          # here: test binaries, daemons, bench probes
#   bash scripts/gpu-suite.sh               # there: everything (longer than 10 minutes)
#   PART=1 bash scripts/gpu-suite.sh        # ceilings, unit, e2e (same-node too), TCP and ipc benches, latency
#   PART=2 bash scripts/gpu-suite.sh        # sweep, 64 GiB memory/CPU run, Ascend emulation, torch
#
# STAGE_GPU_SRC / STAGE_GPU_DST pick the GPUs of the two sides (default 0 0;
# on two GPUs use 0 1). SKIP_CEILINGS=1 skips the ../shared/bench probes.
set -u
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
src=${STAGE_GPU_SRC:-0}; dst=${STAGE_GPU_DST:-0}
export STAGE_GPU_SRC=$src STAGE_GPU_DST=$dst
part=${PART:-all}
summary=$out/summary.txt; : > "$summary"
# Three files come back: machine.txt, summary.txt and all.log (every step's
# whole output, in order).
step() { # name, command...
  local name=$1; shift
  local log; log=$(mktemp)
  local t0=$SECONDS
  if "$@" > "$log" 2>&1; then r=PASS; else r="FAIL($?)"; fi
  printf '%-28s %-8s %4ds\n' "$name" "$r" $((SECONDS - t0)) | tee -a "$summary"
  { echo "===== $name: $r"; cat "$log"; } >> "$out/all.log"
  rm -f "$log"
}
B=".dev/stagectl bench --spawn --staged .dev/staged"
GPUS="--device cuda:$src --remote-device cuda:$dst"

{ nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv; nvcc --version | tail -1; uname -r; nproc; } > "$out/machine.txt" 2>&1

if [ "$part" = all ] || [ "$part" = 1 ]; then
  if [ "${SKIP_CEILINGS:-0}" != 1 ]; then
    step ceilings env CONNS="1 4 8" bash .dev/bench/ceilings.sh
  fi
  # The cuda tests read cuda/testdata: run them from the package's folder.
  step cuda-unit bash -c "cd cuda && ../.dev/cuda.test -test.v -test.count=1"
  step cuda-bench bash -c "cd cuda && ../.dev/cuda.test -test.run '^$' -test.bench . -test.benchtime 1s"
  # GPU e2e: TCP staging both ways, and the same-node paths (ipc with view
  # and VMM regions, shm between hostmem and cuda).
  step e2e-gpu env STAGED_BIN=$PWD/.dev/staged .dev/e2e.test -test.v -test.count=1 -test.run 'GPU' -test.timeout 8m
  for pat in "ranges 1MiB" "blocks 16KiB"; do
    set -- $pat
    step "bench-tcp-$1-$2" $B $GPUS --stripes 8 --slots 64 --size 1GiB --block "$2" --pattern "$1" --iters 3 --verify --raw
  done
  step bench-tcp-ranges-crc $B $GPUS --stripes 8 --slots 64 --size 1GiB --block 1MiB --iters 3 --verify --raw --checksum on
  step bench-tcp-ranges-depth0 env STAGE_STAGING_STREAM_DEPTH=0 $B $GPUS --stripes 8 --slots 64 --size 1GiB --block 1MiB --iters 3 --verify --raw
  step bench-ipc-ranges-4GiB $B $GPUS --transport auto --size 4GiB --block 1GiB --iters 3 --verify
  step bench-ipc-blocks-16KiB $B $GPUS --transport auto --size 1GiB --block 16KiB --pattern blocks --iters 3 --verify
  step latency-4KiB $B --stripes 1 --size 4KiB --block 4KiB --iters 5000 --warmup 300 --verify
  step latency-4KiB-again $B --stripes 1 --size 4KiB --block 4KiB --iters 5000 --warmup 300 --verify
fi
if [ "$part" = all ] || [ "$part" = 2 ]; then
  step sweep $B $GPUS --stripes 8 --slots 64 --size 1GiB --sweep --raw --iters 3
  for d in 0 1 0 1; do
    step "bench-tcp-depth$d" env STAGE_STAGING_STREAM_DEPTH=$d $B $GPUS --stripes 8 --slots 64 --size 2GiB --block 1MiB --iters 4 --raw
  done
  # Memory and CPU while moving 64 GiB: 8 transfers of 8 GiB.
  step bench-64GiB $B $GPUS --stripes 8 --slots 64 --size 8GiB --block 1MiB --iters 8 --raw
  # The Ascend backend over an emulation of ACL built on the CUDA runtime: an
  # "Ascend" sidecar on GPU0 and a CUDA sidecar move a KV cache both ways.
  step acl-hetero bash -c "nvcc -shared -Xcompiler -fPIC -o .dev/libascendcl.so acl/testdata/fakeacl_cuda.c -lpthread -lcuda && cd acl && STAGE_TEST_ACL_LIBRARY=$PWD/.dev/libascendcl.so STAGED_BIN=$PWD/.dev/staged ../.dev/acl.test -test.v -test.count=1 -test.run GPU"
  step torch-tests bash -c "cd python && STAGED=$PWD/.dev/staged PYTHONUNBUFFERED=1 python3 -m unittest discover -v -s tests -p 'test_torch*.py'"
fi
echo; cat "$out/machine.txt"; echo; cat "$summary"
! grep -q FAIL "$summary"
