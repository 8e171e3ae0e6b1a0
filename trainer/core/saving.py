"""Lightning's ``lightning.pytorch.core.saving`` helpers: hyper-parameters to and from a YAML file.

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "hparams.yaml")
    >>> save_hparams_to_yaml(path, {"lr": 0.01, "layers": [64, 32]})
    >>> load_hparams_from_yaml(path)
    {'layers': [64, 32], 'lr': 0.01}
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

import yaml


def load_hparams_from_yaml(config_yaml: str | os.PathLike[str], use_omegaconf: bool = True) -> dict[str, Any]:
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

    Values YAML cannot represent safely are written as their ``repr`` (a readable record, never a pickle).
    """
    if isinstance(hparams, argparse.Namespace):
        hparams = vars(hparams)
    if type(hparams).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        hparams = OmegaConf.to_container(hparams, resolve=True)
    if not isinstance(hparams, Mapping):
        raise TypeError(f"save_hparams_to_yaml takes a dict or a Namespace. Received: {type(hparams).__name__}.")
    with open(config_yaml, "w", newline="") as f:
        yaml.safe_dump({str(k): _representable(v) for k, v in hparams.items()}, f)


def _representable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        return [_representable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _representable(v) for k, v in value.items()}
    return repr(value)


__all__ = ["load_hparams_from_yaml", "save_hparams_to_yaml"]
