"""What the package ships besides code: its types and its licence."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import tripwire

ROOT = Path(__file__).resolve().parent.parent

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_py_typed_ships_with_the_package() -> None:
    assert (Path(tripwire.__file__).parent / "py.typed").is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["tripwire"]


def test_the_licence_file_is_the_one_the_metadata_names() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert data["project"]["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def _declared() -> set[str]:
    """Every distribution pyproject.toml names, in its dependencies or in any extra."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = data["project"]
    specs = [*project["dependencies"], *(s for e in project["optional-dependencies"].values() for s in e)]
    return {re.split(r"[\[<>=!~;\s]", s, maxsplit=1)[0].lower().replace("_", "-") for s in specs}


def _imported_top_levels() -> dict[str, str]:
    """Top-level module name -> one file of src/tripwire that imports it (absolute imports)."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "src" / "tripwire").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def test_every_library_the_code_imports_is_a_declared_dependency() -> None:
    # An import that works here only because another package pulled its library in breaks a
    # clean install (typer 0.29 vendors click and installs none: `import click` broke the CLI).
    declared = _declared()
    owners = importlib.metadata.packages_distributions()
    undeclared = {}
    for top, where in _imported_top_levels().items():
        if top in sys.stdlib_module_names or top in ("tripwire", "__future__"):
            continue
        dists = {d.lower().replace("_", "-") for d in owners.get(top, [top])}
        if not dists & declared:
            undeclared[top] = (sorted(dists), where)
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
