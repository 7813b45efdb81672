"""The package's shape, read from its source: docs/architecture.md names every module
and only modules that exist, no import circle, no oversized module or function, and the
import-linter contracts of pyproject.toml are kept."""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pytest_arbiter"
MAP = ROOT / "docs" / "architecture.md"
REPOSITORY_FOLDERS = ("tests", "tools", "bench", "ci", "docs")
"""A path in the map that starts with one of these is the repository's, not the package's."""
NOT_PYTHON = ("runtime/cuda/kernels",)
"""Folders of the package holding no Python (the CUDA sources): not walked."""

MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80
OVERSIZE: Mapping[str, str] = {}
"""Modules allowed past the size limits, each with the reason (none today)."""


def package_files() -> dict[str, Path]:
    """Every Python file of the package, by its path relative to ``pytest_arbiter/``."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if "__pycache__" in path.parts or rel.startswith(NOT_PYTHON):
            continue
        found[rel] = path
    return found


def holds_code(path: Path) -> bool:
    """More than a docstring and ``from __future__ import annotations``."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return any(not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
               for node in body)


def modules_to_name() -> set[str]:
    """The modules the map must name: all but a package's ``__init__.py`` that holds
    no code (a folder named in the map stands for it)."""
    return {rel for rel, path in package_files().items()
            if Path(rel).name != "__init__.py" or holds_code(path)}


def package_folders() -> set[str]:
    """Each folder of the package that holds Python, as ``core/``."""
    return {Path(rel).parent.as_posix() + "/" for rel in package_files()} - {"./"}


# -- the map -----------------------------------------------------------------------------

FENCED = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^(?:[\w.-]+/)*[\w*.-]+\.(?:py|pyi|cu|cuh)$|^(?:[\w-]+/)+$")


def named_paths(text: str) -> list[str]:
    """The paths the doc names in inline code (``store/cache.py``, ``runtime/cuda/``),
    in order, repeats kept; fenced blocks (diagrams) are not read."""
    prose = FENCED.sub("", text)
    return [token for token in INLINE.findall(prose) if PATH.match(token)]


def where(token: str) -> Path:
    """The file or folder a named path means: the repository's for ``tests/...`` and
    its kind, else the package's (``pytest_arbiter/`` may be written or left out)."""
    token = token.removeprefix("pytest_arbiter/")
    if token.split("/")[0] in REPOSITORY_FOLDERS:
        return ROOT / token
    return PACKAGE / token


def test_the_map_names_every_module_once() -> None:
    named = [t.removeprefix("pytest_arbiter/") for t in named_paths(MAP.read_text("utf-8"))]
    missing = sorted(modules_to_name() - set(named))
    assert missing == [], f"docs/architecture.md does not name: {missing}"
    twice = sorted({t for t in named if t.endswith(".py") and named.count(t) > 1})
    assert twice == [], f"docs/architecture.md names these more than once: {twice}"


def test_the_map_names_every_folder() -> None:
    named = {t.removeprefix("pytest_arbiter/") for t in named_paths(MAP.read_text("utf-8"))}
    assert sorted(package_folders() - named) == []


def test_every_path_the_map_names_exists() -> None:
    gone = [token for token in named_paths(MAP.read_text("utf-8"))
            if not (list(where(token).parent.glob(where(token).name)) if "*" in token
                    else where(token).exists())]
    assert gone == [], f"docs/architecture.md names paths that do not exist: {gone}"


def test_the_map_parser() -> None:
    text = ("`store/cache.py` holds `MeasureCache`; `runtime/cuda/`, `tests/conftest.py`\n"
            "```\nnot/read.py\n```\n`runtime/cuda/kernels/*.cu` and `x.py` and `a b.py`\n")
    assert named_paths(text) == ["store/cache.py", "runtime/cuda/", "tests/conftest.py",
                                 "runtime/cuda/kernels/*.cu", "x.py"]
    assert where("tests/conftest.py") == ROOT / "tests" / "conftest.py"
    assert where("pytest_arbiter/plugin.py") == where("plugin.py") == PACKAGE / "plugin.py"


def exports() -> dict[str, str]:
    """Each public name of the export table (``__init__.pyi``) and its layer, as the map
    writes it: ``core/`` for a folder, ``errors`` for a module."""
    stub = ast.parse((PACKAGE / "__init__.pyi").read_text(encoding="utf-8"))
    found = {}
    for node in stub.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            top = node.module.split(".")[0]
            layer = f"{top}/" if (PACKAGE / top).is_dir() else top
            found.update({alias.asname or alias.name: layer for alias in node.names})
    return found


def test_the_map_lists_the_public_names_by_layer() -> None:
    """The map's table of public names is the export table's, layer by layer."""
    text = MAP.read_text(encoding="utf-8")
    table = {}
    for row in re.findall(r"(?m)^\| `([\w/]+)` \| (`.*`) \|$", text):
        layer, names = row
        table.update(dict.fromkeys(re.findall(r"`(\w+)`", names), layer))
    assert table == exports()


# -- import circles ----------------------------------------------------------------------


def module_names() -> dict[str, Path]:
    """Every module's dotted name (a package by its own name) and its file."""
    names = {}
    for rel, path in package_files().items():
        parts = ["pytest_arbiter", *Path(rel).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imported(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The package's modules that ``name`` imports anywhere: at the top, inside
    functions, under ``TYPE_CHECKING``; relative imports resolved. ``from pkg import x``
    counts as an import of ``pkg.x`` when that is a module."""
    known = set(known)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[:len(package) - node.level + 1], *filter(None, [base])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    names = module_names()
    return {name: imported(name, path, names) for name, path in names.items()}


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_circle_finder() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d", "f"}, "f": {"e"}}
    assert circles(graph) == [["a", "b", "c"], ["e", "f"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(textwrap.dedent("""
        from typing import TYPE_CHECKING
        from . import b
        if TYPE_CHECKING:
            from .c import Thing
        def late():
            from ..top import x
            import pytest_arbiter.p.d.e
        """), encoding="utf-8")
    known = ["pytest_arbiter.top", "pytest_arbiter.p", "pytest_arbiter.p.b",
             "pytest_arbiter.p.c", "pytest_arbiter.p.d", "pytest_arbiter.p.a"]
    assert imported("pytest_arbiter.p.a", tmp_path / "a.py", known) == {
        "pytest_arbiter.p.b", "pytest_arbiter.p.c", "pytest_arbiter.top", "pytest_arbiter.p.d"}
    assert len(import_graph()) == len(package_files())


def test_no_import_circle() -> None:
    graph = import_graph()
    found = circles(graph)
    detail = [f"{m} -> {sorted(set(graph[m]) & set(c))}" for c in found for m in c]
    assert found == [], "import circles:\n" + "\n".join(detail)


# -- sizes -------------------------------------------------------------------------------


def test_no_module_over_the_limit() -> None:
    over = {rel: n for rel, path in package_files().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
            and rel not in OVERSIZE}
    assert over == {}, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_no_function_over_the_limit() -> None:
    over = {}
    for rel, path in package_files().items():
        if rel in OVERSIZE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    over[f"{rel}:{node.lineno} {node.name}"] = length
    assert over == {}, f"functions over {MAX_FUNCTION_LINES} lines: {over}"


# -- the contracts -----------------------------------------------------------------------


def test_the_import_linter_contracts_are_kept(capsys: pytest.CaptureFixture[str]) -> None:
    """The layers and "the runtime never imports pytest" (pyproject.toml), as
    ``lint-imports`` checks them, in process (a fraction of a second)."""
    from importlinter.cli import lint_imports

    code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)
    assert code == 0, capsys.readouterr().out
