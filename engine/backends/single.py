"""``SingleProcess``: one process (CPU or one GPU), no process group: nothing to wrap, sync or shard."""

from __future__ import annotations

from engine.backends.base import Backend
from engine.state import DistributedType


class SingleProcess(Backend):
    """The model trains as it is; every step is ``Backend``'s plain behaviour.

    Example:
        >>> import torch
        >>> from engine.state import PartialState
        >>> model = torch.nn.Linear(2, 1)
        >>> SingleProcess(PartialState(cpu=True)).wrap_model(model, []) is model
        True
    """

    distributed_type = DistributedType.NO
