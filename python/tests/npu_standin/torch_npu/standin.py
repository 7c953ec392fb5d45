"""The stand-in's device, tensors and factories (see the package doc)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import types
from typing import Any, Dict, Iterator, List, Optional

import torch
from torch.overrides import TorchFunctionMode

from . import _acl

__all__ = ["NPUTensor", "allocating", "runtime", "reset", "new_process", "close", "wrap", "over_cuda", "real_device",
           "pools"]

if torch._C._get_privateuse1_backend_name() != "npu":
    torch.utils.rename_privateuse1_backend("npu")


class NPUTensor(torch.Tensor):
    """A CPU tensor over emulated NPU memory that says it is on ``npu:<device>``."""

    npu_index = 0

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("npu", type(self).npu_index)

    @property
    def is_npu(self) -> bool:
        return True


_state: Dict[str, Any] = {"rt": None, "alloc": None, "pools": []}


def runtime() -> "_acl.ACLRuntime":
    """The emulated runtime (libascendcl from STAGE_TEST_ACL_LIBRARY), opened on first use."""
    if _state["rt"] is None:
        path = os.environ.get("STAGE_TEST_ACL_LIBRARY", "")
        if not path:
            raise RuntimeError("torch_npu stand-in: STAGE_TEST_ACL_LIBRARY is not set (build acl/testdata/fakeacl.c "
                               "as a shared library and point it there)")
        _state["rt"] = _acl.ACLRuntime(path, 0 if _state.get("cuda") is None else int(_state["cuda"].index))
    return _state["rt"]


def reset(conf: Optional[str] = None) -> "_acl.Allocator":
    """Free what every allocator holds and start one for ``conf`` (default: PYTORCH_NPU_ALLOC_CONF)."""
    close()
    return new_process(conf)


def new_process(conf: Optional[str] = None) -> "_acl.Allocator":
    """Start another allocator and allocate from it from now on, keeping the others' memory: what another
    engine process (a tensor-parallel rank) would have, whose segments no other rank's tensors share."""
    a = _acl.allocator(runtime(), conf if conf is not None else os.environ.get("PYTORCH_NPU_ALLOC_CONF"))
    _state["pools"].append(a)
    _state["alloc"] = a
    return a


def pools() -> List["_acl.Allocator"]:
    """The allocators started since the last :func:`reset` / :func:`close`, oldest first."""
    return list(_state["pools"])


def close() -> None:
    """Free every allocation (the sidecar must have let go of it)."""
    pools, _state["pools"], _state["alloc"] = _state["pools"], [], None
    errs = []
    for a in reversed(pools):
        try:
            a.close()
        except _acl.ACLCallError as e:
            errs.append(e)
    if errs:
        raise errs[0]


def over_cuda(gpu: int) -> None:
    """The runtime is fakeacl_cuda (its device memory is CUDA memory of GPU ``gpu``): tensors are CUDA tensors
    over it, and events are CUDA events. Call before the first allocation."""
    _state["cuda"] = torch.device("cuda", gpu)


class _Span:
    """A CUDA array interface over ``n`` bytes at ``ptr`` (what torch.as_tensor wraps)."""

    def __init__(self, ptr: int, n: int) -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None}


def wrap(ptr: int, nbytes: int, dtype: Any, shape: Any) -> NPUTensor:
    """A tensor of ``shape`` and ``dtype`` over ``nbytes`` of device memory at ``ptr``."""
    if not nbytes:
        t = torch.empty(0, dtype=torch.uint8)
    elif _state.get("cuda") is not None:
        t = torch.as_tensor(_Span(ptr, nbytes), device=_state["cuda"])
    else:
        t = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), dtype=torch.uint8)
    return t.view(dtype).view(tuple(shape)).as_subclass(NPUTensor)


def real_device(t: Any) -> torch.device:
    """Where an NPUTensor's bytes are for torch (cpu, or cuda over fakeacl_cuda), not the npu it reports."""
    return torch._C.TensorBase.device.__get__(t)


def _npu(device: Any) -> bool:
    if device is None:
        return False
    d = torch.device(device) if not isinstance(device, torch.device) else device
    return d.type == "npu"


