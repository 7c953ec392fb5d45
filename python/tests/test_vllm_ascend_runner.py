"""vllm-ascend 0.23.0.post1's own model runner making KV caches on the emulated Ascend runtime (no tests here).

:func:`load` puts our torch_npu stand-in (tests/npu_standin) and vllm-ascend's
source (``STAGE_VLLM_ASCEND_SRC``: the sdist scripts/vllm-ascend-src.sh
unpacks) on ``sys.path`` and imports ``vllm_ascend.worker.model_runner_v1``
the way vllm-ascend's worker does (``vllm_ascend.ops`` first, worker.py:64).
:func:`make_caches` builds one rank's ``NPUModelRunner`` without its
``__init__`` (which needs a whole engine: model, device, distributed
groups), sets the attributes ``initialize_kv_cache_tensors`` and what it
calls read, and runs it: ``_allocate_kv_cache_tensors`` (int8 buffers,
K and V apart, each 2 MiB-aligned inside 2 MiB of slack because a KV
transfer is configured), ``_reshape_kv_cache_tensors`` (the views the
attention backend indexes) and vLLM's ``bind_kv_cache``. The memory comes
from the torch_npu stand-in in the allocator mode asked for.

Fixtures stand where vllm-ascend cannot run here, each with its source:

* ``vllm_ascend._build_info``: written by setup.py's gen_build_info
  (setup.py:189-192) when it builds the CANN kernels; ``A2`` is what it
  writes for SOC ``ascend910b1`` (setup.py:156-160);
* the layer objects of ``static_forward_context`` are vLLM's own
  ``Attention`` / ``MLAAttention`` classes made without their ``__init__``
  (which builds kernels); the runner reads ``kv_lora_rank`` and
  ``qk_rope_head_dim`` of an MLA layer (model_runner_v1.py:3987-3989),
  given here as DeepSeek-V3's (512, 64: its config.json);
* the KV cache config is vLLM's own ``get_kv_cache_config_from_groups``
  (v1/core/kv_cache_utils.py:1247) over the specs vLLM's attention
  layers would give (``FullAttentionSpec``; vllm-ascend's
  ``AscendMLAAttentionSpec`` with head size 576 = 512 + 64, one kv head),
  with memory for exactly the blocks asked for.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "npu_standin")
SRC = os.environ.get("STAGE_VLLM_ASCEND_SRC", "")
VERSION = "0.23.0.post1"
KV_LORA_RANK, QK_ROPE_HEAD_DIM = 512, 64  # DeepSeek-V3's config.json; the widths model_runner_v1.py:4607-4627 reads

_mods: Dict[str, Any] = {}


def load() -> str:
    """Import vllm-ascend's model runner over the stand-in: "" when done, else why it cannot be."""
    if _mods:
        return ""
    if not SRC or not os.path.isdir(os.path.join(SRC, "vllm_ascend")):
        return ("STAGE_VLLM_ASCEND_SRC (%r) is not vllm-ascend %s's unpacked source: run "
                "scripts/vllm-ascend-src.sh DIR and point it at what it prints" % (SRC, VERSION))
    if not os.environ.get("STAGE_TEST_ACL_LIBRARY"):
        return "STAGE_TEST_ACL_LIBRARY is not set: build acl/testdata/fakeacl.c as a shared library"
    try:
        import torch  # noqa: F401
        import vllm
    except ImportError as e:
        return "torch and vllm are not importable here (%s): use the venv of python/requirements/vllm-0.23.txt" % e
    if vllm.__version__ != "0.23.0":
        return "vllm %s is installed; vllm-ascend %s pairs with vllm 0.23.0" % (vllm.__version__, VERSION)
    for p in (SRC, STANDIN):
        if p not in sys.path:
            sys.path.insert(0, p)
    import torch_npu

    if not os.path.abspath(torch_npu.__file__).startswith(STANDIN):
        return "a torch_npu other than the stand-in was imported (%s)" % torch_npu.__file__
    build_info = types.ModuleType("vllm_ascend._build_info")
    build_info.__device_type__ = "A2"  # setup.py:189-192 for SOC ascend910b1 (setup.py:156-160)
    sys.modules[build_info.__name__] = build_info
    import vllm_ascend

    got = os.path.abspath(os.path.dirname(vllm_ascend.__file__))
    if got != os.path.abspath(os.path.join(SRC, "vllm_ascend")):
        return "vllm_ascend came from %s, not from %s" % (got, SRC)
    import vllm_ascend.ops.triton.triton_utils  # noqa: F401  (worker.py:64 imports it before the runner)
    from vllm.config import KVTransferConfig
    from vllm.model_executor.layers.attention import Attention, MLAAttention
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec
    from vllm.v1.worker.utils import AttentionGroup
    from vllm_ascend.attention.attention_v1 import AscendAttentionBackend
    from vllm_ascend.attention.mla_v1 import AscendMLABackend
    from vllm_ascend.core.kv_cache_interface import AscendMLAAttentionSpec
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

    _mods.update(locals())
    return ""


