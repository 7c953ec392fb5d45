"""NPU memory as torch tensors, over fakeacl_cuda, for the GPU tests.

``acl/testdata/fakeacl_cuda.c`` emulates libascendcl over the CUDA runtime:
its ``aclrtMalloc`` is ``cudaMalloc`` in this process's primary context, the
one torch uses. :class:`ACLArena` takes one such allocation and hands out
torch CUDA tensors over it (``__cuda_array_interface__``), so an "Ascend"
engine's KV cache can be written by torch and registered with an ``acl``
sidecar by export key (``register_kv_cache(..., acl=...)``), as
vllm-ascend's would be on an NPU. On a real NPU the tensors would come from
torch_npu; nothing here runs there.

Build the library on the GPU machine and point the tests at it::

    nvcc -shared -Xcompiler -fPIC -o libascendcl.so acl/testdata/fakeacl_cuda.c -lpthread
    STAGE_TEST_ACL_LIBRARY=$PWD/libascendcl.so ...

(the variable the Go acl tests read too; the acl sidecars get the path as
``device.acl.library`` from :func:`sidecar_config`).
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import torch

from stage_client.ascend import ACL

LIBRARY = os.environ.get("STAGE_TEST_ACL_LIBRARY", "")


class _Span:
    """A CUDA array interface over ``n`` bytes at ``ptr`` (what torch.as_tensor wraps)."""

    def __init__(self, ptr: int, n: int) -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None}


class ACLArena:
    """One ``aclrtMalloc`` allocation handing out torch tensors (bump allocation, nothing freed before close)."""

    def __init__(self, acl: ACL, size: int, device: Any, align: int = 256) -> None:
        self.acl, self.size, self.align, self.device = acl, size, align, torch.device(device)
        self.base = acl.malloc(size)
        self.used = 0
        with torch.cuda.device(self.device):
            self.mem = torch.as_tensor(_Span(self.base, size), device=self.device)
        if self.mem.data_ptr() != self.base:
            raise AssertionError("torch wrapped %#x, not the ACL allocation %#x" % (self.mem.data_ptr(), self.base))

    def empty(self, shape: Sequence[int], dtype: Any) -> Any:
        n = torch.Size(shape).numel() * torch.tensor([], dtype=dtype).element_size()
        off = -(-self.used // self.align) * self.align
        if off + n > self.size:
            raise MemoryError("ACLArena: %d B wanted, %d of %d B used" % (n, off, self.size))
        self.used = off + n
        return self.mem[off:off + n].view(dtype).view(tuple(shape))

    def close(self) -> None:
        """Free the allocation (its export key closed first); the sidecar must have let go of it."""
        torch.cuda.synchronize(self.device)
        self.mem = None
        self.acl.free(self.base)


def open_acl(ordinal: int) -> Optional[ACL]:
    """The fake ACL runtime on GPU ``ordinal``, or None without ``STAGE_TEST_ACL_LIBRARY``."""
    return ACL(LIBRARY, ordinal) if LIBRARY else None


def sidecar_config(ordinal: int) -> str:
    """staged config for an acl sidecar over the fake library on GPU ``ordinal``."""
    return "device: {kind: acl, ordinal: %d, acl: {library: %s}}\n" % (ordinal, LIBRARY)
