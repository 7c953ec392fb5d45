"""A model decodes the same tokens after its KV cache moved between layouts (issue 18, Python side).

examples/tinylm.py prefills a batch of prompts with its cache in layout A
(block size, TP split and preset of one engine), the cache moves into
layout B (another block size, split and preset) through the reference
mapper in canonical order (each pair of ranks moving the heads they share),
and 64 greedy tokens decoded on B must equal those of one process that
prefilled and decoded without moving anything. The negative test copies
blocks byte for byte between two layouts, as a layout-blind transfer would,
and the tokens must differ: the comparison can fail.

float32 on the CPU; with CUDA the same runs in bfloat16 on the GPU too.
"""

from __future__ import annotations

import os
import random
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

try:
    import torch

    import tinylm
    WHY = ""
    HAVE_CUDA = bool(torch.cuda.is_available())
except ImportError:
    torch = None
    WHY = "torch is not installed"
    HAVE_CUDA = False

STEPS = 64


def prompts(seed: int, n: int = 6, vocab: int = 256):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(3, 190))] for _ in range(n)]


@unittest.skipIf(torch is None, WHY)
class TestTinyLM(unittest.TestCase):
    device, dtype = "cpu", None

    @classmethod
    def setUpClass(cls) -> None:
        torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
        cls.dtype = cls.dtype or torch.float32
        cls.cfg = tinylm.Config()
        cls.model = tinylm.TinyLM(cls.cfg, seed=7, dtype=cls.dtype, device=cls.device)
        cls.prompts = prompts(11)
        ref = cls.cache("vllm-flash", 16, 1, seed=1)
        cls.ref_logits = cls.model.prefill(cls.prompts, ref)
        cls.ref_tokens, cls.ref_step_logits = cls.model.decode(ref, cls.ref_logits, STEPS)

    @classmethod
    def cache(cls, preset: str, block_size: int, ranks: int, seed: int) -> "tinylm.Cache":
        blocks = sum(-(-(len(p) + STEPS) // block_size) for p in cls.prompts) + 8
        return tinylm.Cache(cls.cfg, preset, block_size, blocks, ranks, cls.dtype, cls.device, seed)

    def test_reference_is_sensitive(self) -> None:
        # A model that always says the same token would prove nothing.
        distinct = [len(set(row.tolist())) for row in self.ref_tokens]
        self.assertGreaterEqual(sum(distinct) / len(distinct), 8, distinct)

    def moved_run(self, a: str, bsa: int, pa: int, b: str, bsb: int, pb: int):
        src = self.cache(a, bsa, pa, seed=2)
        logits = self.model.prefill(self.prompts, src)
        self.assertTrue(torch.equal(logits, self.ref_logits), "prefill in %s/%d x %d differs" % (a, bsa, pa))
        dst = self.cache(b, bsb, pb, seed=3)
        moved = tinylm.move(src, dst)
        per_row = self.cfg.layers * 2 * self.cfg.head_size * torch.tensor([], dtype=self.dtype).element_size()
        # every (layer, token, head) row once: no rank replicates a head in these splits
        self.assertEqual(moved, sum(len(p) for p in self.prompts) * self.cfg.kv_heads * per_row)
        # the block tables really differ: random ids, other block sizes
        self.assertNotEqual(src.tables[0][0][:2], dst.tables[0][0][:2])
        return self.model.decode(dst, logits, STEPS)

    def check_same(self, a: str, bsa: int, pa: int, b: str, bsb: int, pb: int) -> None:
        tokens, logits = self.moved_run(a, bsa, pa, b, bsb, pb)
        why = "%s/%d x %d ranks -> %s/%d x %d" % (a, bsa, pa, b, bsb, pb)
        self.assertTrue(torch.equal(tokens, self.ref_tokens), "%s: tokens differ\n%s\n%s" % (why, tokens, self.ref_tokens))
        self.assertTrue(torch.equal(logits, self.ref_step_logits), why + ": decode logits differ")

    def test_ascend_two_ranks_to_vllm_hnd(self) -> None:
        self.check_same("ascend", 128, 2, "vllm-hnd", 16, 1)

    def test_vllm_flash_to_packed(self) -> None:
        self.check_same("vllm-flash", 16, 1, "vllm-packed", 64, 1)

    def test_sglang_to_vllm_flash(self) -> None:
        self.check_same("sglang", 1, 1, "vllm-flash", 16, 1)

    def test_one_rank_to_four(self) -> None:
        # a prefill rank holding all heads pushes to four decode ranks of one head each
        self.check_same("vllm-flashinfer", 64, 1, "ascend", 128, 4)

    def test_byte_copy_between_layouts_is_wrong(self) -> None:
        src = self.cache("vllm-flash", 16, 1, seed=2)
        logits = self.model.prefill(self.prompts, src)
        dst = self.cache("vllm-hnd", 16, 1, seed=3)
        for s, n in enumerate(src.lens):
            dst.reserve(s, n)
            dst.lens[s] = n
        # what a layout-blind transfer does: block i's bytes (K half and V half) land in block j unchanged
        a, b = src.ranks[0].alloc, dst.ranks[0].alloc  # (layers, 2, blocks, ...): same bytes per block
        for ta, tb in zip(src.tables[0], dst.tables[0]):
            ia, ib = torch.tensor(ta), torch.tensor(tb)
            b[:, :, ib] = a[:, :, ia].reshape(b[:, :, ib].shape)
        tokens, _ = self.model.decode(dst, logits, STEPS)
        self.assertFalse(torch.equal(tokens, self.ref_tokens), "a byte copy into another layout gave the same tokens")


@unittest.skipUnless(HAVE_CUDA, "CUDA is not available to torch" if torch is not None else WHY)
class TestTinyLMCUDA(TestTinyLM):
    """The same proof on the GPU in bfloat16 (exact equality still holds: the same math on the same values)."""

    device = "cuda"

    @classmethod
    def setUpClass(cls) -> None:
        cls.dtype = torch.bfloat16
        super().setUpClass()


if __name__ == "__main__":
    unittest.main()
