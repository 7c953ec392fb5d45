"""stage as an SGLang transfer backend, loaded and driven through SGLang's own code (sglang installed).

* The ``stage`` entry point of group ``sglang.srt.plugins`` is loaded by
  SGLang's ``load_plugins()``; afterwards ``--disaggregation-transfer-backend
  stage`` parses with SGLang's own argument parser, ``TransferBackend("stage")``
  is a member, and SGLang's ``get_kv_class`` (also as prefill.py and decode.py
  imported it) gives SGLang's KVArgs and our manager, sender, receiver and
  bootstrap server.
* Conformance: every method of SGLang's installed BaseKVManager, BaseKVSender
  and BaseKVReceiver exists on ours and accepts the base's parameters (names,
  kinds, defaults), as inspect.signature reports them.
* Transfer: a prefill of two tensor-parallel ranks (two of four kv heads each)
  and a decode of one rank, each manager built by the class get_kv_class
  returned, from SGLang's KVArgs filled as prefill.py/decode.py fill them
  (pointers of SGLang-shaped MHA token pools: per layer K and V buffers of
  (tokens + page, heads, head_dim); SGLang's own MetadataBuffers as aux) and
  SGLang's ServerArgs; two real sidecars. One request goes bootstrap ->
  init(0) -> send_metadata -> pop_decode_prefix_len -> init -> send per chunk
  (should_send_kv_chunk) -> poll Success on both sides, as the prefill and
  decode loops call them. The decode's pages must equal the prefill's byte for
  byte, every other row of the decode's pool must be unchanged, and the aux
  slot (bootstrap_room included, which SGLang's metadata gate reads) must
  land. With decode_prefix_len > 0 the prefill's sender reports it, SGLang's
  prefill sends only the suffix pages, and the decode's prefix pages stay as
  they were.
"""

from __future__ import annotations

import inspect
import os
import random
import socket
import sys
import time
import unittest
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import test_sglang  # noqa: E402  (as a module: its test classes are not collected twice)
from test_e2e import HAVE_STAGED, SKIP_WHY  # noqa: E402

WHY = ""
try:
    import numpy as np
    import torch
    from importlib.metadata import entry_points, version

    import sglang  # noqa: F401
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins

    if "stage" not in {ep.name for ep in entry_points(group=GENERAL_PLUGINS_GROUP)}:
        WHY = ("stage-client's sglang.srt.plugins entry point is not installed in this environment: "
               "pip install --no-build-isolation --no-deps ./python")
    SGLANG_VERSION = version("sglang")
except ImportError as e:
    WHY = "sglang is not importable (%s): pip install sglang==0.5.23" % e
    SGLANG_VERSION = ""
if os.environ.get("STAGE_ENGINES_REQUIRED") == "1" and (WHY or not HAVE_STAGED):  # make test-engines-real
    raise RuntimeError(WHY or SKIP_WHY)

LAYERS, HEADS, D, PAGE, PAGES = 2, 4, 16, 8, 24
SLOTS = 8


