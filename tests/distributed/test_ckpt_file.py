"""One ``.ckpt`` file for a DDP run on 2 real processes (gloo, 127.0.0.1): every rank's exact-resume state is in
it (gathered to rank 0), and a resume from it mid-accumulation (each rank's own un-synced gradients) is bitwise
equal to the uninterrupted run."""

from __future__ import annotations

from typing import Any

import torch

from tests.trainer.helpers import data
from tests.trainer.test_resume import Dropout, SaveAt, _trainer


def _fit(path: str, save_at: int | None, ckpt_path: str | None) -> dict[str, Any]:
    callbacks = [SaveAt(path, save_at)] if save_at is not None else []
    trainer = _trainer(callbacks=callbacks)  # seeds: the module and the loaders are built alike
    module = Dropout()
    trainer.fit(module, data(n=32, batch_size=4, shuffle=True), ckpt_path=ckpt_path)
    # Bytes, not tensors: a tensor sent back through the result queue shares its storage by a file descriptor,
    # which is gone once the process has exited.
    return {"weights": {name: value.numpy().tobytes() for name, value in module.state_dict().items()},
            "global_step": trainer.global_step, "rank": trainer.global_rank}


def test_ddp_mid_accumulation_file_resume_is_bitwise_exact(run_distributed: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "mid.ckpt")
    full = run_distributed(_fit, 2, path, None, None)
    run_distributed(_fit, 2, path, 3, None)  # after micro-batch 3 of 4 per epoch: mid-window (accumulation 2)
    saved = torch.load(path)  # one file, torch's defaults
    ranks = saved["ember"]["ranks"]
    assert saved["ember"]["world_size"] == 2 and len(ranks) == 2
    grads = [ranks[r]["gradients"][0] for r in range(2)]
    assert grads[0] and any(not torch.equal(grads[0][n], grads[1][n]) for n in grads[0])  # each rank's own
    resumed = run_distributed(_fit, 2, path, None, path)
    for reference, again in zip(full, resumed):
        assert again["global_step"] == reference["global_step"]
        for name, value in reference["weights"].items():
            assert again["weights"][name] == value, (again["rank"], name)  # bitwise
