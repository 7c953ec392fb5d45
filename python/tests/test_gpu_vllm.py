"""The GPU vLLM pair's parts that need no GPU (issue 34): scripts/gpu_vllm_parts.py (prompts, token
comparison, timings, sidecar config and metrics, the summary), scripts/gpu_vllm_wheel.py (which members of
vLLM's wheel stay behind, RECORD rewritten, a wheel stripped for real with zip -d), and
scripts/gpu-bundle.sh (parts packed, stashed, reassembled; a damaged part refused)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, HERE)

import gpu_vllm_parts as parts  # noqa: E402
import gpu_vllm_wheel as wheel  # noqa: E402


class TestPrompts(unittest.TestCase):
    def test_lengths_span_and_rise(self) -> None:
        ls = parts.prompt_lengths(16, 3, 1600)
        self.assertEqual(len(ls), 16)
        self.assertEqual((ls[0], ls[-1]), (3, 1600))
        self.assertTrue(all(a < b for a, b in zip(ls, ls[1:])), ls)

    def test_lengths_refuse_nonsense(self) -> None:
        for n, lo, hi in ((1, 3, 10), (4, 0, 10), (4, 10, 10)):
            with self.assertRaises(ValueError):
                parts.prompt_lengths(n, lo, hi)

    def test_prompts_share_prefix_and_avoid_specials(self) -> None:
        ps = parts.make_prompts([5, 800, 900], 4096, 7, shared=700)
        self.assertEqual([len(p) for p in ps], [5, 800, 900])
        self.assertEqual(ps[1][:700], ps[2][:700])
        self.assertNotEqual(ps[1][700:750], ps[2][700:750])
        self.assertTrue(all(4 <= t < 4096 for p in ps for t in p))
        self.assertEqual(ps, parts.make_prompts([5, 800, 900], 4096, 7, shared=700))

    def test_short_prompts_share_nothing(self) -> None:
        ps = parts.make_prompts([10, 20], 512, 1, shared=15)
        self.assertNotEqual(ps[0], ps[1][:10])


class TestCompare(unittest.TestCase):
    def test_equal_differ_failed(self) -> None:
        c = parts.compare([[1, 2, 3], [1, 9, 3], None, [1, 2]], [[1, 2, 3], [1, 2, 3], [4], [1, 2, 3]])
        self.assertEqual((c["equal"], c["of"]), (1, 4))
        self.assertEqual(c["diff"], [{"prompt": 1, "first_diff": 1, "got_len": 3, "want_len": 3},
                                     {"prompt": 2, "failed": "got"},
                                     {"prompt": 3, "first_diff": 2, "got_len": 2, "want_len": 3}])

    def test_gaps_tell_ties(self) -> None:
        gaps = [[1.0, 2.0, 3.0], [2.0, 0.01, 3.0], [5.0, 5.0, 5.0]]
        c = parts.compare([[1, 2, 3], [1, 9, 3], [7, 2, 3]], [[1, 2, 3], [1, 2, 3], [1, 2, 3]], gaps)
        self.assertEqual(c["diff"], [{"prompt": 1, "first_diff": 1, "got_len": 3, "want_len": 3, "ref_gap": 0.01},
                                     {"prompt": 2, "first_diff": 0, "got_len": 3, "want_len": 3, "ref_gap": 5.0}])
        self.assertEqual(c["near_ties"], 1)
        self.assertNotIn("near_ties", parts.compare([[1]], [[1]]))
        self.assertAlmostEqual(parts.top2_gap({"a": -0.1, "b": -2.6, "c": -3.0}), 2.5)
        self.assertIsNone(parts.top2_gap({"a": -0.1}))
        row = {"phase": "pd-pull-tcp", "tokens": c, "control": parts.compare([[1]], [[1]], [[1.0]])}
        self.assertIn("#1@1 gap 0.010", parts.summary_text([row]))
        self.assertIn("1 at a near tie", parts.summary_text([row]))
        self.assertIn("control (the decode alone again, one at a time): 1/1", parts.summary_text([row]))

    def test_timing(self) -> None:
        rs = [{"status": 200, "tokens": [1] * 4, "ttft": t} for t in (0.1, 0.3, 0.2)] + [{"status": 500}]
        t = parts.timing(rs, 2.0)
        self.assertEqual((t["requests"], t["ok"], t["tokens"], t["tok_per_s"]), (4, 3, 12, 6.0))
        self.assertEqual((t["ttft_p50"], t["ttft_p90"]), (0.2, 0.3))
        self.assertIsNone(parts.percentile([], 0.5))


METRICS = """# HELP stage_bytes_total payload bytes
stage_bytes_total{direction="in",link="a"} 100
stage_bytes_total{direction="in",link="b"} 28
stage_bytes_total{direction="out",link="a"} 5
stage_transfer_duration_seconds_bucket{direction="pull",result="ok",le="0.1"} 3
stage_transfer_duration_seconds_sum{direction="pull",result="ok"} 0.25
stage_transfer_duration_seconds_count{direction="pull",result="ok"} 4
stage_other 9
"""


class TestMetrics(unittest.TestCase):
    def test_sums_over_links_without_buckets(self) -> None:
        m = parts.metric_sums(METRICS, ("stage_bytes_total", "stage_transfer_duration_seconds_sum",
                                        "stage_transfer_duration_seconds_count"))
        self.assertEqual(m, {"stage_bytes_total{direction=in}": 128.0, "stage_bytes_total{direction=out}": 5.0,
                             "stage_transfer_duration_seconds_sum{direction=pull,result=ok}": 0.25,
                             "stage_transfer_duration_seconds_count{direction=pull,result=ok}": 4.0})
        self.assertEqual(parts.delta({"a": 3.0, "b": 1.0}, {"a": 1.0, "b": 1.0}), {"a": 2.0})

    def test_kv_line(self) -> None:
        kv = {"decode": {"stage_bytes_total{direction=in}": 2.0 * parts.MIB,
                         "stage_transfer_duration_seconds_sum{direction=pull,result=ok}": 1.0,
                         "stage_transfer_duration_seconds_count{direction=pull,result=ok}": 4.0}}
        self.assertIn("decode: out 0.0 MiB, in 2.0 MiB, 4 transfers, 0.250 s mean", parts._kv_line(kv))
        kv["prefill"] = {"stage_transport_fallbacks_total{reason=ipc_open}": 3.0}
        self.assertIn("prefill: out 0.0 MiB, in 0.0 MiB, 0 transfers, 0.000 s mean, 3 same-node fallbacks to TCP",
                      parts._kv_line(kv))


class TestSidecarConfig(unittest.TestCase):
    def test_config(self) -> None:
        cfg = parts.sidecar_config("prefill", "127.0.0.1:1", "/s/p.sock", "127.0.0.1:2", "cuda", 1,
                                   [("decode", "127.0.0.1:3")], "tcp")
        for want in ("node: {name: prefill}", "device: {kind: cuda, ordinal: 1}", "metrics: {listen: 127.0.0.1:2}",
                     "  - name: decode\n    peers: [\"127.0.0.1:3\"]\n    transport: tcp\n"):
            self.assertIn(want, cfg)
        with self.assertRaises(ValueError):
            parts.sidecar_config("p", "a", "s", "m", "cuda", 0, [], "rdma")

    def test_config_route_of_several_peers(self) -> None:
        """Under TP each sidecar's route lists every sidecar of the other engine (one per GPU)."""
        cfg = parts.sidecar_config("decode-0", "127.0.0.1:1", "/s/d.sock", "127.0.0.1:2", "cuda", 0,
                                   [("prefill", ["127.0.0.1:3", "127.0.0.1:4"])], "auto")
        self.assertIn("  - name: prefill\n    peers: [\"127.0.0.1:3\", \"127.0.0.1:4\"]\n    transport: auto\n", cfg)

    def test_config_loads_in_staged(self) -> None:
        """staged itself accepts the config (--check-config where it exists, else a start it stops)."""
        staged = os.path.join(ROOT, "bin", "staged")
        if not os.access(staged, os.X_OK):
            self.skipTest("no bin/staged (make build)")
        d = tempfile.mkdtemp(prefix="gv-cfg-")
        self.addCleanup(shutil.rmtree, d, True)
        for i, peers in enumerate(("127.0.0.1:9", ["127.0.0.1:9", "127.0.0.1:10"])):
            with self.subTest(peers=peers):
                self.check_staged_starts(staged, d, i, peers)

    def check_staged_starts(self, staged: str, d: str, i: int, peers: object) -> None:
        cfg = os.path.join(d, "p%d.yaml" % i)
        with open(cfg, "w") as f:
            f.write(parts.sidecar_config("prefill", "127.0.0.1:0", os.path.join(d, "p%d.sock" % i), "127.0.0.1:0",
                                         "hostmem", 0, [("decode", peers)], "auto"))
        from test_e2e import sidecar_env  # the token the driver's sidecars get too

        p = subprocess.Popen([staged, "--config", cfg], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=sidecar_env())
        try:
            line = p.stdout.readline().decode()  # type: ignore[union-attr]
        finally:
            p.terminate()
            _, err = p.communicate(20)
        self.assertTrue(line.startswith("staged ready"), "staged refused the config: %s %s" % (line, err[-500:]))


