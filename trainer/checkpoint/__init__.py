"""Checkpoint and resume: what the trainer saves, when it writes it, how ``ckpt_path`` finds it, how a run resumes.

- ``entry``: the trainer's part of every engine checkpoint (``TrainerEntry``), built from and restored into the
  parts it is given at construction; its format, and the check that it holds only plain values.
- ``checkpointer``: the boundary queue and the writing of checkpoints inside and outside ``fit``.
- ``resume``: ``ckpt_path`` resolved to a ``Resume`` value, and loading the first of its candidates that verifies.
- ``loading`` (with ``hparams_io``): ``load_from_checkpoint`` for modules and data modules.
- ``ckpt_file`` (atomic write, digests, safe read), ``lightning_format`` (Lightning's keys both ways),
  ``lightning_import`` (resuming a Lightning file), ``discovery`` (which checkpoints a folder holds): the
  one-file ``.ckpt`` layout (``format`` shows it).

The files of a checkpoint folder (sharded backends), its commit and its checks are the engine's
(``engine.checkpoint.folders``).
"""