class _Factories(TorchFunctionMode):
    """torch.zeros / torch.empty on an npu device, from the stand-in's allocator."""

    def __torch_function__(self, func: Any, types_: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in (torch.zeros, torch.empty) and _npu(kwargs.get("device")):
            shape = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
            shape = tuple(int(x) for x in shape)
            dtype = kwargs.get("dtype") or torch.get_default_dtype()
            n = 1
            for x in shape:
                n *= x
            nbytes = n * torch.empty((), dtype=dtype).element_size()
            a = _state["alloc"] or reset()
            t = wrap(a.malloc(nbytes), nbytes, dtype, shape)
            if func is torch.zeros:
                with torch._C.DisableTorchFunctionSubclass():
                    t.zero_()
            return t
        return func(*args, **kwargs)


@contextlib.contextmanager
def allocating() -> Iterator[None]:
    """While on, npu factories on this thread allocate from the emulated runtime."""
    with _Factories():
        yield


# ---- torch.npu: the named stubs vllm-ascend's imports touch ----

npu = types.ModuleType("torch_npu.npu")
sys.modules["torch_npu.npu"] = npu


def is_available() -> bool:
    """False: no NPU is here, and libraries that ask (transformers) must not take their NPU kernels."""
    return False


npu.is_available = is_available
# torch.manual_seed seeds every registered device module: nothing to seed here
npu._is_in_bad_fork = lambda: False
npu.manual_seed_all = lambda seed: None


def _absent(qualname: str, kind: str = "class") -> Any:
    """A named stand-in for a torch_npu class or function that importing vllm-ascend names but the KV path never
    calls: using it raises, saying so."""

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("torch_npu stand-in: %s is not emulated (only vllm-ascend's KV cache allocation is)"
                           % qualname)

    if kind == "class":
        return type(qualname.rsplit(".", 1)[-1], (), {"__init__": refuse, "__module__": "torch_npu.npu"})
    refuse.__name__ = refuse.__qualname__ = qualname.rsplit(".", 1)[-1]
    return refuse


# What importing vllm_ascend.worker.model_runner_v1 (after vllm_ascend.ops, as worker.py imports them)
# reads at module level, one line each, with where in vllm-ascend 0.23.0.post1; the KV path calls none.
npu.NPUGraph = _absent("torch.npu.NPUGraph")  # compilation/acl_graph.py:57, an annotation
npu.ExternalEvent = _absent("torch.npu.ExternalEvent")  # compilation/acl_graph.py:294, an annotation
npu.Stream = _absent("torch.npu.Stream")  # ops/fused_moe/prepare_finalize.py:52, an annotation
npu.Event = None  # ops/fused_moe/fused_moe.py:73, an annotation; the class below
# patch/platform/patch_torch_accelerator.py:14-16 puts these in torch.accelerator's place
npu.memory_stats = _absent("torch.npu.memory_stats", "fn")
npu.memory_reserved = _absent("torch.npu.memory_reserved", "fn")
npu.reset_peak_memory_stats = _absent("torch.npu.reset_peak_memory_stats", "fn")
# worker/model_runner_v1.py:201 sets torch.npu.config.allow_internal_format = True
npu.config = types.SimpleNamespace(allow_internal_format=False)



class Event:
    """torch.npu.Event for the stage connector's save_kv_layer (stage_client/vllm/npu.py): the stand-in's device
    work is torch on CPU tensors, done when the call returns, so an event recorded after it is complete at once.
    Records and waits are counted, for the test to see the connector order its pushes by them."""

    recorded = 0
    waited = 0

    def __init__(self, *_a: Any, **_k: Any) -> None:
        self.is_recorded = False
        self.cuda = None  # over fakeacl_cuda the device work is on CUDA's current stream: a CUDA event orders it

    def record(self, stream: Any = None) -> None:
        self.is_recorded = True
        Event.recorded += 1
        if _state.get("cuda") is not None:
            self.cuda = torch.cuda.Event()
            self.cuda.record()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        if not self.is_recorded:
            raise RuntimeError("torch_npu stand-in: synchronize on an event never recorded")
        Event.waited += 1
        if self.cuda is not None:
            self.cuda.synchronize()


def set_device(device: Any) -> None:
    """torch.npu.set_device (the connector's mover thread binds to the cache's NPU): the one emulated NPU."""
    idx = device.index if isinstance(device, torch.device) else int(device)
    if idx not in (None, 0):
        raise RuntimeError("torch_npu stand-in: NPU %s does not exist (one NPU: 0)" % idx)


npu.Event = Event
npu.set_device = set_device

_C = types.ModuleType("torch_npu._C")
sys.modules[_C.__name__] = _C
_C._NPUTaskGroupHandle = _absent("torch_npu._C._NPUTaskGroupHandle")  # compilation/acl_graph.py:296, an annotation
if not hasattr(torch, "npu"):
    torch._register_device_module("npu", npu)
