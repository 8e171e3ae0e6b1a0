"""SWA and EMA: the averaged weights equal what torch.optim.swa_utils gives by hand, validation runs on them,
and a run killed after a checkpoint resumes bitwise."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch.optim.swa_utils import SWALR, AveragedModel, get_ema_avg_fn, update_bn

from callbacks import Callback, EMAWeightAveraging, StochasticWeightAveraging, WeightAveraging
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer


class BatchNormRegressor(Regressor):
    """Regression through a batch-norm layer, so SWA's update_bn has statistics to recompute."""

    def __init__(self) -> None:
        super().__init__(lr=0.05)
        self.norm = torch.nn.BatchNorm1d(3)
        self.seen_in_validation: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.norm(x))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.seen_in_validation.append(self.net.weight.detach().clone())
        super().validation_step(batch, batch_idx)


def by_hand(module: torch.nn.Module, epochs: int, per_step: AveragedModel | None = None,
            swa: tuple[AveragedModel, int, float, int] | None = None) -> None:
    """PyTorch's own loop: SGD on the same batches, swa_utils updates as their docs show."""
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    scheduler = None
    for epoch in range(epochs):
        if swa is not None and epoch == swa[1]:
            scheduler = SWALR(optimizer, swa_lr=swa[2], anneal_epochs=swa[3], anneal_strategy="cos")
        for x, y in data(n=16, batch_size=4):
            loss = torch.nn.functional.mse_loss(module(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if per_step is not None:
                per_step.update_parameters(module)
        if swa is not None and epoch >= swa[1]:
            swa[0].update_parameters(module)
            assert scheduler is not None
            scheduler.step()


def fit(module: Regressor, callback: Callback, epochs: int = 4, ckpt_path: str | None = None,
        extra: tuple[Callback, ...] = ()) -> Trainer:
    trainer = Trainer(**QUIET, max_epochs=epochs, callbacks=[callback, *extra])
    trainer.fit(module, data(n=16, batch_size=4), data(n=8, batch_size=4), ckpt_path=ckpt_path)
    return trainer


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name, value in a.items():
        assert torch.equal(value, b[name]), name


def test_ema_equals_averaged_model_by_hand_and_validates_on_it() -> None:
    torch.manual_seed(0)
    module = BatchNormRegressor()
    hand = copy.deepcopy(module)
    ema = AveragedModel(hand, avg_fn=get_ema_avg_fn(0.9), use_buffers=True)
    by_hand(hand, epochs=2, per_step=ema)

    callback = EMAWeightAveraging(decay=0.9)
    fit(module, callback, epochs=2)
    assert callback.average_model is not None
    assert_same(callback.average_model.state_dict(), ema.state_dict())
    assert_same(module.state_dict(), {k: v for k, v in ema.module.state_dict().items() if k in module.state_dict()})
    # Validation after epoch 0 ran on the average of that moment, not on the trained weights (Lightning 2.6).
    torch.manual_seed(0)
    check = BatchNormRegressor()
    ema_after_epoch0 = AveragedModel(check, avg_fn=get_ema_avg_fn(0.9), use_buffers=True)
    by_hand(check, epochs=1, per_step=ema_after_epoch0)
    assert torch.equal(module.seen_in_validation[0], ema_after_epoch0.module.net.weight)
    assert not torch.equal(module.seen_in_validation[0], check.net.weight)


def test_swa_equals_the_swa_utils_recipe_by_hand() -> None:
    torch.manual_seed(0)
    module = BatchNormRegressor()
    hand = copy.deepcopy(module)
    average = AveragedModel(hand)
    by_hand(hand, epochs=4, swa=(average, 2, 0.02, 1))  # swa_epoch_start=3 is the 0-based epoch 2
    update_bn(data(n=16, batch_size=4), average)

    callback = StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=3, annealing_epochs=1)
    trainer = fit(module, callback)
    assert_same(module.state_dict(), average.module.state_dict())  # weights averaged, batch norm recomputed
    assert trainer.optimizers[0].param_groups[0]["lr"] == 0.02
    # Validation ran on the trained weights until the first average existed, then on the average.
    assert len(module.seen_in_validation) == 8  # 4 epochs x 2 batches
    assert int(callback.average_model.n_averaged) == 2  # type: ignore[union-attr]


def test_swa_owns_the_learning_rate_over_another_scheduler() -> None:
    class WithScheduler(BatchNormRegressor):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
            return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.1)}

    seen: list[float] = []

    class Lr(Callback):
        # The rate this batch's step uses (at its end an epoch's last batch shows the epoch scheduler's step).
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            seen.append(trainer.optimizers[0].param_groups[0]["lr"])

    fit(WithScheduler(), StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=2, annealing_epochs=0),
        extra=(Lr(),))
    assert seen[:4] == [0.05] * 4 and seen[4:] == [0.02] * 12  # StepLR's decay does not reach the SWA epochs


