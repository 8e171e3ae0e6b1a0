"""`DataModule`: Lightning's ``LightningDataModule`` (data preparation, set-up and loaders in one class)."""

from __future__ import annotations

import inspect
import os
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, Dataset, IterableDataset

from trainer.checkpoint.loading import load_datamodule
from trainer.data_hooks import DataHooks
from trainer.hparams import HyperparametersMixin

if TYPE_CHECKING:
    from typing_extensions import Self


class DataModule(DataHooks, HyperparametersMixin):
    """Groups the data of a run: ``prepare_data`` once per machine, ``setup(stage)`` on every process, loaders.

    Override the ``*_dataloader`` methods you use; the trainer only calls those that are overridden.
    ``state_dict`` / ``load_state_dict`` are saved in checkpoints.

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> class Numbers(DataModule):
        ...     def __init__(self, batch_size: int = 4) -> None:
        ...         super().__init__()
        ...         self.save_hyperparameters()
        ...     def setup(self, stage: str) -> None:
        ...         self.data = TensorDataset(torch.arange(10.0).unsqueeze(1))
        ...     def train_dataloader(self) -> DataLoader:
        ...         return DataLoader(self.data, batch_size=self.hparams.batch_size)
        >>> dm = Numbers()
        >>> dm.setup("fit")
        >>> len(dm.train_dataloader())
        3
    """

    prepare_data_per_node: bool = True
    # Lightning's names of the .ckpt keys holding the data module's hyper-parameters.
    CHECKPOINT_HYPER_PARAMS_KEY = "datamodule_hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "datamodule_hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "datamodule_hparams_type"

    def __init__(self) -> None:
        self._trainer_ref: weakref.ReferenceType[Any] | None = None

    @property
    def trainer(self) -> Any:
        """The ``Trainer`` using this data module (``None`` before a run); held weakly, like the module's."""
        ref = self.__dict__.get("_trainer_ref")
        return None if ref is None else ref()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_trainer_ref"] = None  # a weakref cannot be pickled
        return state

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: str | os.PathLike[str], map_location: Any = None,
                             hparams_file: str | os.PathLike[str] | None = None, weights_only: bool | None = None,
                             **kwargs: Any) -> Self:
        """Rebuild the data module from a checkpoint folder's saved hyper-parameters and its ``state_dict``.

        ``map_location`` is accepted for Lightning's signature (a data module has no tensors to move);
        ``hparams_file`` / ``weights_only`` / ``kwargs`` as in ``TrainModule.load_from_checkpoint``.

        Example::

            dm = MNISTData.load_from_checkpoint("runs/checkpoints/epoch=9-step=500.ckpt", batch_size=256)
        """
        del map_location
        return load_datamodule(cls, checkpoint_path, hparams_file, weights_only, kwargs)

    @classmethod
    def from_datasets(cls, train_dataset: Any = None, val_dataset: Any = None, test_dataset: Any = None,
                      predict_dataset: Any = None, batch_size: int = 1, num_workers: int = 0,
                      **datamodule_kwargs: Any) -> DataModule:
        """A data module whose ``*_dataloader()`` methods wrap the given datasets (Lightning's ``from_datasets``).

        Each argument is a ``Dataset`` or a list / dict of them (one loader each); training loaders shuffle unless
        the dataset is iterable. Loaders are built as ``DataLoader(ds, batch_size, shuffle, num_workers,
        pin_memory=True)``. ``batch_size`` / ``num_workers`` also go to ``__init__`` when it takes them, and
        ``datamodule_kwargs`` always do.

        Example:
            >>> import torch
            >>> from torch.utils.data import TensorDataset
            >>> dm = DataModule.from_datasets(TensorDataset(torch.arange(6.0)), batch_size=4)
            >>> [len(batch[0]) for batch in dm.train_dataloader()]
            [4, 2]
        """

        def loaders(datasets: Any, shuffle: bool) -> Any:
            if isinstance(datasets, Dataset):
                return DataLoader(datasets, batch_size=batch_size, shuffle=shuffle and not isinstance(
                    datasets, IterableDataset), num_workers=num_workers, pin_memory=True)
            if isinstance(datasets, Mapping):
                return {key: loaders(value, shuffle) for key, value in datasets.items()}
            if isinstance(datasets, Sequence) and not isinstance(datasets, str):
                return [loaders(value, shuffle) for value in datasets]
            return datasets

        accepted = inspect.signature(cls.__init__).parameters
        takes_any = any(p.kind == p.VAR_KEYWORD for p in accepted.values())
        special = {name: value for name, value in (("batch_size", batch_size), ("num_workers", num_workers))
                   if takes_any or name in accepted}
        datamodule = cls(**datamodule_kwargs, **special)
        for name, datasets, shuffle in (("train", train_dataset, True), ("val", val_dataset, False),
                                        ("test", test_dataset, False), ("predict", predict_dataset, False)):
            if datasets is not None:  # instance attributes, bound now: each call builds fresh loaders
                setattr(datamodule, f"{name}_dataloader",
                        lambda datasets=datasets, shuffle=shuffle: loaders(datasets, shuffle))
        return datamodule

    def __str__(self) -> str:
        """Lightning's summary of the loaders, one line per kind: ``{Train dataloader: size=64}`` (the dataset's
        length, ``NA`` without one; ``1. size=16 ; 2. size=NA`` for several; ``None`` where the method is missing
        or fails, e.g. before ``setup``)."""
        def size(loader: Any) -> str:
            dataset: Any = getattr(loader, "dataset", None)  # anything: len() may raise TypeError, answered below
            try:
                return str(len(dataset))
            except TypeError:
                return "NA"

        lines = []
        for label, method in (("Train dataloader", "train_dataloader"), ("Validation dataloader", "val_dataloader"),
                              ("Test dataloader", "test_dataloader"), ("Predict dataloader", "predict_dataloader")):
            try:
                loaders = getattr(self, method)()
            except Exception:  # noqa: BLE001 (not implemented, not set up yet...: Lightning shows None)
                lines.append(f"{{{label}: None}}")
                continue
            if isinstance(loaders, Mapping):
                loaders = list(loaders.values())
            if isinstance(loaders, (list, tuple)):
                text = " ; ".join(f"{i}. size={size(loader)}" for i, loader in enumerate(loaders, start=1))
            else:
                text = f"size={size(loaders)}"
            lines.append(f"{{{label}: {text}}}")
        return os.linesep.join(lines)

    def on_exception(self, exception: BaseException) -> None:
        """Called when a ``fit`` / ``validate`` / ``test`` / ``predict`` run raises, after the callbacks'
        ``on_exception`` and before the strategy's (Lightning's order): override to release what the data module
        holds (open files, a server). The exception is raised again afterwards."""

    def state_dict(self) -> dict[str, Any]:
        """State to save in checkpoints (JSON-able values and tensors); empty by default."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
