"""Every public name and every Trainer keyword is on a hand-written docs page; every module is on the map.

The API reference (docs/api, generated from docstrings) lists everything by construction, so it proves nothing:
a name only the reference mentions is one no guide explains. The hand-written pages are docs/**/*.md outside
docs/api and docs/gen, and README.md. A public name is one in the ``__all__`` of a top-level package (engine,
trainer, callbacks, trackers); ``engine.utils`` mirrors ``accelerate.utils`` name for name and is described as
a whole on the Accelerate porting page."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

from trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGES = ("engine", "trainer", "callbacks", "trackers")


def hand_written_text() -> str:
    pages = [p for p in sorted(DOCS.rglob("*.md")) if p.relative_to(DOCS).parts[0] not in ("api", "gen")]
    return "\n".join(p.read_text(encoding="utf-8") for p in [*pages, ROOT / "README.md"])


def missing(names: list[str], text: str) -> list[str]:
    """The names that occur nowhere in ``text`` as a whole word."""
    return [n for n in names if re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)|\.{re.escape(n)}(?!\w)", text) is None]


def test_every_exported_name_is_on_a_hand_written_page() -> None:
    text = hand_written_text()
    absent = {package: missing(list(importlib.import_module(package).__all__), text) for package in PACKAGES}
    absent = {package: names for package, names in absent.items() if names}
    assert not absent, f"exported but on no hand-written docs page (say what each is for, on its guide): {absent}"


def test_every_trainer_keyword_is_on_a_hand_written_page() -> None:
    keywords = [name for name in inspect.signature(Trainer.__init__).parameters if name != "self"]
    assert len(keywords) > 40, "Trainer's signature lost its keywords: did it become **kwargs?"
    absent = missing(keywords, hand_written_text())
    assert not absent, f"Trainer keywords on no hand-written docs page (the Trainer guide's table): {absent}"


def test_the_check_finds_a_name_only_as_a_whole_word() -> None:
    text = "Use `engine.send_to_device` or `Accelerator.prepare`; limit_val_batches_extra is another word."
    assert missing(["send_to_device", "Accelerator", "prepare", "limit_val_batches", "Undocumented"], text) == [
        "limit_val_batches", "Undocumented"]


def test_every_module_of_engine_and_trainer_is_on_the_architecture_map() -> None:
    page = (DOCS / "architecture.md").read_text(encoding="utf-8")
    modules = [p for folder in ("engine", "trainer") for p in sorted((ROOT / folder).rglob("*.py"))
               if p.name != "__init__.py"]
    absent = [str(p.relative_to(ROOT)) for p in modules if missing([p.stem], page)]
    assert not absent, f"modules missing from the maps on docs/architecture.md (say what each does): {absent}"
