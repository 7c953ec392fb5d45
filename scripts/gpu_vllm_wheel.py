"""Make vLLM's CUDA wheel small enough to carry to the GPU machine (issue 34 item 1).

``vllm==0.26.0`` is a 303.7 MB wheel; a device call carries 64 MiB. Most of
it is kernels an H100 / H200 serving a bf16 Llama- or Qwen-shaped model never
loads. This copies the wheel without:

* ``vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so`` (FlashAttention 2, 130 MB
  compressed): on sm_90 vLLM picks FlashAttention 3 (``_vllm_fa3_C``, kept);
  ``flash_attn_interface`` imports FA2 under try/except and reports it
  unavailable;
* ``vllm/_moe_C_stable_libtorch.abi3.so`` (the fused-MoE kernels, 41 MB
  compressed; a dense model calls none) and ``vllm/_qutlass_C.abi3.so``
  (quantized GEMMs): ``CudaPlatform.import_kernels`` imports both under
  ``contextlib.suppress(ImportError)``;
* ``vllm/vllm-rs`` (the optional Rust frontend, used only with
  ``VLLM_RUST_FRONTEND_PATH``);
* the C++/CUDA headers under ``vllm/third_party`` (DeepGEMM's and the sm_100
  FMHA's JIT includes: FP8 and Blackwell paths) and DeepGEMM's ``_C`` for
  Pythons other than 3.12.

Python files are all kept. ``RECORD`` loses the dropped files' lines, so
pip installs the result as the same distribution. Members are deleted in
place with Info-ZIP's ``zip -d`` (nothing is recompressed).

    python3 scripts/gpu_vllm_wheel.py IN.whl OUT.whl
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Iterable, List

_PY312 = re.compile(r"cpython-312-")
_DROP = frozenset(("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm-rs", "vllm/_moe_C_stable_libtorch.abi3.so",
                   "vllm/_qutlass_C.abi3.so"))


def dropped(name: str) -> bool:
    """True for a wheel member the GPU run does not need (module docstring)."""
    if name in _DROP:
        return True
    if not name.startswith("vllm/third_party/") or name.endswith(".py"):
        return False
    base = name.rsplit("/", 1)[-1]
    if base.startswith("_C.cpython-"):
        return not _PY312.search(base)
    if "/include/" in name or name.startswith("vllm/third_party/fmha_sm100/"):
        return not base.endswith(".so")
    return False


def record_without(record: str, gone: Iterable[str]) -> str:
    """RECORD's text less the lines of the files in ``gone``."""
    drop = set(gone)
    keep = [ln for ln in record.splitlines() if ln and ln.split(",", 1)[0] not in drop]
    return "\n".join(keep) + "\n"


def strip(src: str, dst: str) -> List[str]:
    """Write ``dst``: ``src`` without the dropped members; returns their names."""
    with zipfile.ZipFile(src) as z:
        names = z.namelist()
        records = [n for n in names if n.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise SystemExit("%s: want one .dist-info/RECORD, found %d" % (src, len(records)))
        record = z.read(records[0]).decode()
    gone = [n for n in names if dropped(n)]
    if not gone:
        raise SystemExit("%s: nothing to drop: is this vLLM's CUDA wheel?" % src)
    shutil.copyfile(src, dst + ".tmp")
    with tempfile.TemporaryDirectory() as tmp:
        lst = os.path.join(tmp, "names")
        with open(lst, "w") as f:
            f.write("\n".join(gone + [records[0]]) + "\n")
        with open(lst) as f:
            subprocess.run(["zip", "-q", "-d", dst + ".tmp", "-@"], stdin=f, check=True)
        os.makedirs(os.path.join(tmp, os.path.dirname(records[0])))
        with open(os.path.join(tmp, records[0]), "w") as f:
            f.write(record_without(record, gone))
        subprocess.run(["zip", "-q", "-X", os.path.abspath(dst + ".tmp"), records[0]], cwd=tmp, check=True)
    with zipfile.ZipFile(dst + ".tmp") as z:
        bad = z.testzip()
        if bad is not None:
            raise SystemExit("%s: member %s is damaged after zip -d" % (dst, bad))
    os.replace(dst + ".tmp", dst)
    return gone


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    out = strip(sys.argv[1], sys.argv[2])
    print("gpu_vllm_wheel: dropped %d members; %d -> %d bytes" % (len(out), os.path.getsize(sys.argv[1]),
                                                                os.path.getsize(sys.argv[2])))
