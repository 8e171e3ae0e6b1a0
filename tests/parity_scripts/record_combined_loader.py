"""Record what Lightning's ``CombinedLoader`` yields, and how its Trainer combines several training loaders
(tests/trainer/test_combined_loader.py and tests/trainer/test_combined_fit.py assert these values).

    /work/venvs/lconf/bin/python tests/parity_scripts/record_combined_loader.py

Printed: per mode, ``len()`` and every ``(batch, batch_idx, dataloader_idx)`` of two small loaders given as a
dict and as a list; the errors for a bad mode and ``len()`` before ``iter()``; ``flattened`` / ``sampler`` of a
nested collection; then, per way of returning the training data, the batch structure ``training_step`` receives
and ``trainer.num_training_batches`` (also with ``limit_train_batches``).
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

from collections import namedtuple

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import CombinedLoader
from torch.utils.data import DataLoader


def show(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {k: show(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(show(v) for v in value)
    return value


def loaders() -> dict[str, DataLoader]:
    return {"a": DataLoader(range(6), batch_size=4), "b": DataLoader(range(15), batch_size=5)}


def main() -> None:
    for mode in ("min_size", "max_size_cycle", "max_size", "sequential"):
        for shape in ("dict", "list"):
            given = loaders() if shape == "dict" else list(loaders().values())
            combined = CombinedLoader(given, mode)
            iter(combined)
            print(mode, shape, "len", len(combined), "items", [show(item) for item in combined])
    print("default mode", CombinedLoader(loaders())._mode)
    for bad in ("cycle", "MIN_SIZE"):
        try:
            CombinedLoader(loaders(), bad)
        except Exception as error:  # noqa: BLE001
            print("bad mode", type(error).__name__, str(error))
    try:
        len(CombinedLoader(loaders(), "max_size"))
    except Exception as error:  # noqa: BLE001
        print("len before iter", type(error).__name__, str(error))
    nested = {"x": [DataLoader(range(4), batch_size=2), DataLoader(range(2))], "y": DataLoader(range(3))}
    combined = CombinedLoader(nested, "max_size_cycle")
    print("flattened", len(combined.flattened), [type(x).__name__ for x in combined.flattened])
    print("sampler", show({k: ([type(s).__name__ for s in v] if isinstance(v, list) else type(v).__name__)
                         for k, v in combined.sampler.items()}))
    print("batch_sampler", show({k: ([type(s).__name__ for s in v] if isinstance(v, list) else type(v).__name__)
                               for k, v in combined.batch_sampler.items()}))
    iter(combined)
    print("nested len", len(combined), "first", show(next(combined)))
    combined.reset()
    print("after reset len error:", end=" ")
    try:
        len(combined)
    except RuntimeError as error:
        print(str(error))
    try:
        combined.flattened = [DataLoader(range(2))]
    except ValueError as error:
        print("flattened setter", str(error))
    single = CombinedLoader(DataLoader(range(3)), "max_size_cycle")
    iter(single)
    print("single leaf", len(single), [show(item) for item in single])
    iter(combined := CombinedLoader([range(3), range(5)], "max_size_cycle"))
    print("ranges", len(combined), [show(item) for item in combined])
    print("primitive container", CombinedLoader([[1, 2], [3, 4, 5]], "min_size").flattened)
    combined = CombinedLoader({"a": DataLoader(range(10), batch_size=2), "b": DataLoader(range(4), batch_size=2)},
                              "max_size_cycle")
    combined.limits = [2, 1]
    iter(combined)
    print("limits", combined.limits, "len", len(combined), [show(item) for item in combined])
    try:
        combined.limits = [1, 2, 3]
    except ValueError as error:
        print("limits error", str(error))
    sequential = CombinedLoader([range(3), range(4)], "sequential")
    sequential.limits = 2
    iter(sequential)
    print("sequential limits", len(sequential), list(sequential))
    pair = namedtuple("Pair", "left right")
    print("namedtuple", next(iter(CombinedLoader(pair(range(2), range(2)), "min_size"))))
    print("tuple", next(iter(CombinedLoader((range(2), range(2)), "min_size"))))
    fit_shapes()
    fit_cadence()


class Recorder(LightningModule):
    def __init__(self, data: object) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.data = data
        self.seen: list[object] = []

    def train_dataloader(self) -> object:
        return self.data

    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        self.seen.append(show(batch))
        return self.layer(torch.ones(1, 1)).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit_shapes() -> None:
    def make() -> dict[str, object]:
        a, b = DataLoader(torch.arange(6.0), batch_size=2), DataLoader(torch.arange(10.0, 14.0), batch_size=2)
        return {"dict": {"a": a, "b": b}, "list": [a, b], "tuple": (a, b), "one-list": [a],
                "combined-min": CombinedLoader({"a": a, "b": b}, "min_size"),
                "combined-max": CombinedLoader([a, b], "max_size")}
    for name in make():
        for limit in (1.0, 2, 0.5):
            model = Recorder(make()[name])
            trainer = Trainer(max_epochs=1, limit_train_batches=limit, logger=False, enable_checkpointing=False,
                              enable_progress_bar=False, enable_model_summary=False)
            trainer.fit(model)
            print("fit", name, limit, "num_training_batches", trainer.num_training_batches, "batches", model.seen)
    model = Recorder(CombinedLoader([DataLoader(range(2))], "sequential"))
    try:
        Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False).fit(model)
    except ValueError as error:
        print("fit sequential", str(error))



class Counting(Recorder):
    """Counts validation batches per dataloader_idx and the optimizer steps."""

    def __init__(self, data: object, val: object) -> None:
        super().__init__(data)
        self.val = val
        self.val_seen: list[int] = []

    def val_dataloader(self) -> object:
        return self.val

    def validation_step(self, batch: object, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.val_seen.append(dataloader_idx)

    def predict_step(self, batch: object, batch_idx: int, dataloader_idx: int = 0) -> object:
        return batch


def fit_cadence() -> None:
    a, b = DataLoader(torch.arange(8.0), batch_size=2), DataLoader(torch.arange(2.0), batch_size=2)
    val = {"x": DataLoader(torch.arange(4.0), batch_size=2), "y": DataLoader(torch.arange(2.0), batch_size=2)}
    model = Counting({"a": a, "b": b}, val)
    trainer = Trainer(max_epochs=2, accumulate_grad_batches=3, val_check_interval=2, num_sanity_val_steps=0,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    trainer.fit(model)
    print("cadence global_step", trainer.global_step, "num_training_batches", trainer.num_training_batches,
          "val idx", model.val_seen, "val_dataloaders", type(trainer.val_dataloaders).__name__,
          sorted(trainer.val_dataloaders), "train_dataloader", type(trainer.train_dataloader).__name__,
          sorted(trainer.train_dataloader))
    trainer.validate(model, DataLoader(torch.arange(4.0), batch_size=2), verbose=False)
    print("validate one loader", type(trainer.val_dataloaders).__name__)
    try:
        trainer.predict(model, CombinedLoader([DataLoader(torch.arange(2.0))], "max_size"))
    except ValueError as error:
        print("predict max_size", str(error))


if __name__ == "__main__":
    main()
