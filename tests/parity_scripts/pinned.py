"""Imported first by every recorder here: the test suite's CPU kernel path (tests/kernel_path.py) before torch
loads, so what a recorder writes on one machine is what the suite reproduces on any other.

Loaded by file path rather than as ``tests.kernel_path``, so the recorder's environment (Lightning, Accelerate,
DeepSpeed) never gets this checkout's packages on its import path.
"""

from __future__ import annotations

import importlib.util
import os

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernel_path.py")
_spec = importlib.util.spec_from_file_location("ember_tests_kernel_path", _PATH)
assert _spec is not None and _spec.loader is not None
kernel_path = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kernel_path)
kernel_path.pin()
