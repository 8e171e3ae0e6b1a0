"""The config CLI: YAML + class_path, overrides, --print_config round trip, merged configs, the saved config on
resume, --help, close matches for bad keys, optimizer / lr_scheduler from the command line, `ember fit`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

pytest.importorskip("jsonargparse")

from ember_cli import main as ember_main
from tests.tools.cli_models import Base, Wide
from trainer.cli import CLI, LightningCLI
from trainer.tools.cli_config import ConfigMismatchError

ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, config: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(config))
    return str(path)


def base_config(run: Path) -> dict[str, Any]:
    return {"seed_everything": 0,
            "model": {"class_path": "tests.tools.cli_models.Wide", "init_args": {"lr": 0.05}},
            "data": {"class_path": "tests.tools.cli_models.Data"},
            "trainer": {"max_epochs": 2, "log_with": None, "enable_progress_bar": False,
                        "enable_model_summary": False, "num_sanity_val_steps": 0, "project_dir": str(run),
                        "callbacks": [{"class_path": "callbacks.ModelCheckpoint",
                                       "init_args": {"save_last": True}}]}}


def cli(*args: str) -> CLI:
    return CLI(None, None, subclass_mode_model=True, subclass_mode_data=True, args=list(args))


def test_fit_from_yaml_with_class_path_and_overrides(tmp_path: Path) -> None:
    config = write(tmp_path / "cfg.yaml", base_config(tmp_path / "run"))
    run = cli("fit", "--config", config, "--model.init_args.hidden", "8", "--trainer.max_epochs", "1")
    assert type(run.model) is Wide and run.model.hparams["hidden"] == 8 and run.model.hparams["lr"] == 0.05
    assert run.trainer.global_step == 4 and run.trainer.max_epochs == 1  # 32 samples / 8, one epoch
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())  # the resolved config, in the run folder
    assert saved["model"]["init_args"] == {"lr": 0.05, "hidden": 8, "dropout": 0.0}
    assert saved["trainer"]["max_epochs"] == 1 and saved["seed_everything"] == 0
    assert os.listdir(tmp_path / "run" / "checkpoints")  # the ModelCheckpoint from class_path ran


def test_print_config_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = write(tmp_path / "cfg.yaml", base_config(tmp_path / "run"))
    with pytest.raises(SystemExit) as done:
        cli("fit", "--config", config, "--model.init_args.dropout", "0.5", "--print_config")
    assert done.value.code in (0, None)
    printed = capsys.readouterr().out
    again = write(tmp_path / "printed.yaml", yaml.safe_load(printed))
    with pytest.raises(SystemExit):
        cli("fit", "--config", again, "--print_config")
    assert yaml.safe_load(capsys.readouterr().out) == yaml.safe_load(printed)
    assert yaml.safe_load(printed)["model"]["init_args"]["dropout"] == 0.5
    assert not (tmp_path / "run").exists()  # printing runs nothing


def test_several_configs_merge_in_order(tmp_path: Path) -> None:
    first = write(tmp_path / "a.yaml", base_config(tmp_path / "run"))
    second = write(tmp_path / "b.yaml", {"model": {"init_args": {"hidden": 2}}, "trainer": {"max_epochs": 1}})
    run = CLI(None, None, subclass_mode_model=True, subclass_mode_data=True, run=False,
              args=["--config", first, "--config", second, "--model.init_args.lr", "0.2"])
    assert run.model.hparams["hidden"] == 2 and run.model.hparams["lr"] == 0.2 and run.trainer.max_epochs == 1
    assert type(run.model) is Wide  # the class_path of the first file kept


def test_resume_reuses_the_saved_config_and_refuses_a_different_one(tmp_path: Path) -> None:
    config = write(tmp_path / "cfg.yaml", base_config(tmp_path / "run"))
    cli("fit", "--config", config, "--model.init_args.hidden", "8", "--trainer.max_epochs", "1")
    saved = (tmp_path / "run" / "config.yaml").read_text()
    # Only the run folder and --ckpt_path: everything else comes from the saved config.
    run = cli("fit", "--trainer.project_dir", str(tmp_path / "run"), "--ckpt_path", "last")
    assert type(run.model) is Wide and run.model.hparams["hidden"] == 8 and run.trainer.global_step == 4
    assert (tmp_path / "run" / "config.yaml").read_text() == saved
    with pytest.raises(ConfigMismatchError, match=r"(?s)model.init_args.lr: 0.05 -> 0.5.*--allow_config_change"):
        cli("fit", "--trainer.project_dir", str(tmp_path / "run"), "--ckpt_path", "last",
            "--model.init_args.lr", "0.5")
    with pytest.raises(ConfigMismatchError, match="trainer.max_epochs: 1 -> 2"):  # a new run into the same folder
        cli("fit", "--config", config, "--model.init_args.hidden", "8")
    run = cli("fit", "--trainer.project_dir", str(tmp_path / "run"), "--ckpt_path", "last",
              "--trainer.max_epochs", "2", "--allow_config_change")
    assert run.trainer.global_step == 8  # resumed after epoch 1 and trained the second
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["trainer"]["max_epochs"] == 2


def test_help_lists_types_defaults_and_docstrings(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        LightningCLI(Base, args=["fit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--model.lr LR the learning rate of SGD. (type: float, default: 0.1)" in text
    assert "--model.hidden HIDDEN the number of hidden units. (type: int, default: 4)" in text
    assert "--trainer.max_epochs" in text and "--ckpt_path" in text and "--optimizer" in text


def test_ember_fit_help_lists_the_configured_classes_arguments(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    config = write(tmp_path / "cfg.yaml", base_config(tmp_path / "run"))
    assert ember_main(["fit", "--config", config, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--trainer.max_epochs MAX_EPOCHS" in text and "--ckpt_path" in text
    assert "--model.hidden HIDDEN (type: int, default: 16)" in text  # Wide's own arguments
    assert "--data.batch_size BATCH_SIZE (type: int, default: 8)" in text


def test_a_bad_key_lists_close_matches(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"(?s)max_epoch.*Did you mean: trainer.max_epochs\?"):
        cli("fit", "--config", write(tmp_path / "c.yaml", base_config(tmp_path / "run")), "--trainer.max_epoch", "3")
    bad = base_config(tmp_path / "run")
    bad["model"]["init_args"]["lrr"] = 0.1
    with pytest.raises(SystemExit, match=r"(?s)lrr.*Did you mean: lr\b"):
        cli("fit", "--config", write(tmp_path / "bad.yaml", bad))
    assert not (tmp_path / "run").exists()


def test_optimizer_and_scheduler_from_the_command_line(tmp_path: Path) -> None:
    config = write(tmp_path / "cfg.yaml", base_config(tmp_path / "run"))
    run = cli("fit", "--config", config, "--trainer.max_epochs", "1", "--optimizer", "torch.optim.Adam",
              "--optimizer.lr", "0.01", "--lr_scheduler", "torch.optim.lr_scheduler.StepLR",
              "--lr_scheduler.step_size", "1")
    optimizer = getattr(run.trainer.optimizers[0], "optimizer", run.trainer.optimizers[0])  # the engine's wrapper
    assert isinstance(optimizer, torch.optim.Adam) and optimizer.param_groups[0]["initial_lr"] == 0.01
    assert isinstance(run.trainer.lr_scheduler_configs[0].scheduler, torch.optim.lr_scheduler.StepLR)
    assert type(run.model).__name__ == "Wide" and isinstance(run.model, Wide)


def test_ember_console_dispatches_fit_and_keeps_engine_commands(tmp_path: Path) -> None:
    config = write(tmp_path / "cfg.yaml", base_config(tmp_path / "run"))
    assert ember_main(["fit", "--config", config, "--trainer.max_epochs", "1"]) == 0
    assert (tmp_path / "run" / "config.yaml").exists()
    assert ember_main(["fit", "--config", config, "--trainer.max_epoch", "1"]) == 2  # an error, reported
    # `ember env` is still the engine's, and importing the dispatcher imports neither trainer nor jsonargparse.
    code = "import sys, ember_cli; assert 'trainer' not in sys.modules and 'jsonargparse' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=False).returncode == 0
    out = subprocess.run([sys.executable, "-m", "ember_cli", "env"], cwd=ROOT, capture_output=True, text=True,
                         check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and "torch:" in out.stdout


def test_ember_test_evaluates_a_finished_fit_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    config = base_config(run)
    # Keep the checkpoint of the *highest* validation loss (the first epoch's) as "best", and the last one apart,
    # so "best" and "last" are different checkpoints with different test losses.
    config["trainer"]["callbacks"] = [{"class_path": "callbacks.ModelCheckpoint", "init_args": {
        "monitor": "val/loss", "mode": "max", "save_top_k": 1, "save_last": True}}]
    fit = cli("fit", "--config", write(tmp_path / "cfg.yaml", config), "--trainer.max_epochs", "3")
    best, last = fit.trainer.checkpoint_callback.best_model_path, fit.trainer.checkpoint_callback.last_model_path
    assert best and last and best != last
    saved = str(run / "config.yaml")

    def test_loss(*args: str) -> float:
        return float(cli("test", *args).trainer.callback_metrics["test/loss"])

    # A fresh process's ModelCheckpoint has saved nothing: "best" is the one the run recorded.
    assert test_loss("--config", saved, "--ckpt_path", "best") == test_loss("--config", saved, "--ckpt_path", best)
    assert test_loss("--config", saved, "--ckpt_path", "last") == test_loss("--config", saved, "--ckpt_path", last)
    assert test_loss("--config", saved, "--ckpt_path", "best") != test_loss("--config", saved, "--ckpt_path", "last")
    # The run folder alone reads its config.yaml too; and the console command prints the metrics.
    assert test_loss("--trainer.project_dir", str(run), "--ckpt_path", "last") == test_loss("--config", saved,
                                                                                            "--ckpt_path", last)
    capsys.readouterr()
    assert ember_main(["test", "--config", saved, "--ckpt_path", "best"]) == 0
    assert "test/loss" in capsys.readouterr().out
    # Evaluating a different model than the run's is refused like a changed resume.
    with pytest.raises(ConfigMismatchError, match="model.init_args.hidden: 16 -> 8"):
        cli("test", "--config", saved, "--ckpt_path", "best", "--model.init_args.hidden", "8")


def test_a_changed_resume_is_one_line_with_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = write(tmp_path / "cfg.yaml", base_config(tmp_path / "run"))
    assert ember_main(["fit", "--config", config, "--trainer.max_epochs", "1"]) == 0
    capsys.readouterr()
    code = ember_main(["fit", "--trainer.project_dir", str(tmp_path / "run"), "--ckpt_path", "last",
                       "--trainer.max_epochs", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: ") and "trainer.max_epochs: 1 -> 2" in err and "--allow_config_change" in err


def test_an_option_of_another_subcommand_says_so(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as refused:
        cli("fit", "--config", write(tmp_path / "c.yaml", base_config(tmp_path / "run")),
            "--return_predictions", "true")
    assert "'return_predictions' is an option of predict only." in str(refused.value)
    assert "Did you mean" not in str(refused.value)


def test_without_log_with_the_cli_logs_with_the_trainers_default_logger(tmp_path: Path) -> None:
    # One rule for `ember fit` and Trainer(): log_with not given is left out, so the Trainer's default applies
    # (Lightning's default logger), and the saved config.yaml does not pin it either.
    config = base_config(tmp_path / "run")
    del config["trainer"]["log_with"]
    run = cli("fit", "--config", write(tmp_path / "cfg.yaml", config), "--trainer.max_epochs", "1")
    from trainer import Trainer

    default = Trainer(project_dir=str(tmp_path / "other"), enable_progress_bar=False)
    assert type(run.trainer.logger) is type(default.logger)
    assert type(run.trainer.logger).__name__ in ("TensorBoardLogger", "CSVLogger")
    assert run.trainer.logger.log_dir.startswith(str(tmp_path / "run" / "lightning_logs" / "version_"))
    assert "log_with" not in yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["trainer"]
