"""``HfDeepSpeedConfig``: a DeepSpeed config dict with the queries Accelerate's and transformers' code ask of it.

``DeepSpeedPlugin.hf_ds_config`` is one of these, as in Accelerate, and ``plugin.deepspeed_config`` is its very
``config`` dict: code written for Accelerate (``plugin.hf_ds_config.config[...]``, ``.is_zero3()``,
``.get_value("zero_optimization.stage")``) reads and edits the config the engine trains with.
"""

from __future__ import annotations

import base64
import copy
import json
import os
from collections.abc import Mapping
from typing import Any

_OFFLOAD_DEVICES = ("cpu", "nvme")


class HfDeepSpeedConfig:
    """A DeepSpeed config (a dict, a JSON file, a JSON string or base64 JSON) and dotted-key queries on it.

    A dict is deep-copied: the caller's dict keeps its ``"auto"`` values and can be given again.

    Example:
        >>> config = HfDeepSpeedConfig({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})
        >>> config.is_zero3(), config.is_offload(), config.get_value("zero_optimization.stage")
        (True, True, 3)
        >>> config.get_value("optimizer.params.lr", 0.1)
        0.1
    """

    def __init__(self, config_file_or_dict: Any) -> None:
        self.config: dict[str, Any] = read_config(config_file_or_dict)
        self.set_stage_and_offload()

    def set_stage_and_offload(self) -> None:
        """Read the stage and whether anything is offloaded again (after the config was edited)."""
        self._stage = self.get_value("zero_optimization.stage", -1)
        devices = {self.get_value("zero_optimization.offload_optimizer.device"),
                   self.get_value("zero_optimization.offload_param.device")}
        self._offload = (self.is_zero2() or self.is_zero3()) and any(d in _OFFLOAD_DEVICES for d in devices)

    def find_config_node(self, ds_key_long: str) -> tuple[dict[str, Any] | None, str]:
        """The dict holding the dotted key's last part, and that part (``None`` when a parent is missing)."""
        *parents, leaf = ds_key_long.split(".")
        node: Any = self.config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return None, leaf
        return (node if isinstance(node, dict) else None), leaf

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The value of a dotted key (``"zero_optimization.stage"``), or ``default`` when it is not set."""
        node, leaf = self.find_config_node(ds_key_long)
        return default if node is None else node.get(leaf, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        """Remove the dotted key's section; a missing one is an error only with ``must_exist``."""
        node, leaf = self.find_config_node(ds_key_long)
        if node is None or leaf not in node:
            if must_exist:
                raise ValueError(f"Can't find {ds_key_long} entry in the config: {self.config}")
            return
        del node[leaf]

    def is_true(self, ds_key_long: str) -> bool:
        """Whether the key is set to a true value (``False`` when it is not set)."""
        value = self.get_value(ds_key_long)
        return False if value is None else bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        """Whether the key is set to a false value (``False`` when it is not set)."""
        value = self.get_value(ds_key_long)
        return False if value is None else not bool(value)

    def is_zero2(self) -> bool:
        return self._stage == 2

    def is_zero3(self) -> bool:
        return self._stage == 3

    def is_offload(self) -> bool:
        return self._offload


def read_config(source: Any) -> dict[str, Any]:
    """A deep copy of a config dict, or the config a JSON file / JSON string / base64 JSON holds."""
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if os.path.isfile(text):
            with open(text, encoding="utf-8") as handle:
                return json.load(handle)
        for decode in (lambda t: t, lambda t: base64.urlsafe_b64decode(t).decode("utf-8")):
            try:
                loaded = json.loads(decode(text))
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(loaded, dict):
                return loaded
    raise ValueError("Expected a string path to an existing deepspeed config, or a dictionary, or a base64 encoded "
                     f"string. Received: {source}")
