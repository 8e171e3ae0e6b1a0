"""Both resume patterns on 2 real gloo processes: bitwise-exact weights after a resume at every batch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def _both_patterns(output_dir: str) -> list[str]:
    from tests.engine.resume_scripts import resume_everywhere

    return resume_everywhere(output_dir + "/a", "accelerate") + resume_everywhere(output_dir + "/e", "engine")


def test_two_process_resume_at_every_batch_is_bitwise_exact(run_distributed: Callable[..., list[Any]],
                                                           tmp_path: Path) -> None:
    assert run_distributed(_both_patterns, 2, str(tmp_path), timeout=300) == [[], []]
