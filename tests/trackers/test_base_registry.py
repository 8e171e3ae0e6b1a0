"""`GeneralTracker`'s contract checks, the blank tracker, and the name registry."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from trackers import (
    CometMLTracker,
    CSVTracker,
    GeneralTracker,
    MLflowTracker,
    TensorBoardTracker,
    WandBTracker,
    available_trackers,
    get_tracker_class,
    is_installed,
    known_trackers,
    register_tracker_class,
    unregister_tracker_class,
)


@pytest.fixture
def register() -> Iterator[Callable[[type[GeneralTracker]], type[GeneralTracker]]]:
    """Register tracker classes for one test and unregister them afterwards."""
    names: list[str] = []

    def _register(cls: type[GeneralTracker]) -> type[GeneralTracker]:
        register_tracker_class(cls)
        names.append(cls.name)
        return cls

    yield _register
    for name in names:
        unregister_tracker_class(name)


def test_subclass_missing_name_fails_at_class_creation() -> None:
    with pytest.raises(TypeError, match=r"NoName has name=None: set a class attribute `name"):
        class NoName(GeneralTracker):
            requires_logging_directory = False

            @property
            def tracker(self) -> None:
                return None


def test_subclass_missing_requires_logging_directory_fails() -> None:
    with pytest.raises(TypeError, match=r"requires_logging_directory=None: set the class attribute"):
        class NoDirFlag(GeneralTracker):
            name = "no_dir_flag"

            @property
            def tracker(self) -> None:
                return None


def test_subclass_missing_tracker_property_fails() -> None:
    with pytest.raises(TypeError, match=r"NoProperty does not define a `tracker` property: add `@property"):
        class NoProperty(GeneralTracker):
            name = "no_property"
            requires_logging_directory = False


def test_general_tracker_itself_needs_blank() -> None:
    with pytest.raises(TypeError, match=r"subclass it .* or pass `_blank=True`"):
        GeneralTracker()
    blank = GeneralTracker(_blank=True)
    # A blank tracker accepts the whole contract and does nothing.
    blank.start()
    blank.store_init_configuration({"lr": 0.1})
    blank.log({"loss": 1.0}, step=3, anything=True)
    blank.finish()
    assert blank.tracker is None and blank.state_dict() == {} and blank.main_process_only is True
    blank.load_state_dict({})
    with pytest.raises(ValueError, match=r"keeps no run identity, so it cannot restore \{'run_id': 'x'\}"):
        blank.load_state_dict({"run_id": "x"})


def test_builtin_contract_attributes() -> None:
    table = {cls.name: (cls.requires_logging_directory, cls.main_process_only, cls.package, cls.extra)
             for cls in (CSVTracker, TensorBoardTracker, WandBTracker, CometMLTracker, MLflowTracker)}
    assert table == {
        "csv": (True, True, None, None),
        "tensorboard": (True, True, "tensorboard", "tensorboard"),
        "wandb": (False, True, "wandb", "wandb"),
        "comet_ml": (False, True, "comet_ml", "comet"),
        "mlflow": (False, True, "mlflow", "mlflow"),
    }


def test_builtins_are_registered_and_available() -> None:
    assert known_trackers()[:4] == ["csv", "tensorboard", "wandb", "comet_ml"]
    # All five packages are installed in the test environment (csv needs none).
    assert available_trackers() == ["csv", "tensorboard", "wandb", "comet_ml", "mlflow"]
    assert get_tracker_class("tensorboard") is TensorBoardTracker
    assert get_tracker_class("WandB") is WandBTracker  # names are case-insensitive


def test_unknown_name_lists_known_ones() -> None:
    with pytest.raises(ValueError) as info:
        get_tracker_class("tensorbored")
    message = str(info.value)
    assert "Unknown tracker 'tensorbored'" in message
    assert "['csv', 'tensorboard', 'wandb', 'comet_ml', 'mlflow']" in message and "register_tracker_class" in message


class _NeedsMissingPackage(CSVTracker):
    """Stands for a built-in whose package is missing: `package` names a module that does not exist."""

    name = "needs_missing"
    package = "ember_tests_no_such_package"
    extra = "wandb"


class _NeedsMissingNoExtra(CSVTracker):
    name = "needs_missing_no_extra"
    package = "ember_tests_no_such_package"


def test_missing_package_names_the_extra(register: Callable[[type[GeneralTracker]], Any]) -> None:
    register(_NeedsMissingPackage)
    register(_NeedsMissingNoExtra)
    assert not is_installed(_NeedsMissingPackage) and is_installed(CSVTracker)
    with pytest.raises(ImportError, match=r"'needs_missing' needs the `ember_tests_no_such_package` package, "
                                          r"which is not installed: pip install \"ember-train\[wandb\]\""):
        get_tracker_class("needs_missing")
    with pytest.raises(ImportError, match=r"pip install ember_tests_no_such_package$"):
        get_tracker_class("needs_missing_no_extra")


class _MyTracker(CSVTracker):
    name = "my_tracker"


class _OtherMyTracker(CSVTracker):
    name = "my_tracker"


def test_register_and_conflicts(register: Callable[[type[GeneralTracker]], Any]) -> None:
    register(_MyTracker)
    assert get_tracker_class("my_tracker") is _MyTracker and "my_tracker" in known_trackers()
    assert "my_tracker" not in available_trackers()  # "all" means built-ins only
    register_tracker_class(_MyTracker)  # the same class again: no-op
    with pytest.raises(ValueError, match=r"used by the registered tracker _MyTracker: .*replace=True"):
        register_tracker_class(_OtherMyTracker)
    register_tracker_class(_OtherMyTracker, replace=True)
    assert get_tracker_class("my_tracker") is _OtherMyTracker

    class CsvImpostor(CSVTracker):
        name = "csv"

    with pytest.raises(ValueError, match=r"'csv' is already used by the built-in tracker CSVTracker"):
        register_tracker_class(CsvImpostor)
    with pytest.raises(ValueError, match=r"built-in tracker and cannot be unregistered"):
        unregister_tracker_class("csv")
    with pytest.raises(TypeError, match=r"expects a GeneralTracker subclass. Received: 'csv'"):
        register_tracker_class("csv")  # type: ignore[arg-type]
