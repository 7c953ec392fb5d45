"""stage_client's import graph, read from the source with ``ast``.

Every import statement counts, those inside functions and under
``if TYPE_CHECKING`` too: an import a function makes when it runs is as
much a dependency as one at the top, only a hidden one. The graph must
have no cycle; ``stage_client.protocol`` (the control socket's frames, as
Go's ``wire``) imports nothing but itself and the standard library; the
modules kept only so that users' old import paths work (:data:`SHIMS`) are
imported by nothing inside stage_client; and the Python table of
docs/ARCHITECTURE.md (under "## Packages") lists each package's imports of
ours exactly, each row above the rows of the packages it imports.

Stdlib only (no torch, no sidecar): the modules are parsed, never run.
"""

from __future__ import annotations

import ast
import os
import sys
import unittest
from typing import Dict, Iterable, List, Optional, Set, Tuple

_PYTHON = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ROOT = os.path.dirname(_PYTHON)
_PACKAGE = "stage_client"

#: The modules that only re-export names for users' old import paths.
SHIMS = ("stage_client.wire", "stage_client.kvwire", "stage_client.kvpresets", "stage_client.kvderive",
         "stage_client.kvmap")

#: The packages that must import nothing of stage_client outside themselves,
#: and nothing outside the standard library.
LEAF_PACKAGES = ("stage_client.protocol",)

#: The heading of the Python table in docs/ARCHITECTURE.md.
TABLE_HEADING = "### Python"


class Module:
    """One module of the package: its name, whether it is a package's ``__init__``, its source path."""

    def __init__(self, name: str, is_package: bool, path: str) -> None:
        self.name, self.is_package, self.path = name, is_package, path

    @property
    def package(self) -> str:
        """The package this module belongs to (itself for an ``__init__``)."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


def walk(root: str = _PYTHON, package: str = _PACKAGE) -> Dict[str, Module]:
    """Every module of ``package`` under ``root`` (subpackages included) by name."""
    out: Dict[str, Module] = {}
    for d, subs, files in os.walk(os.path.join(root, package)):
        subs[:] = sorted(s for s in subs if os.path.exists(os.path.join(d, s, "__init__.py")))
        rel = os.path.relpath(d, root).replace(os.sep, ".")
        for f in sorted(files):
            if f.endswith(".py"):
                name = rel if f == "__init__.py" else rel + "." + f[:-3]
                out[name] = Module(name, f == "__init__.py", os.path.join(d, f))
    return out


class Imports:
    """What one module imports: modules of the package (``ours``) and other top-level names (``others``),
    each with the line of its first import."""

    def __init__(self) -> None:
        self.ours: Dict[str, int] = {}
        self.others: Dict[str, int] = {}


def _resolve(mod: Module, level: int, name: Optional[str]) -> str:
    """The absolute module name of ``from <level dots><name> import ...`` in ``mod``."""
    if level == 0:
        return name or ""
    parts = mod.package.split(".")
    if level - 1 > len(parts) - 1:
        raise ValueError("%s: relative import beyond the top package" % mod.name)
    base = ".".join(parts[:len(parts) - (level - 1)])
    return base + "." + name if name else base


def _ours(target: str, mods: Dict[str, Module]) -> str:
    """The module of ours that importing ``target`` names: the longest prefix that is a module."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        cand = ".".join(parts[:n])
        if cand in mods:
            return cand
    return parts[0]


