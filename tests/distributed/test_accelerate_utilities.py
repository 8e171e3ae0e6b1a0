"""LocalSGD, get_logger and Accelerator.profile on 2 real gloo processes (one pair of ranks for all three)."""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _local_sgd() -> dict[str, Any]:
    import torch

    from engine import Accelerator
    from engine.local_sgd import LocalSGD

    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    record: list[dict[str, Any]] = []
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=3) as local_sgd:
        for step in range(7):
            x = torch.full((2, 3), float(rank + 1 + step))  # each rank its own data: replicas drift apart
            model(x).sum().backward()
            grad = model.module.weight.grad.clone()
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
            weights = accelerator.gather(model.module.weight.detach().clone()[None])
            record.append({"grad": grad.tolist(), "same": bool(torch.equal(weights[0], weights[1]))})
    after = accelerator.gather(model.module.weight.detach().clone()[None])
    return {"record": record, "equal_after_exit": bool(torch.equal(after[0], after[1])),
            "num_steps": local_sgd.num_steps}


def _logging() -> str:
    from engine import PartialState
    from engine.logging import get_logger

    state = PartialState()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = get_logger("ember.dist.logger", log_level="INFO")
    logger.logger.addHandler(handler)
    logger.info("main only")
    logger.info("everyone", main_process_only=False)
    for _ in range(3):  # in order: rank 0's line is written before rank 1 starts, every time
        logger.info("ordered", in_order=True)
    logger.logger.removeHandler(handler)
    del state
    return stream.getvalue()


def _ordered_file_log(path: str) -> None:
    from engine import PartialState
    from engine.logging import get_logger

    PartialState()
    logger = get_logger("ember.dist.file", log_level="INFO")
    handler = logging.FileHandler(path)
    logger.logger.addHandler(handler)
    for i in range(3):
        logger.info(f"line {i}", in_order=True)
        handler.flush()
    logger.logger.removeHandler(handler)
    handler.close()


def _profile(folder: str) -> list[str]:
    import torch

    from engine import Accelerator
    from engine.utils import ProfileKwargs

    accelerator = Accelerator(cpu=True, kwargs_handlers=[ProfileKwargs(output_trace_dir=folder)])
    with accelerator.profile():
        torch.ones(4, 4) @ torch.ones(4, 4)
    return sorted(os.listdir(folder))  # after profile(): every rank has written its trace (it waits for all)


def _all(folder: str) -> dict[str, Any]:
    out = {"local_sgd": _local_sgd(), "log": _logging()}
    _ordered_file_log(os.path.join(folder, "ordered.log"))
    out["traces"] = _profile(os.path.join(folder, "traces"))
    return out


def test_local_sgd_logging_and_profiler_on_two_processes(run_distributed: Callable[..., list[Any]],
                                                         tmp_path: Path) -> None:
    rank0, rank1 = run_distributed(_all, 2, str(tmp_path))
    for result in (rank0, rank1):
        record = result["local_sgd"]["record"]
        # Averaged after steps 3 and 6 only; in between each replica follows its own gradients.
        assert [r["same"] for r in record] == [False, False, True, False, False, True, False]
        assert result["local_sgd"]["equal_after_exit"] and result["local_sgd"]["num_steps"] == 7
    # Gradients stay local inside the block: rank r's gradient is its own data's, not the average.
    assert rank0["local_sgd"]["record"][0]["grad"] == [[2.0, 2.0, 2.0]]
    assert rank1["local_sgd"]["record"][0]["grad"] == [[4.0, 4.0, 4.0]]
    assert rank0["log"].splitlines() == ["[RANK 0] main only", "[RANK 0] everyone"] + ["[RANK 0] ordered"] * 3
    assert rank1["log"].splitlines() == ["[RANK 1] everyone"] + ["[RANK 1] ordered"] * 3
    assert (tmp_path / "ordered.log").read_text().splitlines() == [
        f"[RANK {r}] line {i}" for i in range(3) for r in (0, 1)]
    assert rank0["traces"] == rank1["traces"] == ["profile_0.json", "profile_1.json"]
