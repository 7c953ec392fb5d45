"""What torch's producer-side CUDA IPC counters really do, printed step by step.

``stage_client`` gives back the counter each ``_share_cuda_`` call arms
(stage_client/cuda.py, "Lifetime"), relying on what torch's source says:
every call takes a new int64 counter, set to 1, in a shared-memory file
(``/dev/shm/torch_<pid>_...``: a 64-byte header, then 10 000 counters), and
``torch.UntypedStorage._release_ipc_counter_cuda(handle, offset)``
decrements it; a freed storage stays in torch's "limbo" while any counter of
it is above 0. This probe shows it on a GPU, without a sidecar:

1. the release calls this torch has;
2. three ``_share_cuda_`` calls on one storage: the (file, index) each
   names and every counter's value after each share and each release;
3. a 64 MiB tensor shared twice and freed: ``memory_reserved`` after
   ``ipc_collect`` and ``empty_cache`` with both counters held, with one
   given back, and with both.

    python3 examples/torch_ipc_counter_probe.py [--device 0] [--mib 64]

Prints SKIP and exits 0 without torch or CUDA.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from stage_client.cuda import IpcRef, ipc_counter_value  # noqa: E402


def value(ref: IpcRef) -> str:
    try:
        return str(ipc_counter_value(ref))
    except (OSError, ValueError) as e:
        return "unreadable (%s)" % e


def ref_of(share: Any) -> IpcRef:
    return IpcRef(device=int(share[0]), handle=bytes(share[4]), offset=int(share[5]))


def reserved_mib(torch: Any, dev: Any) -> float:
    torch.cuda.synchronize(dev)
    torch.cuda.ipc_collect()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved(dev) / (1 << 20)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", type=int, default=0, help="CUDA device (default 0)")
    ap.add_argument("--mib", type=int, default=64, help="size of the tensors (default 64 MiB)")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("SKIP: torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("SKIP: CUDA is not available to torch %s" % torch.__version__)
        return 0
    dev = torch.device("cuda", args.device)
    n = args.mib << 20
    release = torch.UntypedStorage._release_ipc_counter_cuda
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name(dev)))
    for cls in (torch.UntypedStorage, torch.TypedStorage):
        for name in ("_release_ipc_counter_cuda", "_release_ipc_counter"):
            print("  %s.%s: %s" % (cls.__name__, name, "yes" if callable(getattr(cls, name, None)) else "no"))

    print("\n2. three _share_cuda_ calls on one storage")
    t = torch.zeros(n, dtype=torch.uint8, device=dev)
    st = t.untyped_storage()
    refs: List[IpcRef] = []
    for i in range(3):
        share = st._share_cuda_()
        refs.append(ref_of(share))
        path = os.path.join("/dev/shm", refs[-1].handle.decode()[1:])
        size = os.path.getsize(path) if os.path.exists(path) else -1
        print("  share %d: handle %r (%s, %d bytes; torch's layout has 80064) index %d; counters %s"
              % (i + 1, refs[-1].handle, path, size, refs[-1].offset, [value(r) for r in refs]))
    for i, r in enumerate(refs):
        release(r.handle, r.offset)
        print("  after releasing share %d: counters %s" % (i + 1, [value(x) for x in refs]))
    del st, t

    print("\n3. a %d MiB tensor shared twice, then freed" % args.mib)
    base = reserved_mib(torch, dev)
    t = torch.zeros(n, dtype=torch.uint8, device=dev)
    with_tensor = reserved_mib(torch, dev)
    st = t.untyped_storage()
    refs = [ref_of(st._share_cuda_()), ref_of(st._share_cuda_())]
    del st, t
    steps = [("freed, both counters held", []), ("share 1 given back", [refs[0]]), ("share 2 given back", [refs[1]])]
    print("  memory_reserved: %.0f MiB before, %.0f MiB with the tensor" % (base, with_tensor))
    for what, give in steps:
        for r in give:
            release(r.handle, r.offset)
        print("  %s: counters %s, memory_reserved %.0f MiB (%.0f MiB above before)"
              % (what, [value(r) for r in refs], reserved_mib(torch, dev), reserved_mib(torch, dev) - base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
