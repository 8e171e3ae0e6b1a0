"""``python -m engine.launch script [args...]``: how ``ember launch`` has torchrun start each worker."""

import sys

from engine.launch.torchrun import run_script

if __name__ == "__main__":
    sys.exit(run_script(sys.argv[1:]))
