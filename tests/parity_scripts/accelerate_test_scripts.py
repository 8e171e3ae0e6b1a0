"""Run Accelerate's own test scripts (``accelerate/test_utils/scripts/``) against Ember's engine (by hand).

    # Ember, through the import shim (the engine's venv; the scripts are read from Accelerate's installed files):
    PYTHONPATH=$PWD /work/main/.venv/bin/python tests/parity_scripts/accelerate_test_scripts.py
    # the real Accelerate, for comparison (throwaway venv with torch==2.13.0, then accelerate 1.15.x):
    /work/venvs/acc/bin/python tests/parity_scripts/accelerate_test_scripts.py --real

Each script runs on 1 process and on 2 (torchrun, gloo; ``ACCELERATE_USE_CPU=1``, as Accelerate needs on a CPU
host; ``test_notebook`` as one process whose ``notebook_launcher`` starts ``ACCELERATE_NUM_PROCESSES`` of them). The test functions a script's ``main()`` calls are wrapped, so one failing does not stop the others, and
each one's outcome is printed as ``RESULT {script, processes, function, ok, error}``; the summary lists the
functions that pass on one side and fail on the other (run both and pass ``--compare real.json ember.json``).

The shim: a module finder serves ``accelerate`` and every ``accelerate.*`` module except ``accelerate.test_utils``
as a stand-in module whose names are looked up in the engine's modules (``engine``, ``engine.utils``,
``engine.data.loader``, ...), so ``from accelerate.utils import gather`` gives ``engine.utils.gather``; a name
the engine lacks fails the import as it would for a port. ``accelerate.test_utils`` (its helpers and the scripts)
is loaded from Accelerate's installed files, unchanged; an ``is_*_available`` that the engine does not define
answers False there (a feature Ember does not have). Nothing of Accelerate is copied into this repository.
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import argparse
import ast
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
import traceback
import types
from pathlib import Path
from typing import Any

DEFAULT_ACCELERATE = "/work/venvs/acc/lib/python3.11/site-packages/accelerate"
SCRIPTS = ["test_script", "test_ops", "test_sync", "test_distributed_data_loop", "test_ddp_comm_hook",
           "test_notebook", "test_cli"]
# Started as one process that launches the others itself (notebook_launcher), told how many by this variable.
SELF_LAUNCHING = {"test_notebook": "ACCELERATE_NUM_PROCESSES"}
# Where the stand-in modules look names up, in this order.
ENGINE_MODULES = ["engine", "engine.utils", "engine.state", "engine.data.loader", "engine.operations",
                  "engine.random", "engine.data.samplers", "engine.prepare.optimizer", "engine.prepare.scheduler", "engine.config",
                  "engine.imports", "engine.launch.launchers", "engine.logging", "engine.local_sgd", "engine.memory.batch_size",
                  "engine.environment", "engine.accelerator", "engine.tracking.hub", "engine.prepare.parallel"]


class _StandIn(types.ModuleType):
    """``accelerate.<name>``: attributes come from the engine's modules."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        for name in ENGINE_MODULES:
            module = importlib.import_module(name)
            if attr in vars(module) or (hasattr(module, "__getattr__") and _lazy(module, attr)):
                return getattr(module, attr)
        if attr.startswith("is_") and attr.endswith("_available"):
            return lambda *args, **kwargs: False
        raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r} (the engine has no such name)")


def _lazy(module: types.ModuleType, attr: str) -> bool:
    try:
        getattr(module, attr)
    except AttributeError:
        return False
    return True


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, accelerate_dir: Path) -> None:
        self.accelerate_dir = accelerate_dir

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "accelerate" and not fullname.startswith("accelerate."):
            return None
        parts = fullname.split(".")
        if parts[1:2] == ["test_utils"]:  # Accelerate's own test helpers and scripts, from its installed files
            where = self.accelerate_dir.joinpath(*parts[1:])
            if (where / "__init__.py").exists():
                return importlib.util.spec_from_file_location(fullname, where / "__init__.py",
                                                              submodule_search_locations=[str(where)])
            return importlib.util.spec_from_file_location(fullname, f"{where}.py")
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandIn(spec.name)
        module.__path__ = []  # a package: `accelerate.utils.dataclasses` and the like resolve too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _called_by_main(module: types.ModuleType) -> list[str]:
    """The module-level functions ``main()`` calls directly: the script's test functions."""
    tree = ast.parse(inspect.getsource(module.main))
    names = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    return sorted(n for n in names if inspect.isfunction(getattr(module, n, None))
                  and getattr(module, n).__module__ == module.__name__ and n != "main")


