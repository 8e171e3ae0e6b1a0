"""Loading model weights straight into the parameters (engine.checkpoint.direct): taken for plain models, declined
(changing nothing) whenever load_state_dict could do more than copy bytes, and load_state gives the same result
either way. Torch files (optimizer states) read by parallel pieces, verified chunk by chunk as they are read."""

from __future__ import annotations

import collections
import contextlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import Accelerator
from engine.backends import base as backend_base
from engine.checkpoint import folders as checkpointing
from engine.checkpoint import state as checkpoint_state
from engine.checkpoint.direct import read_into_module, read_torch_file
from engine.checkpoint.io import CorruptCheckpointError, save_safetensors, save_torch


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(5, 4)
        self.head = torch.nn.Linear(4, 5, bias=False)
        self.head.weight = self.embed.weight


def _saved(model: torch.nn.Module, tmp_path: Path) -> str:
    path = str(tmp_path / "model.safetensors")
    save_safetensors(model.state_dict(), path)
    return path


@pytest.mark.parametrize("make", [lambda: torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(),
                                                               torch.nn.Linear(4, 2)).to(torch.bfloat16), Tied])
def test_a_plain_model_is_read_in_place(tmp_path: Path, make: object) -> None:
    torch.manual_seed(0)
    source = make()  # type: ignore[operator]
    path = _saved(source, tmp_path)
    torch.manual_seed(1)
    target = make()  # type: ignore[operator]
    pointers = [p.data_ptr() for p in target.parameters()]
    assert read_into_module(target, path)
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))
    assert [p.data_ptr() for p in target.parameters()] == pointers  # the same tensors, filled in place


def test_declined_cases_change_nothing(tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = _saved(torch.nn.Linear(3, 4), tmp_path)

    def unchanged(model: torch.nn.Module, **kwargs: bool) -> bool:
        before = {k: v.clone() for k, v in model.state_dict().items()}
        declined = not read_into_module(model, path, **kwargs)
        return declined and all(torch.equal(before[k], v) for k, v in model.state_dict().items())

    assert unchanged(torch.nn.Linear(3, 4), strict=False)  # load_state_dict's own key handling
    assert unchanged(torch.nn.Linear(3, 5))  # a shape differs: torch's error comes from load_state_dict
    assert unchanged(torch.nn.Linear(3, 4, bias=False))  # a missing / unexpected name
    assert unchanged(torch.nn.Linear(3, 4).to(torch.float64))  # load_state_dict converts the dtype
    hooked = torch.nn.Linear(3, 4)
    hooked.register_load_state_dict_post_hook(lambda module, keys: None)
    assert unchanged(hooked)
    norm = torch.nn.Sequential(torch.nn.BatchNorm1d(3))  # overrides _load_from_state_dict
    norm_path = _saved(torch.nn.Sequential(torch.nn.BatchNorm1d(3)), tmp_path)
    assert not read_into_module(norm, norm_path)


def test_load_state_takes_the_fast_path_and_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[bool] = []
    real = backend_base.read_into_module  # the backends read safetensors weights straight into the parameters
    monkeypatch.setattr(backend_base, "read_into_module",
                        lambda *args: taken.append(real(*args)) or taken[-1])
    for model in (torch.nn.Linear(3, 4), torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))):
        acc = Accelerator(cpu=True)
        prepared = acc.prepare(model)
        folder = acc.save_state(str(tmp_path / type(model).__name__))
        expected = {k: v.clone() for k, v in prepared.state_dict().items()}
        with torch.no_grad():
            for param in prepared.parameters():
                param.add_(1)
        acc.load_state(folder)
        assert all(torch.equal(expected[k], v) for k, v in prepared.state_dict().items())
    assert taken == [True, False]


def _meta_loads_give_offsets() -> bool:
    import io

    buffer = io.BytesIO()
    torch.save({"x": torch.ones(1)}, buffer)
    buffer.seek(0)
    return hasattr(torch.load(buffer, map_location="meta", weights_only=True)["x"].untyped_storage(),
                   "_checkpoint_offset")


needs_offsets = pytest.mark.skipif(not _meta_loads_give_offsets(),
                                   reason="this torch gives no storage offsets on meta loads: the reader declines")


