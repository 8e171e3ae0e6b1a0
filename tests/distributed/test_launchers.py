"""``notebook_launcher`` and ``debug_launcher`` called from a plain process, as a notebook calls them: the functions
live in ``__main__`` of a ``python -c`` program (no file to re-import them from), which has already run torch ops.

Accelerate 1.15.0 (recorded with ``tests/parity_scripts/issue17_differential.py accelerate``, CPU host):
``notebook_launcher(f, num_processes=2, mixed_precision="bf16")`` runs f on ranks 0 and 1 (local 0 and 1,
MULTI_CPU when the function asks for ``cpu=True``) but the children run with mixed_precision "no" (it sets
``MIXED_PRECISION``, which nothing reads) and it returns None. ``debug_launcher`` gives every rank
``local_process_index`` 0 and ``FORK_LAUNCHED=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port

PROGRAM = textwrap.dedent("""
    import json, os, sys
    import torch
    from engine import Accelerator, PartialState, debug_launcher, notebook_launcher

    torch.randn(256, 256) @ torch.randn(256, 256)  # the notebook has used torch (and its threads) before

    def train(tag):
        accelerator = Accelerator()
        state = PartialState()
        total = accelerator.reduce(torch.tensor([state.process_index + 1.0]), "sum")
        return {"tag": tag, "rank": state.process_index, "local": state.local_process_index,
                "world": state.num_processes, "type": str(state.distributed_type),
                "precision": accelerator.mixed_precision, "total": total.item()}

    def broken():
        state = PartialState()
        state.wait_for_everyone()  # the group is complete on both ranks before one fails
        if state.process_index == 1:  # rank 0 returns: no race over whose failure is seen first
            raise RuntimeError("rank one gives up")

    def record(folder):
        state = PartialState()
        torch.distributed.all_reduce(torch.ones(1))
        with open(os.path.join(folder, f"rank{state.process_index}.json"), "w") as f:
            json.dump({"rank": state.process_index, "local": state.local_process_index,
                       "world": state.num_processes, "type": str(state.distributed_type),
                       "fork": os.environ.get("FORK_LAUNCHED"), "cpu": os.environ.get("ACCELERATE_USE_CPU")}, f)

    def flaky(folder):
        # Both ranks fail on the first attempt; the elastic agent restarts them (max_restarts=1).
        state = PartialState()
        marker = os.path.join(folder, f"attempt{state.process_index}")
        attempt = 1 + os.path.exists(marker)
        open(marker, "w").close()
        state.wait_for_everyone()  # both markers exist before either rank fails (the agent then stops the other)
        if attempt == 1:
            raise RuntimeError("first attempt fails")
        return attempt

    out = {}
    result = notebook_launcher(flaky, (sys.argv[3],), num_processes=2, use_port=sys.argv[4], max_restarts=1)
    out["restarts"] = {str(k): v for k, v in result.items()}
    result = notebook_launcher(train, ("nb",), num_processes=2, use_port=sys.argv[1], mixed_precision="bf16")
    out["notebook"] = {str(k): v for k, v in result.items()}
    try:
        notebook_launcher(broken, num_processes=2, use_port=sys.argv[2])
    except Exception as err:
        out["notebook_error"] = [type(err).__name__, str(err)]
    debug_launcher(record, (sys.argv[3],), num_processes=2)
    out["debug"] = [json.load(open(os.path.join(sys.argv[3], f"rank{r}.json"))) for r in range(2)]
    try:
        debug_launcher(broken, num_processes=2)
    except Exception as err:
        out["debug_error"] = [type(err).__name__, str(err)]
    print("RESULT " + json.dumps(out))
""")


def test_launchers_run_a_notebook_function_on_two_processes_and_return(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                         os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    env.pop("RANK", None), env.pop("WORLD_SIZE", None), env.pop("LOCAL_RANK", None)
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(free_port()), str(free_port()), str(tmp_path),
                           str(free_port())],
                          env=env, capture_output=True, text=True, timeout=240, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-5000:]
    out: dict[str, Any] = json.loads(lines[0][len("RESULT "):])

    assert out["notebook"] == {str(rank): {"tag": "nb", "rank": rank, "local": rank, "world": 2,
                                           "type": "DistributedType.MULTI_CPU", "precision": "bf16", "total": 3.0}
                               for rank in (0, 1)}
    assert out["restarts"] == {"0": 2, "1": 2}  # torch's elastic restarts, as Accelerate's max_restarts
    kind, message = out["notebook_error"]
    assert kind == "ChildFailedError" and "rank one gives up" in message, message
    assert out["debug"] == [{"rank": rank, "local": rank, "world": 2, "type": "DistributedType.MULTI_CPU",
                             "fork": "1", "cpu": "yes"} for rank in (0, 1)]
    kind, message = out["debug_error"]
    assert kind == "ProcessRaisedException" and "rank one gives up" in message, message


def test_notebook_launcher_runs_one_process_here_and_refuses_a_used_process() -> None:
    from engine import Accelerator, notebook_launcher

    assert notebook_launcher(lambda x: x * 2, (21,), num_processes=1) == 42
    with pytest.raises(ValueError, match="num_processes=..."):
        notebook_launcher(print)
    with pytest.raises(ValueError, match="Unknown mixed_precision mode: 'fp32'"):
        notebook_launcher(print, num_processes=2, mixed_precision="fp32")
    Accelerator(cpu=True)
    with pytest.raises(ValueError, match="should only be initialized inside your training function"):
        notebook_launcher(print, num_processes=2, use_port=str(free_port()))