class TestTPLayout(unittest.TestCase):
    def test_parse_tp_runs(self) -> None:
        self.assertEqual(parts.parse_tp_runs("2:1,2:2"), [(2, 1), (2, 2)])
        self.assertEqual(parts.parse_tp_runs(" 1:1 ,"), [(1, 1)])
        for bad in ("", "2", "2:0", "0:1", "9:1", "2:1:1", "a:b", "2-1"):
            with self.assertRaises(ValueError, msg=bad):
                parts.parse_tp_runs(bad)

    def test_plan_four_gpus(self) -> None:
        p = parts.tp_plan([(2, 1), (2, 2)], [0, 1, 2, 3])
        self.assertEqual((p["pre_group"], p["dec_group"], p["per_rank"]), ([0, 1], [2, 3], True))
        self.assertEqual([(r["pre"], r["dec"]) for r in p["runs"]], [([0, 1], [2]), ([0, 1], [2, 3])])
        self.assertEqual([(r["pre_tp"], r["dec_tp"]) for r in p["runs"]], [(2, 1), (2, 2)])

    def test_plan_default_pair_unchanged(self) -> None:
        p = parts.tp_plan([(1, 1)], [0, 1])
        self.assertEqual((p["pre_group"], p["dec_group"], p["per_rank"]), ([0], [1], False))
        self.assertEqual(parts.sidecar_specs("decode", p["dec_group"], p["per_rank"]),
                         [{"name": "decode", "visible": "1", "ordinal": 0, "rank": 0}])

    def test_plan_shared_on_two_gpus(self) -> None:
        """No 4-GPU machine: --share-gpus puts the decode on the last GPUs, beside the prefill."""
        plan = parts.tp_plan([(2, 1), (2, 2)], [0, 1], share=True)
        self.assertTrue(plan["shared"])
        self.assertEqual([(r["pre"], r["dec"]) for r in plan["runs"]], [([0, 1], [0]), ([0, 1], [0, 1])])
        self.assertFalse(parts.tp_plan([(2, 1)], [0, 1, 2], share=True)["shared"])  # enough: apart as before
        with self.assertRaises(ValueError):
            parts.tp_plan([(4, 1)], [0, 1], share=True)

    def test_plan_too_few_gpus(self) -> None:
        with self.assertRaisesRegex(ValueError, "need 4 GPUs"):
            parts.tp_plan([(2, 2)], [0, 1])

    def test_push_skipped_per_rank(self) -> None:
        self.assertEqual(parts.tp_skip("push", False), "")
        self.assertEqual(parts.tp_skip("pull", True), "")
        self.assertIn("stage_peer", parts.tp_skip("push", True))

    def test_sidecars_per_rank(self) -> None:
        """Rank r of an engine on GPUs 2,3 registers device index r: its sidecar sees 2,3 and serves ordinal r."""
        self.assertEqual(parts.sidecar_specs("decode", [2, 3], True),
                         [{"name": "decode-0", "visible": "2,3", "ordinal": 0, "rank": 0},
                          {"name": "decode-1", "visible": "2,3", "ordinal": 1, "rank": 1}])
        # a TP 1 decode under a TP 2 prefill: one sidecar, still named per rank (peer_name decode-{rank})
        self.assertEqual(parts.sidecar_specs("decode", [2], True),
                         [{"name": "decode-0", "visible": "2", "ordinal": 0, "rank": 0}])


