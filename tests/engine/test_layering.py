"""The dependency rules of DESIGN.md, checked on the source: imports go one way and ``engine/`` has no circle.

Every ``import`` statement is read with ``ast`` from the whole file, so imports inside functions and under
``if TYPE_CHECKING:`` count the same as module-level ones: a function-level import hides a circle from the
interpreter, not from a reader (or a refactoring) that has to untangle the modules.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "trackers", "callbacks", "trainer")
MAX_LINES = 600


@dataclass(frozen=True)
class Import:
    """One imported module, as seen from one line of one of our files."""

    source: str  # dotted name of the importing module ("engine.state")
    target: str  # dotted name of the imported module ("engine.operations", "torch.distributed")
    where: str  # "engine/state.py:332"


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _source_files() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _known_modules() -> set[str]:
    return {_module_name(p) for p in _source_files()}


def _imports_of(path: Path, known: set[str], root: Path = ROOT) -> list[Import]:
    """Every module ``path`` imports, wherever the statement sits in the file."""
    source = _module_name(path, root)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[Import] = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [Import(source, alias.name, where) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                package = source.split(".") if is_package else source.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                # `from engine import operations` imports the submodule; `from engine import __version__` the package.
                submodule = f"{base}.{alias.name}"
                found.append(Import(source, submodule if submodule in known else base, where))
    return list(dict.fromkeys(found))  # `from trainer import A, B` is one import of `trainer`


def _all_imports() -> list[Import]:
    known = _known_modules()
    return [imp for path in _source_files() for imp in _imports_of(path, known)]


def _top(name: str) -> str:
    return name.split(".", 1)[0]


def _violations(importer: str, forbidden: set[str]) -> list[str]:
    return [f"{imp.where}: {imp.source} imports {imp.target}" for imp in _all_imports()
            if _top(imp.source) == importer and _top(imp.target) in forbidden]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (or a module importing itself): Tarjan."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges.get(node, ()):
                components.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return components


def _circles_in(package: str) -> list[str]:
    """Each import circle among ``package``'s modules, with the import lines that close it."""
    imports = [imp for imp in _all_imports()
               if _top(imp.source) == package and _top(imp.target) == package and imp.source != imp.target]
    edges: dict[str, set[str]] = {}
    for imp in imports:
        edges.setdefault(imp.source, set()).add(imp.target)
    report = []
    for component in _cycles(edges):
        members = set(component)
        lines = sorted(f"  {imp.where}: {imp.source} -> {imp.target}" for imp in imports
                       if imp.source in members and imp.target in members)
        report.append(f"circle among {', '.join(component)}:\n" + "\n".join(lines))
    return report


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_has_an_import_cycle(package: str) -> None:
    report = _circles_in(package)
    assert not report, (f"{package}/ must have no import circle (function-level and TYPE_CHECKING imports count; "
                        "a package's __init__ counts as a module, so `from {package} import X` inside it imports "
                        "the whole package):\n" + "\n".join(report))


def test_engine_imports_neither_trainer_nor_callbacks() -> None:
    found = _violations("engine", {"trainer", "callbacks"})
    assert not found, "engine/ must not import trainer/ or callbacks/:\n" + "\n".join(found)


def test_trackers_import_nothing_of_ours() -> None:
    found = _violations("trackers", {"engine", "trainer", "callbacks"})
    assert not found, "trackers/ must not import engine/, trainer/ or callbacks/:\n" + "\n".join(found)


def test_callbacks_do_not_import_trainer() -> None:
    found = _violations("callbacks", {"trainer"})
    assert not found, ("callbacks/ must not import trainer/, not even under TYPE_CHECKING (callbacks see the "
                       "trainer through a typing.Protocol in callbacks/):\n" + "\n".join(found))


def test_no_source_file_exceeds_the_line_cap() -> None:
    too_long = {str(p.relative_to(ROOT)): n for p in _source_files()
                if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not too_long, f"files over {MAX_LINES} lines (split them by job): {too_long}"


# -- the checker itself: each rule must be able to fail --------------------------------------------------------


def test_imports_inside_functions_and_type_checking_are_seen(tmp_path: Path) -> None:
    package = tmp_path / "engine"
    package.mkdir()
    (package / "__init__.py").write_text("from engine.a import x\n")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainer import T\n"
                                  "def f():\n    from . import b\n")
    (package / "b.py").write_text("import engine.a\nfrom engine import __version__\n")
    known = {"engine", "engine.a", "engine.b"}
    a = {(i.target, i.where) for i in _imports_of(package / "a.py", known, tmp_path)}
    b = {i.target for i in _imports_of(package / "b.py", known, tmp_path)}
    assert ("trainer", "engine/a.py:3") in a and ("engine.b", "engine/a.py:5") in a
    assert b == {"engine.a", "engine"}


def test_cycle_finder_reports_circles_and_only_circles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert _cycles({"a": {"a"}}) == [["a"]]
