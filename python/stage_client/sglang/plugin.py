"""The SGLang plugin (entry point ``stage`` of group ``sglang.srt.plugins``): ``stage`` as a transfer backend."""

from __future__ import annotations

from typing import Any, Dict

from .adapter import (BACKEND, SGLangBootstrapServer, SGLangKVManager, SGLangKVReceiver, SGLangKVSender,
                      _mode)

__all__ = ["sglang_classes", "sglang_plugin"]


def sglang_classes() -> Dict[str, Any]:
    """SGLang's KVClassType values -> this module's classes (KVArgs stays SGLang's)."""
    return {"manager": SGLangKVManager, "sender": SGLangKVSender, "receiver": SGLangKVReceiver,
            "bootstrap_server": SGLangBootstrapServer}


def _get_kv_class(original: Any, transfer_backend: Any, class_type: Any) -> Any:
    """AROUND hook on sglang.srt.disaggregation.utils.get_kv_class."""
    if _mode(transfer_backend) != BACKEND or _mode(class_type) == "kvargs":
        return original(transfer_backend, class_type)
    return sglang_classes().get(_mode(class_type))


def _stage_member(enum_cls: Any) -> Any:
    """``TransferBackend("stage")``: a member added to SGLang's enum (it has no API for it)."""
    m = enum_cls._value2member_map_.get(BACKEND)
    if m is None:
        m = object.__new__(enum_cls)
        m._name_, m._value_ = "STAGE", BACKEND
        type.__setattr__(enum_cls, "STAGE", m)
        enum_cls._member_map_["STAGE"] = m
        enum_cls._value2member_map_[BACKEND] = m
    return m


def sglang_plugin() -> None:
    """Entry point ``stage`` of group ``sglang.srt.plugins``: run by SGLang's ``load_plugins()`` in every
    process, before its arguments are parsed. Adds ``stage`` to the transfer backend choices and to the
    TransferBackend enum, and hooks get_kv_class (SGLang's HookRegistry applies it)."""
    from sglang.srt.arg_groups.choices import DISAGG_TRANSFER_BACKEND_CHOICES, add_disagg_transfer_backend_choices
    from sglang.srt.disaggregation.utils import TransferBackend
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if BACKEND not in DISAGG_TRANSFER_BACKEND_CHOICES:
        add_disagg_transfer_backend_choices([BACKEND])
    _stage_member(TransferBackend)
    HookRegistry.register("sglang.srt.disaggregation.utils.get_kv_class", _get_kv_class, HookType.AROUND)
