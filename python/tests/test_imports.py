"""Every module of stage_client imports alone, in a fresh interpreter.

A module that works only because another one was imported first (a cycle
broken by import order, a registry filled in by a module imported
elsewhere) passes every test that imports the package and fails the user
who imports that one module. Each module here gets its own interpreter
(``python -c "import stage_client.x"``) with nothing imported before it,
twice: once as users import it (the package's ``__init__`` runs first), and
once with ``__init__`` kept from running (a bare package object stands in
for it), so that an order ``__init__`` happens to import things in cannot
hide a cycle that a change to ``__init__`` would expose.

A module that needs a third-party package this interpreter lacks (torch,
vllm) is skipped, not failed: it is checked where that package is
installed.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import unittest
from typing import Callable, Dict, List

_PYTHON = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = "stage_client"

# argv: the module, then "bare" to keep the package's __init__ from running.
# Exit status 3 and "missing: NAME" when the import failed only because a
# third-party package is not installed; any other failure is a traceback.
_IMPORT = """
import importlib, importlib.util, os, sys, types
name, bare = sys.argv[1], sys.argv[2:] == ["bare"]
if bare:
    top = name.split(".")[0]
    pkg = types.ModuleType(top)
    pkg.__path__ = [os.path.join(os.getcwd(), top)]
    sys.modules[top] = pkg
try:
    importlib.import_module(name)
except ModuleNotFoundError as e:
    top = (e.name or "").split(".")[0]
    if top and top != name.split(".")[0] and importlib.util.find_spec(top) is None:
        print("missing: " + top)
        sys.exit(3)
    raise
"""

#: Modules that fail imported without the package's __init__, with why.
#: Their tests are expected failures, so one that starts to pass is
#: reported (remove its entry then).
FAIL_WITHOUT_INIT: Dict[str, str] = {}

#: Modules that must import nothing of the package: the bottom of its
#: import graph, which any module may import first without a cycle.
LEAVES = ("stage_client.layout.presets", "stage_client.layout.model")


def modules(root: str = _PYTHON, package: str = _PACKAGE) -> List[str]:
    """Every module and package of ``package`` under ``root``, subpackages included, sorted."""
    out = []
    top = os.path.join(root, package)
    for d, subs, files in os.walk(top):
        subs[:] = sorted(s for s in subs if os.path.exists(os.path.join(d, s, "__init__.py")))
        rel = os.path.relpath(d, root).replace(os.sep, ".")
        for f in files:
            if f.endswith(".py"):
                out.append(rel if f == "__init__.py" else rel + "." + f[:-3])
    return sorted(out)


def import_alone(name: str, root: str = _PYTHON, bare: bool = False) -> "subprocess.CompletedProcess[str]":
    """Import ``name`` in a fresh interpreter that finds its package under ``root`` first;
    ``bare``: with the top package's ``__init__`` kept from running."""
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("PYTHONSTARTUP", None)
    argv = [sys.executable, "-c", _IMPORT, name] + (["bare"] if bare else [])
    return subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=120)


class _Alone(unittest.TestCase):
    bare = False

    def check(self, name: str) -> None:
        r = import_alone(name, bare=self.bare)
        if r.returncode == 3 and r.stdout.startswith("missing: "):
            self.skipTest("%s needs %s, not installed here" % (name, r.stdout.split()[1]))
        self.assertEqual(r.returncode, 0, "import %s alone failed:\n%s" % (name, r.stderr))


class ImportAloneTest(_Alone):
    """Each module imported as a user imports it: the package's __init__ first."""


class ImportWithoutInitTest(_Alone):
    """Each module imported with the package's __init__ kept from running."""

    bare = True


def _test(name: str) -> Callable[[_Alone], None]:
    def test(self: _Alone) -> None:
        self.check(name)

    test.__doc__ = "import %s alone" % name
    return test


