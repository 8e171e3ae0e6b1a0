"""``load_from_checkpoint`` for modules and data modules: rebuild from the saved hyper-parameters, then load.

Reads a ``.ckpt`` file (Ember's, its digests verified, or Lightning's: ``state_dict`` and ``hyper_parameters``),
an older Ember checkpoint folder (the trainer's entry and ``model.safetensors``, both checked against the
manifest) or a weights-only folder (``save_model``). Nothing is unpickled unless the caller passes
``weights_only=False``.
"""

from __future__ import annotations

import inspect
import os
import warnings
from typing import Any

import torch

from engine.checkpoint import folders
from engine.checkpoint.io import CheckpointError, load_torch
from engine.checkpoint.state import custom_name, read_model_weights
from trainer.checkpoint import ckpt_file
from trainer.checkpoint.ckpt_file import EMBER_KEY
from trainer.checkpoint.format import FORMAT
from trainer.checkpoint.hparams_io import decode_hparams, typed
from trainer.checkpoint.lightning_format import is_ember, trainer_entry


def read_file(path: str, unpickle: bool) -> dict[str, Any]:
    """A ``.ckpt`` file (Ember's, every digest verified, or Lightning's) as the parts ``load_module`` uses:
    ``{"state_dict", "hyper_parameters": {"module", "datamodule"}, "checkpoint": the whole dict,
    "datamodule_state"}``."""
    checkpoint = ckpt_file.read(path, unpickle=unpickle)
    if "state_dict" not in checkpoint:
        raise CheckpointError(f"load_from_checkpoint({path!r}): the file holds no 'state_dict' (its keys: "
                              f"{sorted(checkpoint)[:8]}): pass a checkpoint written by Ember's or Lightning's Trainer.")
    entry = trainer_entry(checkpoint[EMBER_KEY].get("custom", [])) if is_ember(checkpoint) else None
    datamodule_state = (entry or {}).get("trainer", {}).get("datamodule")
    weights_only = bool(checkpoint[EMBER_KEY].get("weights_only")) if is_ember(checkpoint) else (
        "optimizer_states" not in checkpoint)
    return {"state_dict": checkpoint["state_dict"], "checkpoint": checkpoint, "datamodule_state": datamodule_state,
            "weights_only": weights_only,
            "hyper_parameters": {"module": checkpoint.get("hyper_parameters") or {},
                                 "module_name": checkpoint.get("hparams_name"),
                                 "module_type": _type_name(checkpoint.get("hparams_type")),
                                 "datamodule": checkpoint.get("datamodule_hyper_parameters") or {},
                                 "datamodule_name": checkpoint.get("datamodule_hparams_name"),
                                 "datamodule_type": _type_name(checkpoint.get("datamodule_hparams_type"))}}


def _type_name(kind: Any) -> str | None:
    """A checkpoint's hyper-parameter type as text: Ember writes the name; Lightning pickles the class itself
    (read only with ``weights_only=False``)."""
    if kind is None or isinstance(kind, str):
        return kind
    return f"{getattr(kind, '__module__', '')}.{getattr(kind, '__qualname__', '')}"


def read_entry(path: str | os.PathLike[str], unpickle: bool) -> dict[str, Any] | None:
    """The trainer's entry of the checkpoint folder ``path`` (None for a weights-only ``save_model`` folder)."""
    folder = os.fspath(path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"load_from_checkpoint({folder!r}): no such checkpoint file or folder. Pass a .ckpt "
                                "written by ModelCheckpoint or trainer.save_checkpoint (or Lightning's).")
    manifest = folders.read_manifest(folder)
    if manifest is None:
        return None
    folders.check_sizes(folder, manifest)
    index = 0
    while custom_name(index) in manifest["files"]:
        candidate = load_torch(os.path.join(folder, custom_name(index)), allow_unsafe_pickle=unpickle)
        if isinstance(candidate, dict) and candidate.get("format") == FORMAT:
            return candidate
        index += 1
    return None


