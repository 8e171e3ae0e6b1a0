"""TrainModule.to_torchscript and to_onnx (trainer/export.py): Lightning's names, arguments and messages."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer import TrainModule
from trainer.export import TORCHSCRIPT_DEPRECATION
from trainer.utilities.rank_zero import LightningDeprecationWarning


class Net(TrainModule):
    def __init__(self, manual: bool = False) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 3)
        self.drop = torch.nn.Dropout(0.5)  # evaluation mode matters: the export must not drop
        self.automatic_optimization = not manual  # a module-level setting TorchScript must not trip over
        self.example_input_array = torch.randn(2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.layer(x)).relu()


@pytest.mark.parametrize("method", ["script", "trace"])
@pytest.mark.parametrize("manual", [False, True])
def test_to_torchscript_matches_the_module_in_eval_mode_and_keeps_its_mode(method: str, manual: bool) -> None:
    model = Net(manual)
    with pytest.warns(LightningDeprecationWarning, match="has been deprecated in v2.7 and will be removed in v2.8"):
        scripted = model.to_torchscript(method=method)
    assert isinstance(scripted, torch.jit.ScriptModule)
    assert model.training and not scripted.training  # the module goes back to training mode
    x = torch.randn(5, 4)
    model.eval()
    torch.testing.assert_close(scripted(x), model(x), rtol=0, atol=0)
    assert not callable(getattr(scripted, "training_step", None))  # only forward is compiled


def test_to_torchscript_saves_to_a_path_or_an_fsspec_url(tmp_path: Path) -> None:
    model = Net()
    with pytest.warns(LightningDeprecationWarning):
        scripted = model.to_torchscript(file_path=tmp_path / "net.pt")
    with pytest.warns(LightningDeprecationWarning):
        model.to_torchscript(file_path="memory://exports/net.pt")
    x = torch.randn(3, 4)
    torch.testing.assert_close(torch.jit.load(tmp_path / "net.pt")(x), scripted(x), rtol=0, atol=0)
    import fsspec

    with fsspec.open("memory://exports/net.pt", "rb") as handle:
        loaded = torch.jit.load(io.BytesIO(handle.read()))
    torch.testing.assert_close(loaded(x), scripted(x), rtol=0, atol=0)


def test_to_torchscript_refuses_an_unknown_method_and_a_trace_without_input() -> None:
    model = Net()
    with pytest.warns(LightningDeprecationWarning), pytest.raises(ValueError, match=r"only supports 'script' or 'trace'. "
                                                                      r"Received: 'compile'"):
        model.to_torchscript(method="compile")
    model.example_input_array = None
    with pytest.warns(LightningDeprecationWarning), pytest.raises(
            ValueError, match="requires either `example_inputs` or `model.example_input_array`.*pass one"):
        model.to_torchscript(method="trace")
    assert model.training
    assert "torch.export.export()" in TORCHSCRIPT_DEPRECATION


def test_to_torchscript_traces_through_the_batch_transfer_hooks() -> None:
    class Halves(Net):
        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            return batch * 0.5

    model = Halves()
    seen: list[torch.Tensor] = []
    model.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with pytest.warns(LightningDeprecationWarning):
        model.to_torchscript(method="trace", example_inputs=torch.full((1, 4), 4.0))
    assert torch.equal(seen[0], torch.full((1, 4), 2.0))


@pytest.mark.skipif(importlib.util.find_spec("onnx") is None or importlib.util.find_spec("onnxscript") is None,
                    reason="needs the onnx extra (pip install onnx onnxscript)")
def test_to_onnx_writes_a_model_onnx_reads_and_keeps_the_modules_mode(tmp_path: Path) -> None:
    import onnx

    model = Net()
    model.to_onnx(tmp_path / "net.onnx")
    assert model.training
    graph = onnx.load(str(tmp_path / "net.onnx")).graph
    onnx.checker.check_model(onnx.load(str(tmp_path / "net.onnx")))
    ops = {node.op_type for node in graph.node}
    assert "Relu" in ops and "Dropout" not in ops  # exported in evaluation mode
    assert [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim] == [2, 4]  # example_input_array


def test_to_onnx_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Net()
    model.example_input_array = None
    if importlib.util.find_spec("onnx") is not None and importlib.util.find_spec("onnxscript") is not None:
        with pytest.raises(ValueError, match="neither `input_sample` nor `model.example_input_array`"):
            model.to_onnx(io.BytesIO())
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnx" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"`Net.to_onnx\(\)` requires `onnx`.*pip install onnx"):
        model.to_onnx("net.onnx", torch.randn(1, 4))
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxscript" else real(name, *a))
    if real("onnx") is not None:
        with pytest.raises(ModuleNotFoundError, match="requires `onnxscript`.*dynamo=False"):
            model.to_onnx("net.onnx", torch.randn(1, 4))