def layer_name(i: int) -> str:
    """vLLM's name of layer ``i``'s attention (the connector sorts layers by the index in it)."""
    return "model.layers.%d.self_attn.attn" % i


def _layer(cls: Any, **attrs: Any) -> Any:
    """An instance of vLLM's layer class ``cls`` without its __init__ (kernels), with ``attrs``."""
    import torch

    obj = cls.__new__(cls)
    torch.nn.Module.__init__(obj)
    for k, v in attrs.items():
        setattr(obj, k, v)
    return obj


def make_caches(kind: str, layers: int, num_blocks: int, block_size: int, kv_heads: int, head_size: int,
                dtype: Any, kv_role: str = "kv_producer") -> Tuple[Dict[str, Any], Any]:
    """One rank's KV caches as vllm-ascend's runner makes them: ({layer name: (K, V)}, the runner).

    ``kind``: "mha" (or "gqa": the same spec, fewer kv heads) or "mla"
    (one latent head; K is the 512-wide latent, V the 64-wide rope part).
    ``kv_heads``: this rank's. The memory comes from the torch_npu
    stand-in's current allocator (``torch_npu.standin.reset``).
    """
    import torch
    import torch_npu

    m = _mods
    names = [layer_name(i) for i in range(layers)]
    if kind == "mla":
        spec = m["AscendMLAAttentionSpec"](block_size=block_size, num_kv_heads=1,
                                           head_size=KV_LORA_RANK + QK_ROPE_HEAD_DIM, dtype=dtype)
        backend = m["AscendMLABackend"]
        ctx = {n: _layer(m["MLAAttention"], kv_lora_rank=KV_LORA_RANK, qk_rope_head_dim=QK_ROPE_HEAD_DIM)
               for n in names}
        model_type = "deepseek_v3"
    else:
        spec = m["FullAttentionSpec"](block_size=block_size, num_kv_heads=kv_heads, head_size=head_size, dtype=dtype)
        backend = m["AscendAttentionBackend"]
        ctx = {n: _layer(m["Attention"]) for n in names}
        model_type = "llama"
    groups = [m["KVCacheGroupSpec"](names, spec)]
    vcfg = types.SimpleNamespace(
        kv_transfer_config=m["KVTransferConfig"](kv_connector="StageConnector", kv_role=kv_role),
        quant_config=None,
        cache_config=types.SimpleNamespace(num_gpu_blocks_override=None),  # read by may_override_num_blocks
        compilation_config=types.SimpleNamespace(static_forward_context=ctx),
    )
    kv_cfg = m["get_kv_cache_config_from_groups"](vcfg, groups, spec.page_size_bytes * num_blocks * layers)
    if kv_cfg.num_blocks != num_blocks:
        raise AssertionError("vLLM gave %d blocks for memory of %d" % (kv_cfg.num_blocks, num_blocks))
    r = m["NPUModelRunner"].__new__(m["NPUModelRunner"])
    # What initialize_kv_cache_tensors and the calls under it read (model_runner_v1.py:3917-4720), no more.
    r.vllm_config = vcfg
    r.compilation_config = vcfg.compilation_config
    r.model_config = types.SimpleNamespace(hf_text_config=types.SimpleNamespace(model_type=model_type))
    r.device = torch.device("npu:0")
    r.kv_cache_config = kv_cfg
    r.attn_groups = [[m["AttentionGroup"](backend, names, spec, 0)]]
    r.kv_caches = []
    r.shared_kv_cache_layers = {}
    r.runner_only_attn_layers = set()
    r.use_compress = r.use_sparse = r.use_hybrid_blocks = r.enable_hamming_sparse = False
    with torch_npu.standin.allocating():
        caches = r.initialize_kv_cache_tensors(kv_cfg)
    return caches, r
