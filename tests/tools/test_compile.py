"""torch.compile: fit(torch.compile(module)) and Trainer(compile=...) train through compiled steps, checkpoints
never hold `_orig_mod.`, resume, and load into compiled and uncompiled modules alike.

The backend is inductor when a C compiler is present, else aot_eager; nothing below depends on which.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest
import torch

from callbacks import ModelCheckpoint
from engine.checkpoint.io import load_safetensors
from tests.trainer.helpers import QUIET, SAVING, Regressor, data
from trainer import Trainer

BACKEND = "inductor" if shutil.which(os.environ.get("CC", "cc")) else "aot_eager"


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class CompiledPart(Regressor):
    """Only a submodule is compiled: its state_dict keys would read `net._orig_mod.weight`."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.compile(torch.nn.Linear(3, 1), backend=BACKEND)


def fit(module: Any, folder: str, ckpt_path: str | None = None, epochs: int = 2, **kwargs: Any) -> Trainer:
    trainer = Trainer(**{**SAVING, "log_with": None}, project_dir=folder, max_epochs=epochs, seed=0,
                      callbacks=[ModelCheckpoint(save_last=True)], **kwargs)
    trainer.fit(module, data(n=16, batch_size=4), ckpt_path=ckpt_path)
    return trainer


def weights_file(path: str) -> dict[str, torch.Tensor]:
    """The module weights a checkpoint holds: a ``.ckpt`` file's ``state_dict`` (one process), or a folder's
    ``model.safetensors``."""
    if os.path.isdir(path):
        return load_safetensors(os.path.join(path, "model.safetensors"))
    return torch.load(path)["state_dict"]  # torch's defaults: weights_only=True


def test_fit_a_compiled_module_trains_checkpoints_resumes_and_loads_uncompiled(tmp_path: Any) -> None:
    torch.manual_seed(0)
    start = Regressor().state_dict()
    plain = Regressor()
    plain.load_state_dict(start)
    fit(plain, str(tmp_path / "plain"))

    module = Regressor()
    module.load_state_dict(start)
    frames_before = torch._dynamo.utils.counters["frames"]["ok"]
    trainer = fit(torch.compile(module, backend=BACKEND), str(tmp_path / "compiled"), epochs=1)
    assert trainer.module is module  # hooks, self.log and state work on the module inside the shell
    assert torch._dynamo.utils.counters["frames"]["ok"] > frames_before  # the steps really ran compiled
    saved = weights_file(trainer.checkpoint_callback.last_model_path)  # type: ignore[union-attr]
    assert sorted(saved) == ["net.bias", "net.weight"]  # no `_orig_mod.`
    # Resume the second epoch, again compiled: the end matches the uncompiled run.
    resumed = Regressor()
    fit(torch.compile(resumed, backend=BACKEND), str(tmp_path / "compiled"), ckpt_path="last")
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[key], value)
    fresh = Regressor()  # an uncompiled module takes the compiled run's weights as they are
    fresh.load_state_dict(saved)


def test_a_compiled_submodule_saves_plain_keys_and_loads_either_way(tmp_path: Any) -> None:
    module = CompiledPart()
    assert list(module.state_dict()) == ["net.weight", "net.bias"]
    trainer = fit(module, str(tmp_path), epochs=1)
    saved = weights_file(trainer.checkpoint_callback.last_model_path)  # type: ignore[union-attr]
    assert sorted(saved) == ["net.bias", "net.weight"]
    plain = Regressor()
    plain.load_state_dict(saved)  # into an uncompiled module
    again = CompiledPart()
    again.load_state_dict(saved)  # into a compiled one
    assert torch.equal(again.net._orig_mod.weight, saved["net.weight"])
    # A state dict taken from the compiled shell itself (with `_orig_mod.`) still loads into a plain module.
    plain.load_state_dict(torch.nn.Module.state_dict(again))
    assert torch.equal(plain.net.weight, saved["net.weight"])


def test_trainer_compile_option_compiles_the_steps(tmp_path: Any) -> None:
    frames_before = torch._dynamo.utils.counters["frames"]["ok"]
    module = Regressor()
    trainer = fit(module, str(tmp_path), epochs=1, compile={"backend": BACKEND})
    assert torch._dynamo.utils.counters["frames"]["ok"] > frames_before
    assert trainer.plan.compiler is not None
    assert not any("_orig_mod" in key for key in module.state_dict())
    with pytest.raises(ValueError, match=r"compile=\{'bakend': 'eager'\}.*\['bakend'\].*'backend'"):
        Trainer(**QUIET, compile={"bakend": "eager"})
    with pytest.raises(TypeError, match="compile=.*Received: 'yes'"):
        Trainer(**QUIET, compile="yes")
