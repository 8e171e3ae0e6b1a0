"""The documentation site builds in strict mode and its pages work in a real browser.

The build is the one ``make docs`` runs (``mkdocs build --strict``: a broken link or anchor, a page missing from
the navigation, a missing API reference or a docstring that does not render fails it), into a temporary folder.
The pictures come from real runs (``docs/gen/figures.py``, run by the build's hook when ``build/docs/`` lacks
them). The browser test loads every page in headless Chromium and fails on a missing page or a JavaScript error;
it is skipped, saying why, where no Chromium is installed (``apt-get install chromium``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import docs_browser

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    yield out


def nav_pages() -> list[str]:
    """Every page named in mkdocs.yml's nav, as the path of its built HTML file."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:"):]
    pages = re.findall(r"([\w/-]+)\.md", nav)
    return [p + ".html" if p == "index" or p.endswith("/index") else p + "/index.html" for p in pages]


def test_every_page_the_navigation_names_is_built(site: Path) -> None:
    pages = nav_pages()
    assert len(pages) >= 20
    missing = [page for page in pages if not (site / page).is_file()]
    assert not missing, f"pages in mkdocs.yml's nav that the build did not write: {missing}"


def test_the_api_reference_and_the_pictures_are_in_the_site(site: Path) -> None:
    api = {name: (site / "api" / name / "index.html").read_text(encoding="utf-8")
           for name in ("engine", "trainer", "callbacks", "trackers")}
    for name, anchor in (("engine", "engine.Accelerator"), ("trainer", "trainer.Trainer"),
                         ("trainer", "trainer.TrainModule"), ("callbacks", "callbacks.ModelCheckpoint"),
                         ("callbacks", "callbacks.base"), ("trackers", "trackers.GeneralTracker"),
                         ("engine", "engine.ParallelismConfig"), ("engine", "engine.backends.tensor_parallel"),
                         ("engine", "engine.precision.fp8.AORecipeKwargs"),
                         ("engine", "engine.memory.activation_checkpointing.apply_activation_checkpointing"),
                         ("engine", "engine.Accelerator.torch_device_mesh"),
                         ("engine", "engine.backends.deepspeed_config.HfDeepSpeedConfig"),
                         ("trainer", "trainer.strategies.ModelParallelStrategy")):
        assert f'id="{anchor}"' in api[name], f"api/{name}: no entry for {anchor}"
    # Docstring examples and literal blocks render as code, not as nested quotes or a literal fence
    # (docs/gen/griffe_examples.py).
    for name, html in api.items():
        assert "<blockquote>\n<blockquote>" not in html and "```" not in html, f"api/{name}: a docstring's code did not render"
    for picture in ("curves.png", "hook_timeline.png"):
        assert (site / "figures" / picture).stat().st_size > 10_000, f"figures/{picture} is missing or empty"
    get_started = (site / "get-started" / "index.html").read_text(encoding="utf-8")
    # The demo run's tree lists its checkpoint files (metrics.csv beside them: the tree, not the prose).
    assert "metrics.csv" in get_started and "last.ckpt" in get_started, \
        "the demo run's folder tree is not on the Get started page"


def test_the_pages_load_in_a_browser_without_errors_and_search_works(site: Path) -> None:
    executable = docs_browser.find_chromium()
    if executable is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium): the browser check did not run")
    with docs_browser.serve(site) as base, docs_browser.browser(executable) as chromium:
        page = chromium.page()
        for path in nav_pages():
            url = base + path.removesuffix("index.html")
            status = page.goto(url)
            assert status == 200, f"{url}: HTTP {status}"
            assert page.evaluate("document.querySelectorAll('nav.md-nav--primary a.md-nav__link').length") > 20, (
                f"{url}: the navigation did not render")
            assert page.errors() == [], f"{url}: JavaScript or load errors: {page.errors()}"
        page.goto(base + "guides/checkpoints/")
        titles = docs_browser.search(page, "async_save")
        assert any("Checkpoints" in title for title in titles), f"search for async_save found {titles}"
        assert page.errors() == [], f"JavaScript or load errors while searching: {page.errors()}"
        assert page.goto(base + "no/such/page/") == 404  # the check above would see a missing page


def test_docstrings_are_rewritten_into_markdown_that_renders() -> None:
    """docs/gen/griffe_examples.py: ``Example:`` becomes an ``Examples:`` section, a doctest outside one and a
    reST literal block become fences (each would otherwise render as nested quotes or a paragraph)."""
    pytest.importorskip("griffe", reason="the docs extra is not installed: pip install -e '.[docs]'")
    sys.path.insert(0, str(ROOT / "docs" / "gen"))
    try:
        from griffe_examples import rewrite
    finally:
        sys.path.remove(str(ROOT / "docs" / "gen"))
    assert rewrite("Sum.\n\nExample:\n    >>> 1 + 1\n    2\n") == "Sum.\n\nExamples:\n    >>> 1 + 1\n    2\n"
    assert rewrite("Sum.\n\n>>> 1 + 1\n2\n") == "Sum.\n\n```pycon\n>>> 1 + 1\n2\n```\n"
    assert rewrite("Calls::\n\n    setup()\n    fit()\n") == "Calls:\n\n```text\nsetup()\nfit()\n```\n\n"
    assert rewrite("Example (a title)::\n\n    x = f()\n").startswith("Examples:\n    a title:\n\n    ```python\n")
