#!/usr/bin/env bash
# Builds .vac/: what python/tests/test_vllm_ascend.py needs on the GPU machine beyond its image, in one
# archive small enough to carry with .dev/ in one device call (64 MiB in all; the image has python3 3.12
# with torch 2.11.0+cu130, transformers 5.17.0, numpy, ... but no vllm and no package index).
#
#   make gpu-vllm-ascend-carry        (or: bash scripts/gpu-vllm-ascend-carry.sh)
#
# .vac/ is ignored: add `/.vac/` to .git/info/exclude once (the device call carries it by name).
# It holds:
#   vac.tar.xz    site/: vllm 0.23.0's Python files and metadata (no compiled kernels: the test calls
#                 none) and every other distribution the test imports that the image lacks, each file
#                 checked against its wheel's RECORD hash; vllm_ascend-0.23.0.post1/: vllm-ascend's
#                 package and egg-info (its entry points make vLLM pick the Ascend platform, as in CI)
#                 bin/staged: the sidecar, built from this checkout
#   MANIFEST.txt  each distribution: version, files kept, bytes kept, bytes left out; the archive's size
# scripts/gpu-vllm-ascend.sh unpacks it into /tmp on the GPU machine and runs the test.
#
# Source: the venv `make test-vllm-ascend` uses (python/requirements/vllm-0.23.txt, pinned; made here if
# missing) and scripts/vllm-ascend-src.sh's checksum-pinned sdist. What to carry was read off a run of the
# test's CPU classes in that venv (the distributions of every module it imported) less those the image
# holds (KINDS.md's list); `scripts/gpu-vllm-ascend.sh --mirror PYTHON` proves the set on a venv that mirrors
# the image (the CPU classes pass from .vac alone).
set -euo pipefail
cd "$(dirname "$0")/.."

venvs=${ENGINES_VENVS:-$HOME/.cache/stage/venvs}
bash scripts/engines-venv.sh "$venvs/vllm-0.23" python/requirements/vllm-0.23.txt >&2
src=$(bash scripts/vllm-ascend-src.sh "$venvs/src")
py="$venvs/vllm-0.23/bin/python"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

