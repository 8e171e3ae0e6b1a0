"""``Strategy``: what the Trainer asks of every strategy object, so that it never asks which class it holds, and
what user code reads from ``trainer.strategy`` in Lightning.

A strategy is resolved once, from a name or an object (``trainer.strategies.resolve_strategy``), into one of these;
the Trainer then only asks questions: the engine keywords it stands for, its ``kind`` (for the launcher and the
messages), the precisions it refuses, what to set up once the processes exist, and the module's device mesh.

Lightning's public strategy surface (``root_device``, ``model``, ``lightning_module``, the ranks, ``barrier``,
``broadcast``, ``reduce``, ``all_gather``, ``reduce_boolean_decision``, ``backward``) answers from the Trainer the
strategy is connected to (``connect``, when the Trainer is built) and its engine: the strategy keeps nothing of
the run itself.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, ClassVar

import torch

from engine import broadcast_object_list
from trainer.strategies.init_context import tensor_init_context


class Strategy(ABC):
    """The questions every strategy answers; subclasses override where they differ."""

    #: ``"ddp"``, ``"fsdp"``, ``"deepspeed"`` or ``"model_parallel"``.
    kind: ClassVar[str]
    #: The module must split itself in ``configure_model`` (Lightning refuses a module without one).
    requires_configure_model: ClassVar[bool] = False

    @abstractmethod
    def accelerator_kwargs(self, world_size: int = 1, num_nodes: int = 1) -> dict[str, Any]:
        """The ``Accelerator`` keywords this strategy stands for (``world_size`` / ``num_nodes``: the run's)."""

    def check_precision(self, precision: Any) -> None:
        """Raise if the strategy cannot train in ``precision`` (Lightning's refusals); most take every one."""

    def setup(self, accelerator: Any) -> None:
        """Called once the processes exist, before any module is seen; most strategies need nothing then."""

    @property
    def module_mesh(self) -> Any:
        """The module's ``device_mesh`` under this strategy (``None``: the module has none)."""
        return None

    def check_parallelized(self, module: Any) -> None:
        """After ``configure_model``: raise if the module split itself in a way this strategy cannot run."""

    # -- Lightning's strategy surface, answered by the connected Trainer ------------------------------------------
    def connect(self, trainer: Any) -> Strategy:
        """This strategy, connected to ``trainer`` (weakly: a strategy never keeps a trainer alive) and set up with
        its engine; returns what ``trainer.strategy`` is.

        A strategy another live Trainer holds is copied first: the Tuner's and the LR finder's search trainers are
        built from the same config, and each Trainer's steps must go through its own (``backward``).

        Given a module instead (Lightning's ``trainer.strategy.connect(model)``), the module is attached to the
        connected Trainer without running anything: ``trainer.lightning_module`` and ``model.trainer`` answer."""
        if isinstance(trainer, torch.nn.Module):
            self._trainer()._attach(trainer, None)
            return self
        ref = self.__dict__.get("_trainer_ref")
        holder = ref() if ref is not None else None
        strategy = self if holder is None or holder is trainer else copy.copy(self)
        strategy.__dict__["_trainer_ref"] = weakref.ref(trainer)
        strategy.setup(trainer.accelerator)
        return strategy

    def _trainer(self) -> Any:
        ref = self.__dict__.get("_trainer_ref")
        trainer = ref() if ref is not None else None
        if trainer is None:
            raise RuntimeError(f"This {type(self).__name__} is not connected to a Trainer yet: pass it as "
                               "Trainer(strategy=...), then read trainer.strategy.")
        return trainer

    def on_exception(self, exception: BaseException) -> None:
        """Called when a run raises, after the callbacks' and the data module's ``on_exception`` (Lightning's
        hook; its order). Ember's strategies need no clean-up of their own here (the failure path ends the other
        processes); a subclass may override it. The exception is raised again afterwards."""

    @property
    def launcher(self) -> Any:
        """Lightning's ``strategy.launcher``: what starts this run's worker processes from this process. The
        in-process launcher of ``ddp_spawn`` / ``ddp_fork`` / ``ddp_notebook`` in the calling process; None in a
        process that trains itself (one process, or a worker: Ember's script launch starts those before the
        Trainer exists)."""
        return getattr(self._trainer(), "_launcher", None)

    @contextlib.contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        """Tensors created inside are on ``root_device``, in the run's true precision's dtype, and left
        uninitialised when ``empty_init`` (``trainer.strategies.init_context``)."""
        with tensor_init_context(self.root_device, self._trainer().config.resolved_precision, empty_init):
            yield

    @property
    def root_device(self) -> torch.device:
        """The device this process trains on."""
        return self._trainer().accelerator.device

    @property
    def model(self) -> torch.nn.Module | None:
        """The model as the engine runs it (wrapped: DDP, FSDP2, DeepSpeed's engine); ``None`` before a run."""
        return self._trainer().plan.model

    @property
    def lightning_module(self) -> Any:
        """The ``TrainModule`` (``LightningModule``) being run, unwrapped."""
        return self._trainer().lightning_module

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return self._trainer().optimizers

    @property
    def global_rank(self) -> int:
        return self._trainer().global_rank

    @property
    def local_rank(self) -> int:
        return self._trainer().local_rank

    @property
    def node_rank(self) -> int:
        return self._trainer().node_rank

    @property
    def world_size(self) -> int:
        return self._trainer().world_size

    @property
    def num_nodes(self) -> int:
        return self._trainer().num_nodes

    @property
    def num_processes(self) -> int:
        """Processes on this machine."""
        return max(1, self.world_size // max(1, self.num_nodes))

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    def barrier(self, name: str | None = None) -> None:
        """Wait until every process gets here."""
        self._trainer().accelerator.wait_for_everyone()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Process ``src``'s ``obj`` on every process (any picklable object)."""
        if self.world_size == 1:
            return obj
        holder = [obj]
        broadcast_object_list(holder, from_process=src)
        return holder[0]

    def reduce(self, tensor: Any, group: Any = None, reduce_op: str | None = "mean") -> Any:
        """``tensor`` summed or averaged over the processes (``reduce_op``: ``"mean"`` / ``"avg"`` / ``"sum"``);
        anything but a tensor is returned as it is, as in Lightning."""
        if not isinstance(tensor, torch.Tensor) or self.world_size == 1:
            return tensor
        op = "mean" if reduce_op in (None, "mean", "avg") else str(reduce_op).lower()
        if op not in ("mean", "sum"):
            raise ValueError(f"strategy.reduce(reduce_op={reduce_op!r}): use 'mean' (or 'avg') or 'sum'.")
        return self._trainer().accelerator.reduce(tensor, op)

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        """Every process's ``tensor``, stacked along a new first dimension (one process: ``tensor`` itself)."""
        if self.world_size == 1:
            return tensor
        return self._trainer().accelerator.gather(tensor.unsqueeze(0))

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """Whether every process (``all``) or any process decided ``True``."""
        if self.world_size == 1:
            return bool(decision)
        votes = int(self._trainer().accelerator.reduce(torch.tensor(int(bool(decision))), "sum").item())
        return votes == self.world_size if all else votes > 0

    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Lightning's training backward: the ``on_before_backward`` / ``on_after_backward`` hooks around the
        module's ``backward`` (the engine's), the loss divided by the accumulation window; the Trainer's own
        steps go through here too."""
        self._trainer().backward(closure_loss, *args, **kwargs)
        return closure_loss
