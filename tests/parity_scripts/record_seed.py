"""Record Lightning 2.6.6's seeding (run with /work/refvenv/bin/python); the values are constants in
tests/trainer/test_utilities.py."""
import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import os
import random

import numpy as np
import torch
from lightning.fabric.utilities.seed import _generate_seed_sequence, pl_worker_init_function
from lightning.pytorch import seed_everything

print("seed_everything(42, workers=True) ->", seed_everything(42, workers=True, verbose=False),
      os.environ["PL_GLOBAL_SEED"], os.environ["PL_SEED_WORKERS"])
print("draws", torch.rand(2).tolist(), random.random(), float(np.random.rand()))
print("sequence(12345, 3, 1)", _generate_seed_sequence(12345, 3, 1, 4))
for worker_id, rank in ((0, 0), (2, 1)):
    torch.manual_seed(1000 + worker_id)
    pl_worker_init_function(worker_id, rank=rank)
    print("worker", worker_id, rank, torch.rand(2).tolist(), random.random(), float(np.random.rand()))
