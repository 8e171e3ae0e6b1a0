"""Debug mode on 2 gloo processes: every collective checks its inputs across ranks and raises
``DistributedOperationException`` on every rank; plus the other cross-rank agreements of issue 17
(``copy_tensor_to_devices``, ``save_state`` with a different folder per rank).

Accelerate 1.15.0 (recorded with ``tests/parity_scripts/issue17_differential.py accelerate``, CPU, gloo): with
rank 0 passing ``{"tensor": [[0., 1, 2, 3, 4]]}`` and rank 1 ``{"tensor": [[[...5], [...5]]]}``, ``gather``,
``reduce`` and ``broadcast`` raise ``DistributedOperationException`` on both ranks with the message
``ACCELERATE_MESSAGE_HEAD`` + "Operation: `accelerate.utils.operations.<name>`\\nInput shapes:\\n  - Process 0:
{'tensor': [1, 5]}\\n  - Process 1: {'tensor': [1, 2, 5]}"; ``pad_across_processes`` raises one chained to the check
of its inner gather. Different sizes along the padded dimension pass (rank 0 gets 2 rows). ``save_state`` into a
different folder per rank saves, then ``load_state`` fails on rank 1 with FileNotFoundError
(".../ckpt/pytorch_model.bin").
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch

ACCELERATE_MESSAGE_HEAD = ("Cannot apply desired operation due to shape mismatches. All shapes across devices must "
                           "be valid.")
SHAPES = ("Process 0: {'tensor': [1, 5]}", "Process 1: {'tensor': [1, 2, 5]}")


def _raised(call: Any) -> tuple[str, str] | None:
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the test inspects what was raised
        return type(err).__name__, str(err)
    return None


def _debug_checks() -> dict[str, Any]:
    from engine import Accelerator, PartialState, operations
    from engine.state import AcceleratorState

    state = PartialState()
    rank = state.process_index
    out: dict[str, Any] = {"default": state.debug}
    first = {"tensor": torch.tensor([[0.0, 1, 2, 3, 4]])}
    other = {"tensor": torch.tensor([[[0.0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]])}
    data = first if rank == 0 else other
    state.debug = True
    for name in ("gather", "reduce", "broadcast", "pad_across_processes"):
        out[name] = _raised(lambda name=name: getattr(operations, name)(data))
    accelerator = Accelerator(cpu=True)  # the Accelerator's methods go through the same checks
    out["accelerator.gather"] = _raised(lambda: accelerator.gather(data))
    out["accelerator.pad_across_processes"] = _raised(lambda: accelerator.pad_across_processes(data))
    # A tensor on another device type than the process group's: every rank hears about it.
    out["device"] = _raised(lambda: operations.gather(torch.ones(2) if rank == 0 else torch.ones(2, device="meta")))
    # What is allowed still works in debug mode.
    out["gather_ok"] = operations.gather(torch.ones(2) * rank).tolist()
    out["pad_ok"] = list(operations.pad_across_processes(torch.ones(rank + 1, 2), dim=0).shape)
    out["broadcast_ok"] = operations.broadcast(torch.tensor([rank, rank])).tolist()
    # AcceleratorState().debug writes through to the shared state the collectives read.
    AcceleratorState().debug = False
    out["after_accelerator_state_set"] = PartialState().debug

    # copy_tensor_to_devices: the receivers know neither shape nor dtype.
    sent = torch.tensor([[1, 2, 3]], dtype=torch.int32) if rank == 0 else None
    copied = operations.copy_tensor_to_devices(sent)
    out["copied"] = (copied.tolist(), str(copied.dtype))
    out["copy_none"] = _raised(lambda: operations.copy_tensor_to_devices(None))

    # save_state with a different folder per rank: refused on every rank before anything is written.
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    del model
    mine = tempfile.mkdtemp(prefix=f"ember_rank{rank}_")
    out["save"] = _raised(lambda: accelerator.save_state(os.path.join(mine, "ckpt")))
    out["save_wrote"] = os.listdir(mine)
    os.rmdir(mine)  # empty: the refused save wrote nothing
    return out


def test_debug_mode_raises_on_every_rank_with_both_shapes(run_distributed: Any) -> None:
    results = run_distributed(_debug_checks, 2)
    for rank, got in enumerate(results):
        assert got["default"] is False
        for name in ("gather", "reduce", "broadcast", "pad_across_processes",
                     "accelerator.gather", "accelerator.pad_across_processes"):
            kind, message = got[name]
            assert kind == "DistributedOperationException", (rank, name, message)
            assert message.startswith(ACCELERATE_MESSAGE_HEAD), message
            assert all(shape in message for shape in SHAPES), message
            operation = name.split(".")[-1]
            assert f"Operation: `engine.operations.{operation}`" in message
        kind, message = got["device"]
        assert kind == "DistributedOperationException" and "Process 1: meta" in message, message
        assert got["gather_ok"] == [0.0, 0.0, 1.0, 1.0]
        assert got["pad_ok"] == [2, 2]  # as Accelerate: sizes may differ along the padded dim
        assert got["broadcast_ok"] == [0, 0]
        assert got["after_accelerator_state_set"] is False
        assert got["copied"] == ([[1, 2, 3]], "torch.int32")
        kind, message = got["copy_none"]
        assert kind == "ValueError" and "processes [] passed a tensor" in message
        kind, message = got["save"]
        assert kind == "ValueError" and "same output_dir on every process" in message
        assert "process 0: " in message and "process 1: " in message
        assert got["save_wrote"] == []
