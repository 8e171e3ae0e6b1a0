"""``fit(ckpt_path=...)`` refuses a checkpoint written by another number of processes, unless the user opts in.

A fit resume promises to continue bitwise where the checkpoint was taken. That holds only on the world size that
wrote it: each rank's RNG state and data position are saved per rank, and the data is sharded by the number of
processes. An elastic restart (``torchrun --nnodes 1:2``) or a second start with another ``--nproc-per-node``
would otherwise continue silently on another trajectory. ``EMBER_ALLOW_WORLD_SIZE_CHANGE=1`` accepts that
(FSDP2 and DeepSpeed reshard their state on load); the engine then warns, as Accelerate's ``load_state`` does.
The engine's ``load_state`` itself keeps Accelerate's behaviour (a warning): it promises no exact resume.
"""

from __future__ import annotations

from engine.checkpoint import folders

OPT_IN_VARIABLE = "EMBER_ALLOW_WORLD_SIZE_CHANGE"


def check_world_size(folder: str, processes: int, allowed: bool, context: str, saved: int | None = None) -> None:
    """Raise unless ``folder`` was saved by ``processes`` processes, or ``allowed`` (the user opted in).

    ``saved``: the world size a ``.ckpt`` file records (a folder's is read from its manifest).

    Raises:
        ValueError: the world sizes differ; the message names both and the opt-in.
    """
    if allowed:
        return
    if saved is None:
        manifest = folders.read_manifest(folder)
        if manifest is None:
            return  # an unreadable manifest is reported by the load itself
        saved = int(manifest.get("world_size", 1))
    if saved == processes:
        return
    raise ValueError(
        f"{context}: the checkpoint {folder} was saved by {saved} process(es), and this run has {processes}. "
        f"Resuming on another number of processes does not continue the run exactly (per-rank RNG states and "
        f"data positions, the data sharding). Start {saved} process(es) to resume exactly, or set "
        f"{OPT_IN_VARIABLE}=1 to resume on {processes} anyway.")


__all__ = ["OPT_IN_VARIABLE", "check_world_size"]
