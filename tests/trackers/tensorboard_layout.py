"""What a TensorBoard run folder holds, as comparable data: folders, files, tags, values, hyper-parameters.

Read with tensorboard's own loader (the one its server uses). Imports nothing of ours, so the recording
script (tests/parity_scripts/record_tensorboard_layout.py) runs it under the real Accelerate and Lightning.
"""

from __future__ import annotations

import os
import re
from typing import Any

import yaml
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from tensorboard.util import tensor_util

# What the recording and the tests log: a configuration, then numbers, a string and a dict of numbers (a group).
CONFIG = {"lr": 0.125, "epochs": 3, "name": "mlp", "flag": True}
STEPS: list[tuple[dict[str, Any], int]] = [
    ({"loss": 0.5, "glue": {"accuracy": 0.75, "f1": 0.5}, "note": "hello"}, 1),
    ({"glue": {"accuracy": 0.8}}, 2),
]
_TIMESTAMP = re.compile(r"^\d{9,}\.\d+$")  # str(time.time()), the name of an hparams sub-run


def layout(root: str) -> list[dict[str, Any]]:
    """One entry per folder under ``root`` that holds files, sorted by folder; timestamps read ``<time>``."""
    out = []
    for folder, _, files in os.walk(root):
        if not files:
            continue
        parts = os.path.relpath(folder, root).split(os.sep)
        entry: dict[str, Any] = {
            "folder": "/".join("<time>" if _TIMESTAMP.match(p) else p for p in parts),
            "files": sorted("events" if f.startswith("events.out.tfevents.") else f for f in files)}
        if "events" in entry["files"]:
            entry.update(_events(folder))
        for name in files:
            if name.endswith((".yml", ".yaml")):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    entry[name] = yaml.safe_load(f)
        out.append(entry)
    return sorted(out, key=lambda e: (e["folder"], e["files"]))


def _events(folder: str) -> dict[str, Any]:
    events = EventAccumulator(folder)
    events.Reload()
    content = {plugin: events.PluginTagToContent(plugin) for plugin in events.ActivePlugins()}
    scalars = {tag: [(e.step, round(float(tensor_util.make_ndarray(e.tensor_proto)), 6))
                     for e in events.Tensors(tag)] for tag in sorted(content.get("scalars", {}))}
    texts = {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors(tag)]
             for tag in sorted(content.get("text", {}))}
    out: dict[str, Any] = {"scalars": scalars, "texts": texts}
    if "hparams" in content:
        start = HParamsPluginData.FromString(content["hparams"]["_hparams_/session_start_info"])
        out["hparams"] = {name: [value.WhichOneof("kind"), getattr(value, value.WhichOneof("kind"))]
                          for name, value in sorted(start.session_start_info.hparams.items())}
        out["hparams_tags"] = sorted(content["hparams"])
    return out
