"""The worked KV-connector example runs against two real sidecars."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_e2e import HAVE_STAGED, SKIP_WHY, Staged  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "kv_connector.py")


@unittest.skipUnless(HAVE_STAGED, SKIP_WHY)
class ExampleTest(unittest.TestCase):
    def test_kv_connector_example(self) -> None:
        dec = Staged("decode")
        self.addCleanup(dec.stop)
        pre = Staged("prefill", route_to=dec.peers)
        self.addCleanup(pre.stop)
        pre.settle(1)
        out = subprocess.run([sys.executable, EXAMPLE, "--prefill", pre.socket, "--decode", dec.socket, "--requests", "8"],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("8 requests over 1 decodes (decode: 8), every byte verified", out.stdout)

    def test_two_decodes_behind_one_route(self) -> None:
        decs = [Staged("decode-%d" % i) for i in range(2)]
        for d in decs:
            self.addCleanup(d.stop)
        route = ("routes:\n  - name: decode\n    peers: [\"%s\", \"%s\"]\n    stripes: 1\n"
                 % (decs[0].peers, decs[1].peers))
        pre = Staged("prefill", extra=route)
        self.addCleanup(pre.stop)
        pre.settle(2)
        out = subprocess.run([sys.executable, EXAMPLE, "--prefill", pre.socket, "--decode", decs[0].socket,
                              "--decode", decs[1].socket, "--requests", "12"], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("12 requests over 2 decodes (decode-0: ", out.stdout)
        self.assertIn("every byte verified", out.stdout)


if __name__ == "__main__":
    unittest.main()
