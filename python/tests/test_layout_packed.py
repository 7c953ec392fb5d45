"""vLLM's one 4-D KV tensor per layer (RFC #42082): packed K|V stored NHD, and the CPU backend's K-then-V blocks.

The engine's tensor is ``(blocks, heads, block_size, 2*head_size)``; the
tests fill it the way the engine's kernels index it (GPU backends: K is
``[..., :hs]`` and V ``[..., hs:]`` of a token's row; CPU_ATTN: each
(block, head) viewed as ``2*block_size`` rows, K the first block_size),
then read each row back at the byte offsets the layout gives. Every preset
is also compared with Go's ``kvlayout.Preset`` through
``kvlayout/testdata/presets.json``, which a Go test holds equal to Go's.
"""

from __future__ import annotations

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchenv import TORCH_WHY, torch  # noqa: E402

from stage_client.kvderive import preset, tensor_lens  # noqa: E402
from stage_client.layout import PRESETS, Layout, Part  # noqa: E402

GO_PRESETS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "kvlayout", "testdata", "presets.json")


class TestSameAsGo(unittest.TestCase):
    def test_every_preset(self) -> None:
        with open(GO_PRESETS) as f:
            cases = json.load(f)
        seen = set()
        for c in cases:
            seen.add(c["preset"])
            lay = preset(c["preset"], **c["params"])
            # a stride over an axis of one item addresses nothing: Python's are 0, Go keeps torch's (sglang-mla's head)
            self.assertEqual(lay, one_item_strides_zero(Layout.from_dict(c["layout"])), c)
            self.assertEqual(tensor_lens(c["preset"], lay), c["lens"], c)
        self.assertEqual(seen, set(PRESETS))


def one_item_strides_zero(lay: Layout) -> Layout:
    ps = tuple(Part(p.name, p.width, p.tensor, p.offset, 0 if lay.blocks == 1 else p.block_stride,
                    0 if lay.block_size == 1 else p.slot_stride, 0 if lay.head_hi - lay.head_lo == 1 else p.head_stride)
               for p in lay.parts)
    return Layout(lay.dtype, lay.block_size, lay.blocks, lay.heads, lay.head_lo, lay.head_hi, ps)


def engine_fill(name: str, t: "torch.Tensor", hs: int) -> "torch.Tensor":
    """Write K and V of each (block, slot, head) as the engine does; return the values, (B, N, H, 2, hs)."""
    B, H, N, _ = t.shape
    vals = torch.arange(B * N * H * 2 * hs, dtype=torch.float32).reshape(B, N, H, 2, hs)
    vals = (vals % 2039).to(t.dtype)  # distinct within f16's exact integers
    if name == "vllm-cpu":
        rows = t.view(B, H, 2 * N, hs)  # vLLM's CPU backend: K rows then V rows of a (block, head)
        rows[:, :, :N] = vals[:, :, :, 0].permute(0, 2, 1, 3)
        rows[:, :, N:] = vals[:, :, :, 1].permute(0, 2, 1, 3)
    else:
        t[..., :hs] = vals[:, :, :, 0].permute(0, 2, 1, 3)
        t[..., hs:] = vals[:, :, :, 1].permute(0, 2, 1, 3)
    return vals


@unittest.skipIf(torch is None, TORCH_WHY)
class TestEngineTensor(unittest.TestCase):
    def engine_tensor(self, name: str, B: int, N: int, H: int, hs: int) -> "torch.Tensor":
        if name == "vllm-packed-nhd":  # allocated (B, N, H, 2hs), handed on as (B, H, N, 2hs)
            return torch.zeros(B, N, H, 2 * hs, dtype=torch.float16).permute(0, 2, 1, 3)
        return torch.zeros(B, H, N, 2 * hs, dtype=torch.float16)

    def test_rows_at_the_layouts_offsets(self) -> None:
        from stage_client.kvmap import from_tensor
        for name in ("vllm-packed-nhd", "vllm-cpu", "vllm-packed", "vllm-packed-hnd"):
            for B, N, H, lo, heads, hs in ((3, 4, 2, 2, 4, 8), (2, 16, 3, 0, 3, 16)):
                with self.subTest(name=name, block_size=N, heads=H):
                    t = self.engine_tensor(name, B, N, H, hs)
                    vals = engine_fill(name, t, hs)
                    view = t.view(B, H, 2, N, hs) if name == "vllm-cpu" else t
                    got = from_tensor(view, name, lo, lo + H, heads)
                    want = preset(name, dtype="f16", blocks=B, block_size=N, heads=heads, head_lo=lo,
                                  head_hi=lo + H, head_size=hs)
                    self.assertEqual(got, want)
                    mem = t.contiguous() if name != "vllm-packed-nhd" else t.permute(0, 2, 1, 3).contiguous()
                    raw = mem.view(-1).view(torch.uint8)
                    self.assertEqual(raw.numel(), tensor_lens(name, want)[0])
                    for b in range(B):
                        for s in range(N):
                            for h in range(H):
                                for k, p in enumerate(want.parts):
                                    off = p.offset + b * p.block_stride + s * p.slot_stride + h * p.head_stride
                                    row = raw[off:off + p.width * 2].view(torch.float16)
                                    self.assertTrue(torch.equal(row, vals[b, s, h, k]), (b, s, h, p.name))


if __name__ == "__main__":
    unittest.main()
