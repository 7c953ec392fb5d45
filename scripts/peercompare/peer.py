"""Drive NIXL or Mooncake Transfer Engine between two local processes, host memory.

One process is the target (it registers a buffer and waits); the other is the
initiator (it registers its own buffer and WRITEs --size bytes into the target's
in --block pieces, --iters times). The initiator prints one JSON line:
{"peer":..., "gbps":[per-iteration GB/s, 1e9 bytes]}.

--pattern ranges keeps offsets (piece i of the source goes to piece i of the
destination); blocks sends the pieces to destination blocks in a random order,
as `stagectl bench --pattern blocks` does, so that neither peer can merge
neighbouring descriptors into one large write.

--streams N: NIXL gets N UCX workers and the transfer split into N requests
posted together; Mooncake gets N lanes per peer (MC_TCP_LANES_PER_PEER, set by
the caller) and the batch split over N Python threads each submitting its own
batch.

Usage (peer-compare.sh runs these):
  peer.py nixl target    --port P --size S --ready FILE --streams N
  peer.py nixl initiator --port P --size S --block B --iters I --pattern ranges|blocks --ready FILE --streams N
  peer.py mooncake target    --size S --ready FILE
  peer.py mooncake initiator --size S --block B --iters I --pattern ... --ready FILE --streams N
The target writes what the initiator needs (its buffer address, and for
Mooncake its session name) to --ready; the initiator waits for that file.
"""
import argparse
import json
import os
import random
import sys
import threading
import time

import numpy as np


def die(msg):
    print(f"peer.py: {msg}", file=sys.stderr)
    sys.exit(1)


def wait_file(path, timeout=60.0):
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path) as f:
                txt = f.read()
            if txt.endswith("\n"):
                return json.loads(txt)
        time.sleep(0.05)
    die(f"the target did not write {path} within {timeout:.0f}s; see its log")


def publish(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(obj) + "\n")
    os.replace(tmp, path)


def buffer(size):
    buf = np.empty(size, dtype=np.uint8)
    buf[:] = 7  # touch every page before timing
    return buf


def placement(n, pattern, seed=1):
    dst = list(range(n))
    if pattern == "blocks":
        random.Random(seed).shuffle(dst)
    return dst


def split(seq, k):
    k = max(1, min(k, len(seq)))
    q, r = divmod(len(seq), k)
    out, i = [], 0
    for j in range(k):
        step = q + (1 if j < r else 0)
        out.append(seq[i:i + step])
        i += step
    return out


# ---------------------------------------------------------------- NIXL
def nixl_agent(name, args, listen):
    from nixl._api import nixl_agent, nixl_agent_config

    conf = nixl_agent_config(enable_prog_thread=args.prog_thread, enable_listen_thread=listen,
                             listen_port=args.port if listen else 0, backends=[])
    agent = nixl_agent(name, conf)
    agent.create_backend("UCX", {"num_workers": str(args.streams)})
    return agent


def nixl_target(args):
    agent = nixl_agent("target", args, listen=True)
    buf = buffer(args.size)
    agent.register_memory([(buf.ctypes.data, args.size, 0, "")], "DRAM")
    publish(args.ready, {"addr": buf.ctypes.data})
    # Serve metadata until the initiator says it is done (a notification).
    end = time.time() + args.timeout
    while time.time() < end:
        notifs = agent.get_new_notifs()
        if any(b"bye" in m for msgs in notifs.values() for m in msgs):
            os._exit(0)  # skip the agent's teardown, which crashed here at exit
        time.sleep(0.01)
    die("target: no 'bye' from the initiator before --timeout")


