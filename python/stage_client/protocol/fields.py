"""The codec of messages whose body is a plain run of fields, written once.

Join, the tickets and the grants (PROTOCOL.md 9.18 to 9.20) are each a
``Req`` and a few fields in a fixed order, every field read and written the
same way. Such a message lists its fields (:class:`Field`, built by the
helpers below) in ``FIELDS``; :class:`FieldMessage` encodes and decodes
them in that order with :mod:`.codec`'s encoder and decoder, so the errors
name the message and the field as every other message's do
(``"Grant.Key: ..."``). A check between fields (Grant's TTL against its
uses) is the message's :meth:`~FieldMessage.check` before encoding and
:meth:`~FieldMessage.verify` after decoding.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Dict, NamedTuple, Sequence, Tuple, Type, TypeVar, Union

from .codec import Message, _Dec, _Enc

__all__ = ["Field", "FieldMessage", "u8", "u16", "u32", "u64", "str16", "bytes16", "bytes32", "put_fields",
           "get_fields"]


class Field(NamedTuple):
    """One field: the attribute that holds it, its name on the wire (as the Go struct's, for errors), how it
    is written (``put(encoder, value, name)``) and read (``get(decoder, name)``)."""

    attr: str
    name: str
    put: Callable[[_Enc, Any, str], None]
    get: Callable[[_Dec, str], Any]


def u8(attr: str, name: str) -> Field:
    return Field(attr, name, lambda e, v, n: e.u8(v, n), lambda d, n: d.u8(n))


def u16(attr: str, name: str) -> Field:
    return Field(attr, name, lambda e, v, n: e.u16(v, n), lambda d, n: d.u16(n))


def u32(attr: str, name: str) -> Field:
    return Field(attr, name, lambda e, v, n: e.u32(v, n), lambda d, n: d.u32(n))


def u64(attr: str, name: str) -> Field:
    return Field(attr, name, lambda e, v, n: e.u64(v, n), lambda d, n: d.u64(n))


def str16(attr: str, name: str, limit: int) -> Field:
    """A UTF-8 string of at most ``limit`` bytes after its u16 length."""
    return Field(attr, name, lambda e, v, n: e.str16(v, limit, n), lambda d, n: d.str16(limit, n))


def bytes16(attr: str, name: str, limit: int) -> Field:
    """Bytes (at most ``limit``) after their u16 length."""
    return Field(attr, name, lambda e, v, n: e.bytes16(v, limit, n), lambda d, n: d.bytes16(limit, n))


def bytes32(attr: str, name: str, limit: int) -> Field:
    """Bytes (at most ``limit``) after their u32 length."""
    return Field(attr, name, lambda e, v, n: e.bytes32(v, limit, n), lambda d, n: d.bytes32(limit, n))


def put_fields(e: _Enc, obj: Any, fields: Sequence[Field]) -> None:
    """Write ``fields`` of ``obj`` in order."""
    for f in fields:
        f.put(e, getattr(obj, f.attr), f.name)


def get_fields(d: _Dec, fields: Sequence[Field]) -> Dict[str, Any]:
    """Read ``fields`` in order: the values by attribute."""
    return {f.attr: f.get(d, f.name) for f in fields}


M = TypeVar("M", bound="FieldMessage")


class FieldMessage(Message):
    """A message (a dataclass) whose body is exactly its ``FIELDS``, in order."""

    FIELDS: ClassVar[Tuple[Field, ...]] = ()

    def check(self) -> None:
        """Raise ValueError for values the receiver refuses that no single field's encoder sees."""

    def verify(self, d: _Dec) -> None:
        """Raise ``d.fail(...)`` for a decoded message that breaks a rule between its fields."""

    def encode(self) -> bytes:
        self.check()
        e = _Enc(type(self).__name__)
        put_fields(e, self, self.FIELDS)
        return e.done()

    @classmethod
    def decode(cls: Type[M], body: Union[bytes, bytearray, memoryview]) -> M:
        d = _Dec(body, cls.__name__)
        m = cls(**get_fields(d, cls.FIELDS))
        m.verify(d)
        d.finish()
        return m
