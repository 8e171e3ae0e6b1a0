"""Record what the real Accelerate 1.15 gives for the scripts in this folder (run once, by hand).

    /work/refvenv/bin/python tests/examples/accelerate_scripts/record.py [case-name prefix]

Each script is copied with its ``engine`` imports rewritten to ``accelerate`` (the only change a port makes)
and run on 1 and 2 CPU processes (torchrun, gloo) in the reference environment; the "RESULT" lines printed are
the values tests/examples/test_accelerate_scripts.py asserts for the engine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests" / "parity_scripts"))
import pinned  # noqa: F401 - the suite's CPU kernel path (tests/kernel_path.py) for every script run below


def swapped(name: str, folder: Path) -> Path:
    """``name`` with ``from engine...`` / ``import engine`` rewritten to accelerate, written into ``folder``."""
    text = (HERE / name).read_text()
    text = re.sub(r"^from engine(\.[\w.]+)? import", lambda m: f"from accelerate{m.group(1) or ''} import", text,
                  flags=re.MULTILINE)
    out = folder / name
    out.write_text(text)
    return out


def run(name: str, procs: int, *args: str, cwd: Path) -> dict:
    with tempfile.TemporaryDirectory() as scripts:
        script = swapped(name, Path(scripts))
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
                   str(script), "--cpu", *args]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{name} {args} on {procs}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    from tests.examples.accelerate_scripts.cases import CASES

    results = {}
    only = sys.argv[1] if len(sys.argv) > 1 else ""  # record only the cases whose name starts with this
    for key, (name, procs, steps) in CASES.items():
        if not key.startswith(only):
            continue
        with tempfile.TemporaryDirectory() as work:
            for args in steps[:-1]:  # runs whose checkpoints the last one resumes from
                run(name, procs, *args, cwd=Path(work))
            results[key] = run(name, procs, *steps[-1], cwd=Path(work))
        print(key, json.dumps(results[key]), flush=True)
    print(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
