"""What the package ships besides code: its types and its licence."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

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


def _absolute_imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, module) of every absolute import in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def _imported_top_levels() -> dict[str, str]:
    """Top-level module name -> one file of src/tripwire that imports it (absolute imports)."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "src" / "tripwire").rglob("*.py")):
        for _, name in _absolute_imports(ast.parse(path.read_text(encoding="utf-8"))):
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


# Each extra's code, by path under src/tripwire (the longest matching prefix wins); everything
# else is the base package's, whose `dependencies` must cover it alone.
_EXTRA_CODE: dict[str, str] = {
    "otel/": "otel",
    "prices.py": "prices",
    "store/redis.py": "redis",
    "serve/": "serve",
    "store/": "serve",
    "cli/serve.py": "serve",
    "report.py": "serve",
    "cli/report.py": "serve",
    "verify/": "verify",
    "replay/plot.py": "plot",
    "integrations/pydantic_ai.py": "pydantic-ai",
    "integrations/langchain.py": "langchain",
    "integrations/openai_agents.py": "openai-agents",
    "integrations/smolagents.py": "smolagents",
    "integrations/google_adk.py": "google-adk",
}

# A lazy import on a path that needs another extra than its file's: (file, module) -> that extra.
# Each one is a path the user asks for by name (a channel, an option, a subcommand).
_LAZY_EXTRA: dict[tuple[str, str], str] = {
    ("remote.py", "redis"): "redis",  # connect(redis_url=...)
    ("remote.py", "httpx"): "otel",  # connect(url=...): the agent side of the fleet
    ("cli/demo.py", "uvicorn"): "serve",  # tripwire demo --serve
    ("cli/calibrate.py", "matplotlib"): "plot",  # calibrate --plot (checked, with its advice)
}

# What a library needs at run time without its code importing it where ours can see: the
# extra whose code uses the feature must declare the package itself.
_FEATURES: tuple[tuple[str, str], ...] = (
    (".form()", "python-multipart"),  # starlette parses a form through python-multipart
)


def _dist(spec: str) -> str:
    return re.split(r"[\[<>=!~;\s]", spec, maxsplit=1)[0].lower().replace("_", "-")


def _extra_closure(extra: str | None) -> set[str]:
    """The distributions an install of ``tripwire[extra]`` asks for by name: the base
    dependencies, the extra's own, and those of the tripwire extras it names (not what those
    distributions pull in: another package's dependency may go away in its next release)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    out = {_dist(s) for s in project["dependencies"]}
    todo = [extra] if extra else []
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for spec in extras[name]:
            if spec.startswith("tripwire["):
                todo.extend(e.strip() for e in spec[len("tripwire["):spec.index("]")].split(","))
            else:
                out.add(_dist(spec))
    return out


def _owner(rel: str) -> str | None:
    best = max((p for p in _EXTRA_CODE if rel.startswith(p)), key=len, default=None)
    return _EXTRA_CODE[best] if best is not None else None


_IMPORT_ERRORS: Final = ("ImportError", "ModuleNotFoundError")


def _catches_import_error(node: ast.Try) -> bool:
    for handler in node.handlers:
        caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(isinstance(c, ast.Name) and c.id in _IMPORT_ERRORS for c in caught):
            return True
    return False


def _optional_or_typing(tree: ast.AST) -> set[int]:
    """Line numbers of imports that may fail (inside ``try: ... except ImportError``) or never
    run (under ``if TYPE_CHECKING:``)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        guarded = (isinstance(node, ast.Try) and _catches_import_error(node)) or (
            isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        )
        if guarded:
            for stmt in node.body:  # type: ignore[attr-defined]
                lines.update(n.lineno for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return lines


def test_every_extra_declares_what_its_own_code_imports() -> None:
    # Another extra pulling a package in hides a gap from CI: `serve` once lacked
    # python-multipart, which google-adk, mcp and openai-agents brought to every test run, and
    # the dashboard's sign-in failed with 500 on a `pip install '.[serve]'` alone.
    owners = importlib.metadata.packages_distributions()
    gaps: list[str] = []
    src = ROOT / "src" / "tripwire"
    for path in sorted(src.rglob("*.py")):
        rel = str(path.relative_to(src))
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        skip = _optional_or_typing(tree)
        extra = _owner(rel)
        for line, name in _absolute_imports(tree):
            top = name.split(".")[0]
            if line in skip or top in sys.stdlib_module_names or top in ("tripwire", "__future__"):
                continue
            needed_by = _LAZY_EXTRA.get((rel, top), extra)
            dists = {d.lower().replace("_", "-") for d in owners.get(top, [top])}
            if not dists & _extra_closure(needed_by):
                gaps.append(f"{rel} imports {name} ({'/'.join(sorted(dists))}): not in tripwire[{needed_by or ''}]")
        for feature, dist in _FEATURES:
            if feature in text and dist not in _extra_closure(extra):
                gaps.append(f"{rel} uses {feature}, which needs {dist}: not in tripwire[{extra or ''}]")
    assert not gaps, "\n".join(gaps)


def test_the_extra_tables_name_real_extras_and_files() -> None:
    # The tables above stay true as the code moves: a renamed file or extra fails here.
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    src = ROOT / "src" / "tripwire"
    for prefix, extra in _EXTRA_CODE.items():
        assert extra in extras, extra
        assert (src / prefix).exists(), prefix
    for (rel, _), extra in _LAZY_EXTRA.items():
        assert extra in extras and (src / rel).is_file(), rel