stage=$(mktemp -d "${TMPDIR:-/tmp}/vac.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p .vac "$stage/site"

# Distributions the test imports (directly or through vllm / vllm_ascend / transformers) that the GPU
# image does not have, and CI's transformers 4.57.6 with its tokenizers and huggingface_hub: under the
# image's transformers 5.17.0 (which vllm 0.23.0 accepts) the test's MLA cases fail in
# tests/test_vllm_ascend_model.py's prefill hook (seen in a venv mirroring the image: "value tensor of
# shape [150, 480] cannot be broadcast to indexing result of shape [150, 64]"), so the GPU run uses CI's. The image's own are used for
# the rest: torch, numpy, scipy, numba, triton, pillow, grpcio, aiohttp, pyyaml, psutil, ... Protobuf is
# CI's too (7.36.2, small): the generated modules carried (googleapis-common-protos, opentelemetry-proto)
# check the runtime's version on import, and the image's is not known here.
"$py" - "$site" "$stage/site" .vac/MANIFEST.txt <<'EOF'
import base64, hashlib, importlib.metadata as md, os, re, shutil, sys

site, out, manifest = sys.argv[1:]
DISTS = """vllm annotated-types apache-tvm-ffi cachetools cbor2 compressed-tensors cuda-tile dill email-validator
fastapi fastsafetensors gguf googleapis-common-protos httpx2 ijson jsonschema jsonschema-specifications llguidance
loguru mistral_common msgspec openai openai-harmony opentelemetry-api opentelemetry-sdk opentelemetry-proto
opentelemetry-semantic-conventions opentelemetry-semantic-conventions-ai opentelemetry-exporter-otlp
opentelemetry-exporter-otlp-common opentelemetry-exporter-otlp-proto-common opentelemetry-exporter-otlp-proto-grpc
opentelemetry-exporter-otlp-proto-http opentelemetry-exporter-http-transport partial-json-parser pybase64 pycountry
pydantic pydantic_core pydantic-extra-types python-multipart pyzmq referencing rpds-py sniffio starlette
typing-inspection xgrammar
transformers tokenizers huggingface_hub protobuf""".split()
# Left out of every distribution: bytecode, build inputs (headers, C/C++/CUDA sources, static libraries,
# Cython and stub files), console scripts outside the package, and data no import reads (vLLM's compiled
# kernels and its Rust router binary, the web UI's static files, mistral_common's tokenizer vocabularies,
# pycountry's translations).
DROP = re.compile(r"""(^\.\./|__pycache__/|\.(pyc|a|h|hpp|hh|cuh|inl|cu|cc|cpp|c|pxd|pyx|pxi|pyi)$|/include/|/3rdparty/
  |^vllm/.*\.so$|^vllm/vllm-rs$|^vllm/entrypoints/serve/instrumentator/static/|^mistral_common/data/
  |^pycountry/locales/|^tvm_ffi/(src|cmake|share)/)""".replace("\n", "").replace(" ", ""))
rows, total_kept = [], 0
for name in DISTS:
    d = next(iter(md.distributions(name=name, path=[site])), None)
    if d is None:
        sys.exit("gpu-vllm-ascend-carry: %s is not in %s" % (name, site))
    kept = dropped = files = 0
    for f in d.files:
        rel = str(f)
        src = os.path.join(site, rel)
        if DROP.search(rel) or not os.path.isfile(src):
            if os.path.isfile(src):
                dropped += os.path.getsize(src)
            continue
        if f.hash is not None:  # the bytes are the wheel's: RECORD's sha256
            got = base64.urlsafe_b64encode(hashlib.new(f.hash.mode, open(src, "rb").read()).digest()).rstrip(b"=")
            if got.decode() != f.hash.value:
                sys.exit("gpu-vllm-ascend-carry: %s differs from %s's RECORD: reinstall the venv" % (src, name))
        dst = os.path.join(out, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)
        kept += os.path.getsize(src)
        files += 1
    total_kept += kept
    rows.append("%-45s %-14s %6d files %10d bytes kept %11d bytes left out" % (d.metadata["Name"], d.version, files,
                                                                          kept, dropped))
with open(manifest, "w") as m:
    m.write("# .vac/vac.tar.xz site/ (scripts/gpu-vllm-ascend-carry.sh): distribution, version, what was kept\n")
    m.write("\n".join(rows) + "\n")
    m.write("%-45s %-14s %6s       %10d bytes kept\n" % ("total site/", "", "", total_kept))
EOF

# staged, stripped, from this checkout (the test's acl and cuda sidecars; it opens libascendcl by path)
mkdir -p "$stage/bin"
"${GO:-go}" build -ldflags='-s -w' -o "$stage/bin/" ./cmd/staged
echo "bin/staged $(stat -c %s "$stage/bin/staged") bytes (go build -ldflags='-s -w' ./cmd/staged at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- '*.go' go.mod go.sum || echo ', with uncommitted Go changes'))" \
  >> .vac/MANIFEST.txt

# vllm-ascend: its package and egg-info (entry points: the ascend platform plugin), not its kernels' sources
tree="$stage/$(basename "$src")"
mkdir -p "$tree"
tar -C "$src" --exclude=__pycache__ -cf - vllm_ascend vllm_ascend.egg-info .stage-stamp | tar -C "$tree" -xf -
echo "$(basename "$src") $(du -sb "$tree" | cut -f1) bytes (vllm_ascend/ and its egg-info; sdist sha256 $(cat "$src/.stage-stamp"))" \
  >> .vac/MANIFEST.txt

rm -f .vac/vac.tar.xz
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner -cf - site bin "$(basename "$src")" \
  | xz -9 -T0 > .vac/vac.tar.xz.tmp
mv .vac/vac.tar.xz.tmp .vac/vac.tar.xz
echo "vac.tar.xz $(stat -c %s .vac/vac.tar.xz) bytes" >> .vac/MANIFEST.txt
cat .vac/MANIFEST.txt
echo "gpu-vllm-ascend-carry: .vac/ is $(du -sh .vac | cut -f1) (the device call carries .vac alone: 64 MiB in all)"