class Crash(Callback):
    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == self.at_step:
            raise RuntimeError("killed")


class SaveAtStep(Callback):
    def __init__(self, path: str, step: int) -> None:
        self.path, self.step = path, step

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


@pytest.mark.parametrize("make", [lambda: EMAWeightAveraging(decay=0.9),
                                  lambda: StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=2,
                                                                    annealing_epochs=2, device=None)],
                         ids=["ema", "swa"])
def test_killed_run_resumes_bitwise(tmp_path: Any, make: Any) -> None:
    torch.manual_seed(0)
    start = BatchNormRegressor().state_dict()

    def run(callback: Callback, extra: tuple[Callback, ...] = (), ckpt_path: str | None = None) -> Any:
        module = BatchNormRegressor()
        module.load_state_dict(start)
        fit(module, callback, ckpt_path=ckpt_path, extra=extra)
        return module

    full_callback = make()
    full = run(full_callback)
    path = str(tmp_path / "mid")
    with pytest.raises(RuntimeError, match="killed"):  # the checkpoint is mid-way through epoch 2, in SWA's epochs
        run(make(), extra=(SaveAtStep(path, 10), Crash(13)))
    resumed_callback = make()
    resumed = run(resumed_callback, ckpt_path=path)
    assert_same(full.state_dict(), resumed.state_dict())
    assert_same(full_callback.average_model.state_dict(), resumed_callback.average_model.state_dict())


def test_bad_arguments_fail_early_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"swa_epoch_start=6\) starts after the last epoch.*max_epochs=4"):
        fit(Regressor(), StochasticWeightAveraging(swa_lrs=0.1, swa_epoch_start=6))
    with pytest.raises(ValueError, match=r"swa_lrs=.*positive.*Received: -1"):
        StochasticWeightAveraging(swa_lrs=-1.0)
    with pytest.raises(ValueError, match=r"swa_epoch_start=.*Received: 0"):
        StochasticWeightAveraging(swa_lrs=0.1, swa_epoch_start=0)
    with pytest.raises(ValueError, match="annealing_strategy.*'cos' or 'linear'"):
        StochasticWeightAveraging(swa_lrs=0.1, annealing_strategy="step")
    with pytest.raises(ValueError, match=r"decay.*\[0, 1\].*1.5"):
        EMAWeightAveraging(decay=1.5)
    with pytest.raises(ValueError, match=r"swa_epoch_start=0.5\) is a fraction.*max_epochs=-1"):
        trainer = Trainer(**QUIET, max_epochs=-1, max_steps=4, callbacks=[StochasticWeightAveraging(0.1, 0.5)])
        trainer.fit(Regressor(), data())


def test_weight_averaging_default_updates_every_step() -> None:
    torch.manual_seed(0)
    module = Regressor()
    hand = copy.deepcopy(module)
    average = AveragedModel(hand, use_buffers=True)
    by_hand(hand, epochs=1, per_step=average)
    callback = WeightAveraging()
    fit(module, callback, epochs=1)
    assert_same(callback.average_model.state_dict(), average.state_dict())  # type: ignore[union-attr]


# Recorded from Lightning 2.6.6 by tests/parity_scripts/weight_averaging_lightning.py (same init, data, SGD).
LIGHTNING_EMA_FINAL_WEIGHT = [0.09988986700773239, 0.6423516869544983, -0.14407122135162354]
LIGHTNING_EMA_FINAL_BIAS = -0.3575661778450012
LIGHTNING_EMA_VALIDATION_AFTER_EPOCH0 = [0.07283277809619904, 0.505405068397522, -0.25727587938308716]


def test_ema_matches_lightning() -> None:
    torch.manual_seed(0)
    module = BatchNormRegressor()
    fit(module, EMAWeightAveraging(decay=0.9), epochs=2)
    assert module.net.weight.flatten().tolist() == pytest.approx(LIGHTNING_EMA_FINAL_WEIGHT, abs=1e-6)
    assert module.net.bias.item() == pytest.approx(LIGHTNING_EMA_FINAL_BIAS, abs=1e-6)
    assert module.seen_in_validation[0].flatten().tolist() == pytest.approx(LIGHTNING_EMA_VALIDATION_AFTER_EPOCH0,
                                                                            abs=1e-6)


def test_bad_swa_arguments_raise_lightnings_exception_and_words() -> None:
    from callbacks.exceptions import MisconfigurationException

    for start in (0, 1.5, -1):
        with pytest.raises(MisconfigurationException, match=">0 integer or a float between 0 and 1"):
            StochasticWeightAveraging(swa_epoch_start=start, swa_lrs=0.1)
    with pytest.raises(MisconfigurationException, match="positive float, or a list of positive floats"):
        StochasticWeightAveraging(swa_epoch_start=5, swa_lrs=[0.2, 1])  # a list holds floats, as in Lightning
