"""Every Python example on the documentation site runs.

Each page's ```python fences run in order, in one namespace (a later example may use what an earlier one
defined), in a fresh process (a fork of a server that has already imported torch) whose working directory is
an empty temporary folder. A fence right below the line
``<small class="no-run">Not run in the docs tests: REASON</small>`` (shown on the page) is not run; the reason is
required (for example "needs a GPU", "starts 2 processes"). ``--8<-- "file"`` lines (pymdownx.snippets) are replaced by
the file they include, from ``docs/snippets/``. Tracebacks name the page and its line numbers.

README.md (the front page) is collected too: it carries the marker line.

An example that shows an error catches it (``try: ... except SomeError as error: print(error)``). Such a ``try``
at the top level of an example must raise into one of its handlers: the test fails when nothing is raised (an
example that expects an error that no longer comes would otherwise print nothing and pass). A ``try`` that may
end without an error (a wrapper script's) says why in a comment on its ``try:`` line.
"""

from __future__ import annotations

import ast
import multiprocessing as mp
import os
import queue as queue_module
import re
import textwrap
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.kernel_path import FP8_PINNED, cpu_runs_fp8_training

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SNIPPETS = DOCS / "snippets"
FRONT_PAGE_MARKER = "<!-- ember-docs: the examples on this page run in tests/test_docs_examples.py -->"
TIMEOUT_S = 180.0

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                    flags=re.MULTILINE | re.DOTALL)
_NO_RUN = re.compile(r'<small class="no-run">Not run in the docs tests:(?P<reason>.*?)</small>')
_SNIPPET = re.compile(r"^(?P<indent>[ \t]*)--8<--\s+\"(?P<name>[^\"]+)\"\s*$", flags=re.MULTILINE)


@dataclass(frozen=True)
class Example:
    page: Path
    line: int  # the fence's first code line, 1-based, in the page
    code: str
    no_run: str | None  # the reason it is not run, or None


def pages() -> list[Path]:
    found = sorted(p for p in DOCS.rglob("*.md") if "gen" not in p.relative_to(DOCS).parts)
    readme = ROOT / "README.md"
    if FRONT_PAGE_MARKER in readme.read_text(encoding="utf-8"):
        found.append(readme)
    return found


def expand_snippets(code: str) -> str:
    """``--8<-- "name"`` lines replaced by ``docs/snippets/name`` (indented as the line was)."""
    def include(match: re.Match[str]) -> str:
        text = (SNIPPETS / match["name"]).read_text(encoding="utf-8").rstrip("\n")
        return textwrap.indent(text, match["indent"])

    return _SNIPPET.sub(include, code)


