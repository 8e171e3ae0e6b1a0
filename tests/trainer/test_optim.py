"""configure_optimizers forms, scheduler intervals / frequency, ReduceLROnPlateau on a logged metric."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch

from callbacks.exceptions import MisconfigurationException
from tests.trainer.helpers import Regressor, data, fit
from trainer import Trainer
from trainer.optim import parse_optimizers


def _opt(model: torch.nn.Module, lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr)


def _halving(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


def _two_lists(m: torch.nn.Module) -> Any:
    opt = _opt(m)
    return [opt], [_halving(opt)]


def _two_lists_of_dict(m: torch.nn.Module) -> Any:
    opt = _opt(m)
    return [opt], [{"scheduler": _halving(opt), "interval": "step"}]


def _dict_with_scheduler(m: torch.nn.Module) -> Any:
    opt = _opt(m)
    return {"optimizer": opt, "lr_scheduler": _halving(opt)}


def _dict_with_config(m: torch.nn.Module) -> Any:
    opt = _opt(m)
    return {"optimizer": opt, "lr_scheduler": {"scheduler": _halving(opt), "interval": "step", "frequency": 2}}


def _list_of_dicts(m: torch.nn.Module) -> Any:
    opt = _opt(m)
    return [{"optimizer": opt, "lr_scheduler": _halving(opt)}, {"optimizer": _opt(m)}]


# Each form -> (builder, number of optimizers, number of schedulers, interval of the first scheduler).
FORMS: dict[str, tuple[Callable[[torch.nn.Module], Any], int, int, str | None]] = {
    "optimizer": (_opt, 1, 0, None),
    "list": (lambda m: [_opt(m), _opt(m)], 2, 0, None),
    "tuple": (lambda m: (_opt(m),), 1, 0, None),
    "two lists": (_two_lists, 1, 1, "epoch"),
    "two lists of dict": (_two_lists_of_dict, 1, 1, "step"),
    "dict": (lambda m: {"optimizer": _opt(m)}, 1, 0, None),
    "dict + scheduler": (_dict_with_scheduler, 1, 1, "epoch"),
    "dict + config": (_dict_with_config, 1, 1, "step"),
    "list of dicts": (_list_of_dicts, 2, 1, "epoch"),
}


@pytest.mark.parametrize("form", FORMS)
def test_every_return_form_parses(form: str) -> None:
    build, n_opts, n_scheds, interval = FORMS[form]
    optimizers, configs = parse_optimizers(build(torch.nn.Linear(2, 1)))
    assert len(optimizers) == n_opts and len(configs) == n_scheds
    assert all(isinstance(o, torch.optim.Optimizer) for o in optimizers)
    if interval is not None:
        assert configs[0].interval == interval


def _module_returning(conf: Callable[[torch.nn.Module], Any]) -> Regressor:
    class Configured(Regressor):
        def configure_optimizers(self) -> Any:
            return conf(self)

    return Configured()


@pytest.mark.parametrize("form", [f for f, (_, n, _, _) in FORMS.items() if n == 1])
def test_single_optimizer_forms_train(form: str) -> None:
    module = _module_returning(FORMS[form][0])
    before = module.net.weight.detach().clone()
    trainer = fit(module, data(n=8, batch_size=4), max_epochs=1)
    assert trainer.global_step == 2
    assert not torch.equal(before, module.net.weight)


@pytest.mark.parametrize("bad, message", [
    ({"optimizer": None, "lr_scheduler": None}, "where an optimizer was expected"),
    ({"lr_scheduler": None}, "without 'optimizer'"),
    ("adam", "not a supported form"),
    ((1, 2), "not a supported form"),
])
def test_bad_forms_name_what_was_received(bad: Any, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        parse_optimizers(bad)


def test_bad_scheduler_configs() -> None:
    opt = _opt(torch.nn.Linear(2, 1))
    # Lightning's texts (MisconfigurationException, a ValueError), then what to do.
    with pytest.raises(MisconfigurationException, match='"interval" key in lr scheduler dict must be "step" or "epoch" '
                                                        'but is "batch"'):
        parse_optimizers({"optimizer": opt, "lr_scheduler": {"scheduler": _halving(opt), "interval": "batch"}})
    with pytest.raises(ValueError, match="'frequency' must be a positive int. Received: 0"):
        parse_optimizers({"optimizer": opt, "lr_scheduler": {"scheduler": _halving(opt), "frequency": 0}})
    # Unknown keys are warned about and ignored, as in Lightning.
    with pytest.warns(RuntimeWarning, match="Found unsupported keys in the lr scheduler dict: \\{'intervall'\\}"):
        parse_optimizers({"optimizer": opt, "lr_scheduler": {"scheduler": _halving(opt), "intervall": "step"}})
    with pytest.warns(RuntimeWarning, match="Found unsupported keys in the optimizer configuration: \\{'oops'\\}"):
        parse_optimizers({"optimizer": opt, "oops": 1})
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    with pytest.raises(MisconfigurationException, match="must include a monitor when a `ReduceLROnPlateau`"):
        parse_optimizers({"optimizer": opt, "lr_scheduler": plateau})
    other = _opt(torch.nn.Linear(2, 1))
    with pytest.raises(MisconfigurationException, match="attached with an optimizer that wasn't returned"):
        parse_optimizers({"optimizer": opt, "lr_scheduler": _halving(other)})


def test_automatic_optimization_needs_exactly_one_optimizer() -> None:
    with pytest.raises(RuntimeError, match="only supported with manual optimization: .*returned 2 optimizers.*"
                                           "automatic_optimization = False"):
        fit(_module_returning(lambda m: [_opt(m), _opt(m)]), max_epochs=1)


def _lr(trainer: Trainer) -> float:
    return trainer.optimizers[0].param_groups[0]["lr"]


@pytest.mark.parametrize("interval, frequency, accumulate, expected_steps", [
    ("step", 1, 1, 12),   # 4 batches x 3 epochs, one scheduler step per optimizer step
    ("step", 4, 1, 3),
    ("step", 1, 2, 6),    # per optimizer step, not per batch
    ("epoch", 1, 1, 3),
    ("epoch", 2, 1, 1),   # after epochs 2 (not 1 or 3)
])
def test_scheduler_interval_and_frequency(interval: str, frequency: int, accumulate: int,
                                          expected_steps: int) -> None:
    def configure(m: torch.nn.Module) -> Any:
        opt = _opt(m, lr=1.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": _halving(opt), "interval": interval,
                                                   "frequency": frequency}}

    module = _module_returning(configure)
    trainer = fit(module, data(n=16, batch_size=4), max_epochs=3, accumulate_grad_batches=accumulate)
    assert _lr(trainer) == pytest.approx(0.5 ** expected_steps)


class PlateauModule(Regressor):
    """Logs a validation metric that never improves, watched by ReduceLROnPlateau(patience=0)."""

    monitor = "val/flat"

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val/flat", 1.0)

    def configure_optimizers(self) -> Any:
        opt = _opt(self, lr=1.0)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": self.monitor}}


def test_reduce_on_plateau_reads_the_validation_metric() -> None:
    trainer = fit(PlateauModule(), data(n=8), data(n=8), max_epochs=3)
    # Epoch 1 sets the best value; epochs 2 and 3 do not improve on it: two reductions.
    assert _lr(trainer) == pytest.approx(0.25)


def test_plateau_monitor_never_logged_lists_the_logged_names() -> None:
    class Typo(PlateauModule):
        monitor = "val/flatt"

    with pytest.raises(MisconfigurationException, match=r"ReduceLROnPlateau conditioned on metric val/flatt which is "
                                                        r"not available. Available metrics are: \['train/loss', "
                                                        r"'val/flat'\]"):
        fit(Typo(), data(n=8), data(n=8), max_epochs=1)


def test_plateau_not_strict_warns_and_skips() -> None:
    class Loose(PlateauModule):
        def configure_optimizers(self) -> Any:
            conf = super().configure_optimizers()
            conf["lr_scheduler"].update(monitor="missing", strict=False)
            return conf

    with pytest.warns(RuntimeWarning, match="not available but strict is set to `False`. Skipping learning rate update"):
        trainer = fit(Loose(), data(n=8), data(n=8), max_epochs=2)
    assert _lr(trainer) == 1.0


def test_custom_optimizer_step_and_clipping_hooks_are_used() -> None:
    calls: list[str] = []

    class Custom(Regressor):
        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
            calls.append(f"step:{float(optimizer_closure().detach()):.0f}" if optimizer_closure else "step")
            optimizer.step(closure=optimizer_closure)

        def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                        gradient_clip_algorithm: Any = None) -> None:
            calls.append(f"clip:{gradient_clip_val}:{gradient_clip_algorithm}")

    fit(Custom(), data(n=4, batch_size=4), max_epochs=1, gradient_clip_val=0.5, gradient_clip_algorithm="value")
    assert calls[0] == "clip:0.5:value" and calls[1].startswith("step:")


def test_epoch_schedulers_step_only_after_a_whole_epoch() -> None:
    # Lightning steps an epoch-interval scheduler only when the epoch ran all its batches: max_steps ending the
    # epoch early leaves the rate alone (Lightning's own test_lr_scheduler_strict relies on it).
    def halving(m: torch.nn.Module) -> Any:
        opt = _opt(m, lr=1.0)
        return [opt], [_halving(opt)]

    cut = fit(_module_returning(halving), data(n=16, batch_size=4), max_steps=3)
    assert cut.global_step == 3 and _lr(cut) == 1.0
    whole = fit(_module_returning(halving), data(n=16, batch_size=4), max_steps=4)
    assert whole.global_step == 4 and _lr(whole) == 0.5


def test_clip_gradients_takes_the_trainers_settings_and_refuses_others() -> None:
    # Lightning 2.6 (test_lightning_module_configure_gradient_clipping_different_argument_values): a value or
    # algorithm given to clip_gradients that differs from the Trainer's raises; not given, it is the Trainer's.
    class Own(Regressor):
        clip: ClassVar[dict[str, Any]] = {}

        def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                        gradient_clip_algorithm: Any = None) -> None:
            self.clip_gradients(optimizer, **self.clip)

    Own.clip = {"gradient_clip_val": 1e-2}
    with pytest.raises(MisconfigurationException, match=r"gradient_clip_val=0.0001\)` and have passed "
                                                        r"`clip_gradients\(gradient_clip_val=0.01"):
        fit(Own(), data(n=4, batch_size=4), max_epochs=1, gradient_clip_val=1e-4)
    Own.clip = {"gradient_clip_algorithm": "foo"}
    with pytest.raises(MisconfigurationException, match=r"gradient_clip_algorithm='norm'\)` and have passed "
                                                        r"`clip_gradients\(gradient_clip_algorithm='foo'"):
        fit(Own(), data(n=4, batch_size=4), max_epochs=1, gradient_clip_algorithm="norm")
    assert Trainer(log_with=None).gradient_clip_algorithm is None  # not given: None, as Lightning's attribute
    seen: list[float] = []

    class Watched(Regressor):  # nothing given to clip_gradients: the Trainer's value clips
        def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                        gradient_clip_algorithm: Any = None) -> None:
            self.clip_gradients(optimizer)
            seen.append(float(torch.cat([p.grad.flatten() for p in self.parameters()]).norm()))

    fit(Watched(), data(n=4, batch_size=4), max_epochs=1, gradient_clip_val=0.5)
    assert seen and max(seen) <= 0.5 + 1e-6