def nixl_initiator(args):
    # NIXL's metadata exchange runs on each agent's listener thread, so the
    # initiator listens too (on --port + 1).
    args.port += 1
    agent = nixl_agent("initiator", args, listen=True)
    args.port -= 1
    buf = buffer(args.size)
    agent.register_memory([(buf.ctypes.data, args.size, 0, "")], "DRAM")
    info = wait_file(args.ready)
    agent.fetch_remote_metadata("target", "127.0.0.1", args.port)
    agent.send_local_metadata("127.0.0.1", args.port)
    end = time.time() + 30
    while not agent.check_remote_metadata("target"):
        if time.time() > end:
            die(f"NIXL: no metadata from the target agent on 127.0.0.1:{args.port}")
        time.sleep(0.01)
    n = args.size // args.block
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT",
                                  [(buf.ctypes.data + i * args.block, args.block, 0) for i in range(n)], "DRAM")
    remote = agent.prep_xfer_dlist("target",
                                   [(info["addr"] + i * args.block, args.block, 0) for i in range(n)], "DRAM")
    dst = placement(n, args.pattern)
    parts = split(list(range(n)), args.streams)
    handles = [agent.make_prepped_xfer("WRITE", local, np.array(p, dtype=np.int32), remote,
                                       np.array([dst[i] for i in p], dtype=np.int32)) for p in parts]

    def once():
        for h in handles:
            st = agent.transfer(h)
            if st == "ERR":
                die("NIXL: transfer posting failed")
        pending = list(handles)
        while pending:
            nxt = []
            for h in pending:
                st = agent.check_xfer_state(h)
                if st == "ERR":
                    die("NIXL: transfer failed")
                if st != "DONE":
                    nxt.append(h)
            pending = nxt

    once()  # warm-up: connects the workers
    rates = []
    for _ in range(args.iters):
        t = time.perf_counter()
        once()
        rates.append(args.size / (time.perf_counter() - t) / 1e9)
    agent.send_notif("target", b"bye")
    time.sleep(0.2)
    print(json.dumps({"peer": "nixl", "gbps": rates}))


# ------------------------------------------------------------ Mooncake
def mc_engine():
    from mooncake.engine import TransferEngine

    te = TransferEngine()
    # P2P handshake: no metadata server; the session name is host:rpc_port.
    rc = te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        die(f"Mooncake: TransferEngine.initialize(tcp, P2PHANDSHAKE) returned {rc}")
    return te


def mc_target(args):
    te = mc_engine()
    buf = buffer(args.size)
    if te.register_memory(buf.ctypes.data, args.size) != 0:
        die("Mooncake: register_memory failed on the target")
    publish(args.ready, {"addr": buf.ctypes.data, "session": f"127.0.0.1:{te.get_rpc_port()}"})
    end = time.time() + args.timeout
    while time.time() < end and not os.path.exists(args.ready + ".done"):
        time.sleep(0.05)


def mc_initiator(args):
    te = mc_engine()
    buf = buffer(args.size)
    if te.register_memory(buf.ctypes.data, args.size) != 0:
        die("Mooncake: register_memory failed on the initiator")
    info = wait_file(args.ready)
    n = args.size // args.block
    dst = placement(n, args.pattern)
    parts = split(list(range(n)), args.streams)
    batches = [([buf.ctypes.data + i * args.block for i in p],
                [info["addr"] + dst[i] * args.block for i in p],
                [args.block] * len(p)) for p in parts]
    errors = []

    def run(b):
        # Sub-batches of --mc-batch slices in all threads: one batch of all 16 KiB
        # blocks overflows the TCP transport's per-peer queue (rejected, -1).
        k = max(1, args.mc_batch // args.streams)
        for i in range(0, len(b[0]), k):
            rc = te.batch_transfer_sync_write(info["session"], b[0][i:i + k], b[1][i:i + k], b[2][i:i + k])
            if rc != 0:
                errors.append(rc)
                return

    def once():
        if len(batches) == 1:
            run(batches[0])
        else:
            ts = [threading.Thread(target=run, args=(b,)) for b in batches]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        if errors:
            die(f"Mooncake: batch_transfer_sync_write returned {errors[0]}")

    once()
    rates = []
    for _ in range(args.iters):
        t = time.perf_counter()
        once()
        rates.append(args.size / (time.perf_counter() - t) / 1e9)
    with open(args.ready + ".done", "w") as f:
        f.write("done\n")
    print(json.dumps({"peer": "mooncake", "gbps": rates}), flush=True)
    os._exit(0)  # skip the engine's teardown, which crashed here at exit


def main():
    p = argparse.ArgumentParser()
    p.add_argument("peer", choices=["nixl", "mooncake"])
    p.add_argument("role", choices=["target", "initiator"])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--size", type=int, default=256 << 20)
    p.add_argument("--block", type=int, default=1 << 20)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--pattern", choices=["ranges", "blocks"], default="ranges")
    p.add_argument("--streams", type=int, default=1)
    p.add_argument("--ready", required=True)
    p.add_argument("--prog-thread", type=int, default=1, help="NIXL: run the agent's progress thread (1) or not (0)")
    p.add_argument("--mc-batch", type=int, default=1024)
    p.add_argument("--timeout", type=float, default=300)
    args = p.parse_args()
    if args.size % args.block:
        die("--size must be a multiple of --block")
    {("nixl", "target"): nixl_target, ("nixl", "initiator"): nixl_initiator,
     ("mooncake", "target"): mc_target, ("mooncake", "initiator"): mc_initiator}[(args.peer, args.role)](args)


if __name__ == "__main__":
    main()
