#!/usr/bin/env bash
# What scripts/gpu-peers.sh needs on the GPU machine (which has no network and
# no Go), made here: the peers' wheels for Python 3.12, manylinux x86_64, and
# stage's two binaries, in one tar cut into three parts of under 60 MiB, one
# carry folder each (.pw1 .pw2 .pw3; a device call carries 64 MiB in all,
# the working tree included).
#
#   bash scripts/gpu-peers-wheels.sh      # here, in the repository root
#
# Wheels (pip download, no deps; their Requires-Dist is printed and written to
# the manifest: nixl-cu13 wants torch and numpy, which the GPU machine has;
# Mooncake's aiohttp, requests and msgpack are not imported by mooncake.engine):
#   nixl==1.5.1 (the meta package: `import nixl` picks nixl_cu13 for torch's CUDA 13)
#   nixl-cu13==1.5.1 (58.8 MB)
#   mooncake-transfer-engine==0.3.13.post1 (the CUDA build, 97.9 MB; needs libcudart.so.12)
#   nvidia-cuda-runtime-cu12==12.9.79 (libcudart.so.12; torch cu130 brings only .so.13)
# Binaries: staged and stagectl built from this tree as `make gpu-build` does
# (-ldflags='-s -w'), gzipped; gpu-peers.sh prefers .dev/ where it is there.
#
# Env: GPU_PEERS_CACHE (default ~/.cache/stage/gpu-peers), GO (default go),
# GPU_PEERS_PARTS (default 3).
set -u
cd "$(dirname "$0")/.." || exit 1
CACHE=${GPU_PEERS_CACHE:-$HOME/.cache/stage/gpu-peers}
PARTS=${GPU_PEERS_PARTS:-3}
case $PARTS in [1-9]) ;; *) echo "gpu-peers-wheels: GPU_PEERS_PARTS must be 1 to 9" >&2; exit 1 ;; esac
GO=${GO:-go}
PINS="nixl==1.5.1 nixl-cu13==1.5.1 mooncake-transfer-engine==0.3.13.post1 nvidia-cuda-runtime-cu12==12.9.79"
# The files those pins save as (pip's wheel names).
GLOBS="nixl-1.5.1-py3-none-any.whl nixl_cu13-1.5.1-cp312-*.whl mooncake_transfer_engine-0.3.13.post1-cp312-*.whl nvidia_cuda_runtime_cu12-12.9.79-*.whl"
die() { echo "gpu-peers-wheels: $*" >&2; exit 1; }
say() { echo "gpu-peers-wheels: $*" >&2; }

mkdir -p "$CACHE/wheels" "$CACHE/bin" || die "cannot make $CACHE"

# --- 1. wheels (pip skips those already saved)
say "pip download $PINS"
# shellcheck disable=SC2086 # PINS is a list
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$CACHE/wheels" $PINS \
  || die "pip download failed; is PyPI reachable?"
WHEELS=()
for g in $GLOBS; do
  # shellcheck disable=SC2206 # the glob is meant to expand
  m=("$CACHE"/wheels/$g)
  [ -f "${m[0]}" ] || die "no wheel $g in $CACHE/wheels after pip download"
  [ ${#m[@]} = 1 ] || die "several wheels match $g in $CACHE/wheels: ${m[*]}"
  WHEELS+=("${m[0]}")
done
NOTES=$CACHE/requires.txt; : >"$NOTES"
for w in "${WHEELS[@]}"; do
  echo "$(basename "$w"): $(unzip -p "$w" '*.dist-info/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' |
    sed 's/^Requires-Dist: //' | paste -sd, -)" >>"$NOTES"
done
say "Requires-Dist (extras left out):"; sed 's/^/  /' "$NOTES" >&2

# --- 2. stage's binaries, as `make gpu-build` builds them
rm -f "$CACHE"/bin/*
if command -v "$GO" >/dev/null; then
  say "go build staged stagectl"
  "$GO" build -ldflags='-s -w' -o "$CACHE/bin/" ./cmd/staged ./cmd/stagectl || die "go build failed"
  gzip -6 "$CACHE/bin/staged" "$CACHE/bin/stagectl" || die "gzip failed"
else
  say "no Go toolchain: the bundle carries no stage binaries (gpu-peers.sh then needs .dev/ from make gpu-build)"
fi

# --- 3. one tar, cut into PARTS equal parts, one carry folder each (.pwK), a
# manifest, the folders git-ignored, and what each call will carry (gpu-bundle.sh)
B=$CACHE/bundle; rm -rf "$B" "$CACHE/bundle.tar"; mkdir -p "$B/wheels" "$B/bin"
cp "${WHEELS[@]}" "$B/wheels/" || die "cannot copy the wheels to $B"
for f in "$CACHE"/bin/*.gz; do [ -f "$f" ] && cp "$f" "$B/bin/"; done
cp "$NOTES" "$B/requires.txt"
# shellcheck source=scripts/gpu-bundle.sh
. scripts/gpu-bundle.sh
bundle_pack "$B" "$CACHE" .pw "$PARTS" gpu-peers-wheels.sh
say "carry .pw1, .pw2, ... one per call to the same warm machine, each with \"bash scripts/gpu-peers.sh --stash\"; the last one with \"bash scripts/gpu-peers.sh\""