class TestPairLayout(unittest.TestCase):
    """gpu_vllm_pair's sidecars and connector settings per TP layout, built without starting anything."""

    def pair(self, *extra: str) -> object:
        import gpu_vllm_pair as gp

        d = tempfile.mkdtemp(prefix="gv-pair-")
        self.addCleanup(shutil.rmtree, d, True)
        p = gp.Pair(gp.parse(["pair", "--model", "m", "--staged", "s", "--stagectl", "c", "--out", d] + list(extra)))
        self.addCleanup(p.phases.close)
        return p

    def test_default_pair_unchanged(self) -> None:
        p = self.pair()
        self.assertEqual([(sc.name, sc.visible, sc.ordinal) for sc in p.sidecars],
                         [("prefill", "0", 0), ("decode", "1", 0)])
        self.assertEqual(p.pre_sc.routes, [("decode", [p.dec_sc.addr])])
        self.assertEqual(p.connector("decode"), (p.dec_sc.socket, {}))
        self.assertEqual(p.plan["runs"], [{"pre_tp": 1, "dec_tp": 1, "pre": [0], "dec": [1]}])

    def test_tp_runs_on_four_gpus(self) -> None:
        from stage_client.vllm.config import for_rank

        p = self.pair("--gpus", "0,1,2,3", "--tp-runs", "2:1,2:2")
        self.assertEqual([(sc.name, sc.visible, sc.ordinal) for sc in p.sidecars],
                         [("prefill-0", "0,1", 0), ("prefill-1", "0,1", 1), ("decode-0", "2,3", 0),
                          ("decode-1", "2,3", 1)])
        for side, other in (("prefill", "decode"), ("decode", "prefill")):
            sock, extra = p.connector(side)
            self.assertEqual(extra, {"peer_name": side + "-{rank}"})
            for r, sc in enumerate(p.scs[side]):
                self.assertEqual(for_rank(sock, r), sc.socket)  # the connector of rank r reaches its sidecar
                self.assertEqual(sc.routes, [(other, [o.addr for o in p.scs[other]])])
        self.assertEqual([(r["pre"], r["dec"]) for r in p.plan["runs"]], [([0, 1], [2]), ([0, 1], [2, 3])])

    def test_pre_dec_tp_options(self) -> None:
        p = self.pair("--gpus", "0,1,2", "--pre-tp", "2")
        self.assertEqual(p.plan["runs"], [{"pre_tp": 2, "dec_tp": 1, "pre": [0, 1], "dec": [2]}])

    def test_bad_tp_refused(self) -> None:
        import gpu_vllm_pair as gp

        for argv in (["--tp-runs", "2:2"], ["--tp-runs", "2x1", "--gpus", "0,1,2"], ["--cpu", "--pre-tp", "2",
                                                                                   "--gpus", "0,1,2"]):
            with self.subTest(argv=argv), self.assertRaises(SystemExit) as cm, \
                    mock.patch("sys.stderr", new_callable=io.StringIO):
                gp.parse(["pair", "--model", "m", "--staged", "s", "--stagectl", "c", "--out", "o"] + argv)
            self.assertEqual(cm.exception.code, 2)


