"""Which weights ``validate`` / ``test`` / ``predict`` evaluate when called without ``ckpt_path``: Lightning's rule.

Observed from Lightning 2.6.6 (tests/parity_scripts/record_eval_after_fit.py):

- a module passed to the call, no ``ckpt_path``: its current weights, nothing loaded, no warning;
- no module passed, but one is attached from an earlier ``fit`` (or evaluation): the first ``ModelCheckpoint``'s
  best checkpoint (``ckpt_path="best"``), with a warning naming the other choices; the module keeps the loaded
  weights afterwards;
- ``"best"`` (given or implied) with no ``ModelCheckpoint``, one that never saved, or under ``fast_dev_run``: a
  ``ValueError``, Lightning's words first, then the fix; with several ``ModelCheckpoint`` callbacks, the first
  one's, with a warning.

Before this, Ember evaluated the current weights in the second case: a ported script reported other test metrics
than under Lightning, silently.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from trainer.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from trainer.checkpoint.checkpointer import Checkpointer
    from trainer.checkpoint.resume import Resume
    from trainer.config import TrainerConfig

_FIX = (" Pass the module to evaluate its current weights (trainer.{fn}(model, ...)), or ckpt_path='last' or a "
        "checkpoint path.")


def evaluation_ckpt_path(fn: str, ckpt_path: str | os.PathLike[str] | None, module_given: bool,
                         module_attached: bool) -> str | os.PathLike[str] | None:
    """``ckpt_path`` for the evaluation method ``fn`` (``"validate"``, ``"test"``, ``"predict"``): None stays None
    for a module given to the call (or none attached: the call then fails on the missing module), else
    becomes ``"best"``, with Lightning's warning."""
    if ckpt_path is not None or module_given or not module_attached:
        return ckpt_path
    rank_zero_warn(f"`.{fn}(ckpt_path=None)` was called without a model. The best model of the previous `fit` call "
                   f"will be used. You can pass `.{fn}(ckpt_path='best')` to use the best model or "
                   f"`.{fn}(ckpt_path='last')` to use the last model. If you pass a value, this warning will be "
                   "silenced.")
    return "best"


def check_best(fn: str, checkpoint_callbacks: list[Any], fast_dev_run: bool) -> None:
    """Raise, in Lightning's words and with the fix, where ``ckpt_path="best"`` names no checkpoint; warn that the
    first of several ``ModelCheckpoint`` callbacks decides."""
    if len(checkpoint_callbacks) > 1:
        rank_zero_warn(f'`.{fn}(ckpt_path="best")` is called with Trainer configured with multiple `ModelCheckpoint` '
                       "callbacks. It will use the best checkpoint path from first checkpoint callback.")
    if not checkpoint_callbacks and not fast_dev_run:
        raise ValueError(f'`.{fn}(ckpt_path="best")` is set but `ModelCheckpoint` is not configured.'
                         + _FIX.format(fn=fn))
    if not checkpoint_callbacks or not checkpoint_callbacks[0].best_model_path:
        if fast_dev_run:
            raise ValueError(f'You cannot execute `.{fn}(ckpt_path="best")` with `fast_dev_run=True`. Please pass '
                             f"an exact checkpoint path to `.{fn}(ckpt_path=...)`" + _FIX.format(fn=fn))
        raise ValueError(f'`.{fn}(ckpt_path="best")` is set but `ModelCheckpoint` is not configured to save the '
                         "best model." + _FIX.format(fn=fn))


def evaluation_resume(checkpointer: Checkpointer, fn: str, ckpt_path: str | os.PathLike[str] | None,
                      given: object, attached: object, config: TrainerConfig,
                      weights_only: bool | None = None) -> Resume | None:
    """The checkpoint the evaluation method ``fn`` loads first, by the rule above (None: the current weights);
    ``given``: the module passed to the call, ``attached``: the trainer's (None: none); ``weights_only=False``:
    a (trusted) Lightning file that needs unpickling may load, as in Lightning."""
    ckpt_path = evaluation_ckpt_path(fn, ckpt_path, given is not None, attached is not None)
    if ckpt_path == "best":
        # Lightning keeps its default ModelCheckpoint under fast_dev_run (it saves nothing there); Ember adds none.
        fast_dev_run = bool(config.fast_dev_run) and bool(config.enable_checkpointing)  # resolved: a bool
        check_best(fn, checkpointer.checkpoint_callbacks, fast_dev_run)
    return checkpointer.resolve(ckpt_path, fn, required=True, unpickle=weights_only is False)
