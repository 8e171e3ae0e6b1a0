"""``ModelPruning`` (Lightning's pruning callback) against what lightning 2.6.6 did on the same scenarios
(``tests/lightning_corpus/pruning.py``, recorded by ``tests/parity_scripts/record_corpus.py pruning``), and its
checkpoints: plain masked weights that load into the unpruned module, masks that come back on resume."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

from callbacks import ModelCheckpoint, ModelPruning
from callbacks.pruning_checkpoint import fold_pruned, pruned_names, unfold_pruned
from tests.lightning_corpus.expected import EXPECTED
from tests.trainer.test_lightning_corpus import approx
from trainer import Trainer
from trainer.utilities.exceptions import MisconfigurationException

LIGHTNING = EXPECTED["pruning"]


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    module = importlib.import_module("tests.lightning_corpus.pruning")
    return json.loads(json.dumps(module.main(str(tmp_path_factory.mktemp("pruning")))))


def test_errors_hold_lightnings_texts(observed: dict[str, Any]) -> None:
    # Ember's messages start with Lightning's, then name the received value or the fix.
    for ours, theirs in zip(observed["errors"], LIGHTNING["errors"], strict=True):
        assert ours.startswith(theirs.rstrip(". ")), (ours, theirs)


def test_parameters_chosen_by_default_match_lightning(observed: dict[str, Any]) -> None:
    assert observed["chosen"] == LIGHTNING["chosen"]


def test_lottery_ticket_resets_the_survivors_to_their_initial_values(observed: dict[str, Any]) -> None:
    assert observed["lottery"] == LIGHTNING["lottery"] and observed["lottery"]["orig_is_initial"]


@pytest.mark.parametrize("case", ["local_l1", "global_l1", "global_l1_lth", "random_local", "ln_structured",
                                  "amount_by_epoch", "on_validation_end", "custom_method"])
@pytest.mark.recorded_bits
def test_pruned_training_matches_lightning(observed: dict[str, Any], case: str) -> None:
    ours, theirs = dict(observed[case]), dict(LIGHTNING[case])
    if case == "custom_method":
        # Lightning logs `None` for a BasePruningMethod class (it names only the built-ins); Ember names the class.
        theirs["log"] = [m.replace("`None`", "`EveryOther`") for m in theirs["log"]]
    assert ours["log"] == theirs["log"]
    assert ours["zeros"] == theirs["zeros"] and ours["still_pruned"] == theirs["still_pruned"]
    assert ours["weights"] == approx(theirs["weights"])
    # Validation inside fit runs under no_grad (a mask made there trains afterwards), validate() under inference mode.
    assert ours["inference_in_val"] == theirs["inference_in_val"] == [False, True]


def test_is_pruning_method_and_filter_hook() -> None:
    assert ModelPruning._is_pruning_method(torch_prune.L1Unstructured)
    assert not ModelPruning._is_pruning_method(torch_prune.l1_unstructured)

    class FirstOnly(ModelPruning):
        def filter_parameters_to_prune(self, parameters_to_prune=()):
            return list(parameters_to_prune)[:1]

    net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    pruning = FirstOnly("l1_unstructured", parameter_names=["weight"])
    pruning.setup(Trainer(enable_progress_bar=False), net, "fit")
    assert [m for m, _ in pruning._parameters_to_prune] == [net[0]]


def test_state_dict_hooks_fold_and_unfold_the_pruning() -> None:
    layer = nn.Linear(3, 2)
    layer.register_state_dict_post_hook(fold_pruned)
    layer.register_load_state_dict_pre_hook(unfold_pruned)
    torch_prune.l1_unstructured(layer, "weight", amount=3)
    saved = layer.state_dict()
    assert sorted(saved) == ["bias", "weight"] and int((saved["weight"] == 0).sum()) == 3
    plain = nn.Linear(3, 2)
    plain.load_state_dict(saved)  # a checkpoint loads into the unpruned module
    assert torch.equal(plain.weight, layer.weight)
    layer.load_state_dict(saved)  # and back into the pruned one: its mask is kept
    assert pruned_names(layer) == ["weight"] and torch.equal(layer.weight, plain.weight)


def _module() -> Any:
    from tests.lightning_corpus.pruning import Net as CorpusNet

    return CorpusNet()


def _fit(root: Path, ckpt_path: str | None = None, epochs: int = 4, **kwargs: Any) -> tuple[Any, Any]:
    from tests.lightning_corpus.pruning import _data

    torch.manual_seed(0)
    model = _module()
    pruning = ModelPruning("l1_unstructured", amount=0.25, use_lottery_ticket_hypothesis=False, **kwargs)
    checkpoint = ModelCheckpoint(dirpath=str(root / "ckpt"), every_n_epochs=1, save_top_k=-1)
    trainer = Trainer(default_root_dir=str(root), max_epochs=epochs, callbacks=[pruning, checkpoint], logger=False,
                      enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, _data(), _data(8, seed=1), ckpt_path=ckpt_path)
    return model, checkpoint


@pytest.mark.parametrize("permanent", [True, False])
def test_resume_of_a_pruned_run_is_exact(tmp_path: Path, permanent: bool) -> None:
    whole, checkpoint = _fit(tmp_path / "whole", make_pruning_permanent=permanent)
    second = next(Path(checkpoint.dirpath).glob("epoch=1-*"))  # after epoch 1: pruned twice
    resumed, _ = _fit(tmp_path / "resumed", ckpt_path=str(second), make_pruning_permanent=permanent)
    # What the forward uses (weight = weight_orig * weight_mask) and the masks; under make_pruning_permanent=False
    # the entries a mask hides in weight_orig are 0 after a resume (momentum moved them on in the whole run): the
    # forward never reads them.
    for (name, ours), (_, theirs) in zip(_effective(resumed).items(), _effective(whole).items(), strict=True):
        assert torch.equal(ours, theirs), name
    assert pruned_names(resumed.layer.mlp_1) == ([] if permanent else ["weight", "bias"])


def _effective(model: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, layer in model.named_modules():
        for tensor in ("weight", "bias"):
            if isinstance(getattr(layer, tensor, None), torch.Tensor):
                out[f"{name}.{tensor}"] = getattr(layer, tensor)
                if hasattr(layer, tensor + "_mask"):
                    out[f"{name}.{tensor}_mask"] = getattr(layer, tensor + "_mask")
    return out


def test_checkpoint_of_a_pruned_module_loads_into_the_plain_module(tmp_path: Path) -> None:
    model, checkpoint = _fit(tmp_path, epochs=2, make_pruning_permanent=False)
    folder = max(Path(checkpoint.dirpath).iterdir())
    loaded = type(model).load_from_checkpoint(str(folder))
    assert pruned_names(loaded.layer.mlp_1) == []
    assert torch.equal(loaded.layer.mlp_1.weight, model.layer.mlp_1.weight)  # the masked values
    assert int((loaded.layer.mlp_1.weight == 0).sum()) > 0


def _resume_per_rank(root: str) -> dict[str, Any]:
    whole, checkpoint = _fit(Path(root) / "whole", make_pruning_permanent=False)
    second = next(Path(checkpoint.dirpath).glob("epoch=1-*"))
    resumed, _ = _fit(Path(root) / "resumed", ckpt_path=str(second), make_pruning_permanent=False)
    return {name: {k: v.tolist() for k, v in _effective(model).items()}
            for name, model in (("whole", whole), ("resumed", resumed))}


def test_pruned_ddp_run_resumes_exactly_on_two_processes(run_distributed: Any, tmp_path: Path) -> None:
    # Global L1 pruning on identical weights gives every rank the same masks; the resumed 2-process run equals
    # the whole one on both ranks.
    rank0, rank1 = run_distributed(_resume_per_rank, 2, str(tmp_path))
    assert rank0 == rank1
    assert rank0["resumed"] == rank0["whole"]


def test_two_pruning_callbacks_keep_their_state_apart() -> None:
    first = ModelPruning("l1_unstructured", amount=0.5)
    second = ModelPruning("random_unstructured", amount=0.25)
    assert first.state_key != second.state_key


def test_bad_parameters_to_prune_name_the_value() -> None:
    with pytest.raises(MisconfigurationException, match="should either be list of tuple.*Received: 'weight'"):
        ModelPruning.sanitize_parameters_to_prune(nn.Linear(2, 2), "weight")
