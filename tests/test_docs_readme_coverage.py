"""Nothing in README.md is lost from the documentation site.

README.md is the repository's short front page (it replaced a long README whose content moved to the site: this
test kept that move honest, and keeps the front page and the site in step), so everything it says must also be on
the site. Two mechanical checks, both reading only text (no build, well under a second):

- every ``## `` / ``### `` heading of README.md is mapped in ``SECTIONS`` to the site pages that carry its
  content, and each of those pages exists and is in mkdocs.yml's navigation: a new README section fails here until
  its content has a page;
- every code span of the README's prose (a name, a keyword, an error text, a test file) appears somewhere in the
  site's pages, whitespace aside: a sentence added to the README with a new name fails here until the site says it
  too. ``NOT_ON_THE_SITE`` lists the few spans that are deliberately left out, each with its reason.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
FRONT_PAGE = DOCS / "README_front_page.md"

# README heading (without the #s) -> the site pages (under docs/) holding its content. Headings of both the
# current README and the front page that replaces it are here, so the swap needs no change.
SECTIONS: dict[str, tuple[str, ...]] = {
    "The demo": ("get-started.md",),
    "Quickstart 1: subclass `TrainModule` and fit": ("get-started.md", "guides/trainer.md"),
    "Quickstart 2: drop to the engine for a custom loop": ("guides/engine.md",),
    "Quickstart 3: write a callback": ("guides/callbacks.md",),
    "Porting": ("porting/lightning.md",),
    "Porting from Accelerate: what goes where, resuming, and what differs": ("porting/accelerate.md",),
    "Lightning's tools": ("guides/tools.md",),
    "Writing predictions: `BasePredictionWriter`": ("guides/tools.md",),
    "Weight averaging: `StochasticWeightAveraging`, `EMAWeightAveraging`, `WeightAveraging`": ("guides/tools.md",),
    "Config-file command line: `ember fit --config cfg.yaml` (`trainer.cli.CLI`, alias `LightningCLI`)":
        ("guides/cli.md",),
    'Profilers: `Trainer(profiler="simple" | "advanced" | "pytorch" | Profiler)`': ("guides/tools.md",),
    "torch.compile: `trainer.fit(torch.compile(model))` or `Trainer(compile=True)`": ("guides/tools.md",),
    "Tuner: `lr_find` and `scale_batch_size`": ("guides/tools.md",),
    "Trackers": ("guides/logging.md",),
    "Run folders": ("guides/checkpoints.md", "get-started.md"),
    "Distributed evaluation is exact": ("guides/distributed.md",),
    "Several processes and machines": ("guides/distributed.md",),
    "DeepSpeed ZeRO 1/2/3": ("guides/deepspeed.md",),
    "Big models": ("guides/big-models.md",),
    "Tensor and 2-D parallelism": ("guides/big-models.md",),
    'fp8 through torchao: `mixed_precision="fp8"`': ("guides/big-models.md",),
    "Activation checkpointing": ("guides/big-models.md",),
    "Notebooks, debug mode, communication hooks and `engine.utils`": ("guides/engine.md",),
    "Checkpoints that do not stop training": ("guides/checkpoints.md", "guides/engine.md"),
    "Promises and the tests that check them": ("promises.md",),
    "Overhead": ("benchmarks.md",),
    "Layout": ("architecture.md",),
    # The front page's own sections.
    "Documentation": ("index.md",),
}

# Code spans of the README deliberately not on the site, with why.
NOT_ON_THE_SITE: dict[str, str] = {
    "../shared/spec/ENGINE.md": "a path outside the repository (the engine's specification, for its developers)",
    "site/index.html": "the front page tells readers of the repository where `make docs` puts the site",
    "examples/by_feature/*.py": "a path of Accelerate's repository: the site says \"Accelerate's own by_feature "
                                "examples\" (a path in backquotes on the site must exist here: test_docs_examples)",
}

_HEADING = re.compile(r"^(#{2,3}) (.+?)\s*$", flags=re.MULTILINE)
_FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```[ \t]*$", flags=re.MULTILINE | re.DOTALL)
_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", flags=re.DOTALL)


def front_page() -> Path:
    """The front page: docs/README_front_page.md until it is moved over README.md, then README.md itself."""
    return FRONT_PAGE if FRONT_PAGE.exists() else README


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def headings(text: str) -> list[str]:
    """The ``## `` / ``### `` headings of a markdown text, fenced code left out."""
    return [match[2] for match in _HEADING.finditer(_FENCE.sub("", text))]


def code_spans(text: str) -> set[str]:
    """The code spans of a markdown text's prose (fenced code left out), whitespace squashed."""
    return {_squash(match[2]) for match in _SPAN.finditer(_FENCE.sub("", text))} - {""}


def site_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if p != FRONT_PAGE and "gen" not in p.relative_to(DOCS).parts)


def nav_pages() -> set[str]:
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    return set(re.findall(r"([\w/-]+\.md)", text[text.index("\nnav:"):]))


def test_every_readme_section_has_a_page_on_the_site() -> None:
    readme = headings(README.read_text(encoding="utf-8"))
    unmapped = [h for h in readme if h not in SECTIONS]
    assert not unmapped, ("README sections with no page on the site: put their content on a page of docs/ and map "
                          f"each heading in SECTIONS ({Path(__file__).name}): {unmapped}")
    if front_page() != README:  # once the front page is README.md, the long README's entries may stay
        known = set(readme) | set(headings(front_page().read_text(encoding="utf-8")))
        stale = [h for h in SECTIONS if h not in known]
        assert not stale, f"SECTIONS maps headings that neither README.md nor the front page has: {stale}"
    nav = nav_pages()
    for heading, pages in SECTIONS.items():
        for page in pages:
            assert (DOCS / page).is_file() and page in nav, f"{heading!r} -> docs/{page}: not a page of the site"


def test_every_code_span_of_the_readme_is_on_the_site() -> None:
    site = _squash("\n".join(p.read_text(encoding="utf-8") for p in site_pages()))
    missing = sorted(span for span in code_spans(README.read_text(encoding="utf-8"))
                     if span not in site and span not in NOT_ON_THE_SITE)
    assert not missing, ("README.md says these (in backquotes) and no page of docs/ does; say them on the page "
                         f"that SECTIONS maps their section to: {missing}")


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_front_page_links_resolve_and_name_every_guide() -> None:
    """The front page (docs/README_front_page.md, README.md once moved there) is read at the repository's root: its
    relative links must name files there, and it links every guide and porting page of the site's navigation."""
    for page in sorted({front_page(), README}):
        targets = [t.split("#")[0] for t in _LINK.findall(page.read_text(encoding="utf-8"))
                   if not t.startswith(("http://", "https://", "#", "mailto:"))]
        broken = [t for t in targets if not (ROOT / t).exists()]
        assert not broken, f"{page.relative_to(ROOT)} links to files that do not exist (from the root): {broken}"
    linked = set(_LINK.findall(front_page().read_text(encoding="utf-8")))
    unlinked = sorted(f"docs/{p}" for p in nav_pages() if p.startswith(("guides/", "porting/")) and
                      not p.endswith("index.md") and f"docs/{p}" not in linked)
    assert not unlinked, f"the front page does not link these pages of the site: {unlinked}"


def test_the_coverage_checks_read_headings_and_spans() -> None:
    text = "# T\n\n## One `a`\n\n```python\n## not a heading `b`\n```\n\n### Two\nSee `x\ny` and ``z`w``.\n"
    assert headings(text) == ["One `a`", "Two"]
    assert code_spans(text) == {"a", "x y", "z`w"}
