# Sourced by scripts/gpu-shape.sh and scripts/gpu-ipc.sh: the common setup
# of a GPU bench script and its variants. A variant is NAME or NAME=ENV
# (commas between its variables); STAGED_<NAME>=path and
# STAGECTL_<NAME>=path run it on other binaries (an older build, say).
# Reads out (the output folder) and bin (where staged and stagectl are).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
src=${STAGE_GPU_SRC:-0}; dst=${STAGE_GPU_DST:-1}
G=(--device "cuda:$src" --remote-device "cuda:$dst")
[ "${NO_GPU:-0}" = 1 ] && G=()
variants=${VARIANTS:-default}

# staged_of NAME[=ENV]: the staged a variant runs, a wrapper that sets its
# variables where it has some
staged_of() {
  local v=$1 name=${1%%=*} env="" base
  base=$(eval "echo \${STAGED_$name:-$bin/staged}")
  [ "$v" = "$name" ] || env=$(echo "${v#*=}" | tr ',' ' ')
  [ -z "$env" ] && { echo "$base"; return; }
  mkdir -p "$out/bin-$name"
  printf '#!/bin/sh\n%s exec %s "$@"\n' "$env" "$base" > "$out/bin-$name/staged"
  chmod +x "$out/bin-$name/staged"
  echo "$out/bin-$name/staged"
}

# stagectl_of NAME: the stagectl a variant runs
stagectl_of() { eval "echo \${STAGECTL_$1:-$bin/stagectl}"; }
