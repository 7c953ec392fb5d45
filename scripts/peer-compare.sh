#!/usr/bin/env bash
# Peers side by side on one CPU machine (issue 27): stage, NIXL 1.5.1 (UCX over
# TCP) and Mooncake Transfer Engine 0.3.13.post1 (its TCP transport) move the
# same bytes between two processes on loopback, host memory, beside raw TCP
# with as many streams measured in the same run. Cases: 1 MiB ranges and
# 16 KiB blocks (scattered), 1 and 4 streams/threads, 256 MiB per transfer.
#
#   bash scripts/peer-compare.sh     # or: make peer-compare
#
# Env: PEER_VENV (pinned venv, made on first use; default
# ~/.cache/stage/venvs/peers), ROUNDS (interleaved rounds, default 3), ITERS
# (timed transfers per run, default 3), BIN (stage binaries, built if missing).
# Prints one table (scripts/peercompare/table.py): median GB/s over all timed
# transfers (min-max), the ratio of each median to raw TCP and to stage in the
# same case, and the check of the destination's bytes after each run (stage:
# --verify-end; the peers: every destination block compared by the target).
set -u
cd "$(dirname "$0")/.." || exit 1
BIN=${BIN:-bin}
VENV=${PEER_VENV:-$HOME/.cache/stage/venvs/peers}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-3}
SIZE=$((256 << 20))
DRIVER=scripts/peercompare/peer.py
WORK=$(mktemp -d "${TMPDIR:-/tmp}/peer-compare.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
die() { echo "peer-compare: $*" >&2; exit 1; }

# --- stage binaries
if [ ! -x "$BIN/stagectl" ] || [ ! -x "$BIN/staged" ]; then
  command -v "${GO:-go}" >/dev/null || die "$BIN/stagectl missing and no Go toolchain to build it; install Go or run make build"
  make -s build BIN="$BIN" >/dev/null || die "make build failed; run it by hand to see why"
fi

# --- pinned venv. nixl==1.5.1 is a meta package that pulls both CUDA variants
# and torch; the CPU machine needs only nixl-cu12's host-memory UCX path and
# numpy, so those are installed without their declared deps (torch is only for
# tensor descriptors, unused here). Mooncake's CPU build of the same release
# is mooncake-transfer-engine-non-cuda (the plain one needs libcudart.so.12).
PINS="nixl==1.5.1 nixl-cu12==1.5.1 numpy==2.4.6 mooncake-transfer-engine-non-cuda==0.3.13.post1"
if ! "$VENV/bin/python" -c 'import nixl._api, mooncake.engine' 2>/dev/null; then
  echo "peer-compare: making the venv $VENV ($PINS)" >&2
  python3 -m venv "$VENV" || die "python3 -m venv $VENV failed (Debian: apt-get install python3-venv)"
  # shellcheck disable=SC2086 # PINS is a list
  "$VENV/bin/pip" install -q --no-deps $PINS || die "pip install of $PINS failed; is PyPI reachable?"
fi
PY=$VENV/bin/python
NIXL_OK=1; MC_OK=1
"$PY" -c 'import nixl._api' 2>"$WORK/nixl.err" || { NIXL_OK=0; echo "peer-compare: NIXL does not import: $(tail -1 "$WORK/nixl.err")" >&2; }
"$PY" -c 'import mooncake.engine' 2>"$WORK/mc.err" || { MC_OK=0; echo "peer-compare: Mooncake does not import: $(tail -1 "$WORK/mc.err")" >&2; }

export UCX_TLS=tcp UCX_NET_DEVICES=lo   # NIXL's UCX backend: TCP on loopback only
export GLOG_minloglevel=2               # Mooncake: errors only

TABLE=scripts/peercompare/table.py
RUNS=$WORK/runs.jsonl

# peer NAME STREAMS BLOCK PATTERN -> a record of its timed transfers and check in $RUNS
peer() {
  local name=$1 s=$2 b=$3 pat=$4 case=$4:$3:$2 ready="$WORK/ready.$RANDOM$RANDOM"
  local port=$((20000 + RANDOM % 20000)) envs=()
  [ "$name" = mooncake ] && envs=("MC_TCP_LANES_PER_PEER=$s")
  env "${envs[@]}" "$PY" "$DRIVER" "$name" target --port $port --size $SIZE --block "$b" --pattern "$pat" \
      --streams "$s" --ready "$ready" --timeout 240 >"$WORK/target.log" 2>&1 &
  local tp=$!; PIDS+=("$tp")
  local line
  line=$(env "${envs[@]}" timeout 240 "$PY" "$DRIVER" "$name" initiator --port $port --size $SIZE --block "$b" \
      --pattern "$pat" --iters "$ITERS" --streams "$s" --ready "$ready" 2>"$WORK/init.log" | tail -1)
  kill "$tp" 2>/dev/null; wait "$tp" 2>/dev/null
  if [ -z "$line" ]; then
    local why; why=$(grep -v '^[IW][0-9]' "$WORK/init.log" | tail -1)
    echo "peer-compare: $name $pat $b x$s failed: $why" >&2
    "$PY" "$TABLE" record "$RUNS" "$case" "$name" --error "failed: $why"; return
  fi
  printf '%s\n' "$line" | "$PY" "$TABLE" record "$RUNS" "$case" "$name" --peer-json
}

stage() { # STREAMS BLOCK PATTERN -> stage and raw TCP
  local s=$1 b=$2 pat=$3 j
  j=$("$BIN/stagectl" bench --spawn --raw --raw-span 256MiB --stripes "$s" --size 256MiB --block "$b" \
      --pattern "$pat" --iters "$ITERS" --verify-end --json 2>"$WORK/stage.log") || {
    echo "peer-compare: stagectl bench failed: $(tail -1 "$WORK/stage.log")" >&2
    "$PY" "$TABLE" record "$RUNS" "$pat:$b:$s" stage --error "failed: $(tail -1 "$WORK/stage.log")"; return; }
  printf '%s' "$j" | "$PY" "$TABLE" record "$RUNS" "$pat:$b:$s" stage --stage-json
}

CASES="ranges:1048576:1 ranges:1048576:4 blocks:16384:1 blocks:16384:4"
for r in $(seq "$ROUNDS"); do
  echo "peer-compare: round $r of $ROUNDS" >&2
  for c in $CASES; do
    IFS=: read -r pat b s <<<"$c"
    stage "$s" "$b" "$pat"
    if [ $NIXL_OK = 1 ]; then peer nixl "$s" "$b" "$pat"
    else "$PY" "$TABLE" record "$RUNS" "$c" nixl --error "did not run: NIXL does not import: $(tail -1 "$WORK/nixl.err")"; fi
    if [ $MC_OK = 1 ]; then peer mooncake "$s" "$b" "$pat"
    else "$PY" "$TABLE" record "$RUNS" "$c" mooncake --error "did not run: Mooncake does not import: $(tail -1 "$WORK/mc.err")"; fi
  done
done

# shellcheck disable=SC2086 # CASES is a list
"$PY" "$TABLE" print "$RUNS" $CASES
echo "256 MiB per transfer, host memory, loopback; raw TCP: stagectl's in-process sink, as many streams, 256 MiB span (cold memory)."
echo "stage: stagectl bench --spawn (tcp, default slots, --verify-end); NIXL: UCX tcp on lo, num_workers=N, N WRITE requests posted together;"
echo "Mooncake: tcp transport, P2P handshake, MC_TCP_LANES_PER_PEER=N, N threads of batch_transfer_sync_write (1024 slices in flight in all)."
