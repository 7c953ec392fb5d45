#!/usr/bin/env bash
# Peers side by side on the GPU machine (issue 27 item 3): stage, NIXL 1.5.1
# (UCX over TCP) and Mooncake Transfer Engine 0.3.13.post1 (its TCP transport)
# move the same bytes from GPU memory on GPU $STAGE_GPU_SRC to GPU memory on
# GPU $STAGE_GPU_DST, two processes on loopback, beside raw TCP with as many
# streams in the same run: 1 MiB ranges and 16 KiB blocks (scattered), 1 and
# 4 streams, 256 MiB per transfer, as scripts/peer-compare.sh does with host
# memory on the CPU machine. Runs from the repository root there, with no
# network, no pip index and no Go:
#
#   bash scripts/gpu-peers-wheels.sh        # here: .pw1 .pw2 .pw3
#   bash scripts/gpu-peers.sh --stash       # there, one call per part carrying .pwK:
#                                           # a carried folder is gone on the next call,
#                                           # so each is copied to $GPU_PEERS_STASH
#   bash scripts/gpu-peers.sh               # there, in the call that carries the last part
#
# It reassembles the parts (sha256 against their MANIFEST), installs the
# wheels with pip --no-index --no-deps --target $GPU_PEERS_SITE (default
# /tmp/site; libcudart.so.12 for Mooncake's CUDA build into $SITE-cudart, on
# Mooncake's LD_LIBRARY_PATH alone), checks that each peer imports, then runs
# every case and prints one table: median GB/s (min-max), the ratio to raw
# TCP and to stage, and the check of the destination's bytes. A peer that
# cannot run is a row "did not run: <why>"; nothing stops the others. Without
# two GPUs (or with GPU_PEERS_DRY=1) every step up to the runs is done and each
# row says "did not run: no GPU ...".
#
# How each is driven (scripts/peercompare/peer.py for the peers):
#   stage: stagectl bench --spawn --device cuda:SRC --remote-device cuda:DST
#          --raw --raw-span 256MiB --stripes N --verify-end (tcp, default slots);
#          stage binaries from .dev/ (make gpu-build) or else from the bundle.
#   NIXL:  torch tensors on each GPU registered as VRAM; UCX backend with
#          UCX_TLS=tcp,cuda_copy UCX_NET_DEVICES=lo: TCP between the processes,
#          GPU memory staged through host by UCX's cuda_copy (no cuda_ipc, which
#          would skip TCP); num_workers=N, N WRITE requests posted together.
#   Mooncake: the CUDA build's tcp transport (it stages device memory through
#          host buffers itself), P2P handshake, MC_TCP_LANES_PER_PEER=N, N
#          threads of batch_transfer_sync_write.
#
# Env: OUT (default ./gpu-peers-out: gpu-peers.log, peers.log, runs.jsonl,
# machine.txt, table.txt), STAGE_GPU_SRC/STAGE_GPU_DST (0, 1), ROUNDS (2),
# ITERS (3), PEERS ("stage nixl mooncake"), GPU_PEERS_BUDGET (seconds for the
# whole script, 450: every step is bounded so that it ends within 8 minutes),
# GPU_PEERS_DRY=1, GPU_PEERS_WORK (/tmp/gpu-peers), GPU_PEERS_SITE (/tmp/site),
# PYTHON (python3), NIXL_UCX_TLS (tcp,cuda_copy), NIXL_UCX_ENV (more NAME=VALUE
# words for NIXL's processes, e.g. UCX_RMA_PPLN_ENABLE=y), STAGE_TIMEOUT (120)
# and PEER_TIMEOUT (100): the most one run may take. GPU_PEERS_HOST=1 tests
# the script itself on a CPU machine: host memory, no install, PYTHON's own
# packages (PYTHON=~/.cache/stage/venvs/peers/bin/python, as peer-compare.sh's).
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
# Parts carried on earlier calls wait here (GPU_PEERS_STASH): outside the
# working tree, which the device tool replaces on every call.
STASH=${GPU_PEERS_STASH:-/tmp/gpu-peers-parts}
# shellcheck source=scripts/gpu-bundle.sh
. "$ROOT/scripts/gpu-bundle.sh"
if [ "${1:-}" = --stash ]; then bundle_stash "$ROOT" .pw "$STASH"; exit; fi
OUT=${OUT:-$ROOT/gpu-peers-out}
mkdir -p "$OUT" || { echo "gpu-peers: cannot make $OUT" >&2; exit 1; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PIP_ROOT_USER_ACTION=ignore
BUDGET=${GPU_PEERS_BUDGET:-450}
SRC=${STAGE_GPU_SRC:-0}; DST=${STAGE_GPU_DST:-1}
ROUNDS=${ROUNDS:-2}; ITERS=${ITERS:-3}
PEERS=${PEERS:-stage nixl mooncake}
WORK=${GPU_PEERS_WORK:-/tmp/gpu-peers}
SITE=${GPU_PEERS_SITE:-/tmp/site}
CUDART=$SITE-cudart
PY=${PYTHON:-python3}
SIZE=$((256 << 20))
CASES="ranges:1048576:1 ranges:1048576:4 blocks:16384:1 blocks:16384:4"
DRIVER=$ROOT/scripts/peercompare/peer.py
TABLE=$ROOT/scripts/peercompare/table.py
RUNS=$OUT/runs.jsonl PLOG=$OUT/peers.log MACHINE=$OUT/machine.txt
NIXL_UCX_TLS=${NIXL_UCX_TLS:-tcp,cuda_copy} NIXL_UCX_ENV=${NIXL_UCX_ENV:-}
STAGE_MAX=${STAGE_TIMEOUT:-120} PEER_MAX=${PEER_TIMEOUT:-100} LATER_MIN=${LATER_MIN:-45}
HOSTTEST=${GPU_PEERS_HOST:-0}
if [ "$HOSTTEST" = 1 ]; then # test this script on a CPU machine: host memory, the packages PYTHON has
  SDEV=cpu DDEV=cpu STAGE_DEVS=(--device hostmem) PYPATH=${PYTHONPATH:-}
else
  SDEV=cuda:$SRC DDEV=cuda:$DST STAGE_DEVS=(--device "cuda:$SRC" --remote-device "cuda:$DST") PYPATH=$SITE
fi

log() { echo "[gpu-peers +$((SECONDS))s] $*"; }
left() { echo $((BUDGET - SECONDS)); }
# allowed MAX: seconds a step may take, at most MAX, leaving 20 s for the table; 0 when none are left
allowed() { local t=$(($(left) - 20)); [ "$t" -lt 10 ] && t=0; [ "$t" -gt "$1" ] && t=$1; echo "$t"; }
# bounded MAX CMD...: CMD under timeout (see allowed); 125 without running it when no time is left
bounded() {
  local t; t=$(allowed "$1"); shift
  if [ "$t" = 0 ]; then log "no time left for: $*"; return 125; fi
  timeout -k 5 "$t" "$@"
}
# step NAME MAX CMD...: a logged, bounded step; its output goes to the log
step() {
  local name=$1 max=$2 rc; shift 2
  log "step $name: $*"
  bounded "$max" "$@"; rc=$?
  log "step $name: rc=$rc$([ $rc = 124 ] && echo " (timed out)")"
  return $rc
}
record() { "$PY" "$TABLE" record "$RUNS" "$@"; }

main() {
  local PIDS=()
  # shellcheck disable=SC2317,SC2329 # the trap below calls it
  cleanup() { local p; for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; }
  trap cleanup EXIT
  : >"$RUNS"; : >"$PLOG"
  mkdir -p "$WORK/run" || { log "cannot make $WORK"; return 1; }
  log "start $(date -u +%FT%TZ) in $ROOT; budget ${BUDGET}s; GPU$SRC -> GPU$DST; rounds $ROUNDS x $ITERS transfers; peers: $PEERS"

  # --- the machine
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -n) $(uname -r) $(uname -m), $(nproc) cores"
    echo "tree: $(git describe --always --dirty 2>/dev/null || echo "no git here")"
    if command -v nvidia-smi >/dev/null; then
      bounded 30 nvidia-smi --query-gpu=index,name,memory.total,driver_version,pci.bus_id --format=csv,noheader
      bounded 30 nvidia-smi topo -m
    else
      echo "nvidia-smi: not found"
    fi
    bounded 90 "$PY" -c 'import sys, numpy, torch; print("python", sys.version.split()[0], "numpy", numpy.__version__, "torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())'
  } >"$MACHINE" 2>&1
  sed 's/^/  /' "$MACHINE"
  GPUS=$(command -v nvidia-smi >/dev/null && bounded 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | awk '{$1=$1" x"; print}' | paste -sd, -)
  NTORCH=$(sed -n 's/.* devices \([0-9]*\)$/\1/p' "$MACHINE" | tail -1)
  NOGPU=""
  if [ "$HOSTTEST" = 1 ]; then log "GPU_PEERS_HOST=1: host memory on both sides, the Python's own packages (a test of this script)"
  elif [ "${GPU_PEERS_DRY:-0}" = 1 ]; then NOGPU="dry run (GPU_PEERS_DRY=1)"
  elif ! command -v nvidia-smi >/dev/null; then NOGPU="no nvidia-smi on this machine"
  elif [ -z "$NTORCH" ]; then NOGPU="torch does not import or sees no CUDA (see machine.txt)"
  elif [ "$NTORCH" -le "$SRC" ] || [ "$NTORCH" -le "$DST" ]; then NOGPU="torch sees $NTORCH GPU(s); GPU$SRC and GPU$DST are wanted"
  fi
  [ -n "$NOGPU" ] && log "no GPU run: $NOGPU"

  # --- the bundle: parts -> tar -> files, each sha256 checked against MANIFEST
  local BUNDLE_WHY="" BSHA="" man
  bundle_unpack "$ROOT" .pw "$STASH" "$WORK"
  man=$(bundle_partdir "$ROOT" .pw "$STASH" 1)/MANIFEST
  [ -n "$BUNDLE_WHY" ] && log "bundle: $BUNDLE_WHY"

  # --- stage's binaries: .dev/ (make gpu-build), else the bundle's
  local STAGECTL="" STAGED="" STAGE_WHY=""
  if [ -x "$ROOT/.dev/stagectl" ] && [ -x "$ROOT/.dev/staged" ]; then
    STAGECTL=$ROOT/.dev/stagectl STAGED=$ROOT/.dev/staged
  elif [ -f "$WORK/bundle/bin/stagectl.gz" ] && [ -f "$WORK/bundle/bin/staged.gz" ]; then
    mkdir -p "$WORK/bin" && for b in stagectl staged; do gunzip -c "$WORK/bundle/bin/$b.gz" >"$WORK/bin/$b" && chmod +x "$WORK/bin/$b"; done
    STAGECTL=$WORK/bin/stagectl STAGED=$WORK/bin/staged
  else
    STAGE_WHY="did not run: no .dev/stagectl and .dev/staged (make gpu-build) and none in the bundle${BUNDLE_WHY:+ ($BUNDLE_WHY)}"
  fi
  [ -n "$STAGECTL" ] && log "stage binaries: $STAGECTL, $STAGED ($(stat -c '%s bytes, %y' "$STAGECTL"))"

  # --- install the wheels (pip, offline, no deps); a dry run on another Python installs what 3.12 would
  local NIXL_WHY="" MC_WHY="" MC_LD=""
  if [ "$HOSTTEST" = 1 ]; then
    log "GPU_PEERS_HOST=1: no install"
  elif [ -n "$BUNDLE_WHY" ]; then
    NIXL_WHY="did not run: $BUNDLE_WHY"; MC_WHY=$NIXL_WHY
  elif [ -f "$SITE/.installed" ] && [ "$(cat "$SITE/.installed")" = "$BSHA" ]; then
    log "wheels already installed in $SITE and $CUDART"
  else
    local pyv extra=()
    pyv=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [ "$pyv" != 3.12 ] && extra=(--python-version 3.12 --implementation cp --only-binary=:all:) &&
      log "python is $pyv here: installing for 3.12 (nothing of it will import)"
    rm -rf "$SITE" "$CUDART"
    local W=$WORK/bundle/wheels
    if ! step pip-install 240 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --disable-pip-version-check --target "$SITE" "${extra[@]}" "$W"/nixl-*.whl "$W"/nixl_cu13-*.whl \
        "$W"/mooncake_transfer_engine-*.whl; then
      NIXL_WHY="did not run: pip install of the wheels failed (gpu-peers.log)"; MC_WHY=$NIXL_WHY
    elif ! step pip-install-cudart 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --disable-pip-version-check --target "$CUDART" "${extra[@]}" "$W"/nvidia_cuda_runtime_cu12-*.whl; then
      MC_WHY="did not run: pip install of nvidia-cuda-runtime-cu12 (libcudart.so.12) failed (gpu-peers.log)"
      echo "$BSHA" >"$SITE/.installed"
    else
      echo "$BSHA" >"$SITE/.installed"
    fi
  fi

  # --- shared libraries: Mooncake's CUDA build wants libcudart.so.12 and, from the
  # system, libibverbs/libmlx5/libnuma/libcurl; where the system lacks one, the
  # copy that NIXL's wheel bundles (same soname, renamed by auditwheel) stands in.
  if [ "$HOSTTEST" = 0 ] && [ -z "$MC_WHY" ] && [ -f "$SITE/mooncake/engine.so" ]; then
    MC_LD=$CUDART/nvidia/cuda_runtime/lib:$SITE/_shim
    mkdir -p "$SITE/_shim"
    local miss lib cand
    miss=$(LD_LIBRARY_PATH=$MC_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ldd "$SITE/mooncake/engine.so" 2>&1 | awk '/not found/ {print $1}')
    for lib in $miss; do
      cand=$(find "$SITE"/nixl_cu13.libs "$SITE"/mooncake_transfer_engine.libs -maxdepth 1 -name "${lib%%.so*}-*.so*" 2>/dev/null | sort | head -1)
      [ -n "$cand" ] && ln -sf "$cand" "$SITE/_shim/$lib" && log "mooncake: $lib not on this system: using $cand"
    done
    miss=$(LD_LIBRARY_PATH=$MC_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ldd "$SITE/mooncake/engine.so" 2>&1 | awk '/not found/ {print $1}' | paste -sd' ' -)
    [ -n "$miss" ] && log "mooncake engine.so: still not found: $miss"
  fi
  if [ "$HOSTTEST" = 0 ] && [ -z "$NIXL_WHY" ] && [ -d "$SITE/nixl_cu13.libs" ]; then
    local f
    for f in "$SITE"/nixl_cu13/_bindings*.so "$SITE"/nixl_cu13.libs/ucx/libuct_cuda.so*; do
      [ -f "$f" ] || continue
      miss=$(ldd "$f" 2>&1 | awk '/not found/ {print $1}' | paste -sd' ' -)
      [ -n "$miss" ] && log "nixl: $(basename "$f"): not found: $miss"
    done
  fi

  # --- does each peer import (and NIXL's UCX backend load)?
  if [ -z "$NOGPU" ] && [ "$HOSTTEST" = 0 ]; then
    if [ -z "$NIXL_WHY" ]; then
      # shellcheck disable=SC2086 # NIXL_UCX_ENV is a list of NAME=VALUE words
      step nixl-import 120 env PYTHONPATH="$SITE" UCX_TLS="$NIXL_UCX_TLS" UCX_NET_DEVICES=lo $NIXL_UCX_ENV "$PY" -c '