def build(cls: type[Any], saved: dict[str, Any], role: str, overrides: dict[str, Any], unpickle: bool) -> Any:
    """``cls`` rebuilt from the hyper-parameters ``saved[role]`` (updated by ``overrides``), as Lightning does:
    passed as the one argument they were given as (``saved[f"{role}_name"]``, e.g. ``cls(config=...)``), else
    as keyword arguments; only those ``cls.__init__`` takes, unless it takes ``**kwargs``."""
    hparams = typed(decode_hparams(saved.get(role) or {}, overrides, unpickle, cls.__name__), saved.get(f"{role}_type"))
    parameters = inspect.signature(cls.__init__).parameters
    named = [name for name, p in list(parameters.items())[1:]
             if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    argument = saved.get(f"{role}_name")
    kwargs = {argument: hparams, **overrides} if argument and argument in named else dict(hparams)
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in named}
    missing = [n for n in named if n not in kwargs and parameters[n].default is inspect.Parameter.empty]
    if missing:
        raise TypeError(f"{cls.__name__}.__init__() missing required arguments {missing}: the checkpoint's "
                        "hyper-parameters do not hold them (left out by save_hyperparameters(ignore=...), or "
                        "dropped at the run's start because they could not be pickled). Pass them again: "
                        f"{cls.__name__}.load_from_checkpoint(path, {missing[0]}=...).")
    return cls(**kwargs)


def load_module(cls: type, path: str | os.PathLike[str], map_location: Any, hparams_file: Any, strict: bool | None,
                weights_only: bool | None, overrides: dict[str, Any]) -> Any:
    """What ``TrainModule.load_from_checkpoint`` does (see there)."""
    unpickle = weights_only is False
    path = downloaded(path)
    if os.path.isfile(path):
        entry: dict[str, Any] | None = read_file(os.fspath(path), unpickle)
        state_dict = entry["state_dict"] if entry is not None else None
    else:
        entry = read_entry(path, unpickle)
        state_dict = read_model_weights(os.fspath(path), allow_unsafe_pickle=unpickle)
    if state_dict is None:
        raise CheckpointError(f"{os.fspath(path)} holds no full model weights (model.safetensors): a sharded FSDP "
                              "checkpoint is loaded by trainer.fit(ckpt_path=...).")
    saved = dict((entry or {}).get("hyper_parameters", {}))
    if hparams_file is not None:
        saved["module"] = read_hparams_file(hparams_file)
    module = build(cls, saved, "module", overrides, unpickle)
    module.configure_model()  # layers built late exist before the weights are loaded (a no-op by default)
    checkpoint = dict((entry or {}).get("checkpoint", {}))
    checkpoint.update(state_dict=state_dict, hyper_parameters=dict(module.hparams))
    module.on_load_checkpoint(checkpoint)
    if not checkpoint["state_dict"]:  # Lightning's warning: a module built from hyper-parameters alone
        warnings.warn(f"The state dict in {os.fspath(path)!r} contains no parameters: the module keeps the weights "
                      "it was built with.", UserWarning, stacklevel=3)
    module.load_state_dict(checkpoint["state_dict"], strict=_strict(strict, module))
    device = _device(map_location)
    return module if device is None else module.to(device)


def _strict(strict: bool | None, module: Any) -> bool:
    """``strict``, else the module's ``strict_loading``, else True; both given and different is an error (as
    Lightning: the caller and the module disagree on whether missing keys are acceptable)."""
    loading = getattr(module, "strict_loading", None)
    if strict is not None and loading is not None and bool(strict) != bool(loading):
        raise ValueError(f"load_from_checkpoint(strict={strict}) is in conflict with {type(module).__name__}."
                         f"strict_loading={loading}: leave one of them unset, or set both the same.")
    return bool(strict if strict is not None else (loading if loading is not None else True))


