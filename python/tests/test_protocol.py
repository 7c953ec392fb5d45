"""stage_client.protocol: one registry of every local message type, and the
old module names (stage_client.wire, stage_client.kvwire; stage_client.kvpresets,
kvderive, kvmap for stage_client.layout) re-exporting what moved."""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stage_client import protocol  # noqa: E402
from stage_client.protocol import fields, kvwire, messages, wire  # noqa: E402


class RegistryTest(unittest.TestCase):
    def test_every_local_type_once(self) -> None:
        local = [t for t in wire.FrameType if t >= 128]
        self.assertEqual(sorted(messages.MESSAGES), sorted(int(t) for t in local))
        for t in local:
            with self.subTest(type=t.name):
                cls = messages.MESSAGES[int(t)]
                self.assertEqual(cls.TYPE, t)
                self.assertTrue(issubclass(cls, wire.Message))

    def test_read_only(self) -> None:
        with self.assertRaises(TypeError):
            messages.MESSAGES[999] = wire.OK  # type: ignore[index]

    def test_round_trip_each_module(self) -> None:
        cases = [
            (wire.OK(req=7), wire.OK),
            (wire.Wait(req=1, transfer=2, timeout_ms=5), wire.Wait),
            (kvwire.SubmitKV(req=9, route="r", local="a", remote="b", layers=[0, 1]), kvwire.SubmitKV),
        ]
        for msg, cls in cases:
            with self.subTest(cls=cls.__name__):
                h, got = messages.decode_frame(wire.encode_frame(msg))
                self.assertEqual(h.type, int(cls.TYPE))
                self.assertIsInstance(got, cls)
                self.assertEqual(got, msg)


class FieldsTest(unittest.TestCase):
    """protocol.fields: a message that lists its fields gets its codec, errors naming message and field."""

    def setUp(self) -> None:
        @dataclasses.dataclass
        class Probe(fields.FieldMessage):
            TYPE = wire.FrameType.OK
            FIELDS = (fields.u64("req", "Req"), fields.str16("name", "Name", 4), fields.u8("small", "Small"),
                      fields.bytes32("blob", "Blob", 8))
            req: int = 0
            name: str = ""
            small: int = 0
            blob: bytes = b""

            def check(self) -> None:
                if self.small == 7:
                    raise ValueError("Probe.Small: 7 is refused")

            def verify(self, d: wire._Dec) -> None:
                if self.small == 9:
                    raise d.fail("malformed", "Small", "9 is refused")

        self.Probe = Probe

    def test_round_trip_in_order(self) -> None:
        m = self.Probe(req=0x0102, name="ab", small=3, blob=b"xyz")
        body = m.encode()
        self.assertEqual(body, bytes([2, 1, 0, 0, 0, 0, 0, 0]) + b"\x02\x00ab" + b"\x03" + b"\x03\x00\x00\x00xyz")
        self.assertEqual(self.Probe.decode(body), m)

    def test_errors(self) -> None:
        with self.assertRaisesRegex(ValueError, r"^Probe\.Name: "):
            self.Probe(name="too long").encode()
        with self.assertRaisesRegex(ValueError, "7 is refused"):
            self.Probe(small=7).encode()
        good = self.Probe(req=1, name="a", small=1, blob=b"b").encode()
        with self.assertRaisesRegex(wire.ProtocolError, r"Probe\.Blob: need"):
            self.Probe.decode(good[:-1])
        with self.assertRaisesRegex(wire.ProtocolError, "trailing"):
            self.Probe.decode(good + b"\x00")
        with self.assertRaisesRegex(wire.ProtocolError, r"Probe\.Small: 9 is refused"):
            self.Probe.decode(good[:11] + b"\x09" + good[12:])


class ReexportTest(unittest.TestCase):
    def test_old_names_are_the_same_objects(self) -> None:
        cases = [
            # (old module, where its names live now)
            ("stage_client.wire", protocol),
            ("stage_client.kvwire", kvwire),
        ]
        for old, new in cases:
            mod = importlib.import_module(old)
            for name in mod.__all__:
                with self.subTest(module=old, name=name):
                    self.assertIs(getattr(mod, name), getattr(new, name))

    def test_layout_shims_are_the_same_objects(self) -> None:
        """kvpresets, kvderive and kvmap re-export stage_client.layout's modules, name for name."""
        for old, new in (("stage_client.kvpresets", "stage_client.layout.presets"),
                         ("stage_client.kvderive", "stage_client.layout.derive"),
                         ("stage_client.kvmap", "stage_client.layout.tensors")):
            mod, now = importlib.import_module(old), importlib.import_module(new)
            self.assertEqual(sorted(mod.__all__), sorted(now.__all__), old)
            for name in mod.__all__:
                with self.subTest(module=old, name=name):
                    self.assertIs(getattr(mod, name), getattr(now, name))

    def test_layout_keeps_its_names(self) -> None:
        """What the module stage_client.layout exported before it became a package, the package exports."""
        layout = importlib.import_module("stage_client.layout")
        model = importlib.import_module("stage_client.layout.model")
        tensors = importlib.import_module("stage_client.layout.tensors")
        for name in ("DType", "Part", "Layout", "LayoutError", "Side", "PRESETS", "TensorRoles", "columns", "check",
                     "sides", "gather", "scatter", "MAX_PARTS", "MAX_ROW_WIDTH"):
            with self.subTest(name=name):
                self.assertIn(name, layout.__all__)
                self.assertTrue(hasattr(layout, name))
        self.assertIs(layout.Layout, model.Layout)
        self.assertIs(layout.gather, tensors.gather)
        self.assertIs(layout.Layout.from_tensor, tensors.from_tensor)
        self.assertEqual([f.name for f in dataclasses.fields(layout.Layout)],
                         ["dtype", "block_size", "blocks", "heads", "head_lo", "head_hi", "parts"])

    def test_wire_keeps_its_public_names_outside_all(self) -> None:
        old = importlib.import_module("stage_client.wire")
        for name in ("LOCAL_OP_SIZE", "MAX_CHUNK_SEGS", "VERSION_MAX", "VERSION_MIN", "checksum_choice", "to_code",
                     "to_handle"):
            with self.subTest(name=name):
                self.assertIs(getattr(old, name), getattr(wire, name))

    def test_protocol_all_is_complete(self) -> None:
        self.assertEqual(len(protocol.__all__), len(set(protocol.__all__)))
        for name in protocol.__all__:
            with self.subTest(name=name):
                self.assertTrue(hasattr(protocol, name))


if __name__ == "__main__":
    unittest.main()
