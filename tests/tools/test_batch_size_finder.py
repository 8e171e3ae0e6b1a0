"""The batch-size search (``Tuner.scale_batch_size``, the ``BatchSizeFinder`` callback) against what lightning 2.6.6
did on the same scenarios (``tests/lightning_corpus/batch_size.py``, recorded by ``record_corpus.py batch_size``):
the sizes tried on a module that runs out of memory above a size, the result and where it is written, the
messages, which errors count as out of memory, the errors; and the callback's runs."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from callbacks import BatchSizeFinder
from tests.lightning_corpus.expected import EXPECTED
from trainer import Trainer
from trainer.tools.batch_size import SizeSearch
from trainer.utilities.exceptions import MisconfigurationException

LIGHTNING = EXPECTED["batch_size"]
# Where Ember decides differently on purpose (trainer/tools/batch_size.py): "power" caps its doubling at max_val.
DIFFERENT = {"max_val_power"}


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    module = importlib.import_module("tests.lightning_corpus.batch_size")
    return json.loads(json.dumps(module.main(str(tmp_path_factory.mktemp("batch_size")))))


SEARCHES = sorted(k for k, v in LIGHTNING.items() if isinstance(v, dict) and "tried" in v and k not in DIFFERENT)


@pytest.mark.parametrize("case", SEARCHES)
def test_sizes_tried_result_and_messages_match_lightning(observed: dict[str, Any], case: str) -> None:
    assert observed[case] == LIGHTNING[case]


def test_which_errors_count_as_out_of_memory_match_lightning(observed: dict[str, Any]) -> None:
    # A RuntimeError with one argument holding "CUDA" and "out of memory", cuDNN's NOT_SUPPORTED, the CPU
    # allocator's message, or torch.cuda.OutOfMemoryError; "out of memory" alone and other errors end the search.
    assert observed["oom_errors"] == LIGHTNING["oom_errors"]


def test_errors_and_warning_hold_lightnings_texts(observed: dict[str, Any]) -> None:
    for ours, theirs in zip(observed["errors"], LIGHTNING["errors"], strict=True):
        assert ours.startswith(theirs.rstrip(".")), (ours, theirs)
    assert observed["duplicate_warning"] == LIGHTNING["duplicate_warning"]


@pytest.mark.parametrize("method", ["fit", "validate", "test", "predict"])
def test_callback_searches_then_runs_with_the_size(observed: dict[str, Any], method: str) -> None:
    assert observed["callback"][method] == LIGHTNING["callback"][method]


def test_power_caps_its_doubling_at_max_val(observed: dict[str, Any]) -> None:
    # Lightning doubles 16 to 32 and stops there, above max_val=24 (an untried size); Ember tries no more than
    # max_val and returns it.
    assert LIGHTNING["max_val_power"]["result"] == 32
    assert observed["max_val_power"]["result"] == observed["max_val_power"]["attribute"] == 24
    assert observed["max_val_power"]["tried"] == LIGHTNING["max_val_power"]["tried"]


def test_a_failed_size_is_halved_even_past_the_dataset_length() -> None:
    # Lightning keeps a failed size at or above the dataset's length (and may return or retry it); Ember halves it.
    tried: list[int] = []

    def fits(size: int) -> bool:
        tried.append(size)
        return size < 64

    search = SizeSearch(fits, write=lambda size: None, start=2, dataset_length=64, mode="power", init_val=16,
                        max_trials=25, margin=0.05, max_val=8192)
    assert search.run() == 32 and tried == [16, 32, 64]


def test_callback_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match=r"`mode` should be either of \('power', 'binsearch'\). Received: mode='x'"):
        BatchSizeFinder(mode="x")
    with pytest.raises(ValueError, match="`margin` should be between 0 and 1"):
        BatchSizeFinder(margin=1.5)
    assert BatchSizeFinder(init_val=8).optimal_batch_size == 8


def test_callback_refuses_several_processes() -> None:
    class TwoProcesses:
        world_size = 2

    with pytest.raises(MisconfigurationException, match="not supported with distributed strategies"):
        BatchSizeFinder().setup(TwoProcesses(), None)  # type: ignore[arg-type]


def test_callback_stages_can_be_chosen(tmp_path: Path) -> None:
    from tests.lightning_corpus.batch_size import Sized

    class OnlyFit(BatchSizeFinder):
        def search_on(self, stage: str) -> bool:
            return stage == "fit"

    model = Sized(n=64)
    trainer = Trainer(default_root_dir=str(tmp_path), max_epochs=1, callbacks=[OnlyFit(max_trials=2)],
                      logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.validate(model, verbose=False)
    assert model.batch_size == 2 and model.tried == [2]  # no search: the run only
    trainer.fit(model)
    # The search (2, then 4: two trials) ran before the fit's loaders were built: the fit trained at 4.
    assert model.batch_size == 4 and model.tried == [2, 4] and trainer.global_step == 64 // 4
