"""Hyper-parameters in checkpoints: plain values stored as they are, anything else sealed (pickled) and only
opened when the loader opts in, so ``load_from_checkpoint`` never unpickles by default (promise 3)."""

from __future__ import annotations

import pickle
from typing import Any

import torch

_PLAIN = (str, int, float, bool, type(None))
SEALED_KEY = "__ember_sealed__"


def is_plain(value: Any) -> bool:
    """Whether ``value`` is str / int / float / bool / None / tensor, or lists, tuples and str-keyed dicts of them."""
    if isinstance(value, (*_PLAIN, torch.Tensor)):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    return False


def encode_hparams(hparams: dict[str, Any] | None) -> dict[str, Any]:
    """``hparams`` for a checkpoint: plain values as they are, others as ``{SEALED_KEY: type, "pickle": bytes}``.

    A value that cannot be pickled (a lambda, an open file) is sealed without its bytes: loading then needs it
    passed again as an override.

    Example:
        >>> from pathlib import PurePosixPath
        >>> encoded = encode_hparams({"lr": 0.1, "root": PurePosixPath("/data")})
        >>> encoded["lr"], encoded["root"][SEALED_KEY]
        (0.1, 'pathlib.PurePosixPath')
    """
    encoded: dict[str, Any] = {}
    for key, value in (hparams or {}).items():
        if is_plain(value):
            encoded[str(key)] = value
            continue
        kind = f"{type(value).__module__}.{type(value).__qualname__}"
        try:
            data = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
        except Exception:  # noqa: BLE001 - any pickling failure: the value can only come back as an override
            data = None
        encoded[str(key)] = {SEALED_KEY: kind, "pickle": data}
    return encoded


def decode_hparams(encoded: dict[str, Any], overrides: dict[str, Any], unpickle: bool, owner: str) -> dict[str, Any]:
    """The hyper-parameters to rebuild ``owner`` with: ``encoded`` updated by ``overrides``.

    Raises:
        ValueError: a sealed value is needed (not overridden) and ``unpickle`` is False, or it has no bytes.
    """
    decoded: dict[str, Any] = {}
    for key, value in encoded.items():
        if key in overrides:
            continue
        if isinstance(value, dict) and SEALED_KEY in value:
            kind = value[SEALED_KEY]
            if value.get("pickle") is None:
                raise ValueError(f"{owner}.load_from_checkpoint: hyper-parameter {key!r} (a {kind}) could not be "
                                 f"stored in the checkpoint: pass it again, load_from_checkpoint(path, {key}=...).")
            if not unpickle:
                raise ValueError(f"{owner}.load_from_checkpoint: hyper-parameter {key!r} is a {kind}, not plain "
                                 "data, so it was stored pickled, and unpickling can run code stored in the file. "
                                 f"Pass it again (load_from_checkpoint(path, {key}=...)), or, if you trust this "
                                 "checkpoint, pass weights_only=False.")
            value = pickle.loads(value["pickle"].numpy().tobytes())
        decoded[key] = value
    decoded.update(overrides)
    return decoded


def hparams_record(owner: Any, role: str) -> dict[str, Any]:
    """What a checkpoint keeps of ``owner``'s hyper-parameters (``role``: ``"module"`` or ``"datamodule"``): the
    encoded values under ``role``, the init argument they were given as under ``{role}_name`` (Lightning's
    ``hparams_name``: ``"kwargs"`` for separate arguments, ``"config"`` for ``save_hyperparameters(config)``), and
    for an OmegaConf config its type's name under ``{role}_type`` (stored as plain values, rebuilt on load).

    Example:
        >>> class Owner:
        ...     hparams, _hparams_name = {"lr": 0.1}, "kwargs"
        >>> hparams_record(Owner(), "module")
        {'module': {'lr': 0.1}, 'module_name': 'kwargs', 'module_type': None}
    """
    hparams = getattr(owner, "hparams", None)
    kind = None
    if hparams is not None and type(hparams).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        kind = f"{type(hparams).__module__}.{type(hparams).__qualname__}"
        hparams = OmegaConf.to_container(hparams, resolve=True)
    name = getattr(owner, "_hparams_name", None)
    return {role: encode_hparams(hparams), f"{role}_name": name if hparams else None, f"{role}_type": kind}


def typed(hparams: dict[str, Any], kind: str | None) -> Any:
    """``hparams`` as the config type a checkpoint names (an OmegaConf config is rebuilt from its plain values;
    no type, or one that is not OmegaConf's, leaves the dict: nothing is imported by a name read from a file)."""
    if kind and kind.startswith("omegaconf."):
        from omegaconf import OmegaConf

        return OmegaConf.create(hparams)
    return hparams
