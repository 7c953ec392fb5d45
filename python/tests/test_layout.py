"""KV layouts: the model's rules (stdlib), layouts read off torch tensors, and the reference mapper.

The torch tests build each engine's tensors the way the engine does and
index them the way the engine does (``native`` below), independently of
stage_client.layout, so a stride or offset read wrongly shows as a wrong row.
"""

from __future__ import annotations

import itertools
import os
import random
import sys
import unittest
from typing import Any, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stage_client.kvderive import preset, tensor_lens  # noqa: E402
from stage_client.layout import PRESETS, DType, Layout, LayoutError, Part, Side, check, columns, sides  # noqa: E402

try:
    import torch

    from stage_client.kvmap import from_tensor, gather, gather_tensor, scatter
    WHY = ""
except ImportError:
    torch = None
    WHY = "torch is not installed"


def kv(name: str, **kw: Any) -> Layout:
    args: Dict[str, Any] = dict(dtype="f16", blocks=3, block_size=4)
    if "mla" not in name:
        args.update(heads=4, head_lo=0, head_hi=2, head_size=8)
    args.update(kw)
    return preset(name, **args)


def parts(*ps: Tuple[str, int, int, int, int, int, int]) -> Tuple[Part, ...]:
    return tuple(Part(*p) for p in ps)


class TestModel(unittest.TestCase):
    def test_presets_valid_and_round_trip(self) -> None:
        for name in PRESETS:
            lay = kv(name)
            lay.validate(tensor_lens(name, lay))
            self.assertEqual(Layout.from_dict(lay.to_dict()), lay, name)

    def test_validate_refusals(self) -> None:
        good = kv("vllm-flash")
        cases = [
            ("head slice", dict(head_lo=2, head_hi=2), "head slice [2, 2)"),
            ("slice past heads", dict(head_lo=3, head_hi=5), "not inside [0, 4)"),
            ("no blocks", dict(blocks=0), "blocks 0"),
            ("no parts", dict(parts=()), "0 parts"),
            ("nine parts", dict(parts=good.parts * 4 + good.parts[:1]), "9 parts"),
            ("wide row", dict(parts=parts(("k", 65536, 0, 0, 0, 0, 0))), "65536 elements"),
            ("kv name", dict(parts=parts(("kv", 8, 0, 0, 128, 32, 16))), '"kv" is not allowed'),
            ("rows overlap", dict(parts=parts(("k", 8, 0, 0, 128, 8, 16), ("v", 8, 0, 384, 128, 32, 16))),
             "let rows of 16 bytes overlap"),
            ("parts overlap", dict(parts=parts(("k", 8, 0, 0, 128, 32, 16), ("v", 8, 0, 8, 128, 32, 16))),
             "may overlap"),
        ]
        for what, change, msg in cases:
            d = dict(dtype=good.dtype, block_size=good.block_size, blocks=good.blocks, heads=good.heads,
                     head_lo=good.head_lo, head_hi=good.head_hi, parts=good.parts)
            d.update(change)
            with self.assertRaises(LayoutError, msg=what) as cm:
                Layout(**d).validate()
            self.assertIn(msg, str(cm.exception), what)
        with self.assertRaisesRegex(LayoutError, "reach byte 768 of tensor 0, which has 767"):
            good.validate([767])
        good.validate([768])
        with self.assertRaisesRegex(LayoutError, "tensor 1, but the layer has 1"):
            kv("ascend").validate([384])

    def test_from_dict_strict(self) -> None:
        d = kv("ascend").to_dict()
        for mutate, msg in [
            (lambda x: x.update(extra=1), "unknown fields"),
            (lambda x: x.pop("heads"), "missing fields"),
            (lambda x: x.update(blocks=True), "not an integer"),
            (lambda x: x.update(blocks=-1), "out of range"),
            (lambda x: x.update(blocks=1 << 63), "out of range"),
            (lambda x: x.update(dtype="f64"), "unknown dtype"),
            (lambda x: x["parts"][0].update(width="8"), "not an integer"),
            (lambda x: x["parts"][1].pop("offset"), "missing fields"),
            (lambda x: x.update(parts={}), "not a list"),
            (lambda x: x["parts"][1].update(name="kv"), "not allowed"),
        ]:
            bad = Layout.from_dict(d).to_dict()
            mutate(bad)
            with self.assertRaisesRegex(LayoutError, msg):
                Layout.from_dict(bad)

    def test_check_and_columns(self) -> None:
        a = kv("vllm-packed")
        self.assertEqual(check(a, kv("ascend", head_lo=1, head_hi=3)), (1, 2))
        self.assertEqual(columns(a, kv("ascend")), [(0, 8), (8, 16)])
        self.assertEqual(columns(kv("vllm-mla"), kv("ascend-mla")), [(0, 512), (512, 576)])
        refusals = [
            (kv("ascend", dtype="bf16"), "dtype f16 against bf16"),
            (kv("ascend", head_size=16), "row width 16 elements against 32"),
            (kv("ascend", heads=8), "4 kv heads in total against 8"),
            (kv("ascend", head_lo=2, head_hi=4), r"head slices \[0, 2\) and \[2, 4\) do not overlap"),
        ]
        for b, msg in refusals:
            with self.assertRaisesRegex(LayoutError, msg):
                check(a, b)
        with self.assertRaisesRegex(LayoutError, "576 elements against 16"):
            columns(kv("vllm-mla"), a)

    def test_sides_refusals(self) -> None:
        a, b = kv("vllm-flash"), kv("ascend")
        sa, sb = sides(a, [2, 0], b, [1], 4, first_a=3)
        self.assertEqual((sa.head_lo, sa.head_hi, sa.cols, sb.first_token, sb.nbytes(2)), (0, 2, [(0, 8), (8, 16)], 0,
                                                                                           2 * 4 * 2 * 16 * 2))
        with self.assertRaisesRegex(LayoutError, "source: 4 tokens from token 3 need 2 blocks of 4, the block table has 1"):
            sides(a, [2], b, [1], 4, first_a=3)
        with self.assertRaisesRegex(LayoutError, "destination: block id 3 at table index 1 is outside the 3 blocks"):
            sides(a, [0, 1], b, [0, 3], 5)
        with self.assertRaisesRegex(LayoutError, r"heads \[1, 3\) not inside the shared slice \[0, 2\)"):
            sides(a, [0], b, [0], 1, heads=(1, 3))
        with self.assertRaisesRegex(LayoutError, "cross the end of part"):
            Side(a, [0], 1, cols=[(0, 16)]).validate()


