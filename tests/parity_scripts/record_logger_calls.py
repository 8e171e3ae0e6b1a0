"""Record how Lightning 2.6 drives a duck-typed logger (``Trainer(logger=Mock())``) (run once, by hand).

    /tmp/venv-pl44/bin/python tests/parity_scripts/record_logger_calls.py

The venv holds lightning 2.6.x and torch. A ``Mock`` logger and a callback that writes each hook into the same mock
record, in order, every call Lightning makes on the logger between the hooks: for a ``fit`` of two epochs (two
training batches, one validation batch, a checkpoint per epoch, metrics every step), then ``validate``, ``test``,
``predict``, and a ``fit`` that raises in ``training_step``. Printed as Python literals (``log_metrics`` with its
step and metric names, ``finalize`` with its status, other calls by name); tests/trainer/test_duck_loggers.py holds the result as
``LIGHTNING_CALLS``.
"""

from __future__ import annotations

import pprint
import tempfile
import warnings
from typing import Any
from unittest import mock

HOOKS = ("setup", "on_fit_start", "on_train_start", "on_validation_start", "on_test_start", "on_predict_start",
         "on_save_checkpoint", "on_train_end", "on_fit_end", "teardown")


def names(logger: mock.Mock) -> list[Any]:
    calls: list[Any] = []
    for name, args, kwargs in logger.method_calls:
        if name == "hook":
            calls.append(args[0])
        elif name == "log_metrics":
            calls.append(("log_metrics", kwargs["step"], sorted(kwargs["metrics"])))
        elif name == "finalize":
            calls.append(("finalize", *args))
        else:
            calls.append(name)
    logger.reset_mock()
    return calls


def main() -> None:
    from lightning.pytorch import Callback, Trainer
    from lightning.pytorch.demos.boring_classes import BoringModel

    warnings.filterwarnings("ignore")

    class Model(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.save_hyperparameters({"lr": 0.1})

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            self.log("train_loss", out["loss"])
            return out

        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().validation_step(batch, batch_idx)
            self.log("val_loss", out["x"])
            return out

        def test_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().test_step(batch, batch_idx)
            self.log("test_loss", out["y"])
            return out

    class Failing(Model):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            raise ValueError("boom")

    folder = tempfile.mkdtemp()
    logger = mock.Mock()
    logger.save_dir, logger.name, logger.version = folder, "mock", "0"

    class Hooks(Callback):
        pass

    for hook in HOOKS:
        setattr(Hooks, hook, lambda self, *args, _hook=hook, **kwargs: logger.hook(_hook))
    trainer = Trainer(default_root_dir=folder, max_epochs=2, limit_train_batches=2, limit_val_batches=1,
                      limit_test_batches=1, limit_predict_batches=1, log_every_n_steps=1, logger=logger,
                      callbacks=[Hooks()], enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0)
    recorded: dict[str, Any] = {"log_dir": trainer.log_dir == folder}
    trainer.fit(Model())
    recorded["checkpoint_dir"] = trainer.checkpoint_callback.dirpath.replace(folder, "{save_dir}")
    recorded["fit"] = names(logger)
    trainer.validate(Model(), verbose=False)
    recorded["validate"] = names(logger)
    trainer.test(Model(), verbose=False)
    recorded["test"] = names(logger)
    trainer.predict(Model())
    recorded["predict"] = names(logger)
    try:
        Trainer(default_root_dir=folder, max_steps=1, logger=logger, enable_progress_bar=False,
                enable_model_summary=False).fit(Failing())
    except ValueError:
        pass
    recorded["failed_fit"] = names(logger)
    pprint.pprint(recorded, width=116, sort_dicts=False)


if __name__ == "__main__":
    main()