def examples(page: Path) -> list[Example]:
    """The page's ```python fences, with the no-run reason of the marker line right above each (if any)."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        language = match["info"].strip().split(" ")[0].strip("{}.").lower()
        if language not in ("python", "py"):
            continue
        before = text[:match.start()].rstrip().splitlines()
        marker = _NO_RUN.search(before[-1]) if before else None
        body = textwrap.dedent(match["body"])
        line = text.count("\n", 0, match.start("body")) + 1
        found.append(Example(page, line, body, marker["reason"].strip() if marker else None))
    return found


def page_chunks(page: Path) -> list[tuple[str, str]]:
    """The page's runnable examples as ``(source, filename)`` pairs, run in order in one namespace.

    Each source is padded with blank lines so that its line numbers are the page's own; a fence that only
    includes a snippet is compiled as the snippet file, so a traceback names the file and line that failed.
    """
    chunks = []
    for example in examples(page):
        if example.no_run is not None:
            continue
        only = _SNIPPET.fullmatch(example.code.strip())
        if only is not None:
            snippet = SNIPPETS / only["name"]
            chunks.append((snippet.read_text(encoding="utf-8"), str(snippet)))
        else:
            chunks.append(("\n" * (example.line - 1) + expand_snippets(example.code), str(page)))
    return chunks


def must_raise(source: str, filename: str) -> ast.Module:
    """``source`` parsed, each top-level ``try`` with handlers, no ``else`` and no comment on its ``try:`` line
    given an ``else`` that fails: the example is meant to raise (see the module docstring)."""
    tree = ast.parse(source, filename)
    lines = source.splitlines()
    for node in tree.body:
        if not isinstance(node, ast.Try) or not node.handlers or node.orelse or "#" in lines[node.lineno - 1]:
            continue
        caught = " or ".join(ast.unparse(h.type) if h.type is not None else "an exception" for h in node.handlers)
        message = f"{filename}, line {node.lineno}: this example is meant to raise {caught}; nothing was raised"
        fail = ast.parse(f"raise AssertionError({message!r})").body[0]
        for part in ast.walk(fail):
            ast.copy_location(part, node)
        node.orelse = [fail]
    return tree


def _run_page(chunks: list[tuple[str, str]], page: str, cwd: str, results: Any, env: dict[str, str]) -> None:
    try:
        os.environ.update(env)  # before the first kernel: oneDNN reads its cap then
        os.chdir(cwd)
        import torch

        torch.set_num_threads(1)
        namespace = {"__name__": "__main__", "__file__": page}
        for source, filename in chunks:
            exec(compile(must_raise(source, filename), filename, "exec"), namespace)  # noqa: S102
        results.put((True, ""))
    except BaseException:  # noqa: BLE001 - every failure reaches the test with its traceback
        results.put((False, traceback.format_exc()))


def run_page(page: Path, cwd: Path, env: dict[str, str] | None = None) -> None:
    ctx = mp.get_context("forkserver")
    # A no-op once the server runs (tests/conftest.py starts the same one, with torch and the engine preloaded).
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "engine", "trainer", "callbacks", "trackers"])
    results = ctx.Queue()
    proc = ctx.Process(target=_run_page, args=(page_chunks(page), str(page), str(cwd), results, env or {}),
                      daemon=False)
    proc.start()
    try:
        ok, error = results.get(timeout=TIMEOUT_S)
    except queue_module.Empty:
        raise AssertionError(f"{_shown(page)}: its examples did not finish in {TIMEOUT_S:.0f} s "
                             f"(exit code {proc.exitcode})") from None
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
        results.close()
    assert ok, f"an example in {_shown(page)} failed:\n{error}"


def _shown(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


RUNNABLE = [page for page in pages() if any(e.no_run is None for e in examples(page))]


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_pages_examples_run(page: Path, tmp_path: Path) -> None:
    # A page that trains in fp8 runs with oneDNN at the fp8 kernels' level (tests/kernel_path.py: FP8_PINNED).
    fp8 = re.search(r"""precision=["']fp8["']""", page.read_text(encoding="utf-8")) is not None
    if fp8 and not cpu_runs_fp8_training():
        pytest.skip(f"{page.name} trains in fp8: torch's CPU fp8 training kernels need AVX512-FP16, which this CPU lacks")
    run_page(page, tmp_path, env=FP8_PINNED if fp8 else None)


def test_every_example_runs_or_says_why_not() -> None:
    everything = [e for page in pages() for e in examples(page)]
    assert len(everything) > 20, "the collector found almost no examples: did the fence syntax change?"
    unexplained = [f"{e.page.relative_to(ROOT)}:{e.line}" for e in everything if e.no_run == ""]
    assert not unexplained, f"a no-run marker needs a reason: {unexplained}"
    skipped = [e for e in everything if e.no_run is not None]
    assert len(skipped) < len(everything) / 2, "most examples must run"


def test_the_collector_reads_markers_snippets_and_line_numbers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text('# T\n\n```python\nx = 1\n```\n\n<small class="no-run">Not run in the docs tests: needs a GPU</small>\n```python\nx.cuda()\n```\n\n'
                    '!!! note\n    ```python\n    assert x == 1\n    raise ValueError("line 15")\n    ```\n',
                    encoding="utf-8")
    found = examples(page)
    assert [(e.line, e.no_run) for e in found] == [(4, None), (9, "needs a GPU"), (14, None)]
    chunks = page_chunks(page)
    assert [filename for _, filename in chunks] == [str(page)] * 2
    assert chunks[1][0].splitlines()[14] == 'raise ValueError("line 15")'
    with pytest.raises(AssertionError, match=r"page\.md\", line 15"):
        run_page(page, tmp_path)
    assert "import torch" in expand_snippets('--8<-- "tiny_setup.py"')


def test_an_example_meant_to_raise_fails_when_nothing_is_raised(tmp_path: Path) -> None:
    shows_an_error = "```python\ntry:\n    int('x')\nexcept ValueError as error:\n    print(error)\n```\n"
    page = tmp_path / "raises.md"
    page.write_text("# T\n\n" + shows_an_error, encoding="utf-8")
    run_page(page, tmp_path)  # it raises into its handler: fine
    page.write_text("# T\n\n" + shows_an_error.replace("int('x')", "int('1')"), encoding="utf-8")
    with pytest.raises(AssertionError, match=r"raises\.md, line 4: this example is meant to raise ValueError; "
                                             r"nothing was raised"):
        run_page(page, tmp_path)
    # a try whose line says why it may end without an error is left as it is
    page.write_text("# T\n\n" + shows_an_error.replace("int('x')", "int('1')").replace(
        "try:", "try:  # ends normally unless the input is bad"), encoding="utf-8")
    run_page(page, tmp_path)



_PATH = re.compile(r"`((?:tests|engine|trainer|callbacks|trackers|examples|benchmarks|docs)/[\w./*-]*)")


def test_every_file_the_docs_name_exists() -> None:
    """A path in backquotes (``tests/trainer/test_resume*.py``, ``engine/environment.py``) names a file or folder
    of the repository (globs must match something), so a renamed test or module cannot leave the docs behind."""
    missing = []
    for page in pages():
        for path in sorted(set(_PATH.findall(page.read_text(encoding="utf-8")))):
            path = path.rstrip(".")
            if not (list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
                missing.append(f"{_shown(page)}: {path}")
    assert not missing, "the docs name files that do not exist:\n" + "\n".join(missing)
