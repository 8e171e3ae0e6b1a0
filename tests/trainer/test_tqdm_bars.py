"""TQDMProgressBar's live bars and their factories (``train_progress_bar``, ``init_train_tqdm()`` ...): what they
hold at each step, as recorded from Lightning 2.6.5's bars running the same loops (5 training batches, 2
validation batches, a sanity check of 1, two test loaders of 2 and 3 batches, refresh_rate=3)."""

from __future__ import annotations

import io
from typing import Any, ClassVar
from unittest import mock

import torch
from torch.utils.data import DataLoader

from callbacks import TQDMProgressBar
from callbacks.tqdm_progress import Tqdm
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer

SHOWN = {**QUIET, "enable_progress_bar": True}


class Recording(Tqdm):
    """A Tqdm that records what is made and every change of ``n``, ``total`` and the description."""

    made: ClassVar[list[Recording]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.events: list[tuple[Any, ...]] = []
        super().__init__(*args, **kwargs)
        self.events = [("made", kwargs.get("desc"), kwargs.get("leave"), kwargs.get("position"))]
        Recording.made.append(self)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("n", "total") and "events" in vars(self):
            self.events.append((name, value))
        super().__setattr__(name, value)

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        super().set_description(desc, refresh)
        self.events.append(("desc", self.desc))

    def close(self) -> None:
        self.events.append(("close",))
        super().close()


class Model(Regressor):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        return None

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        return None

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return 0


def _events(run: Any) -> list[list[tuple[Any, ...]]]:
    Recording.made = []
    with mock.patch("callbacks.tqdm_progress.Tqdm", Recording):
        run()
    return [bar.events for bar in Recording.made]


def test_bars_count_reset_and_close_as_lightnings() -> None:
    bar = TQDMProgressBar(refresh_rate=3)
    trainer = Trainer(**{**SHOWN, "num_sanity_val_steps": 1}, max_epochs=2, callbacks=[bar])
    module = Model()
    fit = _events(lambda: trainer.fit(module, data(n=20), data(n=8)))
    # Recorded from Lightning 2.6.5: updates every 3 batches and at the last (3, 5), one training bar reset per
    # epoch, a validation bar per validation (position 1, not left), a dummy training bar in the sanity check.
    assert fit == [
        [("made", "Sanity Checking", False, 0), ("n", 0), ("total", 1), ("desc", "Sanity Checking DataLoader 0: "),
         ("n", 1), ("close",), ("close",)],
        [("made", None, None, None), ("close",)],
        [("made", "Training", True, 0), ("n", 0), ("total", 5), ("desc", "Epoch 0: "), ("n", 3), ("n", 5),
         ("n", 0), ("total", 5), ("desc", "Epoch 1: "), ("n", 3), ("n", 5), ("close",)],
        *[[("made", "Validation", False, 1), ("n", 0), ("total", 2), ("desc", "Validation DataLoader 0: "),
           ("n", 2), ("close",)]] * 2,
    ]
    test = _events(lambda: trainer.test(module, [data(n=8), data(n=12)], verbose=False))
    assert test == [[("made", "Testing", True, 0), ("n", 0), ("total", 2), ("desc", "Testing DataLoader 0: "),
                     ("n", 2), ("n", 0), ("total", 3), ("desc", "Testing DataLoader 1: "), ("n", 3), ("close",)]]
    predict = _events(lambda: trainer.predict(module, data(n=4)))
    assert predict == [[("made", "Predicting", True, 0), ("n", 0), ("total", 1),
                        ("desc", "Predicting DataLoader 0: "), ("n", 1), ("close",)]]
    # The references stay after the run, as Lightning's (tests read them).
    assert (bar.train_progress_bar.n, bar.train_progress_bar.total) == (5, 5)
    assert bar.test_progress_bar.desc == "Testing DataLoader 1: "


def test_training_bar_postfix_holds_the_metrics_at_epoch_end(capsys: Any) -> None:
    class Logging(Model):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("m", 0.5, prog_bar=True)
            return super().training_step(batch, batch_idx)

    bar = TQDMProgressBar(refresh_rate=3)
    Trainer(**SHOWN, max_epochs=2, callbacks=[bar]).fit(Logging(), data(n=20), data(n=8))
    # Lightning 2.6.5 at the last on_train_epoch_end: n=5, total=5, desc 'Epoch 1: ', postfix 'm=0.500'.
    train = bar.train_progress_bar
    assert (train.n, train.total, train.desc, train.postfix) == (5, 5, "Epoch 1: ", "m=0.500")
    # Not a terminal: one line per epoch instead of the bars (Ember's log-friendly output).
    assert [line.split(",")[0] for line in capsys.readouterr().out.splitlines()] == ["Epoch 0/1: 5 batches",
                                                                                     "Epoch 1/1: 5 batches"]


def test_an_overridden_factory_makes_the_bar() -> None:
    made: list[Any] = []

    class Custom(TQDMProgressBar):
        def init_validation_tqdm(self) -> Any:
            made.append(super().init_validation_tqdm())
            made[-1].set_description("running validation ...")
            return made[-1]

    bar = Custom()
    Trainer(**SHOWN, max_epochs=1, callbacks=[bar]).fit(Model(), data(n=8), data(n=8))
    assert len(made) == 1 and bar.val_progress_bar is made[0]
    assert made[0].n == made[0].total == 2


def test_leave_makes_a_training_bar_per_epoch() -> None:
    for leave, made in ((True, 4), (False, 1)):  # Lightning 2.6.5, 3 epochs: 4 with leave (train start + 3), else 1
        bar = TQDMProgressBar(leave=leave)
        with mock.patch.object(bar, "init_train_tqdm", wraps=bar.init_train_tqdm) as init:
            Trainer(**SHOWN, max_epochs=3, callbacks=[bar]).fit(Model(), data(n=4), data(n=4))
        assert init.call_count == made


def test_refresh_rate_zero_keeps_the_bars_but_updates_none() -> None:
    bar = TQDMProgressBar(refresh_rate=0)
    Trainer(**SHOWN, max_epochs=1, callbacks=[bar]).fit(Model(), data(n=8))
    # Lightning 2.6.5: the bar exists, disabled, its total set and its n never moved.
    assert bar.train_progress_bar.disable and bar.train_progress_bar.total == 2 and bar.train_progress_bar.n == 0


def test_module_print_goes_through_the_open_bar() -> None:
    class Printing(Model):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.print("training_step", end="")
            return super().training_step(batch, batch_idx)

        def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            self.print("test_step")

    with mock.patch("tqdm.tqdm.write") as write:
        trainer = Trainer(**SHOWN, max_steps=1, callbacks=[TQDMProgressBar()])
        trainer.fit(Printing(), data(n=4))
        trainer.test(Printing(), data(n=4), verbose=False)
    # Lightning 2.6.5 writes both through tqdm.write, with the print's keywords.
    assert write.call_args_list == [mock.call("training_step", end=""), mock.call("test_step")]


def test_bars_draw_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    Trainer(**SHOWN, max_epochs=1, callbacks=[TQDMProgressBar(stream=stream)]).fit(Model(), data(n=16))
    text = stream.getvalue()
    assert "Epoch 0: 100%" in text and "4/4" in text and "\r" in text


def test_a_loader_without_a_length_has_no_total() -> None:
    class Endless(torch.utils.data.IterableDataset):
        def __iter__(self) -> Any:
            return iter([(torch.randn(3), torch.randn(1))] * 8)

    bar = TQDMProgressBar()
    Trainer(**SHOWN, max_epochs=1, callbacks=[bar]).fit(Model(), DataLoader(Endless(), batch_size=4))
    assert bar.train_progress_bar.total is None and bar.train_progress_bar.n == 2  # tqdm's "unknown", as Lightning
