"""`TrainModule.load_from_checkpoint` / `DataModule.load_from_checkpoint`: rebuilt from saved hyper-parameters,
weights loaded, overrides applied, and nothing unpickled unless the caller opts in."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from tests.trainer.helpers import QUIET, Regressor, data
from trainer import DataModule, Trainer


class Data(DataModule):
    def __init__(self, batch_size: int = 4, root: Any = "unused") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.seen = 0

    def train_dataloader(self) -> DataLoader:
        return data(16, self.hparams.batch_size)

    def state_dict(self) -> dict[str, Any]:
        return {"seen": 7}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.seen = state_dict["seen"]


class WithBackbone(Regressor):
    def __init__(self, backbone: Any, lr: float = 0.05) -> None:
        super().__init__(lr=lr)
        self.backbone = backbone

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.loaded_keys = sorted(checkpoint)


def _fit(module: Any, tmp_path: Path, datamodule: Any = None) -> Path:
    trainer = Trainer(max_epochs=1, project_dir=str(tmp_path), **QUIET)
    if datamodule is None:
        trainer.fit(module, data())
    else:
        trainer.fit(module, datamodule=datamodule)
    path = tmp_path / "ckpt"
    trainer.save_checkpoint(path)
    return path


def test_module_is_rebuilt_from_hparams_with_weights_and_overrides(tmp_path: Path) -> None:
    module = Regressor(lr=0.2, features=3)
    path = _fit(module, tmp_path)
    loaded = Regressor.load_from_checkpoint(path)
    assert loaded.hparams == {"lr": 0.2, "features": 3}
    assert torch.equal(loaded.net.weight, module.net.weight) and torch.equal(loaded.net.bias, module.net.bias)
    assert Regressor.load_from_checkpoint(str(path), lr=0.5, unknown=1).hparams.lr == 0.5  # extra kwargs dropped
    assert Regressor.load_from_checkpoint(path, map_location="cpu").net.weight.device.type == "cpu"
    with pytest.raises(RuntimeError, match="size mismatch"):
        Regressor.load_from_checkpoint(path, features=4)
    # torch.load's other forms, as Lightning passes them on: a dict of devices and a callable(storage, location).
    for where in ({"cuda:0": "cpu"}, {"cpu": "cpu"}, lambda storage, loc: storage, lambda storage, loc: None):
        assert Regressor.load_from_checkpoint(path, map_location=where).net.weight.device.type == "cpu"
    with pytest.raises(TypeError, match="map_location=...\\) takes a device"):
        Regressor.load_from_checkpoint(path, map_location=3)
    hparams = tmp_path / "hp.yaml"
    hparams.write_text("lr: 0.3\nfeatures: 3\n")
    assert Regressor.load_from_checkpoint(path, hparams_file=hparams).hparams.lr == 0.3


def test_non_plain_hparams_are_refused_unless_overridden_or_trusted(tmp_path: Path) -> None:
    module = WithBackbone(backbone=PurePosixPath("/models/resnet"), lr=0.1)
    path = _fit(module, tmp_path)
    with pytest.raises(ValueError, match=r"'backbone' is a pathlib.PurePosixPath.*backbone=\.\.\..*weights_only=False"):
        WithBackbone.load_from_checkpoint(path)
    loaded = WithBackbone.load_from_checkpoint(path, backbone="given")
    assert loaded.backbone == "given" and loaded.hparams.lr == 0.1
    # The whole checkpoint, as Lightning passes it to on_load_checkpoint.
    assert {"epoch", "global_step", "hyper_parameters", "state_dict", "optimizer_states"} <= set(loaded.loaded_keys)
    trusted = WithBackbone.load_from_checkpoint(path, weights_only=False)
    assert trusted.backbone == PurePosixPath("/models/resnet")
    # Unpicklable values cannot be stored at all (dropped when the run starts): they must come back as overrides.
    module = WithBackbone(backbone=lambda x: x)
    path = _fit(module, tmp_path / "lambda")
    with pytest.raises(TypeError, match=r"missing required arguments \['backbone'\].*load_from_checkpoint\(path, "
                                        r"backbone=\.\.\.\)"):
        WithBackbone.load_from_checkpoint(path, weights_only=False)
    assert WithBackbone.load_from_checkpoint(path, backbone="again").backbone == "again"


def test_datamodule_is_rebuilt_with_its_state(tmp_path: Path) -> None:
    path = _fit(Regressor(), tmp_path, datamodule=Data(batch_size=8))
    dm = Data.load_from_checkpoint(path)
    assert dm.hparams == {"batch_size": 8, "root": "unused"} and dm.seen == 7
    assert Data.load_from_checkpoint(path, batch_size=2).hparams.batch_size == 2


def test_bad_paths_and_weights_only_folders(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such checkpoint file or folder"):
        Regressor.load_from_checkpoint(tmp_path / "model.ckpt")
    module = Regressor(lr=0.3)
    trainer = Trainer(max_epochs=1, project_dir=str(tmp_path), **QUIET)
    trainer.fit(module, data())
    trainer.save_checkpoint(tmp_path / "weights", weights_only=True)
    loaded = Regressor.load_from_checkpoint(tmp_path / "weights", lr=0.3)  # no hparams there: pass them
    assert torch.equal(loaded.net.weight, module.net.weight)
    with pytest.raises(Exception, match="weights-only"):
        Data.load_from_checkpoint(tmp_path / "weights")


@pytest.mark.parametrize(("strict", "loading", "expected"), [
    (None, None, True), (None, False, False), (True, None, True), (True, False, "error"), (False, None, False),
    (False, True, "error"), (False, False, False)])
def test_strict_and_strict_loading_as_lightning(tmp_path: Path, strict: bool | None, loading: bool | None,
                                                expected: Any) -> None:
    path = _fit(Regressor(), tmp_path)
    seen: list[bool] = []

    class Loading(Regressor):
        strict_loading = loading

        def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
            seen.append(strict)
            return super().load_state_dict(state_dict, strict=strict, assign=assign)

    if expected == "error":
        with pytest.raises(ValueError, match="in conflict with .*strict_loading"):
            Loading.load_from_checkpoint(path, strict=strict)
    else:
        Loading.load_from_checkpoint(path, strict=strict)
        assert seen == [expected]


def test_an_empty_state_dict_warns(tmp_path: Path) -> None:
    path = _fit(Regressor(), tmp_path)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint.pop("ember")  # a Lightning file: an edited Ember one fails its digest check (a damaged copy)
    checkpoint["state_dict"] = {}
    torch.save(checkpoint, path)
    with pytest.warns(UserWarning, match="contains no parameters"):
        Regressor.load_from_checkpoint(path, strict=False)


def test_the_hyper_parameter_keys_name_the_ckpt_entries(tmp_path: Path) -> None:
    path = _fit(Regressor(lr=0.3), tmp_path)
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint[Regressor.CHECKPOINT_HYPER_PARAMS_KEY]["lr"] == 0.3
    assert checkpoint[Regressor.CHECKPOINT_HYPER_PARAMS_NAME] == "kwargs"