def _optimizer_state() -> dict[str, Any]:
    torch.manual_seed(0)
    shared = torch.randn(10)
    return {"state": {0: {"step": torch.tensor(7.0), "exp_avg": torch.randn(5 << 20),  # 20 MiB: spans chunks
                          "exp_avg_sq": torch.randn(1024, 1024).to(torch.bfloat16)},
                      1: {"step": torch.tensor(7.0), "exp_avg": torch.randn(2, 3)[:, 1:], "view": shared[2:5],
                          "whole": shared, "flag": torch.tensor([True, False])}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0, 1], "name": None}]}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
                and torch.equal(a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


@needs_offsets
@pytest.mark.parametrize("threads", [0, 2])
def test_a_torch_file_is_read_as_torch_load_reads_it_and_verified_while_read(tmp_path: Path, threads: int) -> None:
    path = str(tmp_path / "optimizer.bin")
    saved = _optimizer_state()
    record = save_torch(saved, path)
    assert record.algorithm == "xxh3_64x16m" and record.size > 16 << 20
    with ThreadPoolExecutor(threads) if threads else contextlib.nullcontext() as pool:
        for expected in (None, record):
            loaded = read_torch_file(path, pool, expected)
            assert _same(loaded, torch.load(path, weights_only=True)) and _same(loaded, saved)
            state = loaded["state"][1]
            assert state["view"].untyped_storage().data_ptr() == state["whole"].untyped_storage().data_ptr()
        data = bytearray(Path(path).read_bytes())
        data[len(data) // 2] ^= 0x10  # inside the 12 MiB tensor's bytes: only the checksum can tell
        Path(path).write_bytes(bytes(data))
        assert read_torch_file(path, pool) is not None  # unchecked: reads the flipped bit
        with pytest.raises(CorruptCheckpointError, match=r"optimizer\.bin has \d+ bytes with xxh3_64x16m"):
            read_torch_file(path, pool, record)


def test_it_declines_what_it_cannot_rebuild(tmp_path: Path) -> None:
    path = str(tmp_path / "x.bin")
    torch.save({"p": torch.nn.Parameter(torch.ones(2))}, path)
    assert read_torch_file(path) is None
    torch.save({"od": collections.OrderedDict(a=torch.ones(2))}, path)
    assert read_torch_file(path) is None
    Path(path).write_bytes(b"not a torch file")
    assert read_torch_file(path) is None


@needs_offsets
@pytest.mark.parametrize("where", ["tensor", "pickle"])
def test_load_state_verifies_the_optimizer_file_in_the_read_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   where: str) -> None:
    hashed_apart: list[str] = []
    real = checkpointing.start_hashing
    monkeypatch.setattr(checkpointing, "start_hashing",
                        lambda path, *a: hashed_apart.append(Path(path).name) or real(path, *a))
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(1024, 2048)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = acc.prepare(model, optimizer)
    model(torch.ones(2, 1024)).sum().backward()
    optimizer.step()
    folder = acc.save_state(str(tmp_path / "ckpt"))
    expected = {k: v.clone() for k, v in optimizer.state_dict()["state"][0].items()}
    acc.load_state(folder)
    assert "optimizer.bin" not in hashed_apart and "model.safetensors" in hashed_apart
    assert all(torch.equal(v, optimizer.state_dict()["state"][0][k]) for k, v in expected.items())

    path = Path(folder) / "optimizer.bin"
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if where == "tensor" else data.index(b"exp_avg")  # the pickle: torch.load(meta) may fail
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    with torch.no_grad():
        model.weight.add_(1)
    weights = model.weight.clone()
    with pytest.raises(CorruptCheckpointError, match=r"optimizer\.bin has"):
        acc.load_state(folder)
    assert torch.equal(model.weight, weights)  # nothing applied
    assert checkpoint_state.checked_while_read(checkpointing.read_manifest(folder), num_models=1, num_optimizers=1,
                                               map_location="cpu") == {"optimizer.bin"}


class CountingPool(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(2)
        self.tasks = 0

    def submit(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.tasks += 1
        return super().submit(*args, **kwargs)


@needs_offsets
def test_reads_are_cut_into_pieces_for_the_pool(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = torch.nn.Linear(2048, 2048)  # 16 MiB of weights: two 8 MiB pieces
    path = _saved(source, tmp_path)
    target = torch.nn.Linear(2048, 2048)
    with CountingPool() as pool:
        assert read_into_module(target, path, pool=pool)
        assert pool.tasks == 3  # the weight's two pieces, the bias
        assert torch.equal(target.weight, source.weight) and torch.equal(target.bias, source.bias)
        torch_path = str(tmp_path / "optimizer.bin")
        record = save_torch(_optimizer_state(), torch_path)
        pool.tasks = 0
        read_torch_file(torch_path, pool)
        assert pool.tasks > 3
        pool.tasks = 0
        read_torch_file(torch_path, pool, record)
        assert pool.tasks == 2  # one per 16 MiB checksum chunk


def test_checksums_are_checked_on_the_pool_and_the_first_failure_in_manifest_order_is_raised(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    acc.prepare(torch.nn.Linear(2048, 2048 + 1024))  # 24 MiB of weights: two checksum chunks
    folder = acc.save_state(str(tmp_path / "ckpt"))
    manifest = checkpointing.read_manifest(folder)
    assert manifest is not None
    with CountingPool() as pool:
        checkpointing.start_checksums(folder, manifest, pool)()
        assert pool.tasks == len(manifest["files"]) + 1  # model.safetensors: one task per chunk
        for name in ("random_states_0.pkl", "model.safetensors"):
            data = bytearray((Path(folder) / name).read_bytes())
            data[-1] ^= 0x01
            (Path(folder) / name).write_bytes(bytes(data))
        finish = checkpointing.start_checksums(folder, manifest, pool)
        with pytest.raises(CorruptCheckpointError, match="model.safetensors"):
            finish()
