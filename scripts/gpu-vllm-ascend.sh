#!/usr/bin/env bash
# Runs python/tests/test_vllm_ascend.py on the GPU machine: TestVLLMAscendGPU (vllm-ascend 0.23.0.post1's
# runner makes the caches over fakeacl_cuda, the ACL runtime emulated over CUDA; a cuda sidecar decodes,
# vllm-packed / vllm-mla, block 16), then the CPU classes over fakeacl.c for comparison.
#
# Here:   make gpu-vllm-ascend-carry          (.vac/: vac.tar.xz + MANIFEST.txt, about 35 MB)
# There:  device run, carry [".vac"], command: bash scripts/gpu-vllm-ascend.sh
#
# It unpacks .vac/vac.tar.xz into /tmp/vac (site/ goes first on PYTHONPATH: vllm 0.23.0's Python files,
# transformers 4.57.6 and what else the image lacks; the image's python3 gives torch 2.11.0+cu130, numpy,
# scipy, ...), prints the versions the test will import and any carried distribution's requirement the
# image's packages miss, builds acl/testdata/fakeacl_cuda.c with nvcc and fakeacl.c with gcc into .dev/,
# and runs both, bounded at 5 minutes in all. Logs go to $OUT (setup.log, gpu.log, cpu.log; without $OUT,
# /tmp/vac-out). The exit status is the GPU class's, else the CPU classes'.
#
# Without CUDA (a venv that mirrors the image, to prove the import set: PYTHON=that venv's python, with
# VAC_EXTRA_PATH naming a folder of what the image has and the venv lacks): the CPU classes run and the
# GPU class must import and skip ("CUDA is not available to torch").
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
export PYTHONUNBUFFERED=1
start=$SECONDS
budget=${VAC_BUDGET_S:-300}
py=${PYTHON:-python3}
out=${OUT:-/tmp/vac-out}
vac=${VAC_DIR:-/tmp/vac}
root=$PWD
mkdir -p "$out" .dev
setup="$out/setup.log"

left() { echo $((budget - (SECONDS - start))); }
fail() { echo "gpu-vllm-ascend: $*" | tee -a "$setup" >&2; exit 2; }

[ -f .vac/vac.tar.xz ] || fail ".vac/vac.tar.xz is missing: run make gpu-vllm-ascend-carry here and carry .vac"
rm -rf "$vac" && mkdir -p "$vac" || fail "cannot make $vac"
if command -v xz >/dev/null; then
  tar -xJf .vac/vac.tar.xz -C "$vac" || fail "unpacking .vac/vac.tar.xz into $vac failed"
else  # no xz program: Python's lzma
  "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' .vac/vac.tar.xz "$vac" \
    || fail "unpacking .vac/vac.tar.xz into $vac with $py failed"
fi
export PYTHONPATH="$vac/site${VAC_EXTRA_PATH:+:$VAC_EXTRA_PATH}"
staged=${STAGED:-$vac/bin/staged}
src="$vac/vllm_ascend-0.23.0.post1"
[ -x "$staged" ] || fail "no staged at $staged"
[ -d "$src/vllm_ascend" ] || fail "no vllm_ascend source at $src"

{
  echo "== $(date -u +%FT%TZ) $(uname -m); python: $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  cat .vac/MANIFEST.txt 2>/dev/null | tail -3
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  command -v nvcc >/dev/null && nvcc --version | tail -2
  # What the test will import, from where, and every carried distribution's requirement that what is
  # importable here does not meet (a missing one is only listed: the carry holds what the test imports).
  "$py" -s - "$vac/site" <<'EOF'
import importlib.metadata as md, os, sys
from packaging.requirements import Requirement
site = sys.argv[1]
for n in ("vllm", "torch", "transformers", "tokenizers", "huggingface_hub", "numpy", "scipy", "numba", "triton",
          "protobuf", "pydantic", "pydantic_core", "msgspec", "pyzmq", "xgrammar", "apache-tvm-ffi", "safetensors"):
    try:
        d = md.distribution(n)
        print("%-16s %-14s %s" % (n, d.version, d.locate_file("")))
    except md.PackageNotFoundError:
        print("%-16s MISSING" % n)
bad = 0
for d in md.distributions(path=[site]):
    for r in d.requires or []:
        q = Requirement(r)
        if q.marker is not None and not q.marker.evaluate({"extra": ""}):
            continue
        try:
            have = md.version(q.name)
        except md.PackageNotFoundError:
            print("absent   %s %s needs %s" % (d.metadata["Name"], d.version, r))
            continue
        if q.specifier and not q.specifier.contains(have, prereleases=True):
            bad += 1
            print("CONFLICT %s %s needs %s; %s here" % (d.metadata["Name"], d.version, r, have))
print("requirement conflicts:", bad)
EOF
} > "$setup" 2>&1
grep -v "^absent " "$setup"

