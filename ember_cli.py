"""The ``ember`` console command: ``ember fit|validate|test|predict`` go to the trainer's config CLI, everything else
(``ember env``, ``ember launch``, ``ember config``) to the engine's. Dispatching here keeps ``engine`` free of
any import of ``trainer``, and ``ember launch`` free of the trainer's import time."""

from __future__ import annotations

import sys
from collections.abc import Sequence

TRAINER_COMMANDS = ("fit", "validate", "test", "predict")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``ember`` command; returns its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in TRAINER_COMMANDS:
        from trainer.cli import console_main

        return console_main(args)
    from engine.launch.cli import main as engine_main

    return engine_main(args)


if __name__ == "__main__":
    sys.exit(main())