def native(name: str, ts: List[Any], block_size: int) -> List[Any]:
    """Each part's rows as the engine indexes them: views (blocks, block_size, held, width)."""
    if name in ("vllm-flash", "vllm-nhd", "vllm-hnd"):
        return [ts[0][0], ts[0][1]]
    if name == "vllm-flashinfer":
        return [ts[0][:, 0], ts[0][:, 1]]
    if name == "vllm-packed":
        d = ts[0].shape[-1] // 2
        t = ts[0].permute(0, 2, 1, 3)
        return [t[..., :d], t[..., d:]]
    if name == "ascend":
        return [ts[0], ts[1]]
    if name == "vllm-mla":
        return [t[:, :, None] for t in ts]
    if name == "ascend-mla":
        return [ts[0], ts[1]]
    # sglang: (tokens, heads, width) pools; a page is block_size tokens
    return [t.reshape(t.shape[0] // block_size, block_size, *t.shape[1:]) for t in ts]


def engine_tensors(name: str, blocks: int, bs: int, held: int, d: int, dtype: Any, layers: int = 1,
                   seed: int = 0) -> Tuple[Any, List[List[Any]]]:
    """(allocation, per layer the tensors) as each engine allocates and slices them."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"vllm-flash": (2, blocks, bs, held, d), "vllm-nhd": (2, blocks, bs, held, d),
              "vllm-hnd": (2, blocks, held, bs, d), "vllm-flashinfer": (blocks, 2, bs, held, d),
              "vllm-packed": (blocks, held, bs, 2 * d), "vllm-mla": (blocks, bs, 576),
              "ascend": (2, blocks, bs, held, d), "sglang": (2, blocks * bs, held, d), "sglang-mla": (blocks * bs, 1, 576)}
    if name == "ascend-mla":
        lat = torch.randn((layers, blocks, bs, 1, 512), generator=g).to(dtype)
        rope = torch.randn((layers, blocks, bs, 1, 64), generator=g).to(dtype)
        return (lat, rope), [[lat[i], rope[i]] for i in range(layers)]
    big = torch.randn((layers,) + shapes[name], generator=g).to(dtype)
    if name == "vllm-hnd":
        return big, [[big[i].permute(0, 1, 3, 2, 4)] for i in range(layers)]
    if name in ("ascend", "sglang"):
        return big, [[big[i][0], big[i][1]] for i in range(layers)]
    return big, [[big[i]] for i in range(layers)]


def logical(name: str, ts: List[Any], bs: int, blk: Any, slot: Any) -> Any:
    """Rows (T, held, row_width) of tokens at (blk, slot), parts concatenated in logical order."""
    return torch.cat([p[blk, slot] for p in native(name, ts, bs)], -1)


@unittest.skipIf(torch is None, WHY)
class TestFromTensor(unittest.TestCase):
    # blocks 3, block size 4, 2 of 4 heads held, head size 8, f16: hand-computed strides in bytes
    WANT = {
        "vllm-flash": [("k", 8, 0, 0, 128, 32, 16), ("v", 8, 0, 384, 128, 32, 16)],
        "vllm-hnd": [("k", 8, 0, 0, 128, 16, 64), ("v", 8, 0, 384, 128, 16, 64)],
        "vllm-flashinfer": [("k", 8, 0, 0, 256, 32, 16), ("v", 8, 0, 128, 256, 32, 16)],
        "vllm-packed": [("k", 8, 0, 0, 256, 32, 128), ("v", 8, 0, 16, 256, 32, 128)],
        "ascend": [("k", 8, 0, 0, 128, 32, 16), ("v", 8, 1, 0, 128, 32, 16)],
        "sglang": [("k", 8, 0, 0, 128, 32, 16), ("v", 8, 1, 0, 128, 32, 16)],
        "vllm-mla": [("kv_c", 576, 0, 0, 4608, 1152, 0)],
        "ascend-mla": [("latent", 512, 0, 0, 4096, 1024, 0), ("rope", 64, 1, 0, 512, 128, 0)],
        "sglang-mla": [("kv_c", 576, 0, 0, 4608, 1152, 0)],
    }

    def test_table(self) -> None:
        for name, want in self.WANT.items():
            mla = "mla" in name
            _, layers = engine_tensors(name, 3, 4, 2, 8, torch.float16, layers=2)
            lo, hi, heads = (0, 1, 1) if mla else (2, 4, 4)
            got = from_tensor(layers[1], name, lo, hi, heads, page_size=4 if "sglang" in name else None)
            self.assertEqual(got, Layout(DType.F16, 4, 3, heads, lo, hi, parts(*want)), name)
            # the preset of the same name describes the same memory
            self.assertEqual(got, preset(name, dtype="f16", blocks=3, block_size=4, heads=heads, head_lo=lo,
                                         head_hi=hi, head_size=None if mla else 8), name)

    def test_offsets_in_a_larger_region(self) -> None:
        big, layers = engine_tensors("vllm-flash", 3, 4, 2, 8, torch.float16, layers=2)
        got = from_tensor(layers[1], "vllm-flash", 0, 2, 2, base=big)
        self.assertEqual([p.offset for p in got.parts], [768, 1152])
        # ascend K and V as views of one (2, ...) tensor registered whole
        a, layers = engine_tensors("ascend", 3, 4, 2, 8, torch.float16, layers=2)
        got = from_tensor(layers[1], "ascend", 0, 2, 2, base=[a, a])
        self.assertEqual([(p.tensor, p.offset) for p in got.parts], [(0, 768), (1, 1152)])
        with self.assertRaisesRegex(LayoutError, "not inside its base region"):
            from_tensor(layers[0], "ascend", 0, 2, 2, base=[a[1], a[1]])

    def test_explicit_roles_and_refusals(self) -> None:
        # the physical HND tensor with its own dim order gives the same layout as vLLM's view
        big, layers = engine_tensors("vllm-hnd", 3, 4, 2, 8, torch.float16)
        roles = [(("kv", "block", "head", "slot", "chan"), ("k", "v"))]
        self.assertEqual(from_tensor(big[0], roles, 0, 2, 4), from_tensor(layers[0], "vllm-hnd", 0, 2, 4))
        # packed MLA in one tensor, split unevenly
        t = torch.zeros((3, 4, 576), dtype=torch.bfloat16)
        got = from_tensor(t, [(("block", "slot", "chan"), ("latent", "rope"))], 0, 1, 1, widths=[512, 64])
        self.assertEqual([(p.name, p.width, p.offset) for p in got.parts], [("latent", 512, 0), ("rope", 64, 1024)])
        cases = [
            (lambda: from_tensor(layers[0], "vllm-hnd", 0, 1, 4), "hold 2 heads, the slice \\[0, 1\\) is 1"),
            (lambda: from_tensor(layers[0], "ascend", 0, 2, 4), "1 tensors given, the layout has 2"),
            (lambda: from_tensor(big[0], "vllm-packed", 0, 2, 4), "expected 4 dims"),
            (lambda: from_tensor(torch.zeros(3, 4, 2, 8, dtype=torch.uint8), "vllm-packed", 0, 2, 4),
             "no kv layout dtype"),
            (lambda: from_tensor(torch.zeros(3, 4, 2, 8, dtype=torch.float16).transpose(2, 3), "vllm-packed", 0, 4, 4),
             "channels are not contiguous"),
            (lambda: from_tensor(layers[0], "vllm-flash", 0, 2, 4, head_size=16), "8 wide in the tensor, 16 expected"),
            (lambda: from_tensor(torch.zeros(3, 2, 8), "sglang-mla", 0, 1, 1), "needs page_size"),
            (lambda: from_tensor(layers[0], "vllm-tpu", 0, 2, 4), "unknown kv layout preset"),
        ]
        for fn, msg in cases:
            with self.assertRaisesRegex(LayoutError, msg):
                fn()
        u8 = from_tensor(torch.zeros(3, 2, 4, 16, dtype=torch.uint8), "vllm-packed", 0, 2, 4, dtype="fp8_e4m3")
        self.assertEqual((u8.dtype, u8.parts[1].offset), (DType.FP8_E4M3, 8))


@unittest.skipIf(torch is None, WHY)
class TestMapper(unittest.TestCase):
    """Logical-row equality of gather then scatter over pairs of presets, untouched rows checked."""

    def move_and_check(self, rng: random.Random, na: str, nb: str, bsa: int, bsb: int, heads: int,
                       sa_split: Tuple[int, int], sb_split: Tuple[int, int], layers: int = 2) -> None:
        mla = "mla" in na
        d = 8
        why = "%s/%d%s -> %s/%d%s" % (na, bsa, sa_split, nb, bsb, sb_split)
        (alo, ahi), (blo, bhi) = sa_split, sb_split
        blocks_a, blocks_b = (bsa + 40) // bsa + 3, (bsb + 40) // bsb + 3
        _, ta = engine_tensors(na, blocks_a, bsa, ahi - alo, d, torch.float16, layers, seed=rng.randrange(1 << 30))
        bb, tb = engine_tensors(nb, blocks_b, bsb, bhi - blo, d, torch.float16, layers, seed=rng.randrange(1 << 30))
        la = from_tensor(ta[0], na, alo, ahi, heads, page_size=bsa if "sglang" in na else None)
        lb = from_tensor(tb[0], nb, blo, bhi, heads, page_size=bsb if "sglang" in nb else None)
        tokens = rng.randint(1, 40)
        fa, fb = rng.randrange(bsa), rng.randrange(bsb)
        table_a = rng.sample(range(blocks_a), (fa + tokens - 1) // bsa + 1)
        table_b = rng.sample(range(blocks_b), (fb + tokens - 1) // bsb + 1)
        before = [[x.clone() for x in layer] for layer in tb]
        sa, sb = sides(la, table_a, lb, table_b, tokens, fa, fb)
        data = gather(sa, ta)
        self.assertEqual(len(data), sa.nbytes(layers), why)
        scatter(sb, tb, data)
        lo, hi = max(alo, blo), min(ahi, bhi)
        ta_pos = torch.arange(fa, fa + tokens)
        tb_pos = torch.arange(fb, fb + tokens)
        blk_a, slot_a = torch.tensor(table_a)[ta_pos // bsa], ta_pos % bsa
        blk_b, slot_b = torch.tensor(table_b)[tb_pos // bsb], tb_pos % bsb
        for layer in range(layers):
            src = logical(na, ta[layer], bsa, blk_a, slot_a)[:, lo - alo:hi - alo]
            dst = logical(nb, tb[layer], bsb, blk_b, slot_b)[:, lo - blo:hi - blo]
            self.assertTrue(torch.equal(src, dst), "%s: layer %d rows differ" % (why, layer))
            # every other row of the destination is as it was
            moved = torch.zeros((blocks_b, bsb, bhi - blo), dtype=torch.bool)
            moved[blk_b[:, None], slot_b[:, None], torch.arange(lo - blo, hi - blo)[None, :]] = True
            for now, was in zip(native(nb, tb[layer], bsb), native(nb, before[layer], bsb)):
                self.assertTrue(torch.equal(now[~moved], was[~moved]), "%s: layer %d rows not moved changed" % (why, layer))
        if not mla:
            self.assertGreater(hi - lo, 0)

    def test_every_pair(self) -> None:
        rng = random.Random(18)
        mha = ["vllm-flash", "vllm-hnd", "vllm-flashinfer", "vllm-packed", "ascend", "sglang"]
        splits = {1: [(0, 4)], 2: [(0, 2), (2, 4)], 4: [(0, 1), (1, 2), (2, 3), (3, 4)]}
        for na, nb in itertools.product(mha, mha):
            for _ in range(2):
                bsa = rng.choice([1, 16] if "sglang" in na else [16, 64])
                bsb = rng.choice([1, 16] if "sglang" in nb else [16, 64])
                pa, pb = rng.choice([1, 2, 4]), rng.choice([1, 2, 4])
                sa = rng.choice(splits[pa])
                sb = rng.choice([s for s in splits[pb] if max(s[0], sa[0]) < min(s[1], sa[1])])
                self.move_and_check(rng, na, nb, bsa, bsb, 4, sa, sb)
        # block 128 (Ascend) both ways, halves of the heads into all of them
        self.move_and_check(rng, "ascend", "vllm-hnd", 128, 16, 4, (0, 2), (0, 4), layers=1)
        self.move_and_check(rng, "ascend", "vllm-hnd", 128, 16, 4, (2, 4), (0, 4), layers=1)
        self.move_and_check(rng, "vllm-packed", "ascend", 16, 128, 4, (0, 4), (2, 4), layers=1)
        mla = ["vllm-mla", "ascend-mla", "sglang-mla"]
        for na, nb in itertools.product(mla, mla):
            self.move_and_check(rng, na, nb, 1 if "sglang" in na else 16, 1 if "sglang" in nb else 64, 1, (0, 1), (0, 1))

    def test_canonical_order(self) -> None:
        # vllm-packed to the stream: per layer, column range (K then V), token, head
        _, ts = engine_tensors("vllm-packed", 4, 2, 2, 3, torch.float32, layers=2)
        lay = from_tensor(ts[0], "vllm-packed", 0, 2, 2)
        side = Side(lay, [3, 1], 3, first_token=1)
        got = gather_tensor(side, ts).view(torch.float32)
        want = []
        for layer in ts:
            t = layer[0]  # (blocks, heads, slot, 6)
            for c0, c1 in ((0, 3), (3, 6)):
                for blk, slot in ((3, 1), (1, 0), (1, 1)):
                    for h in range(2):
                        want.append(t[blk, h, slot, c0:c1])
        self.assertTrue(torch.equal(got, torch.cat(want)))

    def test_scatter_refuses_wrong_length(self) -> None:
        _, ts = engine_tensors("ascend", 4, 2, 2, 3, torch.float32)
        before = [x.clone() for x in ts[0]]
        side = Side(from_tensor(ts[0], "ascend", 0, 2, 2), [0, 1], 3)
        with self.assertRaisesRegex(LayoutError, "143 bytes given, the transfer has 144"):
            scatter(side, ts, bytes(143))
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(ts[0], before)))
        scatter(side, ts, bytes(144))
        self.assertFalse(all(torch.equal(a, b) for a, b in zip(ts[0], before)))


if __name__ == "__main__":
    unittest.main()
