"""BasePredictionWriter: batch / epoch writes, batch indices, and every sample written once across 2 ranks."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import BasePredictionWriter
from callbacks.exceptions import MisconfigurationException
from tests.trainer.helpers import QUIET, Regressor
from trainer import Trainer


class Doubler(Regressor):
    """predict_step returns the sample's own index (as a float, doubled), so a write can be checked per sample."""

    def __init__(self) -> None:
        super().__init__(features=1)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        index, x = batch
        return {"index": index, "double": 2 * x.squeeze(1)}


def indexed(n: int, batch_size: int, shuffle: bool = False) -> DataLoader:
    idx = torch.arange(n)
    return DataLoader(TensorDataset(idx, idx.float().unsqueeze(1)), batch_size=batch_size, shuffle=shuffle)


class FileWriter(BasePredictionWriter):
    """Writes one file per batch and one per epoch, per rank."""

    def __init__(self, folder: str, write_interval: str) -> None:
        super().__init__(write_interval)
        self.folder = folder
        self.batch_calls: list[tuple[int, int]] = []

    def write_on_batch_end(self, trainer: Any, module: Any, prediction: Any, batch_indices: Any, batch: Any,
                           batch_idx: int, dataloader_idx: int) -> None:
        self.batch_calls.append((dataloader_idx, batch_idx))
        torch.save({"indices": batch_indices, "prediction": prediction},
                   os.path.join(self.folder, f"r{trainer.global_rank}_d{dataloader_idx}_b{batch_idx}.pt"))

    def write_on_epoch_end(self, trainer: Any, module: Any, predictions: Any, batch_indices: Any) -> None:
        torch.save({"indices": batch_indices, "predictions": predictions},
                   os.path.join(self.folder, f"r{trainer.global_rank}_epoch.pt"))


def test_batch_and_epoch_writes_with_indices(tmp_path: Any) -> None:
    writer = FileWriter(str(tmp_path), "batch_and_epoch")
    trainer = Trainer(**QUIET, callbacks=[writer])
    trainer.predict(Doubler(), indexed(10, 4), return_predictions=False)
    assert writer.batch_calls == [(0, 0), (0, 1), (0, 2)]
    for b, expected in enumerate([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]):
        saved = torch.load(tmp_path / f"r0_d0_b{b}.pt")
        assert saved["indices"] == expected
        assert saved["prediction"]["index"].tolist() == expected
    epoch = torch.load(tmp_path / "r0_epoch.pt")
    assert epoch["indices"] == [[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]]  # per loader, per batch (Lightning's shape)
    assert [p["index"].tolist() for p in epoch["predictions"]] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_epoch_only_with_two_loaders(tmp_path: Any) -> None:
    writer = FileWriter(str(tmp_path), "epoch")
    Trainer(**QUIET, callbacks=[writer]).predict(Doubler(), [indexed(3, 2), indexed(4, 4)])
    assert writer.batch_calls == []
    epoch = torch.load(tmp_path / "r0_epoch.pt")
    assert epoch["indices"] == [[[0, 1], [2]], [[0, 1, 2, 3]]]
    assert [[p["index"].tolist() for p in loader] for loader in epoch["predictions"]] == [[[0, 1], [2]],
                                                                                          [[0, 1, 2, 3]]]


