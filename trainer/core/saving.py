"""Lightning's ``lightning.pytorch.core.saving`` helpers: hyper-parameters to and from a YAML or a tags CSV file.

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "hparams.yaml")
    >>> save_hparams_to_yaml(path, {"lr": 0.01, "layers": [64, 32]})
    >>> load_hparams_from_yaml(path)
    {'layers': [64, 32], 'lr': 0.01}
"""

from __future__ import annotations

import argparse
import ast
import csv
import os
import warnings
from collections.abc import Mapping, MutableMapping
from enum import Enum
from typing import Any, cast

import yaml


def load_hparams_from_yaml(config_yaml: str | os.PathLike[str],
                           use_omegaconf: bool = True) -> MutableMapping[Any, Any]:
    """The hyper-parameters in ``config_yaml`` as a dict (``{}`` for a missing or empty file, as in Lightning).

    ``use_omegaconf``: return an OmegaConf ``DictConfig`` when omegaconf is installed (Lightning's default).
    """
    if not os.path.isfile(config_yaml):
        return {}
    with open(config_yaml) as f:
        hparams = yaml.safe_load(f) or {}
    if use_omegaconf:
        try:
            from omegaconf import OmegaConf
        except ImportError:
            return hparams
        return OmegaConf.create(hparams)
    return hparams


def save_hparams_to_yaml(config_yaml: str | os.PathLike[str], hparams: Mapping[str, Any] | argparse.Namespace,
                         use_omegaconf: bool = True) -> None:
    """Write ``hparams`` (a dict, a ``Namespace`` or an OmegaConf container) to ``config_yaml``.

    A value YAML cannot write at all (a ``torch.dtype``, a lock) is left out with Lightning's warning; other
    values safe YAML cannot represent are written as their ``repr`` (a readable record, never a Python tag, so
    ``yaml.safe_load`` reads the file back).
    """
    if isinstance(hparams, argparse.Namespace):
        hparams = vars(hparams)
    if type(hparams).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        hparams = cast("dict[str, Any]", OmegaConf.to_container(hparams, resolve=True))
    if not isinstance(hparams, Mapping):
        raise TypeError(f"save_hparams_to_yaml takes a dict or a Namespace. Received: {type(hparams).__name__}.")
    kept = {}
    for key, value in hparams.items():
        try:  # what Lightning writes and skips: a value yaml.dump itself cannot write is left out
            yaml.dump(value.name if isinstance(value, Enum) else value)
        except (TypeError, ValueError):
            warnings.warn(f"Skipping {str(key)!r} parameter because it is not possible to safely dump to YAML (a "
                          f"{type(value).__name__}): it is left out of {os.fspath(config_yaml)}.", UserWarning,
                          stacklevel=2)
            continue
        kept[str(key)] = _representable(value)
    with open(config_yaml, "w", newline="") as f:
        yaml.safe_dump(kept, f)


def save_hparams_to_tags_csv(tags_csv: str | os.PathLike[str], hparams: Mapping[str, Any] | argparse.Namespace) -> None:
    """Write ``hparams`` to ``tags_csv`` as Lightning's ``key,value`` rows (a header row, then one per name).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "tags.csv")
        >>> save_hparams_to_tags_csv(path, {"lr": 0.01, "layers": [64, 32], "deep": True})
        >>> load_hparams_from_tags_csv(path)
        {'lr': 0.01, 'layers': [64, 32], 'deep': True}
    """
    folder = os.path.dirname(os.fspath(tags_csv))
    if not os.path.isdir(folder):  # Lightning's words, then the fix
        raise RuntimeError(f"Missing folder: {folder}. Create it before saving the tags there.")
    if isinstance(hparams, argparse.Namespace):
        hparams = vars(hparams)
    with open(tags_csv, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["key", "value"])
        writer.writerows([name, "" if value is None else value] for name, value in hparams.items())


def load_hparams_from_tags_csv(tags_csv: str | os.PathLike[str]) -> dict[str, Any]:
    """The hyper-parameters of a tags CSV (``save_hparams_to_tags_csv``), each value read back as the Python
    literal it spells (``32``, ``0.001``, ``[1, 2]``, ``True``), else as its text; ``{}`` with a ``RuntimeWarning``
    for a missing file, as in Lightning."""
    if not os.path.isfile(tags_csv):
        warnings.warn(f"Missing Tags: {os.fspath(tags_csv)}.", RuntimeWarning, stacklevel=2)
        return {}
    with open(tags_csv, newline="") as f:
        rows = list(csv.reader(f))
    return {row[0]: _literal(row[1]) for row in rows[1:]}


def _literal(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)  # a literal only: never code
    except (ValueError, SyntaxError):
        return text


def _representable(value: Any) -> Any:
    if isinstance(value, Enum):  # its name, as Lightning 2.6 writes it (observed): a str Enum is no plain str
        return value.name
    if type(value) in (str, int, float, bool, type(None)):  # a subclass of them is written as its repr
        return value
    if isinstance(value, (list, tuple)):
        return [_representable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _representable(v) for k, v in value.items()}
    return repr(value)


__all__ = ["load_hparams_from_yaml", "save_hparams_to_yaml"]
