"""Two PyTorch processes move a KV cache through two CUDA sidecars.

The test process is the prefill engine; a child process is the decode
engine. Each registers per-layer views of one big tensor (so every region
sits at a non-zero offset inside a larger allocation) with its own staged
(device kind cuda). 1 GiB (STAGE_TORCH_E2E_BYTES) is pushed as 1 MiB ranges,
then as 16 KiB blocks in a random permutation, then pulled back; every layer
is compared by SHA-256 on both sides. Transport is TCP staging.

GPUs: STAGE_GPU_SRC (prefill) and STAGE_GPU_DST (decode), default 0 and 0.
Skipped without torch, CUDA or a staged binary.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
import unittest
from typing import List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchenv import CUDA_WHY as WHY, HAVE_CUDA, HERE, torch  # noqa: E402

from test_e2e import HAVE_STAGED, SKIP_WHY, Staged  # noqa: E402
from stage_client import Access, Block, Client  # noqa: E402

TOTAL = int(os.environ.get("STAGE_TORCH_E2E_BYTES", str(1 << 30)))
LAYERS = 4
SLACK = (1 << 20) + 4096 + 48  # bytes before the first layer inside the allocation
BLOCK = 16 << 10
SRC = int(os.environ.get("STAGE_GPU_SRC", "0"))
DST = int(os.environ.get("STAGE_GPU_DST", "0"))

# The decode engine: owns its tensor, answers commands on stdin, one per line.
CHILD = textwrap.dedent("""
    import hashlib, json, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    from stage_client import Access, Client
    sock, ordinal, layers, lb, slack = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    dev = torch.device("cuda", ordinal)
    big = torch.full((2 * slack + layers * lb,), 0xAB, dtype=torch.uint8, device=dev)
    views = [big[slack + i * lb: slack + (i + 1) * lb] for i in range(layers)]
    c = Client(sock)
    for i, v in enumerate(views):
        c.register_tensor("decode-kv/%d" % i, v, Access.REMOTE_WRITE | Access.REMOTE_READ, ordinal=ordinal)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "poison":
            big.fill_(0xAB); torch.cuda.synchronize(dev); print("ok", flush=True)
        elif cmd[0] == "hash":
            torch.cuda.synchronize(dev)
            hs = [hashlib.sha256(v.cpu().numpy().tobytes()).hexdigest() for v in views]
            guard = bool((big[:slack] == 0xAB).all().item() and (big[slack + layers * lb:] == 0xAB).all().item())
            print(json.dumps({"layers": hs, "guard": guard}), flush=True)
        elif cmd[0] == "quit":
            for i in range(layers):
                c.unregister("decode-kv/%d" % i)
            c.close(); print("bye", flush=True); break
