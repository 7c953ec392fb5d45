"""Wire format of RegisterKV (151) and SubmitKV (152): golden bytes from Go, malformed input, fast block tables.

test_wire.py's samples include these frames too, so its round-trip,
truncation, trailing-byte and fuzz tests cover them.

The golden frames are what Go's ``wire.AppendFrame`` writes for the same
messages (printed by a throwaway Go program with the values below), so a
Python encoder that drifts from Go fails here, not in a sidecar's Fail.
"""

from __future__ import annotations

import array
import os
import struct
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stage_client import wire  # noqa: E402  (the old module name, kept for users)
from stage_client.kvclient import layout_of, wire_layout  # noqa: E402
from stage_client.layout import DType, LayoutError, preset  # noqa: E402
from stage_client.protocol.kvwire import DTYPE_CODES, KVLayout, KVPart, RegisterKV, SubmitKV, pack_u32s  # noqa: E402
from stage_client.protocol.wire import Checksum, Direction, FrameType, ProtocolError  # noqa: E402


def hx(s: str) -> bytes:
    return bytes.fromhex("".join(line.split("#", 1)[0] for line in s.splitlines()))


def kv_layout() -> KVLayout:
    return KVLayout(2, 16, 0x100, 8, 2, 4, (KVPart("k", 64, 0, 0x10, 0x2000, 0x200, 0x80),
                                            KVPart("v", 64, 1, 0x20, 0x2000, 0x200, 0x80)))


REGISTER_GO = hx("""
    53 47 01 97 00 00 00 00 8d 00 00 00 00 00 00 00   # header, type 151, length 141
    03 00 00 00 00 00 00 00                           # Req 3
    02 00 6b 76                                       # Name "kv"
    02                                                # DType bf16
    10 00 00 00 00 01 00 00 08 00 00 00               # BlockSize 16, Blocks 256, Heads 8
    02 00 00 00 04 00 00 00                           # HeadLo 2, HeadHi 4
    02 00 00 00                                       # Parts count
    01 00 6b 40 00 00 00 00                           # "k", Width 64, Tensor 0
    10 00 00 00 00 00 00 00 00 20 00 00 00 00 00 00   # Offset, BlockStride
    00 02 00 00 00 00 00 00 80 00 00 00 00 00 00 00   # SlotStride, HeadStride
    01 00 76 40 00 00 00 01                           # "v", Width 64, Tensor 1
    20 00 00 00 00 00 00 00 00 20 00 00 00 00 00 00
    00 02 00 00 00 00 00 00 80 00 00 00 00 00 00 00
    02 00 00 00                                       # Layers count
    02 00 00 00 01 00 61 01 00 62                     # ["a", "b"]
    02 00 00 00 01 00 63 01 00 64                     # ["c", "d"]
""")

SUBMIT_GO = hx("""
    53 47 01 98 00 00 00 00 5e 00 00 00 00 00 00 00   # header, type 152, length 94
    04 00 00 00 00 00 00 00                           # Req 4
    06 00 64 65 63 6f 64 65                           # Route "decode"
    01 00 70                                          # Peer "p"
    02 01                                             # Dir pull, Checksum on
    01 00 74 01 00 78 01 00 79                        # Tag "t", Local "x", Remote "y"
    02 00 00 00 00 00 00 00 02 00 00 00               # Layers [0, 2]
    02 00 00 00 01 00 00 00 03 00 00 00               # RemoteLayers [1, 3]
    02 00 00 00 07 00 00 00 ef be ad de               # LocalBlocks [7, 0xdeadbeef]
    01 00 00 00 05 00 00 00                           # RemoteBlocks [5]
    01 00 00 00 02 00 00 00 2c 01 00 00               # LocalFirst 1, RemoteFirst 2, Tokens 300
    01 00 00 00 03 00 00 00                           # HeadLo 1, HeadHi 3
""")

SUBMIT_EMPTY_GO = hx("""
    53 47 01 98 00 00 00 00 47 00 00 00 00 00 00 00   # header, type 152, length 71
    05 00 00 00 00 00 00 00 01 00 72 00 00            # Req 5, Route "r", Peer ""
    01 00 00 00 01 00 61 01 00 62                     # push, route's checksum, Tag "", Local "a", Remote "b"
    01 00 00 00 00 00 00 00 00 00 00 00               # Layers [0], RemoteLayers []
    01 00 00 00 01 00 00 00 01 00 00 00 02 00 00 00   # LocalBlocks [1], RemoteBlocks [2]
    00 00 00 00 00 00 00 00 01 00 00 00               # LocalFirst 0, RemoteFirst 0, Tokens 1
    00 00 00 00 00 00 00 00                           # HeadLo 0, HeadHi 0: every head both hold
""")


