"""Packaging metadata as installers read it: an SPDX license expression (PEP 639) with a build
backend that understands it, and no runtime dependency that nothing in the package imports."""

from __future__ import annotations

import ast
import re
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGES = ("collector", "exporters", "kubesim")


def test_license_is_an_spdx_expression_the_pinned_backend_understands() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"  # a string, not the deprecated table
    [setuptools] = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    floor = re.fullmatch(r"setuptools>=(\d+)", setuptools)
    assert floor and int(floor.group(1)) >= 77, "setuptools reads PEP 639 license expressions from 77 on"
    assert not any(c.startswith("License ::") for c in PYPROJECT["project"].get("classifiers", []))


def _modules(dist: str) -> set[str]:
    """The import names an installed distribution provides (packages at the depth it owns them)."""
    names = set()
    for f in metadata.files(dist) or []:
        if f.suffix in (".py", ".pyi") and f.parts[0] not in ("..", "bin") and not f.parts[0].endswith(
                (".dist-info", ".data")):
            names.add(".".join(f.parts[:-1]) if len(f.parts) > 1 else f.stem)
    return names


def _imports() -> set[str]:
    out = set()
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    out |= {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    out.add(node.module)
    return out


def test_every_runtime_dependency_is_imported() -> None:
    imported = _imports()
    unused = []
    for req in PYPROJECT["project"]["dependencies"]:
        dist = re.match(r"[A-Za-z0-9_.-]+", req)
        assert dist
        mods = _modules(dist.group(0))
        assert mods, f"{dist.group(0)} is not installed"
        if not any(i == m or i.startswith(m + ".") or m.startswith(i + ".") for i in imported for m in mods):
            unused.append(dist.group(0))
    assert unused == []