""")


def sha(t: "torch.Tensor") -> str:
    return hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()


@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
@unittest.skipUnless(HAVE_CUDA, WHY)
class TorchE2E(unittest.TestCase):
    def test_kv_cache_between_two_torch_processes(self) -> None:
        lb = TOTAL // LAYERS
        lb -= lb % BLOCK
        dec = Staged("decode", slots=64, extra="device: {kind: cuda, ordinal: %d}\n" % DST)
        self.addCleanup(dec.stop)
        pre = Staged("prefill", route_to=dec.peers, slots=64, extra="device: {kind: cuda, ordinal: %d}\n" % SRC)
        self.addCleanup(pre.stop)
        pre.settle(1)
        # Engines and sidecars see the same GPU numbering here, so regions
        # are registered with the sidecar's configured ordinal.
        child = subprocess.Popen([sys.executable, "-c", CHILD, os.path.dirname(HERE), dec.socket, str(DST),
                                  str(LAYERS), str(lb), str(SLACK)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        self.addCleanup(child.kill)

        def ask(cmd: str) -> str:
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(cmd + "\n")
            child.stdin.flush()
            line = child.stdout.readline().strip()
            if not line:
                self.fail("decode engine died: %s" % dec.tail())
            return line

        self.assertEqual(child.stdout.readline().strip() if child.stdout else "", "ready")

        dev = torch.device("cuda", SRC)
        g = torch.Generator(device=dev).manual_seed(1234)
        big = torch.full((2 * SLACK + LAYERS * lb,), 0xAB, dtype=torch.uint8, device=dev)
        src = [big[SLACK + i * lb: SLACK + (i + 1) * lb] for i in range(LAYERS)]
        for v in src:
            v.copy_(torch.randint(0, 256, (lb,), generator=g, dtype=torch.uint8, device=dev))
        back_big = torch.full_like(big, 0xCD)
        back = [back_big[SLACK + i * lb: SLACK + (i + 1) * lb] for i in range(LAYERS)]
        c = pre.client
        for i in range(LAYERS):
            c.register_tensor("prefill-kv/%d" % i, src[i], Access.LOCAL_READ, ordinal=SRC)
            c.register_tensor("back-kv/%d" % i, back[i], Access.LOCAL_WRITE, ordinal=SRC)
        torch.cuda.synchronize(dev)

        def move(direction: str, local: str, ops_per_layer: List[List[Block]], tag: str) -> float:
            t0 = time.monotonic()
            ids = []
            for i, ops in enumerate(ops_per_layer):
                f = c.push if direction == "push" else c.pull
                ids.append(f("decode", "%s/%d" % (local, i), "decode-kv/%d" % i, ops, tag="%s-%d" % (tag, i)))
            c.wait_all(ids, timeout=300)
            dt = time.monotonic() - t0
            print("\n%s %s: %d MiB in %.3f s = %.2f GB/s (cuda:%d -> cuda:%d)" % (
                direction, tag, LAYERS * lb >> 20, dt, LAYERS * lb / dt / 1e9, SRC, DST), file=sys.stderr)
            return dt

        # 1. push as 1 MiB ranges
        move("push", "prefill-kv", [[Block(o, o, 1 << 20) for o in range(0, lb, 1 << 20)] for _ in range(LAYERS)], "ranges")
        got = json.loads(ask("hash"))
        self.assertTrue(got["guard"], "bytes around the decode regions changed")
        self.assertEqual(got["layers"], [sha(v) for v in src])

        # 2. push as 16 KiB blocks, each layer a random permutation, in random order
        self.assertEqual(ask("poison"), "ok")
        n = lb // BLOCK
        cg = torch.Generator().manual_seed(99)
        perms = [torch.randperm(n, generator=cg).tolist() for _ in range(LAYERS)]
        orders = [torch.randperm(n, generator=cg).tolist() for _ in range(LAYERS)]
        ops = [[Block(i * BLOCK, perms[l][i] * BLOCK, BLOCK) for i in orders[l]] for l in range(LAYERS)]
        move("push", "prefill-kv", ops, "blocks")
        want = []
        for l in range(LAYERS):
            exp = torch.empty_like(src[l]).view(n, BLOCK)
            exp[torch.tensor(perms[l], device=dev)] = src[l].view(n, BLOCK)
            want.append(sha(exp))
        got = json.loads(ask("hash"))
        self.assertTrue(got["guard"], "bytes around the decode regions changed")
        self.assertEqual(got["layers"], want)

        # 3. pull the blocks back, undoing the permutation: back must equal src
        pull_ops = [[Block(i * BLOCK, perms[l][i] * BLOCK, BLOCK) for i in orders[l]] for l in range(LAYERS)]
        move("pull", "back-kv", pull_ops, "blocks-back")
        torch.cuda.synchronize(dev)
        for l in range(LAYERS):
            self.assertTrue(torch.equal(back[l], src[l]), "layer %d differs after the pull" % l)
        self.assertTrue(bool((back_big[:SLACK] == 0xCD).all().item()), "bytes before the back regions changed")

        self.assertEqual(ask("quit"), "bye")
        child.wait(30)
        for i in range(LAYERS):
            c.unregister("prefill-kv/%d" % i)
            c.unregister("back-kv/%d" % i)


if __name__ == "__main__":
    unittest.main()