def load_datamodule(cls: type, path: str | os.PathLike[str], hparams_file: Any, weights_only: bool | None,
                    overrides: dict[str, Any]) -> Any:
    """What ``DataModule.load_from_checkpoint`` does (see there)."""
    unpickle = weights_only is False
    path = downloaded(path)
    entry = read_file(os.fspath(path), unpickle) if os.path.isfile(path) else read_entry(path, unpickle)
    if entry is not None and entry.get("weights_only"):
        raise CheckpointError(f"{os.fspath(path)} is a weights-only checkpoint file: it holds no data module "
                              "state. Load a checkpoint written by ModelCheckpoint or trainer.save_checkpoint(path).")
    if entry is None:
        raise CheckpointError(f"{os.fspath(path)} is a weights-only folder: it holds no data module "
                              "hyper-parameters. Load a checkpoint written by ModelCheckpoint or "
                              "trainer.save_checkpoint(path).")
    saved = dict(entry.get("hyper_parameters", {}))
    if hparams_file is not None:
        saved["datamodule"] = read_hparams_file(hparams_file)
    datamodule = build(cls, saved, "datamodule", overrides, unpickle)
    state = entry.get("datamodule_state") if "datamodule_state" in entry else entry.get("trainer", {}).get("datamodule")
    if state:
        datamodule.load_state_dict(state)
    return datamodule


def downloaded(path: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """``path`` itself, or for an ``http(s)://`` address the local copy of that file: downloaded into torch hub's
    checkpoint folder (``$TORCH_HOME/hub/checkpoints``) unless a file of that name is there already, as
    Lightning (through ``torch.hub``) does. The copy is then read like any file: digests verified, nothing
    unpickled unless ``weights_only=False``."""
    text = os.fspath(path)
    if not text.startswith(("http://", "https://")):
        return path
    from urllib.parse import urlparse

    folder = os.path.join(torch.hub.get_dir(), "checkpoints")
    os.makedirs(folder, exist_ok=True)
    local = os.path.join(folder, os.path.basename(urlparse(text).path) or "checkpoint.ckpt")
    if not os.path.isfile(local):
        try:
            torch.hub.download_url_to_file(text, local, progress=False)  # to a temporary name, then renamed
        except OSError as error:
            raise FileNotFoundError(f"load_from_checkpoint({text!r}): the download failed ({error}). Check the "
                                    "address, or download the file and pass its local path.") from error
    return local


def read_hparams_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Hyper-parameters from a YAML file (``yaml.safe_load``: plain data only), replacing the checkpoint's."""
    import yaml

    if not os.fspath(path).lower().endswith((".yaml", ".yml")):
        raise ValueError(f"load_from_checkpoint(hparams_file={os.fspath(path)!r}) must be a .yaml / .yml file.")
    with open(path, encoding="utf-8") as f:
        loaded = yaml.safe_load(f) or {}
    if not isinstance(loaded, dict):
        raise TypeError(f"{os.fspath(path)} must hold a mapping of hyper-parameter name -> value.")
    return loaded


def _device(map_location: Any) -> torch.device | None:
    """The device ``map_location`` puts the weights on. Ember reads them on the CPU, then moves the module; a
    ``torch.load``-style dict (``{"cpu": "cuda:0"}``) or callable (``lambda storage, loc: storage``) is asked
    where it sends a CPU tensor, as torch.load would ask it for each."""
    if map_location is None:
        return None
    if isinstance(map_location, (str, torch.device)):
        return torch.device(map_location)
    if isinstance(map_location, dict):
        return torch.device(map_location.get("cpu", "cpu"))
    if callable(map_location):
        moved = map_location(torch.zeros(1).untyped_storage(), "cpu")
        return torch.device("cpu") if moved is None else moved.device
    raise TypeError(f"load_from_checkpoint(map_location=...) takes a device, a device string, a dict of device "
                    f"strings or a callable(storage, location), as torch.load. Received: {map_location!r}.")
