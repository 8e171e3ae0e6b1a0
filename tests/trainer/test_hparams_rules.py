"""``save_hyperparameters`` and the checkpoint's hyper-parameters by Lightning 2.6's rules (each rule is one of
Lightning's own tests in tests_pytorch/models/test_hparams.py, which pass on Lightning 2.6.6 and on Ember):
one config object passed back under its argument's name, a subclass adding to what its parent saved, primitives
refused, unpicklable values dropped at a run's start, the logged configuration as first saved, and
``hparams.yaml`` / ``http://`` checkpoints for ``load_from_checkpoint``."""

from __future__ import annotations

import functools
import http.server
import threading
import warnings
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from tests.trainer.helpers import QUIET, Regressor, data
from trainer import DataModule, Trainer, TrainModule
from trainer.core.saving import save_hparams_to_yaml
from trainer.hparams import AttributeDict
from trainer.loggers import TensorBoardLogger


class Bare(TrainModule):
    """A regression module that saves no hyper-parameters itself."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Configured(Bare):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.save_hyperparameters(config)


class ConfiguredData(DataModule):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.save_hyperparameters(config)

    def train_dataloader(self) -> Any:
        return data(8, 4)


class Child(Regressor):
    def __init__(self, *args: Any, extra: int = 7, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.save_hyperparameters()  # after the parent's call: adds to it


def _checkpoint(module: Any, tmp_path: Path, datamodule: Any = None) -> Path:
    trainer = Trainer(max_epochs=1, project_dir=str(tmp_path), **QUIET)
    trainer.fit(module, data(8, 4) if datamodule is None else None, datamodule=datamodule)
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    return path


@pytest.mark.parametrize("config", [Namespace(lr=0.25), {"lr": 0.25}], ids=["namespace", "dict"])
def test_one_config_object_is_passed_back_under_its_argument_name(tmp_path: Path, config: Any) -> None:
    module = Configured(config)
    assert type(module.hparams) is AttributeDict and module.hparams.lr == 0.25
    path = _checkpoint(module, tmp_path)
    raw = torch.load(path)  # weights_only=True, torch's default
    assert raw["hparams_name"] == "config" and raw["hyper_parameters"] == {"lr": 0.25}
    loaded = Configured.load_from_checkpoint(path)  # Configured(config={...}): no error about a missing argument
    assert loaded.hparams == {"lr": 0.25} and type(loaded.hparams) is AttributeDict


def test_an_omegaconf_config_is_stored_plain_and_rebuilt_without_unpickling(tmp_path: Path) -> None:
    module = Configured(OmegaConf.create({"lr": 0.25, "nested": [1.5, {"a": 1}]}))
    assert isinstance(module.hparams, DictConfig)
    path = _checkpoint(module, tmp_path)
    raw = torch.load(path)
    assert raw["hparams_type"] == "omegaconf.dictconfig.DictConfig"
    assert raw["hyper_parameters"] == {"lr": 0.25, "nested": [1.5, {"a": 1}]}
    loaded = Configured.load_from_checkpoint(path)
    assert isinstance(loaded.hparams, DictConfig) and loaded.hparams.nested[1].a == 1


def test_a_data_module_config_uses_lightnings_data_module_keys(tmp_path: Path) -> None:
    datamodule = ConfiguredData({"size": 3})
    path = _checkpoint(Regressor(), tmp_path, datamodule)
    raw = torch.load(path)
    assert ConfiguredData.CHECKPOINT_HYPER_PARAMS_KEY == "datamodule_hyper_parameters"
    assert raw["datamodule_hparams_name"] == "config" and raw["datamodule_hyper_parameters"] == {"size": 3}
    assert ConfiguredData.load_from_checkpoint(path).hparams == {"size": 3}


def test_a_subclass_saving_after_its_parent_adds_to_what_the_parent_saved() -> None:
    assert Child(lr=0.5).hparams == {"lr": 0.5, "features": 3, "extra": 7}


def test_a_module_built_inside_another_modules_init_sees_its_arguments_too() -> None:
    # Lightning collects the arguments of every enclosing __init__ of a hyper-parameter-saving object.
    class Inner(Regressor):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.save_hyperparameters(ignore=["lr", "features"])

    class Outer(Regressor):
        def __init__(self, depth: int) -> None:
            super().__init__()
            self.inner = Inner(width=5)

    assert Outer(depth=2).inner.hparams == {"width": 5, "depth": 2}


@pytest.mark.parametrize("args", [(42,), (3.14, "abc")])
def test_primitives_are_refused_with_the_fix(args: tuple[Any, ...]) -> None:
    with pytest.raises(ValueError, match=r"Primitives \(<class 'bool'>.*Pass the names of init arguments"):
        Regressor().save_hyperparameters(*args)


def test_an_empty_config_changes_nothing() -> None:
    module = Regressor(lr=0.5)
    module.save_hyperparameters(Namespace())
    assert module.hparams == {"lr": 0.5, "features": 3}


def test_unpicklable_values_are_dropped_with_a_warning_when_a_run_starts(tmp_path: Path) -> None:
    class WithFunction(Regressor):
        def __init__(self, fn: Any = lambda x: x + 1) -> None:
            super().__init__()
            self.save_hyperparameters()

    module = WithFunction()
    with pytest.warns(UserWarning, match="Attribute 'fn' removed from hparams because it cannot be pickled"):
        Trainer(max_steps=1, project_dir=str(tmp_path), **QUIET).fit(module, data(8, 4))
    assert "fn" not in module.hparams


def test_the_logged_configuration_is_the_first_saved_and_clashes_are_errors(tmp_path: Path) -> None:
    module = Regressor(lr=0.5)
    module.hparams.lr = 9.0  # a change during the run is not the run's configuration
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    trainer = Trainer(max_steps=1, project_dir=str(tmp_path), logger=logger, enable_progress_bar=False,
                      enable_checkpointing=False)
    trainer.fit(module, data(8, 4))
    assert yaml.safe_load(Path(logger.log_dir, "hparams.yaml").read_text()) == {"lr": 0.5, "features": 3}

    clashing = ConfiguredData({"lr": 0.1})
    trainer = Trainer(max_steps=1, project_dir=str(tmp_path), logger=TensorBoardLogger(str(tmp_path)),
                      enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(RuntimeError, match=r"Error while merging hparams: the keys \['lr'\]"):
        trainer.fit(Regressor(lr=0.5), datamodule=clashing)


def test_a_run_without_hyper_parameters_still_writes_an_empty_hparams_yaml(tmp_path: Path) -> None:
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    Trainer(max_steps=1, project_dir=str(tmp_path), logger=logger, enable_progress_bar=False,
            enable_checkpointing=False).fit(Bare(), data(8, 4))
    assert yaml.safe_load(Path(logger.log_dir, logger.NAME_HPARAMS_FILE).read_text()) == {}


def test_a_value_yaml_cannot_write_is_skipped_with_lightnings_warning(tmp_path: Path) -> None:
    path = tmp_path / "hparams.yaml"
    with pytest.warns(UserWarning, match="Skipping 'torch_type' parameter"):
        save_hparams_to_yaml(path, {"torch_type": torch.float32, "lr": 0.1})
    assert yaml.safe_load(path.read_text()) == {"lr": 0.1}


def test_load_from_checkpoint_reads_an_http_address_through_torch_hubs_folder(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = _checkpoint(Regressor(lr=0.25), tmp_path / "run")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(path.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.RequestHandlerClass.log_message = lambda *args: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{path.name}"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loaded = Regressor.load_from_checkpoint(url)
        assert loaded.hparams.lr == 0.25
        assert (tmp_path / "torch_home" / "hub" / "checkpoints" / path.name).is_file()
        with pytest.raises(FileNotFoundError, match="the download failed"):
            Regressor.load_from_checkpoint(url.replace(path.name, "missing.ckpt"))
    finally:
        server.shutdown()
        server.server_close()


def test_an_edited_file_is_refused_with_the_way_out_and_loads_without_its_ember_entry(tmp_path: Path) -> None:
    path = _checkpoint(Regressor(lr=0.25), tmp_path)
    raw = torch.load(path)
    raw["hyper_parameters"]["lr"] = 0.5
    torch.save(raw, path)
    with pytest.raises(Exception, match="corrupted.*delete its 'ember' entry"):
        Regressor.load_from_checkpoint(path)
    del raw["ember"]
    torch.save(raw, path)
    assert Regressor.load_from_checkpoint(path).hparams.lr == 0.5


def test_hyper_parameters_with_keys_of_several_types_copy_and_name_what_is_missing() -> None:
    import copy

    module = Configured({1: 1, "two": 2})  # Lightning allows any key type
    assert copy.deepcopy(module.hparams) == {1: 1, "two": 2}
    with pytest.raises(AttributeError, match=r"No hyper-parameter 'three'; saved ones: \['1', 'two'\]"):
        _ = module.hparams.three