def imports_of(mod: Module, mods: Dict[str, Module], package: str = _PACKAGE) -> Imports:
    """Every import statement of ``mod``, wherever it is in the file."""
    with open(mod.path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), mod.path)
    out = Imports()

    def add(target: str, line: int) -> None:
        if target.split(".")[0] == package:
            out.ours.setdefault(_ours(target, mods), line)
        elif target:
            out.others.setdefault(target.split(".")[0], line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(mod, node.level, node.module)
            for a in node.names:
                sub = base + "." + a.name
                # `from . import wire` imports the module stage_client.wire; `from .wire import Code` a name of it
                add(sub if sub in mods else base, node.lineno)
    out.ours.pop(mod.name, None)
    return out


def graph(root: str = _PYTHON, package: str = _PACKAGE) -> Tuple[Dict[str, Module], Dict[str, Imports]]:
    mods = walk(root, package)
    return mods, {n: imports_of(m, mods, package) for n, m in mods.items()}


def cycles(edges: Dict[str, Iterable[str]]) -> List[List[str]]:
    """The strongly connected components of more than one node, each sorted (Tarjan's algorithm, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def _stdlib() -> Optional[Set[str]]:
    names = getattr(sys, "stdlib_module_names", None)  # Python 3.10 and later
    return set(names) if names is not None else None


def problems(mods: Dict[str, Module], imps: Dict[str, Imports]) -> List[str]:
    """Every cycle, every import out of a leaf package, every internal use of a shim."""
    out = []
    for comp in cycles({n: i.ours for n, i in imps.items()}):
        out.append("import cycle: %s" % " <-> ".join(comp))
    std = _stdlib()
    for name, imp in sorted(imps.items()):
        m = mods[name]
        for leaf in LEAF_PACKAGES:
            if m.package != leaf and not m.package.startswith(leaf + "."):
                continue
            for t, line in sorted(imp.ours.items()):
                if t != leaf and not t.startswith(leaf + "."):
                    out.append("%s:%d: %s imports %s: %s imports nothing of stage_client outside itself"
                               % (m.path, line, name, t, leaf))
            for t, line in sorted(imp.others.items()):
                if std is not None and t not in std:
                    out.append("%s:%d: %s imports %s: %s imports the standard library only"
                               % (m.path, line, name, t, leaf))
        if name in SHIMS:
            continue
        for t, line in sorted(imp.ours.items()):
            if t in SHIMS:
                out.append("%s:%d: %s imports %s, kept only for users' old import paths; import where its names "
                           "live" % (m.path, line, name, t))
    return out


# ----------------------------------------------------------------------
# The Python table of docs/ARCHITECTURE.md


def folder(package: str) -> str:
    return "python/" + package.replace(".", "/")


def package_edges(mods: Dict[str, Module], imps: Dict[str, Imports]) -> Dict[str, Set[str]]:
    """Each package's imports of the other packages, by folder (a module counts for the package it is in)."""
    out: Dict[str, Set[str]] = {folder(m.package): set() for m in mods.values()}
    for name, imp in imps.items():
        src = folder(mods[name].package)
        for t in imp.ours:
            dst = folder(mods[t].package) if t in mods else folder(t)
            if dst != src:
                out[src].add(dst)
    return out


def parse_table(text: str, heading: str = TABLE_HEADING) -> List[Tuple[int, str, List[str]]]:
    """(line, package, imports of ours) of each row of the first table under ``heading``."""
    lines = text.split("\n")
    if heading not in lines:
        raise ValueError("no %r heading" % heading)
    i = lines.index(heading) + 1
    while i < len(lines) and not lines[i].startswith("|"):
        if lines[i].startswith("#"):
            raise ValueError("no table under %r" % heading)
        i += 1
    if i >= len(lines):
        raise ValueError("no table under %r" % heading)

    def cells(line: str) -> List[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    head = cells(lines[i])
    if not head or head[0] != "package" or "imports of ours" not in head:
        raise ValueError("line %d: the table's header lacks a package or an \"imports of ours\" column" % (i + 1))
    col = head.index("imports of ours")
    rows = []
    for i in range(i + 2, len(lines)):
        if not lines[i].startswith("|"):
            break
        c = cells(lines[i])
        if len(c) != len(head):
            raise ValueError("line %d: %d cells, the header has %d" % (i + 1, len(c), len(head)))
        imps = [] if c[col] == "-" else [x.strip().strip("`") for x in c[col].split(",")]
        rows.append((i + 1, c[0].strip("`"), imps))
    return rows


def diff_table(rows: List[Tuple[int, str, List[str]]], pkgs: Dict[str, Set[str]]) -> List[str]:
    """Every way the rows differ from ``pkgs`` (each package's imports of ours), and every row below a package
    it imports."""
    out = []
    at: Dict[str, int] = {}
    for i, (line, pkg, _) in enumerate(rows):
        if pkg in at:
            out.append("line %d: %s has a row already (line %d)" % (line, pkg, rows[at[pkg]][0]))
        else:
            at[pkg] = i
    for i, (line, pkg, listed) in enumerate(rows):
        if at[pkg] != i:
            continue
        if pkg not in pkgs:
            out.append("line %d: %s: no such package" % (line, pkg))
            continue
        want = pkgs[pkg]
        for imp in listed:
            if listed.count(imp) > 1:
                out.append("line %d: %s lists %s twice" % (line, pkg, imp))
            elif imp not in want:
                out.append("line %d: %s lists %s, which it does not import" % (line, pkg, imp))
        for imp in sorted(want):
            if imp not in listed:
                out.append("line %d: %s imports %s; its row does not list it" % (line, pkg, imp))
            if imp in at and at[imp] < i:
                out.append("line %d: %s imports %s, whose row is above it (line %d)"
                           % (line, pkg, imp, rows[at[imp]][0]))
    for pkg in sorted(set(pkgs) - set(at)):
        out.append("%s has no row" % pkg)
    return sorted(set(out), key=out.index)


class ImportGraphTest(unittest.TestCase):
    def setUp(self) -> None:
        self.mods, self.imps = graph()

    def test_no_cycle_no_leaf_breach_no_shim_inside(self) -> None:
        got = problems(self.mods, self.imps)
        self.assertEqual(got, [], "\n".join(got))

    def test_shims_exist(self) -> None:
        for name in SHIMS:
            self.assertIn(name, self.mods, "SHIMS names a module that is gone")

    def test_python_table(self) -> None:
        with open(os.path.join(_ROOT, "docs", "ARCHITECTURE.md"), encoding="utf-8") as f:
            rows = parse_table(f.read())
        got = diff_table(rows, package_edges(self.mods, self.imps))
        self.assertEqual(got, [], "docs/ARCHITECTURE.md:\n" + "\n".join(got))


class CheckerTest(unittest.TestCase):
    """The checks can fail: throwaway packages with each kind of fault."""

    def build(self, files: Dict[str, str]) -> Tuple[Dict[str, Module], Dict[str, Imports]]:
        import tempfile

        tmp = tempfile.mkdtemp()
        self.addCleanup(__import__("shutil").rmtree, tmp)
        for rel, text in files.items():
            path = os.path.join(tmp, *rel.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return graph(tmp, _PACKAGE)

    def test_cycle_through_a_function_level_import(self) -> None:
        mods, imps = self.build({
            "stage_client/__init__.py": "",
            "stage_client/a.py": "from .b import x\n",
            "stage_client/b.py": "x = 1\ndef f():\n    from .c import y\n    return y\n",
            "stage_client/c.py": "from . import a\ny = 2\n",
        })
        self.assertEqual(problems(mods, imps),
                         ["import cycle: stage_client.a <-> stage_client.b <-> stage_client.c"])

    def test_leaf_package_imports(self) -> None:
        mods, imps = self.build({
            "stage_client/__init__.py": "",
            "stage_client/layout.py": "",
            "stage_client/protocol/__init__.py": "from .wire import *\n",
            "stage_client/protocol/wire.py": "import struct\nfrom ..layout import X\n",
            "stage_client/protocol/kv.py": "import numpy\nfrom . import wire\n",
        })
        got = problems(mods, imps)
        self.assertEqual(len([p for p in got if "imports stage_client.layout" in p]), 1, got)
        if _stdlib() is not None:
            self.assertEqual(len([p for p in got if "imports numpy" in p]), 1, got)
        self.assertFalse([p for p in got if "struct" in p or "cycle" in p], got)

    def test_shim_used_inside(self) -> None:
        mods, imps = self.build({
            "stage_client/__init__.py": "",
            "stage_client/protocol/__init__.py": "",
            "stage_client/wire.py": "from .protocol import *\n",
            "stage_client/client.py": "from . import wire\n",
            "stage_client/kv.py": "def f():\n    from stage_client.wire import Code\n",
        })
        got = problems(mods, imps)
        self.assertEqual(len(got), 2, got)
        self.assertTrue(all("stage_client.wire, kept only" in p for p in got), got)

    def test_table(self) -> None:
        pkgs = {"python/a": {"python/b", "python/c"}, "python/b": {"python/c"}, "python/c": set()}
        good = "| `python/a` | x | python/b, python/c |\n| `python/b` | x | `python/c` |\n| `python/c` | x | - |\n"
        cases = [
            ("matches", good, []),
            ("import not listed", good.replace("| `python/c` |\n", "| - |\n"),
             ["line 8: python/b imports python/c; its row does not list it"]),
            ("listed, not imported", good.replace("| x | - |", "| x | python/a |"),
             ["line 9: python/c lists python/a, which it does not import"]),
            ("no row", good.replace("| `python/c` | x | - |\n", ""), ["python/c has no row"]),
            ("order",
             "| `python/c` | x | - |\n| `python/a` | x | python/b, python/c |\n| `python/b` | x | python/c |\n",
             ["line 8: python/a imports python/c, whose row is above it (line 7)",
              "line 9: python/b imports python/c, whose row is above it (line 7)"]),
            ("unknown", good + "| `python/d` | x | - |\n", ["line 10: python/d: no such package"]),
        ]
        for name, body, want in cases:
            with self.subTest(name):
                text = "## Packages\n\n### Python\n\n| package | what it does | imports of ours |\n|---|---|---|\n"
                rows = parse_table(text + body + "\n## Memory\n")
                self.assertEqual(diff_table(rows, pkgs), want)

    def test_table_refuses(self) -> None:
        for text in ("## Packages\n", "### Python\n\ntext\n\n## Memory\n| package | x | imports of ours |\n",
                     "### Python\n\n| package | what |\n|---|---|\n| a | b |\n"):
            with self.subTest(text=text):
                with self.assertRaises(ValueError):
                    parse_table(text)


if __name__ == "__main__":
    unittest.main()