def free_ports(n: int) -> int:
    """A port p with p .. p+n-1 free on 127.0.0.1 (prefill rank r serves the bootstrap port + r)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + n >= 65536:
            continue
        ok = True
        for q in range(p, p + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", q))
                except OSError:
                    ok = False
                    break
        if ok:
            return p
    raise AssertionError("no %d free consecutive ports" % n)


def poll_until(obj: Any, want: int, limit: float = 30.0) -> None:
    t0 = time.monotonic()
    while True:
        st = int(obj.poll())
        if st == want:
            return
        if st == 0 and want != 0:
            obj.failure_exception()
        if time.monotonic() - t0 > limit:
            raise AssertionError("poll %s after %ss, want %s" % (st, limit, want))
        time.sleep(0.01)


@unittest.skipIf(WHY, WHY)
class TestSGLangPlugin(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        load_plugins()  # what every SGLang process does first
        from sglang.srt.disaggregation import utils

        cls.U = utils

    def test_registered(self) -> None:
        import argparse

        import sglang.srt.disaggregation.decode as dec_mod
        import sglang.srt.disaggregation.prefill as pre_mod
        from sglang.srt.disaggregation.base.conn import KVArgs
        from sglang.srt.server_args import ServerArgs
        from stage_client import sglang as ours

        U = self.U
        p = argparse.ArgumentParser()
        ServerArgs.add_cli_args(p)
        a = p.parse_args(["--model-path", "m", "--disaggregation-transfer-backend", "stage"])
        self.assertEqual(a.disaggregation_transfer_backend, "stage")
        tb = U.TransferBackend(a.disaggregation_transfer_backend)
        self.assertIsInstance(tb, U.TransferBackend)
        self.assertNotEqual(tb, U.TransferBackend.MOONCAKE)
        want = {U.KVClassType.KVARGS: KVArgs, U.KVClassType.MANAGER: ours.SGLangKVManager,
                U.KVClassType.SENDER: ours.SGLangKVSender, U.KVClassType.RECEIVER: ours.SGLangKVReceiver,
                U.KVClassType.BOOTSTRAP_SERVER: ours.SGLangBootstrapServer}
        for fn in (U.get_kv_class, pre_mod.get_kv_class, dec_mod.get_kv_class):
            for ct, cls in want.items():
                self.assertIs(fn(tb, ct), cls, "%s %s" % (fn.__module__, ct))
        # the other backends still resolve as before
        self.assertEqual(U.get_kv_class(U.TransferBackend.FAKE, U.KVClassType.SENDER).__name__, "FakeKVSender")

    def test_signatures(self) -> None:
        from sglang.srt.disaggregation.base import conn
        from stage_client import sglang as ours

        for base, mine in [(conn.BaseKVManager, ours.SGLangKVManager), (conn.BaseKVSender, ours.SGLangKVSender),
                           (conn.BaseKVReceiver, ours.SGLangKVReceiver),
                           (conn.BaseKVBootstrapServer, ours.SGLangBootstrapServer)]:
            for name, member in inspect.getmembers(base):
                if name.startswith("_") and name != "__init__":
                    continue
                with self.subTest(cls=base.__name__, member=name):
                    self.assertTrue(hasattr(mine, name), "%s lacks %s" % (mine.__name__, name))
                    if isinstance(member, property) or not callable(member):
                        continue
                    got = getattr(mine, name)
                    theirs = inspect.signature(member).parameters
                    have = inspect.signature(got).parameters
                    varkw = any(p.kind is p.VAR_KEYWORD for p in have.values())
                    for pname, prm in theirs.items():
                        if pname == "self":
                            continue
                        if pname not in have:
                            self.assertTrue(varkw and prm.kind is prm.KEYWORD_ONLY,
                                            "%s.%s has no parameter %s" % (mine.__name__, name, pname))
                            continue
                        if prm.default is not prm.empty and not hasattr(prm.default, "value"):
                            self.assertEqual(have[pname].default, prm.default, "%s.%s(%s=)" % (mine.__name__, name,
                                                                                                pname))
                        elif prm.default is not prm.empty:  # an enum default: ours takes its value
                            self.assertIn(have[pname].default, (prm.default, prm.default.value))
                        else:
                            self.assertIs(have[pname].default, prm.empty, "%s.%s(%s)" % (mine.__name__, name, pname))
                    order = [n for n in theirs if n != "self"]
                    self.assertEqual([n for n in have if n in order], order, "%s.%s parameter order"
                                     % (mine.__name__, name))


@unittest.skipIf(WHY, WHY)
@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class TestSGLangPluginTransfer(test_sglang.SidecarPairCase):
    arena_bytes, arena_name = 16 << 20, "sglang-plugin"

    @classmethod
    def setUpClass(cls) -> None:
        load_plugins()
        from sglang.srt.disaggregation import utils

        cls.U = utils
        super().setUpClass()

    def token_pool(self, held: int, seed: int) -> tuple:
        """MHATokenToKVPool's buffers: per layer K and V of (size + page_size, heads, head_dim)."""
        return test_sglang.token_pool(self.arena, LAYERS, PAGES * PAGE + PAGE, held, D, seed, torch.bfloat16)

    def kv_args(self, rank: int, ks: List[Any], vs: List[Any], held: int, meta: Any) -> Any:
        """KVArgs as prefill.py/decode.py's _init_kv_manager fill them for an MHA pool."""
        U = self.U
        args = U.get_kv_class(U.TransferBackend("stage"), U.KVClassType.KVARGS)()
        bufs = ks + vs
        args.engine_rank, args.pp_rank, args.system_dp_rank = rank, 0, 0
        args.kv_cache_dtype_str, args.kv_layout = "auto", None
        args.prefill_start_layer, args.prefill_end_layer = 0, LAYERS
        args.kv_data_ptrs = [t.data_ptr() for t in bufs]
        args.kv_data_lens = [t.nbytes for t in bufs]
        args.kv_item_lens = [t[0].nbytes * PAGE for t in bufs]
        args.num_draft_entries, args.kv_layer_ids = 0, []
        args.kv_head_num, args.total_kv_head_num, args.page_size = held, HEADS, PAGE
        args.aux_data_ptrs, args.aux_data_lens, args.aux_item_lens = meta.get_buf_infos()
        args.ib_device, args.gpu_id = None, 0
        args.state_types, args.state_data_ptrs, args.state_data_lens, args.state_item_lens = [], [], [], []
        return args

    def server_args(self, mode: str, tp: int, port: int) -> Any:
        from sglang.srt.server_args import ServerArgs

        return ServerArgs(model_path="dummy", device="cpu", tp_size=tp, disaggregation_mode=mode,
                          disaggregation_transfer_backend="stage", disaggregation_bootstrap_port=port)

    def manager(self, sidecar: Any, mode: str, args: Any, sa: Any, route: str, name: str) -> Any:
        U = self.U
        # the bootstrap on loopback without a secret: only when asked (an unsigned ticket could be replayed)
        env = {"STAGE_SOCKET": sidecar.socket, "STAGE_ROUTE": route, "STAGE_KV_NAME": name, "STAGE_TIMEOUT": "20",
               "STAGE_RENDEZVOUS_INSECURE": "1"}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            cls = U.get_kv_class(U.TransferBackend(sa.disaggregation_transfer_backend), U.KVClassType.MANAGER)
            m = cls(args, U.DisaggregationMode(mode), sa, False)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.addCleanup(m.close)
        return m

    def metadata(self, seed: int) -> Any:
        meta = self.U.MetadataBuffers(SLOTS, hidden_size=32, hidden_states_dtype=torch.bfloat16,
                                      max_sampling_mask_tokens=4)
        g = torch.Generator().manual_seed(seed)
        for name, t in vars(meta).items():
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=g))
            elif isinstance(t, torch.Tensor) and t.dtype in (torch.int32, torch.int64):
                t.copy_(torch.randint(0, 1000, t.shape, generator=g))
        meta.bootstrap_room.zero_()
        return meta

    def run_request(self, tag: str, prefix_pages: int) -> None:
        U = self.U
        port = free_ports(2)
        room = 4242 + prefix_pages
        pre_meta, dec_meta = self.metadata(1), self.metadata(2)
        pres, pools = [], []
        for r in range(2):
            ks, vs = self.token_pool(2, 10 + r)
            pools.append((ks, vs))
            pres.append(self.manager(self.pre, "prefill", self.kv_args(r, ks, vs, 2, pre_meta),
                                     self.server_args("prefill", 2, port), "decode", "p-" + tag))
        dks, dvs = self.token_pool(4, 20)
        dec = self.manager(self.dec, "decode", self.kv_args(0, dks, dvs, 4, dec_meta),
                           self.server_args("decode", 1, port), "prefill", "d-" + tag)
        before = [t.clone() for t in dks + dvs]
        rng = random.Random(prefix_pages)
        tokens = 9 * PAGE - 3
        npages = -(-tokens // PAGE)
        ppages = rng.sample(range(1, PAGES + 1), npages)  # page 0 is SGLang's padding page
        dpages = rng.sample(range(1, PAGES + 1), npages)
        prefix = prefix_pages * PAGE
        pslot, dslot = 3, 6
        pre_meta.bootstrap_room[pslot, 0] = room

        # decode: bootstrap, init(prefill_dp_rank), send_metadata of the pages past its prefix
        addr = "127.0.0.1:%d" % port
        self.assertTrue(dec.try_ensure_parallel_info(addr))
        self.assertEqual(dec.prefill_info_table[addr].dp_size, 1)
        recv = U.get_kv_class(U.TransferBackend("stage"), U.KVClassType.RECEIVER)(
            mgr=dec, bootstrap_addr=addr, bootstrap_room=room)
        recv.init(0)
        self.assertEqual(recv.poll(), U.KVPoll.WaitingForInput)
        recv.send_metadata(np.array(dpages[prefix_pages:], dtype=np.int32), dslot, None,
                           decode_prefix_len=prefix)
        # prefill: each rank's sender, as the bootstrap queue and send_kv_chunk drive it
        senders = [U.get_kv_class(U.TransferBackend("stage"), U.KVClassType.SENDER)(
            mgr=m, bootstrap_addr=addr, bootstrap_room=room, req_has_disagg_prefill_dp_rank=False) for m in pres]
        suffix = ppages[prefix_pages:]
        for s in senders:
            poll_until(s, U.KVPoll.WaitingForInput)
            got = s.pop_decode_prefix_len()
            self.assertEqual(got, prefix)
            s.init(-(-(tokens - got) // PAGE), pslot)
        chunks = [suffix[:2], suffix[2:]]
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            for s in senders:
                if s.should_send_kv_chunk(len(chunk), last):
                    s.send(np.array(chunk, dtype=np.int32), None, num_kv_tokens=len(chunk) * PAGE)
            if not last:
                self.assertNotEqual(recv.poll(), U.KVPoll.Success, "Success before the last chunk")
        for s in senders:
            poll_until(s, U.KVPoll.Success)
            m = s.get_transfer_metric()
            self.assertIsInstance(m, __import__("sglang.srt.disaggregation.base.conn",
                                                fromlist=["KVTransferMetric"]).KVTransferMetric)
            self.assertGreater(m.transfer_total_bytes, 0)
        poll_until(recv, U.KVPoll.Success)
        # the suffix rows equal the prefill ranks' rows, byte for byte
        moved = set()
        for r, (ks, vs) in enumerate(pools):
            for pt, dt in zip(ks + vs, dks + dvs):
                for pp, dp in zip(ppages[prefix_pages:], dpages[prefix_pages:]):
                    a = pt[pp * PAGE:(pp + 1) * PAGE].view(torch.uint8)
                    b = dt[dp * PAGE:(dp + 1) * PAGE, 2 * r:2 * r + 2].contiguous().view(torch.uint8)
                    self.assertTrue(torch.equal(a, b), "rank %d page %d -> %d" % (r, pp, dp))
                    moved.add(dp)
        # nothing else changed: the decode's prefix pages and the pages not named
        keep = [p for p in range(PAGES + 1) if p not in moved]
        for t0, t1 in zip(before, dks + dvs):
            v0, v1 = t0.view(PAGES + 1, -1), t1.view(PAGES + 1, -1)
            self.assertTrue(torch.equal(v0[keep], v1[keep]), "rows outside the suffix pages changed")
        # the aux slot landed (SGLang's metadata gate reads bootstrap_room)
        self.assertEqual(int(dec_meta.bootstrap_room[dslot, 0]), room)
        for name in ("output_ids", "cached_tokens", "output_token_logprobs_val", "output_hidden_states"):
            p_t, d_t = getattr(pre_meta, name), getattr(dec_meta, name)
            self.assertTrue(torch.equal(p_t[pslot].view(torch.uint8), d_t[dslot].view(torch.uint8)), name)
        recv.clear()
        for s in senders:
            s.clear()

    def test_request(self) -> None:
        self.run_request("a", 0)

    def test_decode_prefix(self) -> None:
        self.run_request("b", 3)

    def test_refusals(self) -> None:
        """What the backend cannot move is refused at construction, saying so."""
        U = self.U
        meta = self.metadata(5)
        ks, vs = self.token_pool(4, 30)
        args = self.kv_args(0, ks, vs, 4, meta)
        sa = self.server_args("decode", 1, free_ports(1))
        cls = U.get_kv_class(U.TransferBackend("stage"), U.KVClassType.MANAGER)
        with self.assertRaisesRegex(NotImplementedError, "MLA"):
            cls(args, U.DisaggregationMode.DECODE, sa, True)
        args.num_draft_entries = 2
        with self.assertRaisesRegex(NotImplementedError, "draft"):
            cls(args, U.DisaggregationMode.DECODE, sa, False)


if __name__ == "__main__":
    unittest.main()
