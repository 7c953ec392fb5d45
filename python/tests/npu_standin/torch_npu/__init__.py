"""A stand-in for torch_npu, ours, for python/tests/test_vllm_ascend.py only (never an installed package).

vllm-ascend's model runner allocates its KV cache with
``torch.zeros(n, dtype=torch.int8, device=self.device)`` on ``npu:N`` and
then only views it (slices, ``view``, ``as_strided``). Torch has no NPU
here, so this package, on the test's ``sys.path`` as ``torch_npu``:

* names the device: ``npu`` is torch's PrivateUse1 backend renamed, as
  torch_npu renames it, so ``torch.device("npu:0")`` is valid;
* answers the factories vllm-ascend's runner calls on that device
  (``torch.zeros`` / ``torch.empty``) while :func:`standin.allocating`
  is on, with memory from the emulated Ascend runtime (libascendcl from
  ``STAGE_TEST_ACL_LIBRARY``: acl/testdata/fakeacl.c in CI), in either of
  torch_npu's allocator modes (``PYTORCH_NPU_ALLOC_CONF``
  ``expandable_segments:True``: VMM pages; ``False``: aclrtMalloc
  segments; see ``_acl.py``);
* returns :class:`NPUTensor`: a CPU tensor over that memory (the emulated
  device memory is host memory of this process) that reports
  ``device npu:N``, so code that routes by device (the stage connector)
  sees an NPU tensor; every view of it is one too;
* stubs, each named in :mod:`torch_npu.npu`, only what importing
  vllm-ascend's model runner touches.

Nothing here runs on an NPU, and nothing of torch_npu's is copied: the
behaviour follows its documented allocator settings.
"""

from __future__ import annotations

from . import standin  # noqa: F401  (registers the npu device and torch.npu)
from .standin import NPUTensor, _C, npu  # noqa: F401

__version__ = "2.10.0.post4+stage.standin"  # the torch_npu vllm-ascend 0.23.0.post1 pins, marked as ours