def _add_tests() -> None:
    for name in modules():
        test_name = "test_" + name.replace(".", "_")
        setattr(ImportAloneTest, test_name, _test(name))
        if name == _PACKAGE:
            continue  # without its __init__ the package itself is nothing to import
        test = _test(name)
        if name in FAIL_WITHOUT_INIT:
            test = unittest.expectedFailure(test)
        setattr(ImportWithoutInitTest, test_name, test)


_add_tests()


class ModulesTest(unittest.TestCase):
    def test_walk_finds_subpackages(self) -> None:
        names = modules()
        for name in ("stage_client", "stage_client.wire", "stage_client.vllm", "stage_client.vllm.worker"):
            self.assertIn(name, names)
        for name in FAIL_WITHOUT_INIT:
            self.assertIn(name, names, "FAIL_WITHOUT_INIT names a module that is gone")

    def test_leaves_import_nothing_of_the_package(self) -> None:
        """A leaf's imports name no stage_client module, read from its source."""
        for name in LEAVES:
            path = os.path.join(_PYTHON, *name.split(".")) + ".py"
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    bad = node.level > 0 or (node.module or "").split(".")[0] == _PACKAGE
                    self.assertFalse(bad, "%s imports %s%s: a leaf imports nothing of %s"
                                     % (name, "." * node.level, node.module or "", _PACKAGE))
                elif isinstance(node, ast.Import):
                    for a in node.names:
                        self.assertNotEqual(a.name.split(".")[0], _PACKAGE, "%s imports %s" % (name, a.name))

    def test_pyproject_lists_every_package(self) -> None:
        """pyproject.toml names its packages one by one (setuptools builds
        the wheel from that list): every package the walk finds is there."""
        with open(os.path.join(_PYTHON, "pyproject.toml"), encoding="utf-8") as f:
            m = re.search(r"^packages\s*=\s*\[([^\]]*)\]", f.read(), re.M)
        self.assertIsNotNone(m, "no packages = [...] in pyproject.toml")
        listed = set(re.findall(r'"([^"]+)"', m.group(1)))
        packages = {n for n in modules() if os.path.exists(os.path.join(_PYTHON, *n.split("."), "__init__.py"))}
        self.assertEqual(sorted(packages - listed), [], "packages missing from pyproject.toml")

    def test_a_module_that_fails_alone_is_caught(self) -> None:
        """The check can fail: two modules of a throwaway package that import
        each other's names at the top pass after the package imports one of
        them first, and fail imported alone."""
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            pkg = os.path.join(tmp, "cyc")
            os.mkdir(pkg)
            files = {
                "__init__.py": "",
                "a.py": "X = 1\nfrom .b import Y\n",
                "b.py": "from .a import X\nY = X + 1\n",
                "leaf.py": "Z = 3\n",
            }
            for f, text in files.items():
                with open(os.path.join(pkg, f), "w") as fh:
                    fh.write(text)
            self.assertEqual(modules(tmp, "cyc"), ["cyc", "cyc.a", "cyc.b", "cyc.leaf"])
            cases = [
                # (what __init__ imports, bare, module, exit status): with a
                # imported first, b finds a half built but X in it; with b
                # first, a finds b half built and no Y in it
                ("from . import a\n", False, "cyc.b", 0),
                ("from . import a\n", True, "cyc.b", 1),
                ("from . import a\n", True, "cyc.a", 0),
                ("", False, "cyc.b", 1),
                ("", False, "cyc.leaf", 0),
                ("raise ImportError('never')\n", True, "cyc.leaf", 0),
                ("import no_such_dependency_here\n", False, "cyc", 3),
            ]
            for init, bare, name, want in cases:
                with self.subTest(module=name, init=init, bare=bare):
                    with open(os.path.join(pkg, "__init__.py"), "w") as fh:
                        fh.write(init)
                    r = import_alone(name, tmp, bare)
                    self.assertEqual(r.returncode, want, r.stderr)
                    if want == 1:
                        self.assertIn("partially initialized", r.stderr)


if __name__ == "__main__":
    unittest.main()