def samples() -> list:
    return [
        RegisterKV(req=3, name="kv", layout=kv_layout(), layers=[["a", "b"], ["c", "d"]]),
        RegisterKV(req=1, name="", layout=KVLayout(0, 0, 0, 0, 0, 0, ()), layers=[]),
        SubmitKV(req=4, route="decode", peer="p", direction=Direction.PULL, checksum=Checksum.ON, tag="t", local="x",
                 remote="y", layers=[0, 2], remote_layers=[1, 3], local_blocks=[7, 0xDEADBEEF], remote_blocks=[5],
                 local_first=1, remote_first=2, tokens=300, head_lo=1, head_hi=3),
        SubmitKV(req=5, route="r", local="a", remote="b", layers=[0], local_blocks=[1], remote_blocks=[2], tokens=1),
    ]


class TestGolden(unittest.TestCase):
    def test_register_kv(self) -> None:
        m = samples()[0]
        self.assertEqual(wire.encode_frame(m), REGISTER_GO)
        self.assertEqual(wire.decode_frame(REGISTER_GO)[1], m)

    def test_submit_kv(self) -> None:
        m = samples()[2]
        self.assertEqual(wire.encode_frame(m), SUBMIT_GO)
        self.assertEqual(wire.decode_frame(SUBMIT_GO)[1], m)
        m = samples()[3]
        self.assertEqual(wire.encode_frame(m), SUBMIT_EMPTY_GO)
        self.assertEqual(wire.decode_frame(SUBMIT_EMPTY_GO)[1], m)

    def test_block_table_forms(self) -> None:
        # A block table may be a list, a range, an array or anything with tolist: the same bytes.
        want = samples()[2].encode()
        for lb in ([7, 0xDEADBEEF], (7, 0xDEADBEEF), array.array("I", [7, 0xDEADBEEF]), _Listable([7, 0xDEADBEEF])):
            with self.subTest(form=type(lb).__name__):
                m = samples()[2]
                m.local_blocks = lb
                self.assertEqual(m.encode(), want)
        m = samples()[3]
        m.local_blocks = range(1, 2)
        self.assertEqual(wire.encode_frame(m), SUBMIT_EMPTY_GO)

    def test_dtype_numbers(self) -> None:
        # PROTOCOL.md 12.1
        self.assertEqual(DTYPE_CODES, {"f16": 1, "bf16": 2, "f32": 3, "fp8_e4m3": 4, "fp8_e5m2": 5, "int8": 6})
        self.assertEqual(sorted(DTYPE_CODES), sorted(d.value for d in DType))  # every dtype of the model
        self.assertEqual(DTYPE_CODES[DType.BF16], 2)  # a DType is its name

    def test_layout_conversion(self) -> None:
        lay = preset("ascend", dtype="bf16", blocks=24, block_size=128, heads=8, head_lo=4, head_hi=8, head_size=64)
        w = wire_layout(lay)
        self.assertEqual((w.dtype, w.block_size, w.blocks, w.heads, w.head_lo, w.head_hi), (2, 128, 24, 8, 4, 8))
        self.assertEqual([(p.name, p.tensor, p.width) for p in w.parts], [("k", 0, 64), ("v", 1, 64)])
        self.assertEqual(layout_of(w), lay)
        back = RegisterKV.decode(RegisterKV(req=1, name="x", layout=w, layers=[["a", "b"]]).encode())
        self.assertEqual(back.layout, w)
        self.assertEqual(layout_of(back.layout), lay)
        with self.assertRaises(LayoutError):
            layout_of(KVLayout(9, 1, 1, 1, 0, 1, ()))
        bad = preset("vllm-flash", dtype=DType.F16, blocks=4, block_size=16, heads=2, head_size=8)
        with self.assertRaises(LayoutError):  # validated before it goes out
            wire_layout(type(bad)(bad.dtype, bad.block_size, bad.blocks, bad.heads, 1, 1, bad.parts))


class _Listable:
    """A stand-in for a tensor or numpy array: only tolist()."""

    def __init__(self, v: list) -> None:
        self.v = v

    def tolist(self) -> list:
        return list(self.v)