import sys, torch, nixl
from nixl._api import nixl_agent, nixl_agent_config
print("nixl module:", sys.modules["nixl._api"].__name__)
a = nixl_agent("probe", nixl_agent_config(backends=[]))
print("plugins:", a.get_plugin_list())
a.create_backend("UCX", {"num_workers": "1"})
print("UCX memory types:", a.get_backend_mem_types("UCX"))' >"$WORK/nixl.imp" 2>&1
      local rc=$?; cat "$WORK/nixl.imp"
      [ $rc != 0 ] && NIXL_WHY="did not run: NIXL does not import or its UCX backend fails: $(grep -v '^\s*$' "$WORK/nixl.imp" | tail -1)"
    fi
    if [ -z "$MC_WHY" ]; then
      step mooncake-import 120 env PYTHONPATH="$SITE" LD_LIBRARY_PATH="$MC_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$PY" -c '
import torch
from mooncake.engine import TransferEngine
print("mooncake.engine:", TransferEngine.__module__)' >"$WORK/mc.imp" 2>&1
      local rc=$?; cat "$WORK/mc.imp"
      [ $rc != 0 ] && MC_WHY="did not run: Mooncake does not import: $(grep -v '^\s*$' "$WORK/mc.imp" | tail -1)"
    fi
  fi

  # --- the runs
  stage_run() { # CASE STREAMS BLOCK PATTERN
    local c=$1 s=$2 b=$3 pat=$4 t rc
    t=$(allowed "$STAGE_MAX")
    [ "$t" = 0 ] && { record "$c" stage --error "did not run: out of time (budget ${BUDGET}s)"; return; }
    log "stage $c (timeout ${t}s)"
    timeout -k 5 "$t" "$STAGECTL" bench --spawn --staged "$STAGED" "${STAGE_DEVS[@]}" \
      --raw --raw-span 256MiB --stripes "$s" --size 256MiB --block "$b" --pattern "$pat" --iters "$ITERS" \
      --verify-end --json >"$WORK/run/stage.json" 2>"$WORK/run/stage.err"
    rc=$?
    { echo "=== stage $c rc=$rc"; tail -n 40 "$WORK/run/stage.err"; } >>"$PLOG"
    if [ $rc = 0 ]; then record "$c" stage --stage-json <"$WORK/run/stage.json"
    elif [ $rc = 124 ] || [ $rc = 137 ]; then record "$c" stage --error "failed: timed out after ${t}s"
    else record "$c" stage --error "failed (rc $rc): $(grep -v '^\s*$' "$WORK/run/stage.err" | tail -1)"; fi
    log "stage $c: rc=$rc"
  }
  peer_run() { # NAME CASE STREAMS BLOCK PATTERN
    local name=$1 c=$2 s=$3 b=$4 pat=$5 t rc tp
    local ready=$WORK/run/ready.$RANDOM$RANDOM port=$((20000 + RANDOM % 20000))
    local envs=(PYTHONPATH="$PYPATH" PYTHONUNBUFFERED=1)
    # shellcheck disable=SC2206 # NIXL_UCX_ENV is a list of NAME=VALUE words
    if [ "$name" = nixl ]; then envs+=(UCX_TLS="$NIXL_UCX_TLS" UCX_NET_DEVICES=lo $NIXL_UCX_ENV)
    else envs+=(MC_TCP_LANES_PER_PEER="$s" GLOG_minloglevel=2 LD_LIBRARY_PATH="$MC_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"); fi
    t=$(allowed "$PEER_MAX")
    [ "$t" = 0 ] && { record "$c" "$name" --error "did not run: out of time (budget ${BUDGET}s)"; return; }
    log "$name $c (timeout ${t}s)"
    timeout -k 5 $((t + 5)) env "${envs[@]}" "$PY" "$DRIVER" "$name" target --port "$port" --size "$SIZE" \
      --block "$b" --pattern "$pat" --streams "$s" --device "$DDEV" --ready "$ready" --timeout "$t" \
      >"$WORK/run/target.log" 2>&1 &
    tp=$!; PIDS+=("$tp")
    timeout -k 5 "$t" env "${envs[@]}" "$PY" "$DRIVER" "$name" initiator --port "$port" --size "$SIZE" \
      --block "$b" --pattern "$pat" --iters "$ITERS" --streams "$s" --device "$SDEV" --ready "$ready" \
      >"$WORK/run/init.out" 2>"$WORK/run/init.err"
    rc=$?
    kill "$tp" 2>/dev/null; wait "$tp" 2>/dev/null
    {
      echo "=== $name $c initiator rc=$rc"; tail -n 40 "$WORK/run/init.err"
      echo "=== $name $c target"; tail -n 40 "$WORK/run/target.log"
    } >>"$PLOG"
    local line; line=$(grep '^{' "$WORK/run/init.out" | tail -1)
    if [ -n "$line" ]; then printf '%s\n' "$line" | record "$c" "$name" --peer-json
    elif [ $rc = 124 ] || [ $rc = 137 ]; then record "$c" "$name" --error "failed: timed out after ${t}s"
    else record "$c" "$name" --error "failed (rc $rc): $(grep -v '^[IWE][0-9]\|^\s*$' "$WORK/run/init.err" | tail -1)"; fi
    log "$name $c: rc=$rc $(printf '%s' "$line" | cut -c1-200)"
  }
  local r c pat b s p
  for r in $(seq "$ROUNDS"); do
    log "round $r of $ROUNDS"
    for c in $CASES; do
      IFS=: read -r pat b s <<<"$c"
      for p in $PEERS; do
        # a round after the first only adds figures: rows it cannot fit are left out, not marked
        if [ "$r" -gt 1 ] && [ $(($(left) - 20)) -lt "$LATER_MIN" ]; then
          log "round $r: $p $c left out (under ${LATER_MIN}s left)"; continue
        fi
        if [ -n "$NOGPU" ]; then record "$c" "$p" --error "did not run: no GPU ($NOGPU)"; continue; fi
        case $p in
          stage) if [ -n "$STAGE_WHY" ]; then record "$c" stage --error "$STAGE_WHY"; else stage_run "$c" "$s" "$b" "$pat"; fi ;;
          nixl) if [ -n "$NIXL_WHY" ]; then record "$c" nixl --error "$NIXL_WHY"; else peer_run nixl "$c" "$s" "$b" "$pat"; fi ;;
          mooncake) if [ -n "$MC_WHY" ]; then record "$c" mooncake --error "$MC_WHY"; else peer_run mooncake "$c" "$s" "$b" "$pat"; fi ;;
          *) record "$c" "$p" --error "did not run: unknown peer $p (PEERS takes stage nixl mooncake)" ;;
        esac
      done
    done
  done

  # --- the table
  {
    echo "gpu-peers: $(date -u +%FT%TZ), ${GPUS:-no GPU}, $SDEV -> $DDEV, tree $(git describe --always --dirty 2>/dev/null || sed -n '1s/.*tree //p' "$man" 2>/dev/null)"
    # shellcheck disable=SC2086 # CASES is a list
    "$PY" "$TABLE" print "$RUNS" $CASES
    echo "256 MiB per transfer, GPU memory to GPU memory between two processes on loopback, $ROUNDS round(s) x $ITERS timed transfers after a warm-up."
    echo "raw TCP: stagectl's in-process sink, as many streams, 256 MiB span of host memory (cold); stage: stagectl bench --spawn (tcp, default slots, --verify-end)."
    echo "NIXL 1.5.1 (nixl-cu13): VRAM, UCX_TLS=$NIXL_UCX_TLS on lo${NIXL_UCX_ENV:+ and $NIXL_UCX_ENV}, num_workers=N, N WRITE requests together; Mooncake 0.3.13.post1 (CUDA build): tcp, MC_TCP_LANES_PER_PEER=N, N threads."
    echo "verify: the target compared every destination block with its source block after the last transfer (stage: every byte)."
  } >"$OUT/table.txt" 2>&1
  cat "$OUT/table.txt"
  log "done in ${SECONDS}s; files in $OUT"
}

main "$@" 2>&1 | tee -a "$OUT/gpu-peers.log"
exit "${PIPESTATUS[0]}"
