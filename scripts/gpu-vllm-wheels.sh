#!/usr/bin/env bash
# What scripts/gpu-vllm.sh needs on the GPU machine (no network, no Go, no
# pip index), made here (issue 34 item 1): vllm==0.26.0 (stripped of the
# kernels an sm_90 bf16 run does not load: scripts/gpu_vllm_wheel.py) and the
# packages of python/requirements/gpu-vllm.txt, for Python 3.12 manylinux
# x86_64; the stage_client wheel built from this tree; staged and stagectl
# (-s -w, gzipped). One tar cut into as few parts of at most 58 MiB as hold
# it, one carry folder each (.vw1 .. .vwN, git-ignored: scripts/gpu-bundle.sh).
#
#   make gpu-vllm-wheels       # = bash scripts/gpu-vllm-wheels.sh, repository root
#
# Then it checks the bundle without a GPU: every wheel installed with pip
# --no-index --no-deps into a fresh folder, over a Python 3.12 that mirrors
# the GPU machine's packages (GPU_VLLM_MIRROR_PYTHON; see below), must import
# vLLM's API server, engine and worker modules and stage_client.vllm's
# connector through vLLM's factory (scripts/gpu_vllm_pair.py imports).
#
# Env: GPU_VLLM_CACHE (~/.cache/stage/gpu-vllm), GO (go), PYTHON (python3: runs
# pip download), GPU_VLLM_MIRROR_PYTHON (default /tmp/gv-mirror/venv/bin/python
# where it exists: a python3.12 venv holding torch 2.11.0 and the machine's
# other packages, none of the carried ones; unset or missing: the check is
# skipped, and says so), GPU_VLLM_PARTS (auto). The mirror used on 2026-11-28
# was a hard-linked copy of a vllm 0.23 venv (torch 2.11.0+cu130), every
# distribution not on KINDS.md's list of the machine's packages removed (by
# its RECORD), then transformers 5.17.0, huggingface_hub 1.33.0 and tokenizers
# 0.23.2 installed as the machine has them; no script makes it yet.
set -u
cd "$(dirname "$0")/.." || exit 1
CACHE=${GPU_VLLM_CACHE:-$HOME/.cache/stage/gpu-vllm}
GO=${GO:-go}
PY=${PYTHON:-python3}
PARTS=${GPU_VLLM_PARTS:-auto}
MIRROR=${GPU_VLLM_MIRROR_PYTHON:-/tmp/gv-mirror/venv/bin/python}
REQ=python/requirements/gpu-vllm.txt
VLLM_WHEEL=vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
die() { echo "gpu-vllm-wheels: $*" >&2; exit 1; }
say() { echo "gpu-vllm-wheels: $*" >&2; }

mkdir -p "$CACHE/wheels" "$CACHE/stripped" "$CACHE/bin" "$CACHE/client" || die "cannot make $CACHE"

# --- 1. wheels (pip skips those already saved)
say "pip download -r $REQ"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$CACHE/wheels" -r "$REQ" || die "pip download failed; is PyPI reachable?"
WHEELS=()
while read -r pin; do
  name=${pin%%==*} ver=${pin#*==}
  [ "$name" = vllm ] && continue
  # pip saves NAME as NAME_WITH_UNDERSCORES-VER-...
  m=("$CACHE"/wheels/"${name//-/_}"-"$ver"-*.whl)
  [ -f "${m[0]}" ] || die "no wheel for $pin in $CACHE/wheels after pip download"
  [ ${#m[@]} = 1 ] || die "several wheels match $pin in $CACHE/wheels: ${m[*]}"
  WHEELS+=("${m[0]}")
done < <(grep -v '^\s*#' "$REQ" | grep '==')
say "${#WHEELS[@]} dependency wheels, $(du -cb "${WHEELS[@]}" | tail -1 | cut -f1) bytes"

# --- 2. vLLM, stripped (again only when the download is newer)
S=$CACHE/stripped/$VLLM_WHEEL
if [ ! -f "$S" ] || [ "$CACHE/wheels/$VLLM_WHEEL" -nt "$S" ]; then
  "$PY" scripts/gpu_vllm_wheel.py "$CACHE/wheels/$VLLM_WHEEL" "$S" || die "stripping $VLLM_WHEEL failed"
fi
WHEELS+=("$S")

# --- 3. stage_client's wheel, and stage's binaries as `make gpu-build` builds them
rm -f "$CACHE"/client/*.whl "$CACHE"/bin/*
"$PY" -m pip wheel -q --no-deps --no-build-isolation ./python -w "$CACHE/client" || die "building stage_client's wheel failed"
WHEELS+=("$CACHE"/client/stage_client-*.whl)
command -v "$GO" >/dev/null || die "no Go toolchain ($GO): gpu-vllm.sh needs staged and stagectl in the bundle"
"$GO" build -ldflags='-s -w' -o "$CACHE/bin/" ./cmd/staged ./cmd/stagectl || die "go build failed"
gzip -6 "$CACHE/bin/staged" "$CACHE/bin/stagectl" || die "gzip failed"

# --- 4. the check, over the mirror of the GPU machine's Python
VER=$CACHE/verify-site
if [ -x "$MIRROR" ]; then
  rm -rf "$VER"
  "$MIRROR" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
      --target "$VER" "${WHEELS[@]}" || die "pip install --no-index --no-deps of the bundle's wheels failed"
  # the tree's scripts/ only for the driver; stage_client comes from the wheel (GPU_VLLM_WHEEL_CLIENT=1)
  (cd / && PYTHONPATH=$VER GPU_VLLM_WHEEL_CLIENT=1 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 timeout 600 nice "$MIRROR" \
      "$OLDPWD/scripts/gpu_vllm_pair.py" imports) >"$CACHE/verify.log" 2>&1
  rc=$?
  grep -v '^\(INFO\|WARNING\|DEBUG\) ' "$CACHE/verify.log" | tail -n 15 >&2
  [ $rc = 0 ] || die "the bundle does not import over the mirror $MIRROR (rc $rc; $CACHE/verify.log)"
  say "checked: the bundle imports over $MIRROR ($("$MIRROR" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null))"
else
  say "NOT CHECKED: no mirror Python at $MIRROR (set GPU_VLLM_MIRROR_PYTHON; its header says what it holds)"
fi

# --- 5. one tar, parts, manifest, git-ignored carry folders .vw1 .. .vwN
B=$CACHE/bundle; rm -rf "$B" "$CACHE/bundle.tar"; mkdir -p "$B/wheels" "$B/bin"
cp "${WHEELS[@]}" "$B/wheels/" || die "cannot copy the wheels to $B"
cp "$CACHE"/bin/*.gz "$B/bin/" || die "cannot copy the binaries to $B"
cp "$REQ" "$B/requirements.txt"
# shellcheck source=scripts/gpu-bundle.sh
. scripts/gpu-bundle.sh
bundle_pack "$B" "$CACHE" .vw "$PARTS" gpu-vllm-wheels.sh
n=$(find . -maxdepth 1 -name '.vw[0-9]' | wc -l)
say "carry .vw1 .. .vw$n one per call to the same warm 2-GPU machine: \"bash scripts/gpu-vllm.sh stash\", the last with \"bash scripts/gpu-vllm.sh stash && bash scripts/gpu-vllm.sh run\""
