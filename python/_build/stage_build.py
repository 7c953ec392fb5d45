"""In-tree PEP 517 build backend for stage-client.

Wheels are built by setuptools (``setuptools.build_meta``) when the
environment can: setuptools >= 61 (the ``[project]`` table) and a
``bdist_wheel`` command (setuptools >= 70.1, or the ``wheel`` package).
Otherwise -- a fresh venv of Python 3.11 has setuptools 65 without
``wheel``, one of 3.12 has no setuptools at all, 3.9 ships setuptools 58 --
this module builds the (pure-Python, py3-none-any) wheel itself with the
standard library, so ``pip install --no-build-isolation ./python`` works
offline everywhere. Source distributions are always built here (so they
carry this backend).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Any, Dict, List, Optional, Tuple

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = "stage_client"


# --------------------------------------------------------------------------
# setuptools, when it can do the job


def _setuptools() -> Optional[Any]:
    if os.environ.get("STAGE_BUILD_NO_SETUPTOOLS"):
        return None
    try:
        import setuptools
        from setuptools import build_meta
    except ImportError:
        return None
    m = re.match(r"(\d+)", getattr(setuptools, "__version__", "0"))
    if not m or int(m.group(1)) < 61:
        return None
    try:
        import setuptools.command.bdist_wheel  # noqa: F401  (setuptools >= 70.1)
        return build_meta
    except ImportError:
        pass
    try:
        import wheel.bdist_wheel  # noqa: F401
        return build_meta
    except ImportError:
        return None


# --------------------------------------------------------------------------
# metadata from pyproject.toml (the few simple keys this project uses)


def _project() -> Dict[str, Any]:
    with open(os.path.join(_ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    try:
        import tomllib  # Python >= 3.11

        return dict(tomllib.loads(text)["project"])
    except ImportError:
        pass
    proj: Dict[str, Any] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]").strip()
            continue
        m = re.match(r'([A-Za-z0-9_-]+)\s*=\s*"([^"]*)"\s*$', line)
        if section == "project" and m:
            proj[m.group(1)] = m.group(2)
        elif section.startswith("project.entry-points.") and m:
            group = section[len("project.entry-points."):].strip().strip('"')
            proj.setdefault("entry-points", {}).setdefault(group, {})[m.group(1)] = m.group(2)
        elif section == "project.optional-dependencies":
            m2 = re.match(r'([A-Za-z0-9_-]+)\s*=\s*\[(.*)\]\s*$', line)
            if m2:
                proj.setdefault("optional-dependencies", {})[m2.group(1)] = re.findall(r'"([^"]+)"', m2.group(2))
    return proj


def _names() -> Tuple[str, str, str]:
    p = _project()
    name, version = p["name"], p["version"]
    dist = re.sub(r"[-_.]+", "_", name).lower()
    return name, version, dist


def _metadata() -> str:
    p = _project()
    lines = ["Metadata-Version: 2.1", "Name: %s" % p["name"], "Version: %s" % p["version"]]
    if p.get("description"):
        lines.append("Summary: %s" % p["description"])
    if p.get("requires-python"):
        lines.append("Requires-Python: %s" % p["requires-python"])
    for extra, reqs in sorted((p.get("optional-dependencies") or {}).items()):
        lines.append("Provides-Extra: %s" % extra)
        for r in reqs:
            lines.append('Requires-Dist: %s; extra == "%s"' % (r, extra))
    readme = os.path.join(_ROOT, "README.md")
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def _entry_points() -> str:
    """entry_points.txt from [project.entry-points.*] (SGLang finds the stage plugin through it)."""
    out = []
    for group, eps in sorted((_project().get("entry-points") or {}).items()):
        out.append("[%s]" % group)
        out.extend("%s = %s" % (k, v) for k, v in sorted(eps.items()))
        out.append("")
    return "\n".join(out)


def _dist_info_files(tag: str = "py3-none-any") -> Dict[str, bytes]:
    files = {
        "METADATA": _metadata().encode("utf-8"),
        "WHEEL": ("Wheel-Version: 1.0\nGenerator: stage_build\nRoot-Is-Purelib: true\nTag: %s\n" % tag).encode(),
        "top_level.txt": (_PACKAGE + "\n").encode(),
    }
    eps = _entry_points()
    if eps:
        files["entry_points.txt"] = eps.encode()
    return files


# --------------------------------------------------------------------------
# wheels


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (path, digest, len(data))


def _write_wheel(wheel_directory: str, files: Dict[str, bytes]) -> str:
    _, version, dist = _names()
    info = "%s-%s.dist-info" % (dist, version)
    for k, v in _dist_info_files().items():
        files["%s/%s" % (info, k)] = v
    record = [_record_line(p, d) for p, d in files.items()]
    record.append("%s/RECORD,," % info)
    files["%s/RECORD" % info] = ("\n".join(record) + "\n").encode()
    fname = "%s-%s-py3-none-any.whl" % (dist, version)
    with zipfile.ZipFile(os.path.join(wheel_directory, fname), "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in files.items():
            zi = zipfile.ZipInfo(p, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, d)
    return fname


def _package_files() -> Dict[str, bytes]:
    files: Dict[str, bytes] = {}
    for rel in _sources(_PACKAGE):
        with open(os.path.join(_ROOT, rel), "rb") as f:
            files[rel] = f.read()
    return files


def _sources(top: str) -> List[str]:
    """The .py files and py.typed under ``top`` (subpackages included), as paths relative to _ROOT."""
    out = []
    for d, subs, fns in os.walk(os.path.join(_ROOT, top)):
        subs[:] = sorted(s for s in subs if s != "__pycache__")
        rel = os.path.relpath(d, _ROOT)
        out.extend("%s/%s" % (rel, fn) for fn in sorted(fns) if fn.endswith(".py") or fn == "py.typed")
    return out


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str,
                                     config_settings: Optional[Dict[str, Any]] = None) -> str:
    st = _setuptools()
    if st is not None:
        return st.prepare_metadata_for_build_wheel(metadata_directory, config_settings)
    _, version, dist = _names()
    info = "%s-%s.dist-info" % (dist, version)
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    for k, v in _dist_info_files().items():
        with open(os.path.join(metadata_directory, info, k), "wb") as f:
            f.write(v)
    return info


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    st = _setuptools()
    if st is not None:
        return st.build_wheel(wheel_directory, config_settings, metadata_directory)
    return _write_wheel(wheel_directory, _package_files())


# PEP 660 editable installs: a .pth file naming the source directory.

def get_requires_for_build_editable(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def prepare_metadata_for_build_editable(metadata_directory: str,
                                        config_settings: Optional[Dict[str, Any]] = None) -> str:
    _, version, dist = _names()
    info = "%s-%s.dist-info" % (dist, version)
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    for k, v in _dist_info_files().items():
        with open(os.path.join(metadata_directory, info, k), "wb") as f:
            f.write(v)
    return info


def build_editable(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    return _write_wheel(wheel_directory, {"__editable__.stage_client.pth": (_ROOT + "\n").encode()})


# --------------------------------------------------------------------------
# source distributions


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    _, version, dist = _names()
    base = "%s-%s" % (dist, version)
    fname = base + ".tar.gz"
    members: List[str] = ["pyproject.toml", "README.md"]
    for d in (_PACKAGE, "_build", "tests"):
        members.extend(_sources(d))
    with tarfile.open(os.path.join(sdist_directory, fname), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, data: bytes) -> None:
            ti = tarfile.TarInfo("%s/%s" % (base, name))
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 1577836800
            tar.addfile(ti, io.BytesIO(data))

        for m in members:
            path = os.path.join(_ROOT, m)
            if os.path.exists(path):
                with open(path, "rb") as f:
                    add(m, f.read())
        add("PKG-INFO", _metadata().encode("utf-8"))
    return fname
