"""KV-cache layouts: stage's model of how an engine stores a layer's KV cache (``docs/KVLAYOUT.md``).

The modules, bottom up (each imports only those above it in this list):

* :mod:`.presets`: the engines' named layouts as data (which dim of each
  tensor is what); imports nothing;
* :mod:`.model`: :class:`Layout`, :class:`Part`, :class:`DType`,
  :class:`Side` and the checks two layouts need to meet (as the Go package
  ``kvlayout``); standard library only;
* :mod:`.derive`: layouts from presets and tensor shapes (:func:`preset`);
* :mod:`.tensors`: layouts read off torch tensors (:func:`from_tensor`,
  also ``Layout.from_tensor``) and the reference mapper :func:`gather` /
  :func:`scatter`; torch is imported when one of them runs.

Nothing here imports the rest of stage_client. The old module names
``stage_client.kvpresets``, ``stage_client.kvderive`` and
``stage_client.kvmap`` re-export these for users' imports.
"""

from .derive import *  # noqa: F401,F403
from .derive import __all__ as _derive_all
from .model import *  # noqa: F401,F403
from .model import Layout
from .model import __all__ as _model_all
from .presets import *  # noqa: F401,F403
from .presets import __all__ as _presets_all
from .tensors import *  # noqa: F401,F403
from .tensors import from_tensor
from .tensors import __all__ as _tensors_all

# Layout.from_tensor is tensors.from_tensor: set here, where both modules are known, so that model imports
# nothing of the code above it (model.py declares the attribute).
Layout.from_tensor = staticmethod(from_tensor)

__all__ = list(_model_all) + list(_presets_all) + list(_derive_all) + list(_tensors_all)
