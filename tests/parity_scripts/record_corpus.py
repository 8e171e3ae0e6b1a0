"""Run the corpus (tests/lightning_corpus) under the real lightning 2.6.6 and write expected.py.

    /work/refvenv/bin/python tests/parity_scripts/record_corpus.py [module ...]

Each corpus file is read, its Ember imports are turned back into Lightning's (SWAPS, the README's import table
read right to left) and nothing else is changed; the result runs in this interpreter (or, for the devices=2
script, as its own process, as a user would start it).
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import json
import os
import pprint
import subprocess
import sys
import tempfile
import types
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "lightning_corpus")
MODULES = ("demo", "gan", "classification", "loggers", "plateau", "hook_order", "bf16_transformer",
           "batchnorm_metrics", "conformance", "conformance_loop", "pruning", "batch_size", "device_stats")
# Ember import -> Lightning import (line prefixes).
SWAPS = (
    ("import trainer as pl", "import lightning.pytorch as pl"),
    ("from callbacks.early_stopping import ", "from lightning.pytorch.callbacks.early_stopping import "),
    ("from trainer.states import ", "from lightning.pytorch.trainer.states import "),
    ("from trainer.utilities.exceptions import ", "from lightning.pytorch.utilities.exceptions import "),
    ("from trainer.loggers import ", "from lightning.pytorch.loggers import "),
    ("from trainer.utilities.types import ", "from lightning.pytorch.utilities.types import "),
    ("from trainer.utilities import ", "from lightning.pytorch.utilities import "),
    ("from trainer.tuner import ", "from lightning.pytorch.tuner import "),
    ("from trainer import ", "from lightning.pytorch import "),
    ("from callbacks import ", "from lightning.pytorch.callbacks import "),
)


def to_lightning(source: str) -> str:
    lines = []
    for line in source.splitlines():
        for ember, lightning in SWAPS:
            if line.startswith(ember):
                line = lightning + line[len(ember):]
                break
        lines.append(line)
    return "\n".join(lines) + "\n"


def run_module(name: str) -> dict:
    with open(os.path.join(CORPUS, f"{name}.py")) as f:
        source = to_lightning(f.read())
    module = types.ModuleType(f"lightning_corpus_{name}")
    module.__file__ = os.path.join(CORPUS, f"{name}.py")
    sys.modules[module.__name__] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 - our own corpus file
    with tempfile.TemporaryDirectory() as workdir:
        return module.main(workdir)


def run_ddp() -> dict:
    with open(os.path.join(CORPUS, "ddp_script.py")) as f:
        source = to_lightning(f.read())
    with tempfile.TemporaryDirectory() as workdir:
        script, out = os.path.join(workdir, "train.py"), os.path.join(workdir, "out.json")
        with open(script, "w") as f:
            f.write(source)
        env = {**os.environ, "PYTHONPATH": ROOT}
        subprocess.run([sys.executable, script, out], check=True, cwd=workdir, env=env)
        with open(out) as f:
            return json.load(f)


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    sys.path.insert(0, ROOT)
    import lightning

    # Names on the command line: record only those and keep the other recorded values (e.g. the 2-process run).
    chosen = [name for name in sys.argv[1:] if name in (*MODULES, "ddp")]
    if chosen:
        from tests.lightning_corpus.expected import EXPECTED

        results = dict(EXPECTED)
        results.update({name: run_ddp() if name == "ddp" else run_module(name) for name in chosen})
    else:
        results = {name: run_module(name) for name in MODULES}
        results["ddp"] = run_ddp()
    with open(os.path.join(CORPUS, "expected.py"), "w") as f:
        f.write(f'"""Observed from lightning {lightning.__version__} (torch {__import__("torch").__version__}) by '
                'tests/parity_scripts/record_corpus.py under the pinned CPU kernel path of tests/kernel_path.py; do not edit."""\n\n# ruff: noqa: ISC004 - pprint splits long strings\n\n')
        f.write(f"EXPECTED = {pprint.pformat(results, width=110, sort_dicts=True)}\n")
    print("wrote", os.path.join(CORPUS, "expected.py"))