class TestSummary(unittest.TestCase):
    def test_rows(self) -> None:
        rows = [{"phase": "engines", "attempt": 1, "ok": True, "eager": False, "pre_block": 16, "dec_block": 64,
                 "start_s": 80},
                {"phase": "pd-pull-tcp", "tokens": {"equal": 15, "of": 16, "diff": [{"prompt": 3, "first_diff": 9}]},
                 "pd": {"ttft_p50": 0.05, "ttft_p90": 0.1, "tok_per_s": 900.0},
                 "alone": {"ttft_p50": 0.04, "ttft_p90": 0.08, "tok_per_s": 1000.0}, "kv": {}},
                {"phase": "pd-push-auto", "skipped": "out of time (20s left)"},
                {"phase": "fault", "requests": [{"status": 200}], "tokens": {"equal": 1, "of": 1},
                 "killed_at_s": 0.5, "mid_transfer": True, "within_timeout": True, "kv": {}}]
        text = parts.summary_text(rows)
        self.assertIn("CUDA graphs on, blocks prefill 16 / decode 64", text)
        self.assertIn("pd-pull-tcp | 15/16 (differ: #3@9) | 0.050/0.100 vs 0.040/0.080 | 900.0 vs 1000.0", text)
        self.assertIn("pd-push-auto | not run: out of time", text)
        self.assertIn("fault | 1/1 | prefill's staged SIGKILLed at 0.50s (mid-transfer)", text)
        json.dumps(rows)

    def test_tp_rows(self) -> None:
        """A TP run's engines row names the split and GPUs; its phases carry the split in their names."""
        rows = [{"phase": "engines", "attempt": 1, "ok": True, "eager": False, "pre_block": 16, "dec_block": 64,
                 "start_s": 95, "pre_tp": 2, "dec_tp": 1, "pre_gpus": [0, 1], "dec_gpus": [2]},
                {"phase": "pd-pull-tcp tp2:1", "tokens": {"equal": 16, "of": 16, "diff": []},
                 "pd": {"ttft_p50": 0.05, "ttft_p90": 0.1, "tok_per_s": 900.0},
                 "alone": {"ttft_p50": 0.04, "ttft_p90": 0.08, "tok_per_s": 1000.0}, "kv": {}},
                {"phase": "warmup tp2:1", "status": 200, "error": None},
                {"phase": "start tp2:2", "ok": False, "error": "vLLM decode-run2 exited 1"}]
        text = parts.summary_text(rows)
        self.assertIn('warmup tp2:1 | {"status": 200, "error": null}', text)
        self.assertIn('start tp2:2 | {"ok": false, "error": "vLLM decode-run2 exited 1"}', text)
        self.assertIn("attempt 1: ok, TP 2 on GPUs [0, 1] -> TP 1 on GPUs [2], CUDA graphs on", text)
        self.assertIn("pd-pull-tcp tp2:1 | 16/16 | 0.050/0.100", text)


