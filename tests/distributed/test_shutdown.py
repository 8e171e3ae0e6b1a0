"""A script that ends with `end_training()` exits cleanly on every rank (no abort during interpreter shutdown).

With torch 2.13, a DDP wrapper (or a Trainer in a reference cycle) that outlives the destroyed gloo group frees
it during interpreter finalization and aborts the process ("terminate called without an active exception") in
about one run in four. The engine releases its DDP wrappers' hold on the group when it is destroyed and collects
unreachable objects before exit; without either, this test fails most of the time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.conftest import free_port

SCRIPT = textwrap.dedent('''
    import torch
    from engine import Accelerator

    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(4, 4))   # a DDP wrapper kept as a module global until shutdown
    acc.backward(model(torch.randn(2, 4)).sum())
    holder = {"model": model}
    holder["self"] = holder                        # and one in a reference cycle
    del holder
    acc.end_training()
''')


def test_end_training_then_exit_never_aborts(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    for attempt in range(6):
        result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                 "--master_port", str(free_port()), str(script)], env=env, capture_output=True,
                                text=True, timeout=120, check=False)
        assert result.returncode == 0, f"attempt {attempt}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        assert "terminate called" not in result.stderr


def _released_by_end_training() -> dict[str, Any]:
    import torch

    from engine import Accelerator, PartialState

    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(4, 4))
    acc.backward(model(torch.randn(2, 4)).sum())
    held_before = [name for name in ("reducer", "logger", "process_group") if name in model.__dict__]
    registered = len(PartialState._teardown)
    acc.end_training()  # state.destroy_process_group runs what the DDP layer registered
    held_after = [name for name in ("reducer", "logger", "process_group") if name in model.__dict__]
    return {"before": held_before, "after": held_after, "registered": registered,
            "left": len(PartialState._teardown), "unwrapped": type(acc.unwrap_model(model)).__name__}


def test_end_training_releases_the_ddp_wrappers_hold_on_the_group(run_distributed: Any) -> None:
    for result in run_distributed(_released_by_end_training, 2):
        assert result == {"before": ["reducer", "logger", "process_group"], "after": [], "registered": 1,
                          "left": 0, "unwrapped": "Linear"}
