"""Loading model weights straight into the parameters (engine.checkpoint_direct): taken for plain models, declined
(changing nothing) whenever load_state_dict could do more than copy bytes, and load_state gives the same result
either way."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import Accelerator, accelerator_checkpoint
from engine.checkpoint_direct import read_into_module
from engine.checkpoint_io import save_safetensors


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(5, 4)
        self.head = torch.nn.Linear(4, 5, bias=False)
        self.head.weight = self.embed.weight


def _saved(model: torch.nn.Module, tmp_path: Path) -> str:
    path = str(tmp_path / "model.safetensors")
    save_safetensors(model.state_dict(), path)
    return path


@pytest.mark.parametrize("make", [lambda: torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(),
                                                               torch.nn.Linear(4, 2)).to(torch.bfloat16), Tied])
def test_a_plain_model_is_read_in_place(tmp_path: Path, make: object) -> None:
    torch.manual_seed(0)
    source = make()  # type: ignore[operator]
    path = _saved(source, tmp_path)
    torch.manual_seed(1)
    target = make()  # type: ignore[operator]
    pointers = [p.data_ptr() for p in target.parameters()]
    assert read_into_module(target, path)
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))
    assert [p.data_ptr() for p in target.parameters()] == pointers  # the same tensors, filled in place


def test_declined_cases_change_nothing(tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = _saved(torch.nn.Linear(3, 4), tmp_path)

    def unchanged(model: torch.nn.Module, **kwargs: bool) -> bool:
        before = {k: v.clone() for k, v in model.state_dict().items()}
        declined = not read_into_module(model, path, **kwargs)
        return declined and all(torch.equal(before[k], v) for k, v in model.state_dict().items())

    assert unchanged(torch.nn.Linear(3, 4), strict=False)  # load_state_dict's own key handling
    assert unchanged(torch.nn.Linear(3, 5))  # a shape differs: torch's error comes from load_state_dict
    assert unchanged(torch.nn.Linear(3, 4, bias=False))  # a missing / unexpected name
    assert unchanged(torch.nn.Linear(3, 4).to(torch.float64))  # load_state_dict converts the dtype
    hooked = torch.nn.Linear(3, 4)
    hooked.register_load_state_dict_post_hook(lambda module, keys: None)
    assert unchanged(hooked)
    norm = torch.nn.Sequential(torch.nn.BatchNorm1d(3))  # overrides _load_from_state_dict
    norm_path = _saved(torch.nn.Sequential(torch.nn.BatchNorm1d(3)), tmp_path)
    assert not read_into_module(norm, norm_path)


def test_load_state_takes_the_fast_path_and_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[bool] = []
    real = accelerator_checkpoint.read_into_module
    monkeypatch.setattr(accelerator_checkpoint, "read_into_module",
                        lambda *args: taken.append(real(*args)) or taken[-1])
    for model in (torch.nn.Linear(3, 4), torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))):
        acc = Accelerator(cpu=True)
        prepared = acc.prepare(model)
        folder = acc.save_state(str(tmp_path / type(model).__name__))
        expected = {k: v.clone() for k, v in prepared.state_dict().items()}
        with torch.no_grad():
            for param in prepared.parameters():
                param.add_(1)
        acc.load_state(folder)
        assert all(torch.equal(expected[k], v) for k, v in prepared.state_dict().items())
    assert taken == [True, False]
