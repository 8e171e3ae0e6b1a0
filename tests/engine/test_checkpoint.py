"""save_state / load_state in one process: exact resume, layout, naming and pruning, hooks, corruption, save,
save_model (ENGINE.md 6 and the decisions table)."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from engine import (
    Accelerator,
    AcceleratorState,
    GradientState,
    GradScalerKwargs,
    ProjectConfiguration,
    set_seed,
)
from engine.checkpoint.folders import MANIFEST_NAME, committed_checkpoints, read_manifest
from engine.checkpoint.io import CheckpointError, CorruptCheckpointError

EPOCHS = 2


class Counter:
    """A registered custom object: how many batches / samples the run has seen."""

    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict[str, int]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.n = state["n"]


class Run:
    """One training setup, built from scratch as a fresh process would (state singletons reset first)."""

    def __init__(self, project_dir: str | None = None, total_limit: int | None = None,
                 mixed_precision: str = "fp16") -> None:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        config = ProjectConfiguration(project_dir=project_dir, automatic_checkpoint_naming=project_dir is not None,
                                      total_limit=total_limit)
        self.acc = Accelerator(cpu=True, mixed_precision=mixed_precision, gradient_accumulation_steps=2,
                               project_config=config,
                               kwargs_handlers=[GradScalerKwargs(init_scale=1024.0, growth_interval=3)])
        set_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        data = torch.Generator().manual_seed(1)
        dataset = TensorDataset(torch.randn(40, 8, generator=data), torch.randn(40, 1, generator=data))
        loader = DataLoader(dataset, batch_size=4, shuffle=True)
        self.model, self.optimizer, self.scheduler, self.loader = self.acc.prepare(model, optimizer, scheduler, loader)
        self.batches, self.samples = Counter(), Counter()
        self.acc.register_for_checkpointing(self.batches, self.samples)

    def train(self, stop_at: int | None = None, after_batch: Callable[[], None] | None = None) -> None:
        """Train until EPOCHS epochs are done, or return right after batch number ``stop_at``; ``after_batch`` runs
        after every batch (a checkpoint, say)."""
        acc = self.acc
        while self.batches.n < EPOCHS * len(self.loader):
            for x, y in self.loader:
                with acc.accumulate(self.model):
                    loss = torch.nn.functional.mse_loss(self.model(x), y)
                    acc.backward(loss)
                    self.optimizer.step()
                    self.scheduler.step()
                    self.optimizer.zero_grad()
                self.batches.n += 1
                self.samples.n += len(x)
                if after_batch is not None:
                    after_batch()
                if self.batches.n == stop_at:
                    return

    def snapshot(self) -> dict[str, Any]:
        return {"params": [p.detach().clone() for p in self.model.parameters()],
                "scale": self.acc.scaler.get_scale(), "lr": self.scheduler.get_last_lr(),
                "counters": (self.batches.n, self.samples.n), "rng": torch.get_rng_state()}


def assert_same_run(expected: dict[str, Any], got: dict[str, Any]) -> None:
    assert all(torch.equal(a, b) for a, b in zip(expected["params"], got["params"]))
    assert (got["scale"], got["lr"], got["counters"]) == (expected["scale"], expected["lr"], expected["counters"])
    assert torch.equal(got["rng"], expected["rng"])


@pytest.mark.parametrize("stop_at", [3, 13])  # mid-epoch and mid-accumulation, in epoch 0 and in epoch 1
def test_resume_mid_epoch_and_mid_accumulation_is_bitwise_exact(tmp_path: Path, stop_at: int) -> None:
    reference = Run()
    reference.train()
    expected = reference.snapshot()

    interrupted = Run(str(tmp_path))
    interrupted.train(stop_at=stop_at)
    assert interrupted.acc.step % 2 == 1  # stopped between the two micro-steps of an optimizer step
    assert any(p.grad is not None for p in interrupted.model.parameters())
    interrupted.acc.save_state()

    resumed = Run(str(tmp_path))  # fresh objects, as a new process would build them
    assert resumed.acc.load_state() == str(tmp_path / "checkpoints" / "checkpoint_0")
    assert resumed.batches.n == stop_at and resumed.acc.step == interrupted.acc.step
    resumed.train()
    assert_same_run(expected, resumed.snapshot())


def test_layout_matches_accelerate_names_and_the_manifest_lists_every_file(tmp_path: Path) -> None:
    run = Run()
    run.train(stop_at=3)
    folder = run.acc.save_state(str(tmp_path / "ckpt"))
    names = {"model.safetensors", "optimizer.bin", "scheduler.bin", "scaler.pt", "random_states_0.pkl",
             "custom_checkpoint_0.pkl", "custom_checkpoint_1.pkl", "dataloader_0_0.bin", "gradients_0_0.safetensors"}
    assert set(os.listdir(folder)) == names | {MANIFEST_NAME}
    manifest = read_manifest(folder)
    assert manifest is not None and set(manifest["files"]) == names
    assert all(record.size == os.path.getsize(os.path.join(folder, name))
               for name, record in manifest["files"].items())
    assert (manifest["step"], manifest["world_size"]) == (run.acc.step, 1)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no temporary folder left behind
    # Every file but the registered objects' loads with weights_only=True (nothing needs full unpickling).
    for name in names - {"model.safetensors", "gradients_0_0.safetensors"}:
        torch.load(os.path.join(folder, name), weights_only=True)

    unsafe_names = set(os.listdir(run.acc.save_state(str(tmp_path / "bin"), safe_serialization=False)))
    assert "pytorch_model.bin" in unsafe_names and "model.safetensors" not in unsafe_names


def test_automatic_naming_prunes_after_commit_and_a_fresh_process_continues(tmp_path: Path) -> None:
    run = Run(str(tmp_path), total_limit=2)
    base = tmp_path / "checkpoints"
    seen_at_hook: list[list[int]] = []
    run.acc.register_save_state_pre_hook(lambda models, weights, out: seen_at_hook.append(
        [n for n, _ in committed_checkpoints(str(base))]))
    saved = [run.acc.save_state() for _ in range(4)]
    assert saved == [str(base / f"checkpoint_{i}") for i in range(4)]
    assert sorted(os.listdir(base)) == ["checkpoint_2", "checkpoint_3"]
    assert run.acc.project_configuration.iteration == 4
    # Nothing is deleted before the new checkpoint is committed: each save still saw all previous ones.
    assert seen_at_hook == [[], [0], [0, 1], [1, 2]]

    fresh = Run(str(tmp_path), total_limit=2)  # iteration starts at 0 again
    assert fresh.acc.save_state() == str(base / "checkpoint_4")  # never "already exists", never overwritten
    assert sorted(os.listdir(base)) == ["checkpoint_3", "checkpoint_4"]

    resumed = Run(str(tmp_path), total_limit=2)
    assert resumed.acc.load_state() == str(base / "checkpoint_4")
    assert resumed.acc.project_configuration.iteration == 5
    resumed.acc.save_state()
    resumed.acc.save_state()
    # checkpoint_4 is what this run resumed from: pruning keeps it (and the newest one) whatever the limit.
    assert sorted(os.listdir(base)) == ["checkpoint_4", "checkpoint_6"]

    tenth = Run(str(tmp_path / "other"))
    tenth.acc.project_configuration.iteration = 10
    assert tenth.acc.save_state().endswith("checkpoint_10")


def test_leftovers_of_a_crashed_save_are_ignored_then_cleaned(tmp_path: Path) -> None:
    run = Run(str(tmp_path))
    first = run.acc.save_state()
    base = tmp_path / "checkpoints"
    (base / ".tmp-checkpoint_1-0123456789ab").mkdir()
    (base / ".tmp-checkpoint_1-0123456789ab" / "model.safetensors").write_bytes(b"half")
    (base / "checkpoint_7").mkdir()  # a final name without a manifest: not a checkpoint, but its name is taken
    (base / "checkpoint_7" / "model.safetensors").write_bytes(b"junk")
    assert committed_checkpoints(str(base)) == [(0, first)]
    assert Run(str(tmp_path)).acc.load_state() == first
    assert run.acc.save_state() == str(base / "checkpoint_8")
    assert sorted(os.listdir(base)) == ["checkpoint_0", "checkpoint_7", "checkpoint_8"]
    with pytest.raises(CorruptCheckpointError, match=r"checkpoint_7 is not a committed Ember checkpoint.*manifest"):
        run.acc.load_state(str(base / "checkpoint_7"))


def _corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    elif how == "truncate":
        path.write_bytes(bytes(data[: len(data) - 7]))
    else:
        path.unlink()


@pytest.mark.parametrize(("name", "how"), [("model.safetensors", "flip"), ("optimizer.bin", "flip"),
                                           ("random_states_0.pkl", "truncate"), ("scaler.pt", "missing")])
def test_a_corrupted_checkpoint_names_the_file_and_load_falls_back_to_the_previous(
        tmp_path: Path, name: str, how: str) -> None:
    run = Run(str(tmp_path))
    run.train(stop_at=3)
    older = run.acc.save_state()
    before = run.snapshot()
    run.train(stop_at=6)
    newer = run.acc.save_state()
    _corrupt(Path(newer) / name, how)

    with pytest.raises(CorruptCheckpointError, match=rf"{name}"):
        run.acc.load_state(newer)
    assert not torch.equal(run.snapshot()["params"][0], before["params"][0])  # a failed load changed nothing

    fresh = Run(str(tmp_path))
    with pytest.warns(UserWarning, match=rf"{name}.*Falling back to the previous committed checkpoint {older}"):
        assert fresh.acc.load_state() == older
    assert all(torch.equal(a, b) for a, b in zip(fresh.snapshot()["params"], before["params"]))
    assert fresh.batches.n == 3

    _corrupt(Path(older) / "model.safetensors", "flip")
    with pytest.warns(UserWarning, match="Falling back"), pytest.raises(CorruptCheckpointError,
                                                                        match=r"checkpoint_0.*model.safetensors"):
        Run(str(tmp_path)).acc.load_state()  # nothing left to fall back to


def test_save_and_load_pre_hooks_can_take_over_files(tmp_path: Path) -> None:
    run = Run()
    calls: list[str] = []

    def save_hook(models: list[torch.nn.Module], weights: list[Any], output_dir: str) -> None:
        calls.append("save")
        torch.save(weights.pop(0), os.path.join(output_dir, "my_model.pt"))  # the hook writes it its own way

    def load_hook(models: list[torch.nn.Module], input_dir: str) -> None:
        calls.append("load")
        models.pop(0).load_state_dict(torch.load(os.path.join(input_dir, "my_model.pt"), weights_only=True))

    save_handle = run.acc.register_save_state_pre_hook(save_hook)
    run.acc.register_load_state_pre_hook(load_hook)
    folder = run.acc.save_state(str(tmp_path / "ckpt"))
    assert "model.safetensors" not in os.listdir(folder)
    manifest = read_manifest(folder)
    assert manifest is not None and "my_model.pt" in manifest["files"]  # hook files are committed and checked
    expected = [p.detach().clone() for p in run.model.parameters()]
    with torch.no_grad():
        for p in run.model.parameters():
            p.zero_()
    run.acc.load_state(folder)
    assert calls == ["save", "load"]
    assert all(torch.equal(a, b) for a, b in zip(expected, run.model.parameters()))
    save_handle.remove()
    assert "model.safetensors" in os.listdir(run.acc.save_state(str(tmp_path / "ckpt")))


def test_saving_again_into_the_same_explicit_folder_replaces_it_whole(tmp_path: Path) -> None:
    run = Run()
    target = tmp_path / "latest"
    run.acc.save_state(str(target))
    run.train(stop_at=2)
    run.acc.save_state(str(target))
    assert sorted(os.listdir(tmp_path)) == ["latest"]  # the old copy and the temporary folder are gone
    assert Run().acc.load_state(str(target)) == str(target)

    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("keep me")
    with pytest.raises(ValueError, match=r"notes.*not an Ember checkpoint.*new or empty directory"):
        run.acc.save_state(str(foreign))
    assert (foreign / "todo.txt").read_text() == "keep me"


def test_a_crash_between_the_two_renames_of_a_replacement_loses_nothing(tmp_path: Path) -> None:
    run = Run()
    target = tmp_path / "latest"
    run.acc.save_state(str(target))
    # What a crash right after moving the old copy aside (before renaming the new one in) leaves behind.
    os.rename(target, tmp_path / ".old-latest-0123456789ab")
    with pytest.warns(UserWarning, match="interrupted"):
        assert Run().acc.load_state(str(target)).endswith(".old-latest-0123456789ab")
    run.train(stop_at=2)
    run.acc.save_state(str(target))  # puts the old copy back first, then replaces it as usual
    assert sorted(os.listdir(tmp_path)) == ["latest"]
    assert Run().acc.load_state(str(target)) == str(target)


def test_registered_object_count_mismatch_and_missing_files_raise_before_changing_anything(tmp_path: Path) -> None:
    run = Run()
    folder = run.acc.save_state(str(tmp_path / "ckpt"))
    fewer = Run()
    fewer.acc._custom_objects.pop()
    with pytest.raises(RuntimeError, match=r"saved custom objects \(2\).*registered.*\(1\)"):
        fewer.acc.load_state(folder)
    more = Run()
    extra = torch.optim.SGD(more.model.parameters(), lr=0.1)
    more.acc.prepare(extra)
    with pytest.raises(CheckpointError, match="no optimizer_1.bin, but 2 optimizers are prepared"):
        more.acc.load_state(folder)


def test_bad_arguments_fail_early_with_the_fix(tmp_path: Path) -> None:
    run = Run()
    with pytest.raises(ValueError, match="needs output_dir"):
        run.acc.save_state()
    with pytest.raises(ValueError, match="needs input_dir"):
        run.acc.load_state()
    with pytest.raises(TypeError, match="DeepSpeed"):
        run.acc.save_state(str(tmp_path / "x"), tag="step")
    with pytest.raises(TypeError, match="allow_unsafe_pickle=True instead of weights_only"):
        run.acc.load_state(str(tmp_path / "x"), weights_only=False)
    with pytest.raises(ValueError, match="no such directory"):
        run.acc.load_state(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=r"no committed checkpoint in .*checkpoints"):
        Run(str(tmp_path / "empty")).acc.load_state()


def test_save_writes_once_and_atomically(tmp_path: Path) -> None:
    acc = Run().acc
    target = tmp_path / "obj.pt"
    acc.save({"a": torch.arange(3), "note": "x"}, str(target))
    acc.save({"a": torch.arange(4), "note": "y"}, target)
    assert torch.load(target, weights_only=True)["note"] == "y"
    acc.save({"w": torch.ones(2)}, str(tmp_path / "w.safetensors"), safe_serialization=True)
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(tmp_path / "w.safetensors"))["w"], torch.ones(2))
    assert sorted(os.listdir(tmp_path)) == ["obj.pt", "w.safetensors"]  # no temporary files left
    with pytest.raises(TypeError, match=r"needs a dict of tensors, got list"):
        acc.save([1, 2], str(tmp_path / "l.safetensors"), safe_serialization=True)


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 32)
        self.hidden = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 100, bias=False)
        self.head.weight = self.embed.weight  # tied: safetensors refuses shared storage unless deduplicated


def test_save_model_shards_with_an_index_and_handles_tied_weights(tmp_path: Path) -> None:
    from engine.checkpoint.io import load_safetensors

    acc = Run().acc
    model = acc.prepare(Tied())
    acc.save_model(model, tmp_path / "one")
    assert sorted(os.listdir(tmp_path / "one")) == ["model.safetensors"]
    single = load_safetensors(str(tmp_path / "one" / "model.safetensors"))
    fresh = Tied()
    fresh.load_state_dict(single)  # strict: the tied name is restored
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))

    acc.save_model(model, tmp_path / "many", max_shard_size="10KB")  # the 12.8 KB embedding gets its own shard
    files = sorted(os.listdir(tmp_path / "many"))
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                     "model.safetensors.index.json"]
    index = json.loads((tmp_path / "many" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == {"embed.weight", "hidden.weight", "hidden.bias"}
    assert index["metadata"]["total_size"] == (100 * 32 + 32 * 32 + 32) * 4
    merged: dict[str, torch.Tensor] = {}
    for name in files[:2]:
        merged.update(load_safetensors(str(tmp_path / "many" / name)))
    fresh.load_state_dict(merged)

    acc.save_model(model, tmp_path / "many", max_shard_size=10**9)  # a new save leaves no stale shards behind
    assert sorted(os.listdir(tmp_path / "many")) == ["model.safetensors"]
    acc.save_model(model, tmp_path / "bin", safe_serialization=False, max_shard_size="5KB")
    assert "pytorch_model.bin.index.json" in os.listdir(tmp_path / "bin")
    with pytest.raises(ValueError, match=r"max_shard_size.*'5MB'.*got 'big'"):
        acc.save_model(model, tmp_path / "x", max_shard_size="big")


def test_load_state_restores_nothing_that_draws_randomness(tmp_path: Path) -> None:
    """After load_state the global RNG is exactly the saved one: nothing in the load consumed from it."""
    run = Run(str(tmp_path))
    run.train(stop_at=5)
    run.acc.save_state()
    saved = torch.get_rng_state()
    fresh = Run(str(tmp_path))
    torch.manual_seed(1234)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback, no world-size warning
        fresh.acc.load_state()
    assert torch.equal(torch.get_rng_state(), saved)


@pytest.mark.parametrize("algorithm", ["xxh3_64x16m", "xxh3_64", "crc32"])
def test_checksums_written_while_writing_match_a_fresh_read(tmp_path: Path, algorithm: str) -> None:
    from engine.checkpoint.checksum import FileRecord, hash_file
    from engine.checkpoint.io import DurableWriter, save_torch

    if algorithm.startswith("xxh3"):
        pytest.importorskip("xxhash")
    path = str(tmp_path / "state.bin")
    with ThreadPoolExecutor(2) as pool, DurableWriter(path, pool, algorithm) as writer:
        torch.save({"big": torch.arange(3 << 20, dtype=torch.float32), "small": torch.ones(3)}, writer)
    record = writer.close()
    assert record == hash_file(path, algorithm) and record.algorithm == algorithm
    assert FileRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    data = bytearray(Path(path).read_bytes())
    data[-100] ^= 0x04
    Path(path).write_bytes(bytes(data))
    assert hash_file(path, algorithm) != record
    assert save_torch({"x": 1}, path).size == os.path.getsize(path)


@pytest.mark.parametrize("size", [0, 1, (16 << 20) - 1, 16 << 20, (16 << 20) + 1, (32 << 20) + 5])
def test_chunked_checksums_are_the_same_streamed_in_pieces_read_in_parallel_and_defined_per_16_mib(
        tmp_path: Path, size: int) -> None:
    import xxhash

    from engine.checkpoint.checksum import CHUNKED, ChunkedXxh3, default_algorithm, hash_file

    assert default_algorithm() == CHUNKED
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    chunks = [data[i:i + (16 << 20)] for i in range(0, size, 16 << 20)]
    expected = xxhash.xxh3_64_hexdigest(b"".join(xxhash.xxh3_64_digest(c) for c in chunks))
    streamed = ChunkedXxh3()
    for start in range(0, size, 7_000_003):  # pieces that straddle the chunk boundaries
        streamed.update(data[start:start + 7_000_003])
    with ThreadPoolExecutor(2) as pool:
        parallel = hash_file(str(path), CHUNKED, pool)
    assert streamed.hexdigest() == parallel.digest == hash_file(str(path), CHUNKED).digest == expected
    assert parallel.size == size


def test_without_xxhash_checkpoints_use_crc32_and_still_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "xxhash", None)  # makes `import xxhash` fail
    run = Run()
    folder = run.acc.save_state(str(tmp_path / "ckpt"))
    manifest = read_manifest(folder)
    assert manifest is not None and {r.algorithm for r in manifest["files"].values()} == {"crc32"}
    assert run.acc.load_state(folder) == folder
    _corrupt(Path(folder) / "optimizer.bin", "flip")
    with pytest.raises(CorruptCheckpointError, match="optimizer.bin"):
        run.acc.load_state(folder)
