"""stage_client.protocol: one registry of every local message type, and the
old module names (stage_client.wire, stage_client.kvwire) re-exporting it."""

from __future__ import annotations

import importlib
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stage_client import protocol  # noqa: E402
from stage_client.protocol import kvwire, messages, wire  # noqa: E402


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
