"""An SGLang-style disaggregation backend over stage: KVManager, KVSender, KVReceiver, KVPoll.

SGLang's transfer backends implement ``BaseKVManager``, ``BaseKVSender``
(``init(num_kv_indices, aux_index)``, ``send(kv_indices, ...)`` once per
prefill chunk, ``poll()``) and ``BaseKVReceiver`` (``init`` and
``send_metadata(kv_indices, ...)``, or the older ``init(kv_indices,
aux_index)``; ``poll()``) from ``sglang/srt/disaggregation/base/conn.py``,
with ``KVPoll`` states Failed, Bootstrapping, WaitingForInput, Transferring,
Success. The decode allocates pages and tells the prefill their indices
(here: a ticket posted to the prefill's rendezvous, which plays the
bootstrap server); the prefill pushes each chunk's pages into them. The
core classes (:mod:`.core`) take the memory pool's tensors rather than
raw pointers, because the sidecar maps memory by handle, not by address;
:mod:`.adapter` builds them from what SGLang passes a backend (its
``KVArgs`` of pointers, mode, server args), and :mod:`.plugin` (entry
point group ``sglang.srt.plugins``) makes ``--disaggregation-transfer-backend
stage`` resolve to those, without a change to SGLang (docs/ENGINES.md).

The KV cache is SGLang's token pool: per layer ``k_buffer`` and
``v_buffer`` of shape (tokens, heads, head_dim), page ``p`` being tokens
[p * page_size, (p + 1) * page_size) (preset ``sglang``). Prefill and
decode may split heads differently; the sidecars convert.

SGLang also moves each request's *aux* bytes (its metadata buffers: the
first output token, logprobs, hidden states; ``KVArgs.aux_data_ptrs``,
one slot per request at ``aux_index``) after the last chunk, and the
decode cannot start without them. Given ``aux_buffers`` (those tensors),
each prefill rank sends its slot with the last chunk to the decode ranks
it serves, as a ticket naming the room's grant (or into the decode's
regions, where the decode's sidecar predates aux tickets: :mod:`.auxmeta`);
the decode reports Success once the KV and the aux bytes landed, and
copies them into its own slot first.
"""

from .adapter import (BACKEND, SGLangBootstrapServer, SGLangKVManager, SGLangKVReceiver,  # noqa: F401
                      SGLangKVSender)
from .auxmeta import AuxSlots  # noqa: F401
from .core import KVPoll, StageKVManager  # noqa: F401
from .receiver import StageKVReceiver  # noqa: F401
from .sender import StageKVSender  # noqa: F401
from .plugin import sglang_classes, sglang_plugin  # noqa: F401

__all__ = ["KVPoll", "AuxSlots", "StageKVManager", "StageKVSender", "StageKVReceiver", "BACKEND",
           "SGLangKVManager", "SGLangKVSender", "SGLangKVReceiver", "SGLangBootstrapServer", "sglang_classes",
           "sglang_plugin"]
