"""``ModelPruning`` scenarios whose outcomes are recorded from Lightning (``record_corpus.py pruning``).

Each returns plain values: error texts, which entries were pruned, the sparsity log, the weights after training.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections import OrderedDict
from typing import Any

import torch
import torch.nn.utils.prune as torch_prune
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer as pl
from callbacks import ModelPruning
from trainer.utilities.exceptions import MisconfigurationException

QUIET = {"enable_progress_bar": False, "enable_model_summary": False, "logger": False, "enable_checkpointing": False}


def _data(n: int = 32, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return DataLoader(TensorDataset(x, x[:, :2].sum(1, keepdim=True)), batch_size=4)


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Sequential(OrderedDict([("mlp_1", nn.Linear(8, 8)), ("mlp_2", nn.Linear(8, 8, bias=False)),
                                                ("mlp_3", nn.Linear(8, 1))]))
        self.inference_in_val: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.inference_in_val.append(torch.is_inference_mode_enabled())
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class EveryOther(torch_prune.BasePruningMethod):
    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t, default_mask):
        mask = default_mask.clone()
        mask.view(-1)[::2] = 0
        return mask


def _zeros(model: nn.Module) -> dict[str, int]:
    return {name: int((p == 0).sum()) for name, p in model.state_dict().items() if p.dtype.is_floating_point}


def _weights(model: nn.Module) -> dict[str, list[float]]:
    return {name: [float(p.double().sum()), float((p.double() ** 2).sum())]
            for name, p in model.state_dict().items() if p.dtype.is_floating_point}


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Applied"):
            self.messages.append(record.getMessage())


def _fit(workdir: str, model: nn.Module, callbacks: list[Any], epochs: int = 3, val: bool = True) -> list[str]:
    records = _Records()
    root = logging.getLogger(ModelPruning.__module__)  # the callback's own logger (Lightning's does not propagate)
    level = root.level
    root.setLevel(logging.INFO)
    root.addHandler(records)
    try:
        trainer = pl.Trainer(default_root_dir=workdir, max_epochs=epochs, callbacks=callbacks, **QUIET)
        trainer.fit(model, _data(), _data(8, seed=1) if val else None)
    finally:
        root.removeHandler(records)
        root.setLevel(level)
    return records.messages


def errors() -> list[str]:
    cases = [{"pruning_fn": "l1_unstructured", "parameter_names": ["chocolate"]}, {"pruning_fn": {}},
             {"pruning_fn": "random_structured"}, {"pruning_fn": "l1_unstructured", "verbose": 3},
             {"pruning_fn": "ln_structured", "pruning_dim": 0}, {"pruning_fn": "ln_structured", "pruning_dim": 0,
                                                                   "pruning_norm": 1},
             {"pruning_fn": EveryOther, "use_global_unstructured": False}, {"pruning_fn": "nope"},
             {"pruning_fn": "l1_unstructured", "amount": "half"}]
    texts = []
    for kwargs in cases:
        try:
            ModelPruning(**kwargs)
            texts.append("no error")
        except MisconfigurationException as error:
            texts.append(str(error).split(" Found method ")[0])
    model = Net()
    for targets in ([(nn.Linear(2, 2), "weight")], [(model.layer.mlp_1, "scale")], "weight"):
        try:
            ModelPruning.sanitize_parameters_to_prune(model, targets)
            texts.append("no error")
        except MisconfigurationException as error:
            texts.append(str(error).split(" Found missing")[0])
    return texts


def chosen() -> list[list[str]]:
    model = Net()
    names = {id(m): n for n, m in model.named_modules()}
    targets = ModelPruning.sanitize_parameters_to_prune(model, (), ["weight", "bias"])
    return [[names[id(m)], name] for m, name in targets]


def scenario(workdir: str, **kwargs: Any) -> dict[str, Any]:
    pl.seed_everything(3, verbose=False)
    model = Net()
    targets = kwargs.pop("targets", None)
    if targets:
        kwargs["parameters_to_prune"] = [(getattr(model.layer, n), "weight") for n in targets]
    messages = _fit(workdir, model, [ModelPruning(**kwargs)])
    pruned = {n for n, m in model.named_modules() for p in ("weight", "bias") if hasattr(m, p + "_orig")}
    pl.Trainer(**QUIET).validate(model, _data(8, seed=1), verbose=False)
    return {"log": messages, "zeros": _zeros(model), "weights": _weights(model), "still_pruned": sorted(pruned),
            "inference_in_val": sorted(set(model.inference_in_val))}


def lottery(workdir: str) -> dict[str, Any]:
    pl.seed_everything(4, verbose=False)
    model = Net()
    initial = model.layer.mlp_1.weight.detach().clone()
    pruning = ModelPruning("l1_unstructured", parameters_to_prune=[(model.layer.mlp_1, "weight")], amount=0.5,
                           use_lottery_ticket_hypothesis=lambda e: e == 1, apply_pruning=lambda e: e == 1,
                           make_pruning_permanent=False)
    _fit(workdir, model, [pruning], epochs=2)
    orig = model.layer.mlp_1.weight_orig
    return {"orig_is_initial": bool(torch.equal(orig, initial)), "zeros": _zeros(model),
            "keys": sorted(model.state_dict())}


def main(workdir: str) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out: dict[str, Any] = {"errors": errors(), "chosen": chosen(),
                               "lottery": lottery(os.path.join(workdir, "l"))}
        no_lth = {"use_lottery_ticket_hypothesis": False}
        l1 = {"pruning_fn": "l1_unstructured"}
        cases = {
            "local_l1": {**l1, "amount": 0.3, "use_global_unstructured": False, "verbose": 2, **no_lth},
            "global_l1": {**l1, "amount": 0.3, "verbose": 1, **no_lth},
            "global_l1_lth": {**l1, "amount": 0.25, "verbose": 1},
            "random_local": {"pruning_fn": "random_unstructured", "amount": 2, "use_global_unstructured": False,
                             "targets": ["mlp_1", "mlp_3"], "verbose": 2, **no_lth},
            "ln_structured": {"pruning_fn": "ln_structured", "pruning_dim": 0, "pruning_norm": 1, "amount": 0.25,
                              "use_global_unstructured": False, "parameter_names": ["weight"], "verbose": 1,
                              **no_lth},
            "custom_method": {"pruning_fn": EveryOther, "amount": 0.5, "verbose": 1, "targets": ["mlp_2"]},
            "amount_by_epoch": {**l1, "amount": lambda e: 0.1 * (e + 1), "apply_pruning": lambda e: e != 1,
                                "make_pruning_permanent": False, "verbose": 1, **no_lth},
            "on_validation_end": {**l1, "amount": 0.2, "prune_on_train_epoch_end": False, "verbose": 1, **no_lth},
        }
        for name, kwargs in cases.items():
            out[name] = scenario(os.path.join(workdir, name), **kwargs)
        return out
