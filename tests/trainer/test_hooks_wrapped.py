"""Hooks wrapped on the instance (``functools.update_wrapper``: how Lightning's hook-order tests record calls, and
how users time or log them): a wrapped hook that is not overridden stays unused where Lightning leaves it unused
(the data module's batch-transfer hooks), callbacks' wrapped hooks are still called, and the data module's
``setup`` / ``teardown`` get ``stage`` as a keyword, as Lightning passes it (tests_pytorch/models/test_hooks.py)."""

from __future__ import annotations

import functools
from typing import Any

from callbacks import Callback
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import DataModule, Trainer


def _wrap_all(obj: Any, names: list[str], called: list[str], prefix: str = "") -> None:
    def call(name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        called.append(prefix + name + ("(stage=)" if "stage" in kwargs else ""))
        return fn(*args, **kwargs)

    for name in names:
        original = getattr(obj, name)
        wrapper = functools.partial(call, name, original)
        functools.update_wrapper(wrapper, original)
        setattr(obj, name, wrapper)


class Data(DataModule):
    def train_dataloader(self) -> Any:
        return data(8, 4)


def test_wrapped_hooks_run_where_lightning_runs_them() -> None:
    called: list[str] = []
    datamodule = Data()
    _wrap_all(datamodule, ["setup", "teardown", "train_dataloader", "on_before_batch_transfer",
                           "transfer_batch_to_device", "on_after_batch_transfer"], called)
    callback = Callback()
    _wrap_all(callback, ["on_fit_start"], called, prefix="Callback.")
    Trainer(**{**QUIET, "max_steps": 1, "callbacks": [callback]}).fit(Regressor(), datamodule=datamodule)
    assert sorted(called) == ["Callback.on_fit_start", "setup(stage=)", "teardown(stage=)", "train_dataloader"]


def test_skipped_hooks_is_a_property_so_callback_methods_are_lightnings_hooks_only() -> None:
    import inspect

    from callbacks import TQDMProgressBar
    from callbacks.base import HOOK_NAMES

    methods = {name for name, _ in inspect.getmembers(Callback, inspect.isfunction) if not name.startswith("_")}
    assert methods == set(HOOK_NAMES) | {"state_dict", "load_state_dict"}
    assert Callback().skipped_hooks == frozenset() and isinstance(TQDMProgressBar().skipped_hooks, frozenset)


def test_lightnings_order_around_evaluation_and_saving_and_clipping_by_name(tmp_path: Any) -> None:
    # Recorded from Lightning 2.6.6 (tests_pytorch/models/test_hooks.py's HookedModel): predict configures the
    # model and clears its gradients before asking for the loader; a save asks the callbacks' state_dict before
    # their on_save_checkpoint; configure_gradient_clipping gets the settings by name.
    events: list[str] = []

    class Model(Regressor):
        def configure_model(self) -> None:
            events.append("configure_model")

        def zero_grad(self, set_to_none: bool = True) -> None:
            events.append("zero_grad")
            super().zero_grad(set_to_none)

        def predict_dataloader(self) -> Any:
            events.append("predict_dataloader")
            return data(8, 4)

        def configure_gradient_clipping(self, optimizer: Any, **settings: Any) -> None:
            events.append(f"clip{sorted(settings)}")

    class Saving(Callback):
        def state_dict(self) -> dict[str, Any]:
            events.append("state_dict")
            return {}

        def on_save_checkpoint(self, trainer: Any, module: Any, checkpoint: dict[str, Any]) -> None:
            events.append("on_save_checkpoint")

    Trainer(**QUIET).predict(Model())
    assert events == ["configure_model", "zero_grad", "predict_dataloader"]
    events.clear()
    trainer = Trainer(**{**QUIET, "max_steps": 1, "callbacks": [Saving()], "gradient_clip_val": 1.0})
    trainer.fit(Model(), data(4, 4))
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    assert events[-3:] == ["clip['gradient_clip_algorithm', 'gradient_clip_val']", "state_dict",
                           "on_save_checkpoint"]


def test_a_mock_callback_gets_every_callback_hook_as_in_lightning() -> None:
    from unittest import mock

    callback = mock.Mock(spec=Callback)
    Trainer(**{**QUIET, "max_steps": 1, "callbacks": [callback]}).fit(Regressor(), data(4, 4))
    called = {c[0] for c in callback.method_calls}
    assert {"setup", "on_fit_start", "on_train_batch_end", "on_fit_end", "teardown"} <= called
    assert "skipped_hooks" not in called  # a Mock declares nothing
