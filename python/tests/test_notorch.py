"""Without torch, the package and every test module still import.

``make test`` runs on machines without torch (the README's "Go and gcc"):
there a test that needs torch must skip with its reason, and a module that
fails to import is an error instead. Each case runs a fresh python3 in
which ``import torch`` fails (``sys.modules["torch"] = None``), whether or
not torch is installed here, so this runs, and can fail, everywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(os.path.dirname(HERE), "stage_client")

# Blocks torch, then runs the case's body; prints what failed, one per line.
PRELUDE = textwrap.dedent("""\
    import sys
    sys.modules["torch"] = None
    sys.path.insert(0, %r)
    failed = []
    """) % os.path.dirname(HERE)

IMPORT_PACKAGE = textwrap.dedent("""\
    import importlib
    for m in sys.argv[1:]:
        try:
            importlib.import_module("stage_client." + m)
        except Exception as e:
            failed.append("stage_client.%s: %r" % (m, e))
    print("\\n".join(failed))
    """)

LOAD_TESTS = textwrap.dedent("""\
    import unittest
    def walk(s):
        for t in s:
            if isinstance(t, unittest.TestSuite):
                yield from walk(t)
            else:
                yield t
    suite = unittest.defaultTestLoader.discover(sys.argv[1])
    for t in walk(suite):
        if type(t).__name__ == "_FailedTest":
            failed.append("%s: %s" % (t.id(), str(getattr(t, "_exception", "")).splitlines()[-1:]))
    print("\\n".join(failed))
    """)


def run_without_torch(body: str, *args: str) -> str:
    p = subprocess.run([sys.executable, "-c", PRELUDE + body, *args], cwd=os.path.dirname(HERE),
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError("python3 without torch exited %d: %s" % (p.returncode, p.stderr[-2000:]))
    return p.stdout.strip()


class TestWithoutTorch(unittest.TestCase):
    def test_modules_import(self) -> None:
        mods = sorted(f[:-3] for f in os.listdir(PKG) if f.endswith(".py") and f != "__init__.py")
        for case, args in (("every stage_client module", mods), ("the package", [])):
            with self.subTest(case):
                body = IMPORT_PACKAGE if args else "import stage_client\nprint('')\n"
                self.assertEqual(run_without_torch(body, *args), "", "these failed to import without torch")

    def test_test_modules_load(self) -> None:
        self.assertEqual(run_without_torch(LOAD_TESTS, HERE), "",
                         "these test modules fail to import without torch (they must skip instead)")

    def test_kvmap_says_it_needs_torch(self) -> None:
        body = textwrap.dedent("""\
            from stage_client.kvmap import region_bytes
            try:
                region_bytes(object())
            except ImportError as e:
                print(e)
            """)
        self.assertIn("torch is not installed", run_without_torch(body))


if __name__ == "__main__":
    unittest.main()
