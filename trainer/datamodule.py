"""`DataModule`: Lightning's ``LightningDataModule`` (data preparation, set-up and loaders in one class)."""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, Any

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

            dm = MNISTData.load_from_checkpoint("runs/checkpoints/epoch=9-step=500", batch_size=256)
        """
        del map_location
        return load_datamodule(cls, checkpoint_path, hparams_file, weights_only, kwargs)

    def state_dict(self) -> dict[str, Any]:
        """State to save in checkpoints (JSON-able values and tensors); empty by default."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
