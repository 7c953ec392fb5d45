"""What the connector does differently when vllm-ascend runs it (NPU caches), read from vllm-ascend 0.23's source.

* **Registration.** vllm-ascend's caches are torch_npu tensors; the worker
  registers them with an ``acl`` sidecar through one
  :class:`stage_client.ascend.ACL` per worker (:func:`open_acl`: the
  library from ``acl_library``, the tensors' NPU), closed at shutdown.
* **NZ.** Some settings keep a cache's ND shape and strides while its
  kernels read the bytes in the FRACTAL_NZ order, so no shape check can see
  it: ``additional_config["enable_kv_nz"]`` (DeepSeek MLA decode,
  ascend_config.py:269-278) and the C8 int8 KV cache of a ModelSlim
  checkpoint (``kv_cache_type: C8``: its attention reads an NZ view,
  attention_v1.py ``_nz_5d_view``); on 310P the cache is allocated
  FRACTAL_NZ (``torch_npu.empty_with_format``). :func:`nz_refusal` asks the
  config, :func:`format_refusal` asks torch_npu of each tensor where it is
  importable. Rows stage would move from such a cache are not rows.
* **Ordering.** A layer-wise push must not read the rows before the NPU
  wrote them: :func:`layer_event` takes vllm-ascend's
  ``attn_metadata[layer].reshape_cache_event`` where the attention backend
  recorded one (sfa_v1), else records a ``torch.npu.Event`` on the current
  stream; the connector's mover thread, bound to the cache's NPU
  (:class:`NPUWait`), waits for it (``synchronize``) before it submits the
  push, as vllm-ascend's own layer-wise connector
  does (mooncake_layerwise_connector.py:1704-1720).
* **The cache name.** vllm-ascend rewrites ``kv_transfer_config.engine_id``
  to ``<engine_id>-<uuid>`` at every start (platform.py:483-487), so a
  ``kv_name`` defaulted from it changes with every restart
  (:func:`under_vllm_ascend`; config.py warns).
"""

from __future__ import annotations

import importlib.util
import threading
from typing import Any, List, Optional, Sequence

from ..errors import StageError

__all__ = ["ACL_FORMAT_ND", "NPUWait", "flat", "format_refusal", "layer_event", "npu_event", "nz_refusal", "open_acl",
           "under_vllm_ascend"]

#: CANN's aclFormat values torch_npu.get_npu_format answers (vllm_ascend/utils.py names ND and FRACTAL_NZ)
ACL_FORMAT_ND = 2
_FORMATS = {0: "NCHW", 1: "NHWC", 2: "ND", 3: "NC1HWC0", 4: "FRACTAL_Z", 29: "FRACTAL_NZ"}


def under_vllm_ascend(vllm_config: Any) -> bool:
    """True when vllm-ascend runs this engine: it patched the engine id, or it is installed."""
    ktc = getattr(vllm_config, "kv_transfer_config", None)
    if getattr(ktc, "_engine_id_patched", False):
        return True
    try:
        return importlib.util.find_spec("vllm_ascend") is not None
    except (ImportError, ValueError):
        return False


def flat(tensors: Sequence[Any]) -> List[Any]:
    """Every tensor of a list of layers (each one tensor, or a tuple or list of them)."""
    return [x for t in tensors for x in (t if isinstance(t, (list, tuple)) else [t])]


def nz_refusal(vllm_config: Any) -> Optional[str]:
    """Why vllm-ascend's settings make the cache's bytes NZ under ND shapes (the setting to change), or None."""
    add = getattr(vllm_config, "additional_config", None) or {}
    if isinstance(add, dict) and add.get("enable_kv_nz"):
        return ("additional_config enable_kv_nz is on: vllm-ascend keeps the MLA cache's ND shape but its kernels "
                "read and write it in the FRACTAL_NZ order, so its rows are not token rows stage can move or convert. "
                "Remove enable_kv_nz from --additional-config")
    qc = getattr(vllm_config, "quant_config", None)
    desc = getattr(qc, "quant_description", None)
    c8 = bool(getattr(qc, "enable_c8_quant", False))
    if isinstance(desc, dict) and desc.get("kv_cache_type") == "C8":
        c8 = True
    if c8:
        return ("the checkpoint's quantization has kv_cache_type C8: vllm-ascend keeps an int8 KV cache in ND shape "
                "that its attention reads in the FRACTAL_NZ order, with per-channel scales stage does not move. "
                "Serve a checkpoint without the C8 KV cache (kv_cache_type in quant_model_description.json)")
    return None


def _npu_format(t: Any) -> Optional[int]:
    try:
        import torch_npu  # type: ignore
    except ImportError:
        return None
    get = getattr(torch_npu, "get_npu_format", None)
    return None if get is None else int(get(t))


def format_refusal(tensors: Sequence[Any]) -> Optional[str]:
    """Why a tensor's NPU storage format is not ND (where torch_npu tells), or None."""
    for t in flat(tensors):
        if getattr(getattr(t, "device", None), "type", None) != "npu":
            continue
        fmt = _npu_format(t)
        if fmt is not None and fmt != ACL_FORMAT_ND:
            return ("a KV cache tensor of shape %s is stored %s (torch_npu.get_npu_format %d), not ND: its bytes are "
                    "not in the order its shape says (vllm-ascend allocates the cache FRACTAL_NZ on 310P). stage moves "
                    "ND caches only; run the prefill on an Atlas A2/A3 (910B/910C) NPU"
                    % (tuple(t.shape), _FORMATS.get(fmt, "format %d" % fmt), fmt))
    return None


def open_acl(path: str, tensors: Sequence[Any]) -> Any:
    """One :class:`stage_client.ascend.ACL` for the NPU the tensors live on (all on one NPU)."""
    from .. import ascend

    idx = {getattr(t.device, "index", None) for t in flat(tensors)}
    if len(idx) != 1:
        raise ValueError("stage connector: the KV cache spans NPUs %s; a worker's cache lives on one NPU"
                         % sorted(idx, key=str))
    dev = idx.pop()
    try:
        return ascend.ACL(path or "libascendcl.so", 0 if dev is None else int(dev))
    except StageError as e:
        raise StageError(e.code, "stage connector: the NPU KV cache needs the Ascend runtime to export it: %s "
                         "(acl_library in kv_connector_extra_config names the library)" % e.message) from e


def layer_event(attn_metadata: Any, layer: str) -> Any:
    """vllm-ascend's ``reshape_cache_event`` for ``layer`` (metadata by layer name, or one for all), or None."""
    m = attn_metadata.get(layer) if isinstance(attn_metadata, dict) else attn_metadata
    return getattr(m, "reshape_cache_event", None)


_bound = threading.local()  # the NPU a thread of ours was bound to


class NPUWait:
    """``event`` (a torch.npu.Event) to wait for on another thread, that thread bound to ``device`` first.

    torch_npu, like CANN, keeps the current device per thread: the mover's
    threads set it once (``torch.npu.set_device``) before their first
    ``synchronize``, as vllm-ascend's own sending thread does."""

    def __init__(self, event: Any, device: int) -> None:
        self.event, self.device = event, device

    def synchronize(self) -> None:
        if getattr(_bound, "device", None) != self.device:
            import torch

            torch.npu.set_device(self.device)
            _bound.device = self.device
        self.event.synchronize()


def npu_event() -> Any:
    """A ``torch.npu.Event`` recorded on the current NPU stream; None where torch has no NPU."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None
    npu = getattr(torch, "npu", None)
    if npu is None:
        return None
    ev = npu.Event()
    ev.record()
    return ev
