"""A worked KV connector: what a prefill and its decode engines do with stage.

Run it against the sidecars `stagectl demo --hold` leaves running (it
prints their sockets), one prefill and one or more decodes whose sidecars
are all peers of the prefill's route "decode":

    ./bin/stagectl demo --hold &
    python3 python/examples/kv_connector.py --prefill PREFILL_SOCK --decode DECODE_SOCK [--decode DECODE2_SOCK]

Each engine registers its paged KV cache once (one region per layer, all in
one allocation), under one name on every decode ("decode-kv"), as identical
decode pods do. Then, per request, the router picks a decode; the prefill
engine pushes the request's blocks into the blocks that decode allocated
for it, naming the decode (``peer=``, its sidecar's node name) so the bytes
land there and nowhere else; and that decode learns from its sidecar's
notification, tagged with the request id, that every byte has landed. On a
route of several decodes, a push naming none is refused. Here all engines
live in one process and the caches are emulated device memory (a memfd);
with CUDA, build the caches with PagedKV.from_tensors over torch tensor
views instead.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from typing import Any, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stage_client import Access, Client, PagedKV  # noqa: E402

LAYERS, BLOCKS, BLOCK = 8, 256, 16 << 10


class Decode:
    """One decode engine: its sidecar's node name, its cache, its free blocks."""

    def __init__(self, sock: str, rng: random.Random) -> None:
        self.client = Client(sock)
        self.node = self.client.stats()["node"]          # what peer= names
        self.kv = PagedKV.hostmem(self.client, "decode-kv", LAYERS, BLOCKS, BLOCK, access=Access.REMOTE_WRITE)
        self.notes = self.client.subscribe()
        self.free = list(range(BLOCKS))
        rng.shuffle(self.free)

    def close(self) -> None:
        self.kv.close()
        self.client.close()


async def serve_request(prefill: PagedKV, dec: Decode, req: str, src: List[int], dst: List[int]) -> float:
    """Push one request's KV blocks to its decode and wait until it is told they landed."""
    t0 = time.monotonic()
    ids = prefill.push_blocks("decode", src, dst, tag=req, remote="decode-kv", peer=dec.node)
    await asyncio.gather(*(prefill.client.wait_async(i) for i in ids))
    # The decode engine starts when its sidecar says the request landed.
    while True:
        n = await asyncio.get_running_loop().run_in_executor(None, dec.notes.get, 10.0)
        if n is None:
            raise TimeoutError("no notification for %s on %s" % (req, dec.node))
        if n.tag == req:
            if n.code != 0:
                raise RuntimeError("%s failed on %s: %s" % (req, dec.node, n.message))
            return time.monotonic() - t0


def check(prefill: PagedKV, dec: Decode, src: List[int], dst: List[int], req: str) -> None:
    """The decode got exactly the request's blocks."""
    for layer in range(LAYERS):
        got, want = dec.kv.layer(layer), prefill.layer(layer)
        for s, d in zip(src, dst):
            if got[d * BLOCK:(d + 1) * BLOCK] != want[s * BLOCK:(s + 1) * BLOCK]:
                raise AssertionError("%s layer %d block %d differs on %s" % (req, layer, d, dec.node))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefill", required=True, help="prefill sidecar's control socket (its route 'decode' leads to the decodes)")
    ap.add_argument("--decode", required=True, action="append", help="a decode sidecar's control socket (repeat for each)")
    ap.add_argument("--requests", type=int, default=16)
    args = ap.parse_args()

    rng = random.Random(7)
    decs: List[Any] = []
    with Client(args.prefill) as pc:
        prefill = PagedKV.hostmem(pc, "prefill-kv", LAYERS, BLOCKS, BLOCK, access=Access.LOCAL_READ)
        prefill.buffer[:] = rng.randbytes(len(prefill.buffer))
        decs = [Decode(s, rng) for s in args.decode]
        served = {d.node: 0 for d in decs}

        async def run() -> List[float]:
            times = []
            for r in range(args.requests):
                dec = decs[rng.randrange(len(decs))]        # the router's choice
                n = rng.randint(4, 16)                      # this request's KV blocks
                src = rng.sample(range(BLOCKS), n)          # where prefill computed them
                dst = [dec.free.pop() for _ in range(n)]    # where that decode allocated them
                times.append(await serve_request(prefill, dec, "req-%d" % r, src, dst))
                check(prefill, dec, src, dst, "req-%d" % r)
                served[dec.node] += 1
                dec.free.extend(dst)                        # decode finished with them
            return times

        try:
            times = asyncio.run(run())
        finally:
            for d in decs:
                d.close()
            prefill.close()
    times.sort()
    print("%d requests over %d decodes (%s), every byte verified; push-to-notified p50 %.0f us, max %.0f us" % (
        len(times), len(decs), ", ".join("%s: %d" % kv for kv in sorted(served.items())),
        times[len(times) // 2] * 1e6, times[-1] * 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
