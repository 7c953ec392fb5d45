"""A worked KV connector: what a prefill and a decode engine do with stage.

Run it against the two sidecars `stagectl demo --hold` leaves running (it
prints both sockets):

    ./bin/stagectl demo --hold &
    python3 python/examples/kv_connector.py --prefill PREFILL_SOCK --decode DECODE_SOCK

Each engine registers its paged KV cache once (one region per layer, all in
one allocation). Then, per request, the prefill engine pushes the request's
blocks into the blocks the decode engine allocated for it, and the decode
engine learns from its sidecar's notification, tagged with the request id,
that every byte has landed. Here both engines live in one process and the
cache is emulated device memory (a memfd); with CUDA, build the caches with
PagedKV.from_tensors over torch tensor views instead.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stage_client import Access, Client, PagedKV  # noqa: E402

LAYERS, BLOCKS, BLOCK = 8, 256, 16 << 10


async def serve_request(prefill: PagedKV, notes, req: str, src, dst) -> float:
    """Push one request's KV blocks and wait until decode is told they landed."""
    t0 = time.monotonic()
    ids = prefill.push_blocks("decode", src, dst, tag=req, remote="decode-kv")
    await asyncio.gather(*(prefill.client.wait_async(i) for i in ids))
    # The decode engine starts when its sidecar says the request landed.
    while True:
        n = await asyncio.get_running_loop().run_in_executor(None, notes.get, 10.0)
        if n is None:
            raise TimeoutError("no notification for %s" % req)
        if n.tag == req:
            if n.code != 0:
                raise RuntimeError("%s failed on decode: %s" % (req, n.message))
            return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefill", required=True, help="prefill sidecar's control socket (route 'decode' leads to the other)")
    ap.add_argument("--decode", required=True, help="decode sidecar's control socket")
    ap.add_argument("--requests", type=int, default=16)
    args = ap.parse_args()

    with Client(args.prefill) as pc, Client(args.decode) as dc:
        prefill = PagedKV.hostmem(pc, "prefill-kv", LAYERS, BLOCKS, BLOCK, access=Access.LOCAL_READ)
        decode = PagedKV.hostmem(dc, "decode-kv", LAYERS, BLOCKS, BLOCK, access=Access.REMOTE_WRITE)
        notes = dc.subscribe()
        rng = random.Random(7)
        prefill.buffer[:] = rng.randbytes(len(prefill.buffer))
        free = list(range(BLOCKS))
        rng.shuffle(free)

        async def run():
            times = []
            for r in range(args.requests):
                n = rng.randint(4, 16)                      # this request's KV blocks
                src = rng.sample(range(BLOCKS), n)          # where prefill computed them
                dst = [free.pop() for _ in range(n)]        # where decode allocated them
                times.append(await serve_request(prefill, notes, "req-%d" % r, src, dst))
                for layer in range(LAYERS):                 # decode checks what it got
                    got, want = decode.layer(layer), prefill.layer(layer)
                    for s, d in zip(src, dst):
                        if got[d * BLOCK:(d + 1) * BLOCK] != want[s * BLOCK:(s + 1) * BLOCK]:
                            raise AssertionError("req-%d layer %d block %d differs" % (r, layer, d))
                free.extend(dst)                            # decode finished with them
            return times

        times = asyncio.run(run())
        decode.close()
        prefill.close()
    times.sort()
    print("%d requests, every byte verified; push-to-notified p50 %.0f us, max %.0f us" % (
        len(times), times[len(times) // 2] * 1e6, times[-1] * 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
