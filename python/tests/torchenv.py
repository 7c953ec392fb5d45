"""What the torch tests share: the package, its examples and this folder on
sys.path, torch when installed (tinylm with it), and why a test skips.

A test file puts its own folder on sys.path first (tests is not a package:
``unittest discover -s tests`` and ``python3 -m unittest tests.test_x`` both
run it), then imports from here.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "examples"), HERE):
    if _p in sys.path:
        sys.path.remove(_p)
    sys.path.insert(0, _p)

try:
    import torch

    import tinylm
except ImportError:
    torch = None
    tinylm = None

#: why a torch test skips: "" when torch is here
TORCH_WHY = "" if torch is not None else "torch is not installed"
HAVE_CUDA = torch is not None and bool(torch.cuda.is_available())
#: why a CUDA test skips
CUDA_WHY = TORCH_WHY or "CUDA is not available to torch"