class TestNixl(unittest.TestCase):
    """vLLM's NixlConnector beside stage (issue 34 item 4): its configuration, its row of the summary."""

    def test_config_is_tcp_without_ipc(self) -> None:
        import gpu_vllm_procs as procs

        ktc, env = procs.nixl_transfer_config(5123)
        self.assertEqual((ktc["kv_connector"], ktc["kv_role"], ktc["kv_buffer_device"]),
                         ("NixlConnector", "kv_both", "cuda"))
        self.assertNotIn("cuda_ipc", env["UCX_TLS"])
        self.assertIn("tcp", env["UCX_TLS"].split(","))
        self.assertEqual((env["UCX_NET_DEVICES"], env["VLLM_NIXL_SIDE_CHANNEL_PORT"]), ("lo", "5123"))

    def test_nixl_flag(self) -> None:
        import gpu_vllm_pair as gp

        base = ["pair", "--model", "m", "--staged", "s", "--stagectl", "c", "--out", "o"]
        self.assertFalse(gp.parse(base).nixl)
        self.assertTrue(gp.parse(base + ["--nixl"]).nixl)

    def test_row(self) -> None:
        d = {"vllm:nixl_xfer_time_seconds_sum": 0.5, "vllm:nixl_xfer_time_seconds_count": 4.0,
             "vllm:nixl_bytes_transferred_sum": 8.0 * parts.MIB}
        rows = [{"phase": "engines", "attempt": 1, "ok": True, "eager": False, "pre_block": 16, "dec_block": 64,
                 "start_s": 90, "connector": "nixl"},
                {"phase": "pd-nixl-pull", "connector": "nixl", "tokens": {"equal": 16, "of": 16, "diff": []},
                 "pd": {"ttft_p50": 0.05, "ttft_p90": 0.1, "tok_per_s": 900.0},
                 "alone": {"ttft_p50": 0.04, "ttft_p90": 0.08, "tok_per_s": 1000.0},
                 "kv": {"prefill": {}, "decode": d}},
                {"phase": "pd-nixl-pull", "connector": "nixl", "tokens": {"equal": 1, "of": 1, "diff": []},
                 "pd": {}, "alone": {}, "kv": {"prefill": {}, "decode": {}}}]
        text = parts.summary_text(rows)
        self.assertIn("ok, vLLM's NixlConnector, CUDA graphs on", text)
        self.assertIn("decode (NIXL): 8.0 MiB in 4 transfers, 0.125 s mean", text)
        self.assertIn("no NIXL transfer counted", text)


