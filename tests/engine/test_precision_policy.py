"""``engine.precision.policy.Precision``: the run's precision as one value with the kinds full / mixed / fp8 / true,
which the Accelerator's state answers and the Trainer resolves its keywords into (issue 43)."""

from __future__ import annotations

import pytest
import torch

from engine import Accelerator
from engine.precision.policy import Precision
from trainer import Trainer
from trainer.args import parse_precision


@pytest.mark.parametrize("value,kind,dtype", [("no", "full", None), ("fp16", "mixed", torch.float16),
                                              ("bf16", "mixed", torch.bfloat16), ("fp8", "fp8", torch.bfloat16)])
def test_accelerates_values_round_trip(value: str, kind: str, dtype: torch.dtype | None) -> None:
    precision = Precision.from_mixed_precision(value)
    assert (precision.kind, precision.dtype, precision.mixed_precision) == (kind, dtype, value)
    assert precision.autocast_dtype == dtype


def test_the_accelerators_state_answers_its_precision() -> None:
    assert Accelerator(cpu=True, mixed_precision="bf16").state.precision == Precision("mixed", torch.bfloat16)


@pytest.mark.parametrize("keywords,expected", [
    ({"precision": "64"}, Precision.true("float64")), ({"precision": "bf16-true"}, Precision.true(torch.bfloat16)),
    ({"precision": "16-mixed"}, Precision("mixed", torch.float16)), ({"mixed_precision": "bf16"},
                                                                      Precision("mixed", torch.bfloat16)),
    ({"precision": "32-true", "mixed_precision": "no"}, Precision()), ({}, None)])
def test_the_trainer_resolves_its_keywords_into_one_value(keywords: dict[str, str], expected: Precision | None) -> None:
    assert parse_precision(keywords.get("mixed_precision"), keywords.get("precision")) == expected


def test_a_true_precision_reaches_the_engine_as_no_autocast_and_converts_the_model() -> None:
    trainer = Trainer(precision="bf16-true", accelerator="cpu", logger=False, enable_checkpointing=False)
    assert trainer.accelerator.mixed_precision == "no" and trainer.precision == "bf16-true"
    assert trainer.config.resolved_precision == Precision.true("bfloat16")


def test_mixed_kinds_leave_modules_and_batches_alone() -> None:
    mixed = Precision.from_mixed_precision("bf16")
    linear = torch.nn.Linear(2, 1)
    batch = {"x": torch.ones(2)}
    with mixed.step_context():
        assert torch.zeros(1).dtype == torch.float32
    assert mixed.convert_module(linear).weight.dtype == torch.float32 and mixed.convert_input(batch) is batch


def test_bad_values_are_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"Unknown mixed_precision='fp4': choose one of 'no', 'fp16'"):
        Precision.from_mixed_precision("fp4")
    with pytest.raises(ValueError, match=r"Precision.true\('int8'\): a true precision is one of \['float64'"):
        Precision.true("int8")
    with pytest.raises(ValueError, match=r"Precision\(kind='mixed', dtype=torch.float64\): a mixed precision"):
        Precision("mixed", torch.float64)
    with pytest.raises(ValueError, match=r"Precision\(kind='half'.*the kinds are"):
        Precision("half")  # type: ignore[arg-type]  # the wrong kind is the point of the test
