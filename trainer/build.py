"""What the Trainer builds from its config: the ``Accelerator`` and the callback list."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from callbacks import (
    Callback,
    ModelCheckpoint,
    ModelSummary,
    ProgressBar,
    RichModelSummary,
    RichProgressBar,
    TQDMProgressBar,
)
from callbacks.exceptions import MisconfigurationException
from engine import Accelerator
from trainer.compat.keywords import DEFAULT_PROJECT_DIR, LightningChoices
from trainer.config import UNSET, TrainerConfig
from trainer.loop.hooks import overrides
from trainer.utilities.rank_zero import rank_zero_only


def build_accelerator(config: TrainerConfig, lightning: LightningChoices) -> Accelerator:
    """The given ``Accelerator`` (checked against the keywords) or a new one for ``"auto"`` / ``"cpu"`` / ``"gpu"``.

    ``lightning`` gives the trackers, the project folder and the strategy's engine settings.
    """
    accelerator, precision, fast_dev_run = config.accelerator, config.mixed_precision, config.fast_dev_run
    lightning.launch_if_asked(precision)  # `python train.py` with devices > 1: run it in N processes, exit
    log_with, project_dir, extra = lightning.log_with, lightning.project_dir, lightning.accelerator_kwargs
    if isinstance(accelerator, Accelerator):
        given = {k: v for k, v in (("log_with", log_with), ("project_dir", project_dir)) if v is not UNSET}
        if extra:
            given["strategy"] = "(options)"
        if given:
            raise ValueError(f"Trainer(accelerator=<Accelerator>) was given together with {sorted(given)}: set "
                             "them on the Accelerator you pass.")
        if precision is not None and precision != accelerator.mixed_precision:
            raise ValueError(f"Trainer asks for mixed precision {precision!r} but the given Accelerator uses "
                             f"{accelerator.mixed_precision!r}: set it on the Accelerator only.")
    elif accelerator not in (None, "auto", "cpu", "gpu", "cuda"):
        raise ValueError(f"Trainer(accelerator=...) takes an engine.Accelerator or 'auto' / 'cpu' / 'gpu'. "
                         f"Received: {accelerator!r}.")
    else:
        log_with = "csv" if log_with is UNSET else log_with
        project_dir = DEFAULT_PROJECT_DIR if project_dir is UNSET else project_dir
        accelerator = Accelerator(cpu=accelerator == "cpu", mixed_precision=precision,
                                  log_with=None if fast_dev_run else log_with, project_dir=project_dir, **extra)
    if accelerator.gradient_accumulation_steps != 1:
        # The trainer decides every accumulation window itself (see Trainer._train_step); a second factor in the
        # engine would divide each loss again.
        raise ValueError(f"The Accelerator accumulates gradients over {accelerator.gradient_accumulation_steps} "
                         "steps (gradient_accumulation_steps or ACCELERATE_GRADIENT_ACCUMULATION_STEPS), but the "
                         "Trainer owns accumulation: build the Accelerator with gradient_accumulation_steps=1 and "
                         f"pass Trainer(accumulate_grad_batches={accelerator.gradient_accumulation_steps}).")
    rank_zero_only.rank = accelerator.process_index
    return accelerator


def build_callbacks(callbacks: Any, progress_bar: bool, model_summary: bool,
                    defaults: Sequence[Callback] = ()) -> list[Callback]:
    """The given callbacks, then ``defaults`` (what Lightning adds: the ``max_time`` Timer, the default
    ``ModelCheckpoint``), the built-in progress bar and ``ModelSummary`` when enabled, checkpoints last:
    Lightning 2.6's order."""
    given = [callbacks] if isinstance(callbacks, Callback) else list(callbacks or [])
    for callback in given:
        if not isinstance(callback, Callback):
            raise TypeError(f"Trainer(callbacks=...) takes Callback instances. Received: {callback!r} "
                            f"({type(callback).__name__}).")
    bars = [c for c in given if isinstance(c, ProgressBar)]
    if len(bars) > 1:  # Lightning's words (a test may match them), then the fix
        raise MisconfigurationException("You added multiple progress bar callbacks to the Trainer, but currently "
                                        f"only one progress bar is supported. Received: {bars!r}; keep one.")
    has_bar = bool(bars)
    if has_bar and not progress_bar:
        raise MisconfigurationException(f"Trainer was configured with `enable_progress_bar=False` but found "
                                        f"`{type(bars[0]).__name__}` in callbacks list: remove one.")
    result = [*given, *defaults]
    if progress_bar and not has_bar:
        result.append(TQDMProgressBar())
    if model_summary and not any(isinstance(c, ModelSummary) for c in given):
        # Lightning's pairing: a rich bar gets the rich summary.
        rich = any(isinstance(c, RichProgressBar) for c in bars)
        result.append(RichModelSummary() if rich else ModelSummary())
    check_state_keys(result)
    return checkpoints_last(result)


def check_state_keys(callbacks: list[Callback]) -> None:
    """Refuse, when the Trainer is built, two stateful callbacks (overriding ``state_dict``) with one ``state_key``:
    a checkpoint would keep only one state. Lightning's error and words, then the fix."""
    seen: set[str] = set()
    for callback in callbacks:
        if overrides(callback, Callback, "state_dict"):
            if callback.state_key in seen:
                name = type(callback).__name__
                raise RuntimeError(
                    f"Found more than one stateful callback of type `{name}`. In the current configuration, this "
                    "callback does not support being saved alongside other instances of the same type. Please "
                    f"consult the documentation of `{name}` regarding valid settings for the callback state to be "
                    "checkpointable. HINT: The `callback.state_key` must be unique among all callbacks in the "
                    f"Trainer (both are {callback.state_key!r}): give them different arguments, or override "
                    "`state_key`.")
            seen.add(callback.state_key)


def checkpoints_last(callbacks: list[Callback]) -> list[Callback]:
    """``callbacks`` with every ``ModelCheckpoint`` moved to the end, keeping the order otherwise (Lightning's
    order: a checkpoint sees what the other callbacks did at the same hook, e.g. an ``EarlyStopping`` decision
    or a metric logged at epoch end, and ``trainer.callbacks[-1]`` is the checkpoint callback)."""
    return [c for c in callbacks if not isinstance(c, ModelCheckpoint)] + \
        [c for c in callbacks if isinstance(c, ModelCheckpoint)]
