"""The KV frames of the local control socket, RegisterKV (151) and SubmitKV
(152): the names of :mod:`stage_client.protocol.kvwire`, kept importable
here as they were before that package existed, for users. Nothing in
stage_client imports this module.
"""

from .protocol.kvwire import DTYPE_CODES, KVLayout, KVPart, RegisterKV, SubmitKV, pack_u32s

__all__ = ["DTYPE_CODES", "KVPart", "KVLayout", "RegisterKV", "SubmitKV", "pack_u32s"]