def run_script(name: str, procs: int, results: str, skip: list[str]) -> None:
    """In this process (one rank): import the script, wrap its test functions, run its main(), record outcomes
    (one JSON line each, in a file of this rank's: the ranks' prints would interleave)."""
    rank = int(os.environ.get("RANK", "0"))
    path = Path(results) / f"{name}_{procs}_{rank}.jsonl"

    def _report(function: str, ok: bool, error: str) -> None:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"script": name, "processes": procs, "rank": rank, "function": function, "ok": ok,
                                "error": error[-1500:]}) + "\n")

    try:
        module = importlib.import_module(f"accelerate.test_utils.scripts.{name}")
    except BaseException as error:  # noqa: BLE001
        _report("(import)", False, "".join(traceback.format_exception(error))[-1500:])
        return
    for function in _called_by_main(module):
        original = getattr(module, function)
        if function in skip:  # e.g. one that hangs on CPU under both libraries: the others still run
            setattr(module, function, functools.partial(_report, function, True, "skipped"))
            continue

        @functools.wraps(original)
        def wrapped(*args: Any, __original: Any = original, __name: str = function, **kwargs: Any) -> Any:
            try:
                value = __original(*args, **kwargs)
            except BaseException as error:  # noqa: BLE001 - recorded, then the next test function runs
                _report(__name, False, "".join(traceback.format_exception_only(error)).strip()
                        + "\n" + "".join(traceback.format_tb(error.__traceback__)[-3:]))
                return None
            _report(__name, True, "")
            return value

        setattr(module, function, wrapped)
    try:
        module.main()
    except BaseException as error:  # noqa: BLE001
        _report("main", False, "".join(traceback.format_exception(error))[-1500:])


def run_all(real: bool, scripts: list[str], accelerate_dir: str, skip: list[str]) -> list[dict[str, Any]]:
    results = []
    for script in scripts:
        for procs in (1, 2):
            with tempfile.TemporaryDirectory() as folder:
                launch = [sys.executable] if script in SELF_LAUNCHING else \
                    [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"]
                command = [*launch, __file__, "--child", script, str(procs), folder, "--accelerate-dir",
                           accelerate_dir, "--skip", *skip] + (["--real"] if real else [])
                env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
                if script in SELF_LAUNCHING:
                    env[SELF_LAUNCHING[script]] = str(procs)
                try:
                    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240,
                                          check=False, cwd=folder)
                    code, stderr = done.returncode, done.stderr
                except subprocess.TimeoutExpired:
                    code, stderr = -1, "timed out after 240 s"
                lines = [json.loads(line) for f in sorted(Path(folder).glob("*.jsonl"))
                         for line in f.read_text().splitlines()]
            if code != 0:  # the processes did not end well (a crash, a hang, an error outside the test functions)
                lines.append({"script": script, "processes": procs, "rank": -1, "function": "(run)", "ok": False,
                              "error": f"exit code {code}: {stderr[-1500:]}"})
            results += lines
            failed = sorted({r["function"] for r in lines if not r["ok"]})
            print(f"{script} on {procs}: {len({r['function'] for r in lines})} functions, failed: {failed}",
                  flush=True)
    return results


def compare(real_file: str, ember_file: str) -> None:
    def outcomes(path: str) -> dict[tuple[str, int, str], bool]:
        out: dict[tuple[str, int, str], bool] = {}
        for r in json.loads(Path(path).read_text()):
            key = (r["script"], r["processes"], r["function"])
            out[key] = out.get(key, True) and r["ok"]  # a function fails if it fails on any rank
        return out

    real, ember = outcomes(real_file), outcomes(ember_file)
    for key in sorted(set(real) | set(ember)):
        if real.get(key) != ember.get(key):
            print(f"{key}: Accelerate {real.get(key)}, Ember {ember.get(key)}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Accelerate's test scripts against the engine")
    parser.add_argument("--real", action="store_true", help="run the real Accelerate instead of the shim")
    parser.add_argument("--accelerate-dir", default=DEFAULT_ACCELERATE)
    parser.add_argument("--scripts", nargs="*", default=SCRIPTS)
    parser.add_argument("--out", default=None, help="write every outcome to this JSON file")
    parser.add_argument("--skip", nargs="*", default=[], help="test functions not to run (reported as skipped)")
    parser.add_argument("--child", nargs=3, metavar=("SCRIPT", "PROCESSES", "RESULTS_DIR"))
    parser.add_argument("--compare", nargs=2, metavar=("REAL_JSON", "EMBER_JSON"))
    args = parser.parse_args()
    if args.compare:
        compare(*args.compare)
        return
    if not args.real:
        sys.meta_path.insert(0, _Finder(Path(args.accelerate_dir)))
    if args.child:
        run_script(args.child[0], int(args.child[1]), args.child[2], args.skip)
        return
    results = run_all(args.real, args.scripts, args.accelerate_dir, args.skip)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
