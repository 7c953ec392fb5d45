"""Drive NIXL or Mooncake Transfer Engine between two local processes.

One process is the target (it registers a buffer and waits); the other is the
initiator (it registers its own buffer and WRITEs --size bytes into the target's
in --block pieces, --iters times). The initiator prints one JSON line:
{"peer":..., "device":..., "gbps":[per-iteration GB/s, 1e9 bytes], "verify":...}.

--device cpu (default) puts both buffers in host memory (numpy); cuda:N puts
this process's buffer on GPU N (a torch tensor; NIXL registers it as VRAM,
Mooncake by its device address). The initiator's buffer holds a known pattern
(each 8-byte word a function of its index), the target's starts zeroed; after
the timed transfers the target compares every destination block with what the
pattern and the placement say it must hold and reports "ok" or what differs,
which the initiator puts in its JSON as "verify".

--pattern ranges keeps offsets (piece i of the source goes to piece i of the
destination); blocks sends the pieces to destination blocks in a random order,
as `stagectl bench --pattern blocks` does, so that neither peer can merge
neighbouring descriptors into one large write.

--streams N: NIXL gets N UCX workers and the transfer split into N requests
posted together; Mooncake gets N lanes per peer (MC_TCP_LANES_PER_PEER, set by
the caller) and the batch split over N Python threads each submitting its own
batch.

Usage (peer-compare.sh runs these):
  peer.py nixl target    --port P --size S --block B --pattern ranges|blocks --ready FILE --streams N [--device D]
  peer.py nixl initiator --port P --size S --block B --iters I --pattern ranges|blocks --ready FILE --streams N [--device D]
  peer.py mooncake target    --size S --block B --pattern ... --ready FILE [--device D]
  peer.py mooncake initiator --size S --block B --iters I --pattern ... --ready FILE --streams N [--device D]
The target writes what the initiator needs (its buffer address and device,
and for Mooncake its session name) to --ready; the initiator waits for that
file. The target writes its check of the destination to FILE.verify.
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


def wait_file(path, timeout=60.0, must=True):
    """The JSON object a peer published at path, once it is there; on timeout
    die (must) or return None."""
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path) as f:
                txt = f.read()
            if txt.endswith("\n"):
                return json.loads(txt)
        time.sleep(0.05)
    if must:
        die(f"the target did not write {path} within {timeout:.0f}s; see its log")
    return None


def publish(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(obj) + "\n")
    os.replace(tmp, path)


def cuda_index(device):
    return int(device.split(":", 1)[1]) if device.startswith("cuda:") else -1


class Buffer:
    """size bytes, zeroed and touched before timing: host memory (numpy) for
    --device cpu, else a torch tensor on that GPU. addr, mem ("DRAM" or
    "VRAM", NIXL's names) and dev (the GPU's index, 0 for host memory) are
    what the peers register and address."""

    def __init__(self, size, device):
        self.size, self.device = size, device
        if device == "cpu":
            self.arr = np.empty(size, dtype=np.uint8)
            self.arr[:] = 0  # touch every page (np.zeros would not)
            self.addr, self.mem, self.dev = self.arr.ctypes.data, "DRAM", 0
        else:
            import torch

            self.torch = torch
            self.dev = cuda_index(device)
            self.t = torch.zeros(size, dtype=torch.uint8, device=device)
            torch.cuda.synchronize(self.dev)
            self.addr, self.mem = self.t.data_ptr(), "VRAM"

    def load(self, host):
        """Copy host (a numpy uint8 array of size bytes) into the buffer."""
        if self.device == "cpu":
            self.arr[:] = host
        else:
            self.t.copy_(self.torch.from_numpy(host))
            self.torch.cuda.synchronize(self.dev)

    def host(self):
        """The buffer's bytes as a numpy array (a copy for GPU memory)."""
        if self.device == "cpu":
            return self.arr
        self.torch.cuda.synchronize(self.dev)
        return self.t.cpu().numpy()


