"""A mistyped keyword names its close match (or the accepted keywords), and stays a ``TypeError``."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import pytest

from engine import (
    Accelerator,
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    FullyShardedDataParallelPlugin,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProfileKwargs,
    ProjectConfiguration,
)
from engine.keywords import UnexpectedKeywordError, close_matches, keyword_error, suggest_keywords


@pytest.mark.parametrize(("cls", "typo", "meant"), [
    (Accelerator, "mixed_precison", "mixed_precision"),
    (Accelerator, "gradient_accumulation_step", "gradient_accumulation_steps"),
    (ProjectConfiguration, "automatic_checkpoint_name", "automatic_checkpoint_naming"),
    (ProjectConfiguration, "total_limt", "total_limit"),
    (DataLoaderConfiguration, "even_batch", "even_batches"),
    (GradientAccumulationPlugin, "num_step", "num_steps"),
    (FullyShardedDataParallelPlugin, "reshard_after_foward", "reshard_after_forward"),
    (DistributedDataParallelKwargs, "find_unused_parameter", "find_unused_parameters"),
    (GradScalerKwargs, "init_scal", "init_scale"),
    (InitProcessGroupKwargs, "timout", "timeout"),
    (AutocastKwargs, "cache_enable", "cache_enabled"),
    (ProfileKwargs, "record_shape", "record_shapes"),
])
def test_a_typo_names_its_close_match(cls: type, typo: str, meant: str) -> None:
    with pytest.raises(TypeError) as caught:  # still a TypeError for callers that catch one
        cls(**{typo: None})
    assert str(caught.value) == (f"{cls.__name__}() got an unexpected keyword argument {typo!r}. "
                                 f"Did you mean {meant!r}?")
    assert isinstance(caught.value, UnexpectedKeywordError) and caught.value.suggestions == [meant]


def test_near_ties_are_all_named_and_nothing_close_lists_the_keywords() -> None:
    @suggest_keywords(docs="help(Loop)")
    class Loop:
        def __init__(self, max_epochs: int = 1, min_epochs: int = 0, *, devices: int = 1) -> None:
            pass

    with pytest.raises(TypeError, match=r"Did you mean 'max_epochs' or 'min_epochs'\?$"):
        Loop(epochs=3)
    with pytest.raises(TypeError) as caught:
        Loop(gpus=1)
    assert str(caught.value) == ("Loop() got an unexpected keyword argument 'gpus'. Accepted keywords: max_epochs, "
                                 "min_epochs, devices (see help(Loop)).")
    assert close_matches("MAX_EPOCH", ["max_epochs", "min_epochs"]) == ["max_epochs"]  # case does not matter


def test_only_the_refused_call_is_rewritten() -> None:
    @suggest_keywords
    class Calls:
        def __init__(self, value: int = 0) -> None:
            int("1", bse=10)  # a bad keyword inside __init__: its names are not this class's

    with pytest.raises(TypeError) as caught:
        Calls()
    assert type(caught.value) is TypeError and "bse" in str(caught.value)
    with pytest.raises(TypeError, match="takes from 1 to 2 positional arguments"):  # other TypeErrors unchanged
        Calls(1, 2)


def test_subclasses_are_named_as_written() -> None:
    @suggest_keywords
    class Base:
        def __init__(self, monitor: str = "loss", patience: int = 3) -> None:
            self.monitor, self.patience = monitor, patience

    class Inherits(Base):
        pass

    class Forwards(Base):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)

    with pytest.raises(TypeError, match=r"^Inherits\(\) got .* 'montor'. Did you mean 'monitor'\?"):
        Inherits(montor="x")
    with pytest.raises(TypeError, match=r"^Base\(\) got .* 'patiance'. Did you mean 'patience'\?"):
        Forwards(patiance=2)
    assert Forwards(patience=5).patience == 5


def test_the_signature_and_the_success_path_are_the_original() -> None:
    @suggest_keywords
    @dataclass
    class Settings:
        size: int = 1
        name: str = "x"

    assert list(inspect.signature(Settings).parameters) == ["size", "name"]
    assert Settings(2, name="y") == Settings(size=2, name="y")
    # Tools that read signatures (jsonargparse, help()) see the real keywords, not (*args, **kwargs).
    assert list(inspect.signature(Accelerator).parameters)[:3] == ["device_placement", "split_batches",
                                                                    "mixed_precision"]


def test_keyword_error_reads_the_same_for_hand_checked_keywords() -> None:
    error = keyword_error("Tool", "verbse", ["verbose", "quiet"])
    assert isinstance(error, TypeError) and error.keyword == "verbse"
    assert str(error) == "Tool() got an unexpected keyword argument 'verbse'. Did you mean 'verbose'?"
