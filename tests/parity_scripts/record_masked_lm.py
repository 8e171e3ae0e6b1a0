"""Record what Accelerate 1.15 gives for tests/examples/accelerate_scripts/masked_lm.py (run once, by hand).

    /work/venvs/acc/bin/python tests/parity_scripts/record_masked_lm.py

The venv holds torch==2.13.0 (installed first) and accelerate 1.15.x. The script's ``engine`` imports are
rewritten to ``accelerate`` (record.py's ``swapped``) and it runs under torchrun on 1 and 2 CPU processes (gloo).
The values go to tests/examples/accelerate_scripts/masked_lm_recorded.py, which tests/examples/test_masked_lm.py
asserts for the engine: the batches (masks drawn by the collator from the global RNGs), the losses and the
trained weights.
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import pprint
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "examples" / "accelerate_scripts" / "masked_lm_recorded.py"


def main() -> None:
    import accelerate

    from tests.examples.accelerate_scripts.record import run

    recorded = {}
    for procs in (1, 2):
        with tempfile.TemporaryDirectory() as work:
            recorded[f"masked_lm_{procs}"] = run("masked_lm.py", procs, cwd=Path(work))
    OUT.write_text(f'"""Recorded by tests/parity_scripts/record_masked_lm.py with Accelerate {accelerate.__version__}, '
                   f'torch {__import__("torch").__version__}, under the pinned CPU kernel path of '
                   'tests/kernel_path.py."""\n\n'
                   f"RECORDED = {pprint.pformat(recorded, width=116, compact=True)}\n")
    print(OUT.read_text())


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
