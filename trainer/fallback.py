"""Loading the newest checkpoint that verifies: ``fit(ckpt_path="last")`` steps past a damaged one.

The engine checks every file of a checkpoint against its manifest (sizes, then checksums) before anything is
applied, and every rank agrees on the outcome. A checkpoint that fails (flipped bits on disk, a truncated
copy) raises ``CorruptCheckpointError`` with the file and the mismatch; with ``"last"`` the previous committed
checkpoint is tried next, with a warning naming the damaged one, as ``Accelerator.load_state()`` does with
automatic naming. A path given explicitly is never swapped for another: its error says what to do instead.
"""

from __future__ import annotations

import warnings

from engine import Accelerator
from engine.checkpoint_io import CorruptCheckpointError


def load_first_intact(accelerator: Accelerator, candidates: list[str], ckpt_path: str, entry: str) -> str:
    """``accelerator.load_state`` the first of ``candidates`` (newest first) that verifies; returns it.

    Only ``ckpt_path == "last"`` moves on to the next candidate; a damaged explicit path raises at once.

    Raises:
        CorruptCheckpointError: every candidate is damaged; the message lists each one and its error and says
            how to start fresh.
    """
    tried: list[str] = []
    for position, folder in enumerate(candidates):
        try:
            accelerator.load_state(folder)
            return folder
        except CorruptCheckpointError as error:
            if ckpt_path != "last":
                raise CorruptCheckpointError(
                    f"{entry}(ckpt_path={ckpt_path!r}): {error} Pass ckpt_path='last' to resume from the newest "
                    "checkpoint that verifies, another checkpoint folder, or ckpt_path=None to start fresh.") from error
            tried.append(f"  {folder}: {error}")
            if position + 1 < len(candidates):
                if accelerator.is_main_process:
                    warnings.warn(f"{entry}(ckpt_path='last'): {error} Falling back to the previous committed checkpoint {candidates[position + 1]}.",
                                  UserWarning, stacklevel=3)
                continue
    listed = "\n".join(tried)
    raise CorruptCheckpointError(
        f"{entry}(ckpt_path='last'): none of the {len(candidates)} committed checkpoint(s) verifies:\n{listed}\n"
        "To start a new run, pass ckpt_path=None (or move these folders out of the checkpoint directory); the "
        "damaged folders are left in place for inspection.")
