"""Record Lightning 2.6's torchmetrics values on an evaluation set that does not split evenly, and its message when
fit resumes a run that already reached max_epochs; write tests/distributed/torchmetrics_uneven_expected.py.

    /work/venvs/l26/bin/python tests/parity_scripts/record_torchmetrics_uneven.py

The module and data are those of tests/distributed/test_exact_torchmetrics.py (copied here: this venv has no
Ember): 3 classes, sample ``i`` has label ``i % 3`` and its logits are the one-hot of the prediction, wrong for
the samples in ``WRONG``; a ``MulticlassAccuracy``, a ``MetricCollection`` (macro accuracy and precision, one
compute group) and the plain per-batch accuracy tensor are logged in validation and test. Run on 1 and 2 CPU
processes (Lightning's ``strategy="ddp"``: ``DistributedSampler`` without shuffling), batches of 4, with and
without ``drop_last``, for N=18 (even: Lightning's sampler repeats nothing) and N=19 (odd: it repeats sample 0).
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import json
import os
import pprint
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "distributed", "torchmetrics_uneven_expected.py")
WRONG = (2, 3, 5, 10)


def worker(n: int, devices: int, drop_last: bool, out: str) -> None:
    import lightning as L
    import torch
    import torchmetrics
    from torch.utils.data import DataLoader, TensorDataset

    def metrics() -> tuple[Any, Any]:
        collection = torchmetrics.MetricCollection({
            "acc_macro": torchmetrics.classification.MulticlassAccuracy(3, average="macro"),
            "prec_macro": torchmetrics.classification.MulticlassPrecision(3, average="macro")})
        return torchmetrics.classification.MulticlassAccuracy(3, average="micro"), collection

    class Classifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(3, 3)
            self.val_acc, self.val_set = metrics()
            self.test_acc, self.test_set = metrics()

        def _step(self, stage: str, batch: Any) -> None:
            x, y = batch
            logits = x + 0 * self.net(x)
            acc, collection = (self.val_acc, self.val_set) if stage == "val" else (self.test_acc, self.test_set)
            acc(logits, y)
            self.log(f"{stage}/acc", acc)
            collection(logits, y)
            self.log_dict({f"{stage}/{k}": v for k, v in collection.items(keep_base=False, copy_state=False)})
            self.log(f"{stage}/acc_tensor", (logits.argmax(1) == y).float().mean())

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self._step("val", batch)

        def test_step(self, batch: Any, batch_idx: int) -> None:
            self._step("test", batch)

    labels = torch.arange(n) % 3
    predicted = labels.clone()
    for i in WRONG:
        if i < n:
            predicted[i] = (labels[i] + 1) % 3
    x = torch.nn.functional.one_hot(predicted, 3).float()
    loader = DataLoader(TensorDataset(x, labels), batch_size=4, drop_last=drop_last)
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False)
    module = Classifier()
    val = trainer.validate(module, loader, verbose=False)[0]
    test = trainer.test(module, loader, verbose=False)[0]
    with open(os.path.join(out, f"rank_{trainer.global_rank}.json"), "w", encoding="utf-8") as f:
        json.dump({"rank": trainer.global_rank, "val": val, "test": test}, f)


def finished_run_message(folder: str) -> dict[str, str]:
    """What Lightning prints when fit resumes (an explicit path to) a checkpoint taken at max_epochs."""
    code = f"""
import lightning as L, torch
from torch.utils.data import DataLoader, TensorDataset
class M(L.LightningModule):
    def __init__(self):
        super().__init__(); self.net = torch.nn.Linear(2, 1)
    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).sum()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
kw = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
          default_root_dir={folder!r})
L.Trainer(max_epochs=2, **kw).fit(M(), data)
import sys; print("----- resume -----", flush=True); print("----- resume -----", file=sys.stderr, flush=True)
t = L.Trainer(max_epochs=2, **kw)
import glob; t.fit(M(), data, ckpt_path=glob.glob({folder!r} + "/checkpoints/*.ckpt")[0])
print("global_step", t.global_step, "current_epoch", t.current_epoch)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=folder)
    marker = "----- resume -----"
    stderr = [line for line in done.stderr.split(marker, 1)[1].strip().splitlines() if "Tip:" not in line]
    return {"stdout": done.stdout.split(marker, 1)[1].strip(), "stderr": "\n".join(stderr)}


def main() -> None:
    import lightning
    import torch
    import torchmetrics

    recorded: dict[str, Any] = {"versions": {"lightning": lightning.__version__, "torch": torch.__version__,
                                             "torchmetrics": torchmetrics.__version__}}
    for n in (18, 19):
        for devices in (1, 2):
            for drop_last in (False, True):
                with tempfile.TemporaryDirectory() as out:
                    done = subprocess.run([sys.executable, __file__, "worker", str(n), str(devices),
                                           str(int(drop_last)), out],
                                          capture_output=True, text=True, check=False, timeout=600)
                    rows = [json.loads(Path(out, name).read_text(encoding="utf-8")) for name in sorted(os.listdir(out))]
                if done.returncode or len(rows) != devices:
                    raise RuntimeError(f"worker {n} {devices} {drop_last} failed:\n{done.stdout}\n{done.stderr}")
                ranks = sorted(rows, key=lambda r: r["rank"])
                if any(r["val"] != ranks[0]["val"] for r in ranks):  # synced metrics: the same on every rank
                    raise RuntimeError(f"ranks differ: {ranks}")
                recorded[f"n={n} devices={devices} drop_last={drop_last}"] = {"val": ranks[0]["val"],
                                                                              "test": ranks[0]["test"]}
    with tempfile.TemporaryDirectory() as folder:
        recorded["finished_run_resume"] = {k: v.replace(folder, "<root>") for k, v in finished_run_message(folder).items()}
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(f'"""Observed from lightning {lightning.__version__} (torch {torch.__version__}, torchmetrics '
                f'{torchmetrics.__version__}, CPU) by tests/parity_scripts/record_torchmetrics_uneven.py; do not '
                'edit."""\n\n')
        f.write("EXPECTED = " + pprint.pformat(recorded, width=116, sort_dicts=False) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), bool(int(sys.argv[4])), sys.argv[5])
    else:
        main()