class TestCodec(unittest.TestCase):
    def test_frame_types(self) -> None:
        self.assertEqual((int(FrameType.REGISTER_KV), int(FrameType.SUBMIT_KV)), (151, 152))
        self.assertIs(wire.RegisterKV, RegisterKV)
        wire.parse_header(wire.encode_header(151, 0, 8))

    def test_refused_values(self) -> None:
        body = bytearray(samples()[2].encode())
        dir_at = 8 + 8 + 3
        for bad in (0, 3):
            b = bytearray(body)
            b[dir_at] = bad
            with self.assertRaises(ProtocolError):
                SubmitKV.decode(bytes(b))
        b = bytearray(body)
        b[dir_at + 1] = 3  # checksum
        with self.assertRaises(ProtocolError):
            SubmitKV.decode(bytes(b))
        # RemoteLayers: one for two local layers
        m = SubmitKV(layers=[0, 1], remote_layers=[1, 2])
        raw = m.encode().replace(struct.pack("<III", 2, 1, 2), struct.pack("<II", 1, 1), 1)
        with self.assertRaises(ProtocolError) as cm:
            SubmitKV.decode(raw)
        self.assertIn("RemoteLayers", str(cm.exception))
        # Counts above the limits, and above what the bytes left can hold
        cut = len(SubmitKV().encode()) - 4 * 4 - 5 * 4  # where the Layers count starts
        head = SubmitKV().encode()[:cut]
        with self.assertRaises(ProtocolError) as cm:
            SubmitKV.decode(head + struct.pack("<I", wire.MAX_KV_LAYERS + 1))
        self.assertEqual(cm.exception.kind, "too_large")
        with self.assertRaises(ProtocolError) as cm:
            SubmitKV.decode(head + struct.pack("<I", 1000))
        self.assertEqual(cm.exception.kind, "malformed")
        reg = RegisterKV(layout=kv_layout()).encode()
        parts_at = 8 + 2 + 21
        with self.assertRaises(ProtocolError) as cm:
            RegisterKV.decode(reg[:parts_at] + struct.pack("<I", wire.MAX_KV_PARTS + 1) + reg[parts_at + 4:])
        self.assertEqual(cm.exception.kind, "too_large")

    def test_encoder_refuses(self) -> None:
        for kw in (dict(direction=3), dict(checksum=7), dict(tag="t" * 1025), dict(local="x" * 256),
                   dict(layers=[0, 1], remote_layers=[0]), dict(local_blocks=[-1]), dict(local_blocks=[2 ** 32]),
                   dict(remote_blocks=[1.5]), dict(tokens=2 ** 32), dict(layers=[0] * (wire.MAX_KV_LAYERS + 1)),
                   dict(local_blocks=array.array("I", [0]) * (wire.MAX_KV_BLOCKS + 1))):
            with self.subTest(kw=list(kw)):
                with self.assertRaises(ValueError):
                    SubmitKV(**kw).encode()
        with self.assertRaises(ValueError):
            RegisterKV(layout=KVLayout(0, 0, 0, 0, 0, 0, (KVPart("p", 1, 0, 0, 0, 0, 0),) * 9)).encode()
        with self.assertRaises(ValueError):
            RegisterKV(layout=kv_layout(), layers=[["a"] * 9]).encode()
        with self.assertRaises(ValueError):
            RegisterKV(layout=KVLayout(256, 0, 0, 0, 0, 0, ())).encode()

    def test_large_table_is_fast(self) -> None:
        # MAX_KV_BLOCKS ids each side: packed in one call, not id by id.
        table = list(range(wire.MAX_KV_BLOCKS))
        m = SubmitKV(route="r", local="a", remote="b", layers=list(range(80)), local_blocks=table,
                     remote_blocks=table[::-1], tokens=1)
        t0 = time.perf_counter()
        body = m.encode()
        dt = time.perf_counter() - t0
        self.assertEqual(len(body), len(SubmitKV(route="r", local="a", remote="b").encode()) + 4 * (80 + 2 * wire.MAX_KV_BLOCKS))
        self.assertLess(dt, 2.0, "encoding 2 x %d block ids took %.2fs" % (wire.MAX_KV_BLOCKS, dt))
        self.assertEqual(SubmitKV.decode(body).remote_blocks[:2], [wire.MAX_KV_BLOCKS - 1, wire.MAX_KV_BLOCKS - 2])
        self.assertEqual(pack_u32s(array.array("I", [1, 2]), 2, "x"), struct.pack("<III", 2, 1, 2))


if __name__ == "__main__":
    unittest.main()