# run NAME SECONDS LIBRARY CUDA TESTS...: one unittest run, logged to $OUT/NAME.log, bounded by SECONDS and
# by what is left of the budget
run() {
  local name=$1 cap=$2 lib=$3 cuda=$4
  shift 4
  local t
  t=$(left)
  [ "$t" -le "$cap" ] || t=$cap
  [ "$t" -gt 20 ] || { echo "gpu-vllm-ascend: no time left for $name" | tee -a "$setup"; return 124; }
  echo "== $name: $* (STAGE_TEST_ACL_CUDA=$cuda, ${t}s left)" | tee -a "$setup"
  (cd python && STAGED="$staged" STAGE_TEST_ACL_LIBRARY="$lib" STAGE_TEST_ACL_CUDA="$cuda" \
    STAGE_VLLM_ASCEND_SRC="$src" STAGE_ENGINES_REQUIRED=1 \
    timeout -k 10 "$t" "$py" -s -m unittest -v "$@") > "$out/$name.log" 2>&1
  local rc=$?
  tail -4 "$out/$name.log"
  echo "== $name: exit $rc after $((SECONDS - start))s" | tee -a "$setup"
  return $rc
}

gpu_rc=
if command -v nvcc >/dev/null && "$py" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  nvcc -shared -Xcompiler -fPIC -o .dev/libascendcl.so acl/testdata/fakeacl_cuda.c -lpthread -lcuda \
    >> "$setup" 2>&1 || fail "nvcc could not build fakeacl_cuda.c (see $setup)"
  run gpu 200 "$root/.dev/libascendcl.so" 1 tests.test_vllm_ascend.TestVLLMAscendGPU
  gpu_rc=$?
elif [ -z "${VAC_EXTRA_PATH+x}" ] && [ -z "${PYTHON:-}" ]; then
  fail "no nvcc or no CUDA for torch here: run this on the GPU machine (or set PYTHON for a mirror venv)"
fi

gcc -shared -fPIC -O1 -Wall -Werror -o .dev/libascendcl-fake.so acl/testdata/fakeacl.c -lpthread \
  >> "$setup" 2>&1 || fail "gcc could not build fakeacl.c (see $setup)"
if [ -z "$gpu_rc" ]; then  # no CUDA: the GPU class imports and skips
  run gpu 200 "$root/.dev/libascendcl-fake.so" 1 tests.test_vllm_ascend.TestVLLMAscendGPU
  gpu_rc=$?  # 5: unittest ran nothing, every test skipped; right here only for lack of CUDA
  if [ "$gpu_rc" -eq 5 ] && grep -q "skipped 'CUDA is not available to torch'" "$out/gpu.log"; then
    gpu_rc=0
  else
    echo "gpu-vllm-ascend: the GPU class did not import and skip for lack of CUDA (see $out/gpu.log)"; gpu_rc=1
  fi
fi
run cpu "$budget" "$root/.dev/libascendcl-fake.so" 0 tests.test_vllm_ascend.TestStandin tests.test_vllm_ascend.TestVLLMAscend
cpu_rc=$?
echo "gpu-vllm-ascend: GPU class exit $gpu_rc, CPU classes exit $cpu_rc, $((SECONDS - start))s; logs in $out" | tee -a "$setup"
[ "$gpu_rc" -ne 0 ] && exit "$gpu_rc"
exit "$cpu_rc"