def test_several_writers_each_get_the_indices() -> None:
    # Lightning 2.6.6 (observed): a "batch", an "epoch" and a "batch_and_epoch" writer in one Trainer, two loaders
    # of 4 and 3 samples in batches of 2; then one loader. Each writer gets every batch's indices.
    said: list[tuple[str, str, Any]] = []

    class Spy(BasePredictionWriter):
        def write_on_batch_end(self, trainer: Any, module: Any, prediction: Any, batch_indices: Any, batch: Any,
                               batch_idx: int, dataloader_idx: int) -> None:
            said.append((self.interval, "batch", (batch_indices, batch_idx, dataloader_idx)))

        def write_on_epoch_end(self, trainer: Any, module: Any, predictions: Any, batch_indices: Any) -> None:
            said.append((self.interval, "epoch", batch_indices))

    trainer = Trainer(**QUIET, callbacks=[Spy("batch"), Spy("epoch"), Spy("batch_and_epoch")])
    trainer.predict(Doubler(), [indexed(4, 2), indexed(3, 2)], return_predictions=False)
    batches = [([0, 1], 0, 0), ([2, 3], 1, 0), ([0, 1], 0, 1), ([2], 1, 1)]
    epoch = [[[0, 1], [2, 3]], [[0, 1], [2]]]
    assert said == [(interval, "batch", b) for b in batches for interval in ("batch", "batch_and_epoch")] + [
        ("epoch", "epoch", epoch), ("batch_and_epoch", "epoch", epoch)]
    said.clear()
    trainer.predict(Doubler(), indexed(3, 2), return_predictions=False)
    assert said == [(interval, "batch", b) for b in [([0, 1], 0, 0), ([2], 1, 0)]
                    for interval in ("batch", "batch_and_epoch")] + [
        ("epoch", "epoch", [[[0, 1], [2]]]), ("batch_and_epoch", "epoch", [[[0, 1], [2]]])]


def test_shuffled_loader_indices_match_the_samples(tmp_path: Any) -> None:
    seen: list[Any] = []

    class Spy(BasePredictionWriter):
        def write_on_batch_end(self, trainer: Any, module: Any, prediction: Any, batch_indices: Any,
                               *args: Any) -> None:
            seen.append((batch_indices, prediction["index"].tolist()))

    trainer = Trainer(**QUIET, callbacks=[Spy()])
    for _ in range(3):  # the prepared loader seeds its own sampler generator, so the lockstep pass is exact
        trainer.predict(Doubler(), indexed(8, 2, shuffle=True))
    assert len(seen) == 12 and all(indices == samples for indices, samples in seen)
    assert sorted(i for _, samples in seen[:4] for i in samples) == list(range(8))


def test_missing_override_and_bad_interval_are_clear() -> None:
    # Lightning 2.6: MisconfigurationException (a ValueError here), text "`write_interval` should be one of [...]".
    with pytest.raises(MisconfigurationException, match=r"`write_interval` should be one of \['batch', 'epoch', "
                                                        r"'batch_and_epoch'\].*'step'"):
        BasePredictionWriter("step")
    with pytest.raises(NotImplementedError, match="override write_on_batch_end"):
        Trainer(**QUIET, callbacks=[BasePredictionWriter()]).predict(Doubler(), indexed(4, 2))


def _two_ranks(folder: str) -> list[int]:
    writer = FileWriter(folder, "batch_and_epoch")
    Trainer(**QUIET, callbacks=[writer]).predict(Doubler(), indexed(10, 4), return_predictions=False)
    return [b for _, b in writer.batch_calls]


def test_every_sample_written_once_across_two_ranks(tmp_path: Any, run_distributed: Any) -> None:
    # 10 samples, batch size 4, 2 ranks: the last round is padded with samples 0..5; those are cut before writing.
    calls = run_distributed(_two_ranks, 2, str(tmp_path))
    assert calls == [[0, 1], [0, 1]]
    written: list[int] = []
    for rank in (0, 1):
        for b in (0, 1):
            saved = torch.load(tmp_path / f"r{rank}_d0_b{b}.pt")
            assert saved["prediction"]["index"].tolist() == saved["indices"]
            assert saved["prediction"]["double"].tolist() == [2.0 * i for i in saved["indices"]]
            written += saved["indices"]
        epoch = torch.load(tmp_path / f"r{rank}_epoch.pt")
        per_batch = [torch.load(tmp_path / f"r{rank}_d0_b{b}.pt")["indices"] for b in (0, 1)]
        assert epoch["indices"] == [per_batch]  # the epoch write holds the same index batches
    assert sorted(written) == list(range(10))


def test_engine_records_the_index_batches_of_each_pass() -> None:
    from engine import Accelerator

    loader = Accelerator(cpu=True).prepare(indexed(6, 4, shuffle=True))
    seen = loader.record_batch_indices()
    for _ in range(2):  # each pass refills the list with what it drew
        drawn = [batch[0].tolist() for batch in loader]
        assert [list(map(int, b)) for b in seen] == drawn
    assert loader.record_batch_indices(False) is None
    list(loader)
    assert len(seen) == 2  # no longer recorded into
