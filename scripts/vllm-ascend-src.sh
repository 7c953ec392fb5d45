#!/usr/bin/env bash
# Fetches vllm-ascend's source (the PyPI sdist, checksum-pinned) and unpacks it, for
# python/tests/test_vllm_ascend.py: its vllm_ascend/ package goes on that test's sys.path.
# The sdist is not installed: its setup.py builds CANN kernels, which need an Ascend toolchain.
#
#   scripts/vllm-ascend-src.sh DIR
#
# Leaves DIR/vllm_ascend-0.23.0.post1/ (vllm_ascend/ inside) and prints that path. Idempotent: an
# unpacked tree whose stamp names the pinned checksum is kept.
set -euo pipefail

dir=${1:?usage: scripts/vllm-ascend-src.sh DIR}
version=0.23.0.post1
sha256=a3b9f4a5dd7aa50c37e03d1f35937c4ae5aeacc49b734cac74d59ce5757738e1
url=https://files.pythonhosted.org/packages/ab/7a/32a1b1f13467fb7372588206fa1ffb735f28dcd8504d562f5c7ccdbd90d0/vllm_ascend-$version.tar.gz
tree="$dir/vllm_ascend-$version"

if [ -f "$tree/.stage-stamp" ] && [ "$(cat "$tree/.stage-stamp")" = "$sha256" ] && [ -d "$tree/vllm_ascend" ]; then
  echo "$tree"; exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "vllm-ascend-src: fetching vllm-ascend $version (sdist, 15 MB) from PyPI" >&2
curl -sSfL --retry 3 -o "$tmp/sdist.tar.gz" "$url" || { echo "vllm-ascend-src: download of $url failed" >&2; exit 1; }
got=$(sha256sum "$tmp/sdist.tar.gz" | cut -d' ' -f1)
if [ "$got" != "$sha256" ]; then
  echo "vllm-ascend-src: $url has sha256 $got, pinned $sha256: refusing it" >&2; exit 1
fi
tar -xzf "$tmp/sdist.tar.gz" -C "$tmp"
[ -d "$tmp/vllm_ascend-$version/vllm_ascend" ] || { echo "vllm-ascend-src: the sdist has no vllm_ascend/ package" >&2; exit 1; }
rm -rf "$tree"
mv "$tmp/vllm_ascend-$version" "$tree"
echo "$sha256" > "$tree/.stage-stamp"
echo "$tree"
