"""Activation checkpointing in one process: the FSDP plugin's option wraps what Accelerate 1.15 wraps (recorded in
tests/distributed/activation_checkpointing_expected.py by tests/parity_scripts/record_activation_checkpointing.py,
whose model and batch are used here), gradients are unchanged, and ``apply_activation_checkpointing`` for any
backend. DDP, FSDP2 and tensor parallelism on 2 processes: tests/distributed/test_activation_checkpointing.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from engine import Accelerator
from engine.backends.fsdp import FullyShardedDataParallelPlugin
from engine.memory.activation_checkpointing import apply_activation_checkpointing
from tests.distributed.activation_checkpointing_expected import EXPECTED

CASES = EXPECTED["cases"]


class Block(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.fc1 = nn.Linear(32, 128)
        self.act = nn.GELU()
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.drop(self.act(self.fc1(self.norm(x)))))


class Net(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(Block(dropout) for _ in range(3))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def net(dropout: float = 0.0) -> Net:
    torch.manual_seed(0)  # the recorder's model (its Block has no dropout: Dropout(0.0) saves nothing)
    return Net(dropout)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(64, 16, generator=g), torch.randn(64, 4, generator=g)


def saved_bytes_and_grads(model: nn.Module, seed: int = 5) -> tuple[int, dict[str, torch.Tensor]]:
    """Bytes autograd saves for backward in one forward (the recorder's measure), and the gradients, by clean name."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    x, y = batch()
    torch.manual_seed(seed)  # dropout draws from here
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return total, {n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()}


def describe(model: nn.Module) -> dict[str, Any]:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    settings = {name: {"checkpoint_impl": str(m.checkpoint_impl), "checkpoint_fn": m.checkpoint_fn.func.__qualname__,
                       "checkpoint_fn_kwargs": {k: repr(v) for k, v in m.checkpoint_fn.keywords.items()},
                       "inner": type(m._checkpoint_wrapped_module).__name__}
                for name, m in model.named_modules() if isinstance(m, CheckpointWrapper)}
    return {"wrappers": {n: type(m).__name__ for n, m in model.named_modules() if "Wrapper" in type(m).__name__},
            "settings": settings, "parameter_names_sample": [n for n, _ in model.named_parameters()][:6],
            "state_dict_keys_sample": list(model.state_dict())[:6]}


@pytest.mark.parametrize(("plugin_kwargs", "case"), [
    ({"transformer_cls_names_to_wrap": ["Block"]}, "transformer_based_wrap_names"),
    ({"transformer_cls_names_to_wrap": "Block", "activation_checkpointing_offload": True}, "offload"),
])
def test_the_plugin_wraps_what_accelerate_wraps(plugin_kwargs: dict[str, Any], case: str) -> None:
    reference_bytes, reference_grads = saved_bytes_and_grads(net())
    assert reference_bytes == CASES["no_ac_saved_bytes"]
    model = net()
    plugin = FullyShardedDataParallelPlugin(activation_checkpointing=True, **plugin_kwargs)
    units = plugin.prepare_units(model)  # what apply_fsdp2 shards, bottom-up: the outermost wrappers
    found, expected = describe(model), CASES[case]
    for key in ("wrappers", "parameter_names_sample", "state_dict_keys_sample"):
        assert found[key] == expected[key], key
    assert [type(u).__name__ for u in units] == [expected["wrappers"]["blocks.0"]] * 3
    for name, setting in found["settings"].items():
        # Accelerate's wrapper, except that the RNG state is restored for the recomputation (Accelerate: False).
        assert setting == {**expected["settings"][name],
                           "checkpoint_fn_kwargs": {"use_reentrant": "False", "preserve_rng_state": "True"}}
    nbytes, grads = saved_bytes_and_grads(model)
    assert nbytes == expected["saved_bytes"]  # 361,216 -> 39,424 bytes (offload: 14,848)
    assert all(torch.equal(grads[name], reference_grads[name]) for name in reference_grads)
    assert expected["grads_max_abs_diff_vs_no_ac"] == 0.0


def test_size_based_units_are_not_nested() -> None:
    # Accelerate checkpoints every module over the size, nested (the blocks, the ModuleList around them and, at 1000,
    # each Linear inside a checkpointed block); Ember checkpoints the units it shards: no module twice.
    model = net()
    FullyShardedDataParallelPlugin(min_num_params=5000, activation_checkpointing=True).prepare_units(model)
    assert describe(model)["wrappers"] == CASES["transformer_based_wrap_names"]["wrappers"]
    assert "blocks" in CASES["size_based_wrap_5000"]["wrappers"]
    assert saved_bytes_and_grads(model)[0] == CASES["size_based_wrap_5000"]["saved_bytes"]


def test_plugin_errors() -> None:
    # Accelerate's text; Accelerate crashes later for the second (recorded: "TypeError: 'NoneType' object is not
    # callable" in prepare); Ember refuses it when the plugin is built.
    with pytest.raises(ValueError, match=r"^`activation_checkpointing_offload=True` requires "
                                         r"`activation_checkpointing=True`.$"):
        FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"], activation_checkpointing_offload=True)
    assert CASES["offload_without_ac"].endswith(
        "`activation_checkpointing_offload=True` requires `activation_checkpointing=True`.")
    assert CASES["default_no_wrap"] == {"error": "TypeError: 'NoneType' object is not callable"}
    with pytest.raises(ValueError, match="none are chosen: pass transformer_cls_names_to_wrap=.* or min_num_params"):
        FullyShardedDataParallelPlugin(activation_checkpointing=True)
    with pytest.raises(ValueError, match="min_num_params=10000000\\) found no submodule of Net that large"):
        FullyShardedDataParallelPlugin(min_num_params=10**7, activation_checkpointing=True).prepare_units(net())
    with pytest.raises(TypeError, match="activation_checkpointing=...\\) must be a bool"):
        FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"], activation_checkpointing="yes")


def test_apply_activation_checkpointing_by_class_or_name() -> None:
    model = net()
    assert apply_activation_checkpointing(model, Block) == ["blocks.0", "blocks.1", "blocks.2"]
    assert apply_activation_checkpointing(model, [Block, "Block"]) == []  # once only
    assert describe(model)["state_dict_keys_sample"] == CASES["transformer_based_wrap_names"]["state_dict_keys_sample"]
    offloaded = net()
    assert apply_activation_checkpointing(offloaded, ["Block"], offload=True) == ["blocks.0", "blocks.1", "blocks.2"]
    assert describe(offloaded)["wrappers"] == CASES["offload"]["wrappers"]
    with pytest.raises(ValueError, match=r"no submodule of class \['Missing'\] in Net \(its classes are \['Block'"):
        apply_activation_checkpointing(net(), "Missing")
    with pytest.raises(TypeError, match="takes nn.Module subclasses or class names. Received: 3"):
        apply_activation_checkpointing(net(), [3])
    with pytest.raises(ValueError, match="is empty"):
        apply_activation_checkpointing(net(), [])


def test_dropout_draws_the_same_masks_when_recomputed() -> None:
    # With Accelerate's preserve_rng_state=False the recomputation would draw new masks: other gradients.
    _, reference = saved_bytes_and_grads(net(dropout=0.5))
    rng_after = torch.get_rng_state()
    model = net(dropout=0.5)
    apply_activation_checkpointing(model, [Block])
    _, grads = saved_bytes_and_grads(model)
    assert all(torch.equal(grads[name], reference[name]) for name in reference)
    assert torch.equal(torch.get_rng_state(), rng_after)  # the recomputation consumed no random numbers


def _prepared(acc: Accelerator, model: nn.Module) -> tuple[nn.Module, Any]:
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    return model, opt


def _step(acc: Accelerator, model: nn.Module, opt: Any) -> None:
    x, y = batch()
    acc.backward(nn.functional.mse_loss(model(x), y))
    opt.step()
    opt.zero_grad()


def test_checkpoints_load_with_or_without_the_wrappers(tmp_path: Path) -> None:
    wrapped = net()
    apply_activation_checkpointing(wrapped, [Block])
    saver = Accelerator(cpu=True)
    wrapped, opt = _prepared(saver, wrapped)
    _step(saver, wrapped, opt)
    saver.save_state(str(tmp_path / "ckpt"))
    _step(saver, wrapped, opt)  # a second step from the saved state (momentum included)
    for wrap in (False, True):  # saved with the wrappers: loads into the model with or without them
        loader = Accelerator(cpu=True)
        model = Net()
        if wrap:
            apply_activation_checkpointing(model, "Block")
        model, opt = _prepared(loader, model)
        loader.load_state(str(tmp_path / "ckpt"))
        _step(loader, model, opt)
        assert all(torch.equal(value, wrapped.state_dict()[name]) for name, value in model.state_dict().items())
