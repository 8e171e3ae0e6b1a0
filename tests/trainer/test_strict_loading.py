"""``TrainModule.strict_loading`` on a resume and on an evaluation's ``ckpt_path`` (Lightning's behaviour), and the
module's own ``load_state_dict`` being the one a resume calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.checkpoint.io import CheckpointError
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer


class WithExtraBuffer(Regressor):
    """A Regressor with a buffer the saved checkpoint lacks (a buffer: the optimizer's state still matches)."""

    def __init__(self, strict_loading: bool | None = None) -> None:
        super().__init__()
        self.register_buffer("extra", torch.full((1,), 5.0))
        self.strict_loading = strict_loading


def _saved(tmp_path: Path) -> Path:
    trainer = Trainer(**QUIET, max_steps=2, default_root_dir=tmp_path)
    trainer.fit(Regressor(), data())
    path = tmp_path / "saved.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_resume_with_strict_loading_false_accepts_missing_keys(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    module = WithExtraBuffer(strict_loading=False)
    trainer = Trainer(**QUIET, max_steps=4, default_root_dir=tmp_path)
    trainer.fit(module, data(), ckpt_path=path)
    assert trainer.global_step == 4
    assert module.extra.item() == 5.0  # not in the checkpoint: kept as built


@pytest.mark.parametrize("strict_loading", [None, True])
def test_resume_is_strict_by_default(tmp_path: Path, strict_loading: bool | None) -> None:
    path = _saved(tmp_path)
    trainer = Trainer(**QUIET, max_steps=4, default_root_dir=tmp_path)
    with pytest.raises(CheckpointError, match="not in the checkpoint: extra"):
        trainer.fit(WithExtraBuffer(strict_loading=strict_loading), data(), ckpt_path=path)


def test_validate_ckpt_path_follows_strict_loading(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    Trainer(**QUIET, default_root_dir=tmp_path).validate(WithExtraBuffer(strict_loading=False), data(),
                                                         ckpt_path=path)
    with pytest.raises(CheckpointError, match="not in the checkpoint: extra"):
        Trainer(**QUIET, default_root_dir=tmp_path).validate(WithExtraBuffer(), data(), ckpt_path=path)


def test_resume_calls_the_modules_load_state_dict(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    calls: list[tuple[list[str], bool]] = []

    class Overriding(Regressor):
        # An override in the pre-`assign` signature: the resume must call it, and without `assign`.
        def load_state_dict(self, state_dict: Any, strict: bool = True) -> Any:  # type: ignore[override]
            calls.append((sorted(state_dict), strict))
            return super().load_state_dict(state_dict, strict=strict)

    module = Overriding()
    module.strict_loading = False
    Trainer(**QUIET, max_steps=3, default_root_dir=tmp_path).fit(module, data(), ckpt_path=path)
    assert calls == [(["net.bias", "net.weight"], False)]