class TestWheelStrip(unittest.TestCase):
    def test_dropped(self) -> None:
        gone = ["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm-rs", "vllm/_moe_C_stable_libtorch.abi3.so",
                "vllm/third_party/deep_gemm/include/cute/arch/mma_sm90.hpp",
                "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so",
                "vllm/third_party/fmha_sm100/cutlass/include/cute/tensor.hpp"]
        kept = ["vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", "vllm/_C_stable_libtorch.abi3.so",
                "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so",
                "vllm/third_party/deep_gemm/__init__.py", "vllm/third_party/fmha_sm100/__init__.py",
                "vllm/entrypoints/openai/api_server.py", "vllm-0.26.0.dist-info/RECORD"]
        self.assertEqual([n for n in gone if not wheel.dropped(n)], [])
        self.assertEqual([n for n in kept if wheel.dropped(n)], [])

    def test_strip_a_wheel(self) -> None:
        if shutil.which("zip") is None:
            self.skipTest("no zip here")
        d = tempfile.mkdtemp(prefix="gv-whl-")
        self.addCleanup(shutil.rmtree, d, True)
        src, dst = os.path.join(d, "vllm-0.0-py3-none-any.whl"), os.path.join(d, "out.whl")
        members = {"vllm/__init__.py": b"x = 1\n", "vllm/vllm-rs": b"\x7fELF" * 100,
                   "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"fa3"}
        record = "".join("%s,sha256=x,%d\n" % (n, len(b)) for n, b in members.items()) + "vllm-0.0.dist-info/RECORD,,\n"
        with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as z:
            for n, b in members.items():
                z.writestr(n, b)
            z.writestr("vllm-0.0.dist-info/RECORD", record)
        self.assertEqual(wheel.strip(src, dst), ["vllm/vllm-rs"])
        with zipfile.ZipFile(dst) as z:
            self.assertEqual(sorted(z.namelist()), ["vllm-0.0.dist-info/RECORD", "vllm/__init__.py",
                                                    "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"])
            rec = z.read("vllm-0.0.dist-info/RECORD").decode()
        self.assertNotIn("vllm-rs", rec)
        self.assertIn("vllm/__init__.py,sha256=x,6", rec)


class TestBundle(unittest.TestCase):
    """gpu-bundle.sh: pack into 3 parts, stash them from 'calls', reassemble; a damaged part is named."""

    def sh(self, script: str, cwd: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", "set -u; log() { echo \"LOG $*\"; }; . %s/scripts/gpu-bundle.sh; %s"
                               % (ROOT, script)], cwd=cwd, capture_output=True, text=True, timeout=120)

    def test_round_trip_and_damage(self) -> None:
        d = tempfile.mkdtemp(prefix="gv-bundle-")
        self.addCleanup(shutil.rmtree, d, True)
        repo, src, cache = os.path.join(d, "repo"), os.path.join(d, "src"), os.path.join(d, "cache")
        for p in (repo, os.path.join(src, "wheels"), cache):
            os.makedirs(p)
        subprocess.run(["git", "init", "-q", repo], check=True)
        with open(os.path.join(src, "wheels", "a.whl"), "wb") as f:
            f.write(os.urandom(300000))
        r = self.sh("BUNDLE_PART_MAX=120000 bundle_pack %s %s .tw auto test" % (src, cache), repo)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(sorted(x for x in os.listdir(repo) if x.startswith(".tw")), [".tw1", ".tw2", ".tw3"])
        ign = subprocess.run(["git", "check-ignore", ".tw1", ".tw3"], cwd=repo, capture_output=True, text=True)
        self.assertEqual(ign.stdout.split(), [".tw1", ".tw3"])
        stash, work = os.path.join(d, "stash"), os.path.join(d, "work")
        # each part stashed on its own "call": only that folder is there
        for k in (1, 2, 3):
            call = os.path.join(d, "call%d" % k)
            os.makedirs(call)
            shutil.copytree(os.path.join(repo, ".tw%d" % k), os.path.join(call, ".tw%d" % k))
            r = self.sh("bundle_stash %s .tw %s" % (call, stash), call)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        empty = os.path.join(d, "empty")
        os.makedirs(empty)
        r = self.sh("bundle_unpack %s .tw %s %s && echo OK $BSHA" % (empty, stash, work), empty)
        self.assertIn("OK ", r.stdout, r.stdout + r.stderr)
        with open(os.path.join(src, "wheels", "a.whl"), "rb") as a, \
                open(os.path.join(work, "bundle", "wheels", "a.whl"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        # a damaged part: refused, named
        os.remove(os.path.join(work, "bundle.ok"))
        with open(os.path.join(stash, ".tw2", "bundle.tar.2"), "r+b") as f:
            f.write(b"\0\0\0\0")
        r = self.sh("bundle_unpack %s .tw %s %s; echo \"WHY $BUNDLE_WHY\"" % (empty, stash, work), empty)
        self.assertIn(".tw2 (size or sha256 differs", r.stdout, r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()