def pattern(size):
    """The source bytes: 8-byte word k holds k * an odd constant (mod 2^64),
    so no two words are alike and a misplaced block cannot pass the check."""
    w = np.arange(size // 8, dtype=np.uint64)
    w *= np.uint64(0x9E3779B97F4A7C15)
    w += np.uint64(0x5DEECE66D)
    return w.view(np.uint8)


def placement(n, pattern, seed=1):
    dst = list(range(n))
    if pattern == "blocks":
        random.Random(seed).shuffle(dst)
    return dst


def check(buf, args):
    """Compare every destination block with the source block placed there:
    "ok", or how many blocks differ and the first."""
    n = args.size // args.block
    got = buf.host().reshape(n, args.block)
    src = pattern(args.size).reshape(n, args.block)
    inv = np.empty(n, dtype=np.int64)
    inv[placement(n, args.pattern)] = np.arange(n)  # destination block j holds source block inv[j]
    step = max(1, (64 << 20) // args.block)
    bad = []
    for j in range(0, n, step):
        rows = np.flatnonzero((got[j:j + step] != src[inv[j:j + step]]).any(axis=1))
        bad.extend((rows + j).tolist())
    if not bad:
        return "ok"
    return f"failed: {len(bad)} of {n} destination blocks differ (first: block {bad[0]})"


def check_and_publish(buf, args, tries=1):
    """The target's side of the check, written to --ready.verify. tries > 1
    looks again a second later while blocks differ (for a peer whose
    completion may precede the last bytes' landing)."""
    for k in range(1, tries + 1):
        verdict = check(buf, args)
        if verdict == "ok" or k == tries:
            break
        time.sleep(1)
    publish(args.ready + ".verify", {"verify": verdict, "looks": k})


def verdict(args):
    """The initiator's view of the target's check."""
    v = wait_file(args.ready + ".verify", timeout=args.verify_timeout, must=False)
    if v is None:
        return f"no answer from the target within {args.verify_timeout:.0f}s"
    return v["verify"] + (f" (at look {v['looks']})" if v.get("looks", 1) > 1 else "")


def source(args):
    buf = Buffer(args.size, args.device)
    buf.load(pattern(args.size))
    return buf


def split(seq, k):
    k = max(1, min(k, len(seq)))
    q, r = divmod(len(seq), k)
    out, i = [], 0
    for j in range(k):
        step = q + (1 if j < r else 0)
        out.append(seq[i:i + step])
        i += step
    return out


def report(args, rates):
    return {"peer": args.peer, "device": args.device, "gbps": rates, "verify": verdict(args)}


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
    buf = Buffer(args.size, args.device)
    agent.register_memory([(buf.addr, args.size, buf.dev, "")], buf.mem)
    publish(args.ready, {"addr": buf.addr, "dev": buf.dev, "mem": buf.mem})
    # Serve metadata until the initiator says it is done (a notification).
    end = time.time() + args.timeout
    while time.time() < end:
        notifs = agent.get_new_notifs()
        if any(b"bye" in m for msgs in notifs.values() for m in msgs):
            check_and_publish(buf, args)
            os._exit(0)  # skip the agent's teardown, which crashed here at exit
        time.sleep(0.01)
    die("target: no 'bye' from the initiator before --timeout")


def nixl_initiator(args):
    # NIXL's metadata exchange runs on each agent's listener thread, so the
    # initiator listens too (on --port + 1).
    args.port += 1
    agent = nixl_agent("initiator", args, listen=True)
    args.port -= 1
    buf = source(args)
    agent.register_memory([(buf.addr, args.size, buf.dev, "")], buf.mem)
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
                                  [(buf.addr + i * args.block, args.block, buf.dev) for i in range(n)], buf.mem)
    remote = agent.prep_xfer_dlist("target",
                                   [(info["addr"] + i * args.block, args.block, info["dev"]) for i in range(n)],
                                   info["mem"])
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
    print(json.dumps(report(args, rates)), flush=True)
    os._exit(0)  # as the target: no teardown


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
    buf = Buffer(args.size, args.device)
    if te.register_memory(buf.addr, args.size) != 0:
        die("Mooncake: register_memory failed on the target")
    publish(args.ready, {"addr": buf.addr, "dev": buf.dev, "mem": buf.mem,
                         "session": f"127.0.0.1:{te.get_rpc_port()}"})
    end = time.time() + args.timeout
    while time.time() < end and not os.path.exists(args.ready + ".done"):
        time.sleep(0.05)
    if os.path.exists(args.ready + ".done"):
        # A few looks: the TCP transport's older framing may report a write
        # done once it has left the initiator, before the target applied it.
        check_and_publish(buf, args, tries=5)
    os._exit(0)  # skip the engine's teardown


def mc_initiator(args):
    te = mc_engine()
    buf = source(args)
    if te.register_memory(buf.addr, args.size) != 0:
        die("Mooncake: register_memory failed on the initiator")
    info = wait_file(args.ready)
    n = args.size // args.block
    dst = placement(n, args.pattern)
    parts = split(list(range(n)), args.streams)
    batches = [([buf.addr + i * args.block for i in p],
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
    print(json.dumps(report(args, rates)), flush=True)
    os._exit(0)  # skip the engine's teardown, which crashed here at exit


def device_arg(v):
    if v == "cpu" or (v.startswith("cuda:") and v[5:].isdigit()):
        return v
    raise argparse.ArgumentTypeError(f"want cpu or cuda:N, got {v!r}")


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
    p.add_argument("--device", type=device_arg, default="cpu", help="cpu, or cuda:N for this process's buffer")
    p.add_argument("--ready", required=True)
    p.add_argument("--prog-thread", type=int, default=1, help="NIXL: run the agent's progress thread (1) or not (0)")
    p.add_argument("--mc-batch", type=int, default=1024)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--verify-timeout", type=float, default=60, help="initiator: how long to wait for the target's check")
    args = p.parse_args()
    if args.size % args.block or args.block % 8:
        die("--size must be a multiple of --block, and --block of 8")
    if args.device != "cpu":
        # torch first: NIXL's meta package picks its CUDA build (nixl_cu13 for
        # torch's CUDA 13) from the torch already imported.
        import torch

        if not torch.cuda.is_available() or cuda_index(args.device) >= torch.cuda.device_count():
            die(f"--device {args.device}: torch sees {torch.cuda.device_count()} CUDA device(s)")
        torch.cuda.set_device(cuda_index(args.device))
    {("nixl", "target"): nixl_target, ("nixl", "initiator"): nixl_initiator,
     ("mooncake", "target"): mc_target, ("mooncake", "initiator"): mc_initiator}[(args.peer, args.role)](args)


if __name__ == "__main__":
    main()
