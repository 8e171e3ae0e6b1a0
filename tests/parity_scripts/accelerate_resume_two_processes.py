"""Show that Accelerate 1.15's resume is not exact on 2 processes either (run by hand; for the README).

    /work/venvs/acc/bin/python tests/parity_scripts/accelerate_resume_two_processes.py

Trains a dropout model on 2 CPU processes (torchrun, gloo) with a seedable sampler, so the data order can come
back on resume: once uninterrupted, once saving after batch 3 of epoch 0, once resumed from there in a new
process (``load_state``, ``skip_first_batches``). Observed: the resumed run sees the uninterrupted run's batches
but ends with other weights, and exactly one 64-bit draw separates the global RNG restored by ``load_state``
from the state at the first resumed batch: DataLoader's per-iterator base seed, drawn from the global RNG when
the resumed loader's iterator is created, so dropout comes from one draw further along the stream. Running
``train`` by hand in one folder without torchrun (arguments ``full``, ``save``, ``resume``) shows the same on
one process.
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import hashlib
import json
import os
import subprocess
import sys
import tempfile


def train(mode: str) -> None:
    import torch
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader, TensorDataset

    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    set_seed(0)
    g = torch.Generator().manual_seed(3)
    dataset = TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(dataset, batch_size=4, shuffle=True))
    seen, restored, first = [], None, None
    if mode == "resume":
        accelerator.load_state("checkpoint")
        restored = torch.get_rng_state()
    for epoch in range(2):
        loader.set_epoch(epoch)
        active = accelerator.skip_first_batches(loader, 3) if mode == "resume" and epoch == 0 else loader
        for step, (x, y) in enumerate(active):
            first = torch.get_rng_state() if first is None else first
            seen.append(round(float(x[0, 0]), 4))
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            if mode == "save" and step == 2:
                accelerator.save_state("checkpoint")
                break
        if mode == "save":
            break
    weights = b"".join(p.detach().numpy().tobytes() for p in accelerator.unwrap_model(model).parameters())
    out = {"seen": seen, "weights": hashlib.sha256(weights).hexdigest()[:12]}
    if restored is not None:
        torch.set_rng_state(restored)
        torch.empty((), dtype=torch.int64).random_()
        out["one_draw_between_load_state_and_the_first_batch"] = torch.equal(torch.get_rng_state(), first)
    if accelerator.process_index == 0:
        print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for mode in ("full", "save", "resume"):
            done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                                   __file__, mode], cwd=work, capture_output=True, text=True, check=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
            line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
            results[mode] = json.loads(line[len("RESULT "):])
    full, resumed = results["full"], results["resume"]
    print(json.dumps(results, indent=1))
    print("same batches as uninterrupted:", resumed["seen"] == full["seen"][3:],
          "| same weights:", resumed["weights"] == full["weights"],
          "| one draw between load_state and the first batch:",
          resumed["one_draw_between_load_state_and_the_first_batch"])


if __name__ == "__main__":
    if len(sys.argv) > 1:
        train(sys.argv[1])
    else:
        main()
