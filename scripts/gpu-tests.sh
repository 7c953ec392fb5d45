#!/usr/bin/env bash
# The GPU tests alone, no benchmarks: what must pass on the GPU machine
# after a change that is meant to change no behaviour (issue 26). Runs from
# the repository root with what `make gpu-build` put in .dev/ (no Go there);
# writes machine.txt, summary.txt and all.log to $OUT (or ./gpu-out).
#
#   make gpu-build                                            # here
#   STAGE_GPU_SRC=0 STAGE_GPU_DST=1 bash scripts/gpu-tests.sh  # there
#
# Steps: the cuda package's tests (the strided and gather kernels, IPC,
# slots), e2e's GPU tests (TCP staging both ways, same-node ipc and shm),
# the Ascend backend over the ACL emulation on CUDA, and the Python tests
# with CUDA torch (connector, tiny LM on GPU sidecars, Ascend emulation).
set -u
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export STAGE_GPU_SRC=${STAGE_GPU_SRC:-0} STAGE_GPU_DST=${STAGE_GPU_DST:-0}
summary=$out/summary.txt; : > "$summary"
step() { # name, seconds, command...
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS r
  if timeout "$secs" "$@" > "$out/$name.log" 2>&1; then r=PASS; else r="FAIL($?)"; fi
  printf '%-14s %-9s %4ds\n' "$name" "$r" $((SECONDS - t0)) | tee -a "$summary"
  { echo "===== $name: $r"; cat "$out/$name.log"; } >> "$out/all.log"
  rm -f "$out/$name.log"
}
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv; uname -r; nproc; date -u; } > "$out/machine.txt" 2>&1

# The cuda tests read cuda/testdata: run them from the package's folder.
step cuda-unit 120 bash -c "cd cuda && ../.dev/cuda.test -test.count=1"
step e2e-gpu 240 env STAGED_BIN="$PWD/.dev/staged" .dev/e2e.test -test.count=1 -test.run GPU -test.timeout 230s
nvcc -shared -Xcompiler -fPIC -o .dev/libascendcl.so acl/testdata/fakeacl_cuda.c -lpthread -lcuda > "$out/nvcc.log" 2>&1
export STAGE_TEST_ACL_LIBRARY=$PWD/.dev/libascendcl.so
step acl-hetero 120 bash -c "cd acl && STAGED_BIN=$PWD/.dev/staged ../.dev/acl.test -test.count=1 -test.run GPU"
step python-cuda 240 bash -c "cd python && STAGED=$PWD/.dev/staged PYTHONUNBUFFERED=1 python3 -m unittest \
  tests.test_torch tests.test_torch_e2e tests.test_tinylm tests.test_tinylm_e2e tests.test_ascend_gpu tests.test_kvcache \
  tests.test_hostmap tests.test_layout tests.test_layout_packed tests.test_vllm_connector tests.test_sglang"
# Failures, and what each Python run skipped and why (a GPU test skipped here is a test not run).
grep -E '^(--- FAIL|FAIL|panic:|Ran |OK|FAILED)|skipped' "$out/all.log" | sort | uniq -c | sort -rn | head -40 > "$out/highlights.txt"
cat "$out/machine.txt" "$summary"
! grep -q FAIL "$summary"
