"""Lightning conformance: run Lightning's own tests on Lightning, then on Ember through a shim, and compare.

    python tests/parity_scripts/lightning_conformance.py /work/lightning-src --python /tmp/venv-pl44/bin/python \\
        --folders all --results /tmp/conf40 --timeout 60 [--side ember] [--failures] [--excluded]

``--folders all`` runs every ``test_*.py`` under Lightning's ``tests/tests_pytorch/`` folders ``callbacks``,
``checkpointing``, ``trainer``, ``loggers``, ``core``, ``tuner`` and ``models`` (or name some of them:
``--folders callbacks trainer``); ``--files`` names single files (without either: issue 27's 20 files, ``--wide``
adds its wider set). ``/work/lightning-src`` is a checkout of Lightning's repository at the tag of the installed
``lightning``; ``--python`` is a throwaway interpreter with torch, that ``lightning``, pytest, pytest-timeout and
the test requirements, plus Ember's dependencies (safetensors, xxhash, pyyaml). Nothing of Lightning's is copied
into this project: its tests run from the checkout.

Each test file runs twice, in separate pytest processes from the checkout's root (so its pytest settings apply):

- on **Lightning**: the real package, Lightning's own conftest;
- on **Ember**: ``conformance/shim`` first on ``sys.path`` (a fake ``lightning`` whose public names are Ember's,
  see ``ember_lightning_shim``), this repository next, ``--noconftest`` and ``conformance/ember_harness.py``
  in place of Lightning's conftest (which imports Lightning's machinery).

Of the tests that pass on Lightning, each is counted as passing on Ember, **excluded** with a reason class
(``EXCLUSIONS``: a Lightning internal the shim refused, ``LightningInternalUsed``; a private name, including the
logger-mock fixtures that set Lightning's private availability flags; a fixture mocking Lightning's device
registry; a GPU/TPU/MPS-only name or error; a package not installed; a trainer plugin attribute), or failing on
Ember (with the first line of its error). Classification is by the failure only, and conservative: anything not
recognised as Lightning's internals counts as an Ember failure (a strategy's public attributes, the loop objects
and checkpoints read as files are public behaviour). Printed: the table per file, the table per folder with the
total, the exclusions by reason class and the largest failure classes; ``--failures`` lists every failing test
with its reason, ``--excluded`` every excluded one. Results are kept per side and file under ``--results``
(``--lightning-results``: the Lightning side's, when several Ember runs compare with one Lightning run); the
Lightning side is reused from there unless ``--rerun-lightning``; ``--missing-only`` lets several runners share a
folder. A run over the seven folders takes about an hour a side on two busy cores.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PLUGINS = os.path.join(HERE, "conformance")
SHIM = os.path.join(PLUGINS, "shim")

# The files issue 27 names first.
NAMED = (
    "callbacks/test_early_stopping.py", "callbacks/test_lr_monitor.py", "callbacks/test_timer.py",
    "callbacks/test_weight_averaging.py", "callbacks/test_prediction_writer.py",
    "checkpointing/test_model_checkpoint.py",
    "trainer/flags/test_barebones.py", "trainer/flags/test_check_val_every_n_epoch.py",
    "trainer/flags/test_env_vars.py", "trainer/flags/test_fast_dev_run.py", "trainer/flags/test_inference_mode.py",
    "trainer/flags/test_limit_batches.py", "trainer/flags/test_min_max_epochs.py",
    "trainer/flags/test_overfit_batches.py", "trainer/flags/test_val_check_interval.py",
    "trainer/logging_/test_train_loop_logging.py", "trainer/optimization/test_optimizers.py",
    "core/test_lightning_module.py", "loggers/test_csv.py", "tuner/test_lr_finder.py",
)
# The wider public-behaviour set (--wide).
WIDER = (
    "callbacks/test_callbacks.py", "callbacks/test_lambda_function.py", "callbacks/test_finetuning_callback.py",
    "callbacks/test_gradient_accumulation_scheduler.py", "callbacks/test_model_summary.py",
    "callbacks/test_device_stats_monitor.py", "callbacks/test_spike.py", "callbacks/test_pruning.py",
    "callbacks/test_rich_model_summary.py", "callbacks/test_throughput_monitor.py",
    "callbacks/test_stochastic_weight_avg.py", "callbacks/test_model_checkpoint_additional_cases.py",
    "callbacks/test_model_checkpoint_edge_cases.py", "callbacks/test_model_checkpoint_manual_opt.py",
    "callbacks/test_model_checkpoint_step_interval_val_metric.py", "callbacks/test_callback_hook_outputs.py",
    "checkpointing/test_checkpoint_callback_frequency.py", "checkpointing/test_trainer_checkpoint.py",
    "core/test_datamodules.py", "core/test_lightning_optimizer.py", "core/test_saving.py",
    "loggers/test_tensorboard.py", "loggers/test_logger.py", "loggers/test_all.py",
    "trainer/logging_/test_eval_loop_logging.py", "trainer/logging_/test_loop_logging.py",
    "trainer/optimization/test_manual_optimization.py", "trainer/optimization/test_multiple_optimizers.py",
    "trainer/optimization/test_backward_calls.py", "trainer/test_dataloaders.py", "trainer/test_states.py",
    "tuner/test_scale_batch_size.py", "tuner/test_tuning.py",
)

# The folders issue 40 measures whole (``--folders all``).
FOLDERS = ("callbacks", "checkpointing", "trainer", "loggers", "core", "tuner", "models")

# Trainer attributes that are Lightning's plugin machinery, not its public behaviour (the loop objects are public:
# Ember answers them with views, trainer.compat.loop_views).
INTERNAL_TRAINER_ATTRIBUTES = {"precision_plugin", "checkpoint_io", "profiler_connector"}
# Fixtures of Lightning's conftest that mock its accelerator registry.
INTERNAL_FIXTURES = {"cuda_count_0", "cuda_count_1", "cuda_count_2", "cuda_count_4", "mps_count_0", "mps_count_1",
                     "xla_available", "tpu_available"}
# Fixtures of Lightning's loggers/conftest.py: each mocks a logger package by setting Lightning's private
# availability flag (e.g. lightning.pytorch.loggers.wandb._WANDB_AVAILABLE).
PRIVATE_FLAG_FIXTURES = {"mlflow_mock": "_MLFLOW_AVAILABLE", "wandb_mock": "_WANDB_AVAILABLE",
                         "comet_mock": "_COMET_AVAILABLE", "litlogger_mock": "_LITLOGGER_AVAILABLE"}
# An error that says the test needs a device this machine lacks (Lightning passed it by mocking the device).
DEVICE_ONLY = re.compile(r"Torch not compiled with CUDA enabled|Found no NVIDIA driver|No CUDA GPUs are available|"
                         r"MPS (?:backend )?(?:is )?not available|XLA|TPU")
# The reason classes of an exclusion, in the order the report lists them.
EXCLUSIONS = ("Lightning internal (shim)", "private name", "device-registry fixture", "GPU/TPU/MPS-only",
              "package not installed", "trainer plugin attribute")


def classify(entry: dict) -> tuple[str, str]:
    """(kind, reason) of one Ember outcome: kind is passed / excluded / failed; an exclusion's reason starts with
    its class (``EXCLUSIONS``). Conservative: anything not recognised as Lightning's internals is a failure."""
    outcome = entry["outcome"]
    if outcome in ("passed", "xfailed"):
        return "passed", ""
    if outcome == "skipped":
        return "failed", "skipped on Ember"
    text = entry.get("text", "")
    match = re.search(r"<device only: ([\w.]+)>", text)
    if match:
        return "excluded", f"GPU/TPU/MPS-only: {match.group(1)}"
    match = re.search(r"<lightning internal: ([\w.]+)>", text)
    if match:
        return "excluded", f"Lightning internal (shim): {match.group(1)}"
    match = re.search(r"fixture '(\w+)' not found", text)
    if match and match.group(1) in INTERNAL_FIXTURES:
        return "excluded", f"device-registry fixture: {match.group(1)}"
    if match and match.group(1) in PRIVATE_FLAG_FIXTURES:
        return "excluded", f"private name: {PRIVATE_FLAG_FIXTURES[match.group(1)]} (fixture {match.group(1)})"
    match = re.search(r"(?:has no attribute|does not have the attribute) '(_\w+)'", text)
    if match:
        return "excluded", f"private name: {match.group(1)}"
    match = re.search(r"'Trainer' object has no attribute '(\w+)'", text)
    if match and match.group(1) in INTERNAL_TRAINER_ATTRIBUTES:
        return "excluded", f"trainer plugin attribute: trainer.{match.group(1)}"
    first = text.strip().splitlines()[0] if text.strip() else outcome
    if first.startswith("ImportError while importing test module"):  # the cause is on the traceback's "E" line
        first = "collection: " + next((m.group(1) for m in re.finditer(r"^E\s+(.+)$", text, re.MULTILINE)), first)
    match = DEVICE_ONLY.search(first)
    if match:
        return "excluded", f"GPU/TPU/MPS-only: {match.group(0)}"
    match = re.search(r"No module named '(\w+)", first)
    if match and match.group(1) not in ("lightning", "trainer", "engine", "callbacks", "trackers") and \
            importlib.util.find_spec(match.group(1)) is None:
        return "excluded", f"package not installed: {match.group(1)}"
    return "failed", first[:240]


def folder_files(checkout: str, folders: tuple[str, ...]) -> list[str]:
    """Every ``test_*.py`` under the named folders of ``tests/tests_pytorch``, sorted (paths relative to it)."""
    base = os.path.join(checkout, "tests", "tests_pytorch")
    files = []
    for folder in folders:
        top = os.path.join(base, folder)
        if not os.path.isdir(top):
            raise SystemExit(f"--folders: no folder {folder!r} under {base}; expected some of {FOLDERS}.")
        for directory, _, names in os.walk(top):
            files += [os.path.relpath(os.path.join(directory, n), base) for n in names
                      if n.startswith("test_") and n.endswith(".py")]
    return sorted(files)


def run_side(side: str, python: str, checkout: str, test_file: str, results: str, extra: list[str],
             timeout: int) -> str:
    """Run one test file on one side; return the path of its JSON-lines report."""
    name = test_file.replace("/", "__").replace(".py", "")
    report = os.path.join(results, f"{side}__{name}.jsonl")
    env = dict(os.environ, CONFORMANCE_REPORT=report, LIGHTNING_CHECKOUT=checkout, PYTHONDONTWRITEBYTECODE="1")
    tests_dir = os.path.join(checkout, "tests")
    args = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conformance_report", "--color=no",
            f"--timeout={timeout}", os.path.join("tests", "tests_pytorch", test_file), *extra]
    if side == "lightning":
        env["PYTHONPATH"] = os.pathsep.join([PLUGINS, tests_dir])
    else:
        env["PYTHONPATH"] = os.pathsep.join([SHIM, PLUGINS, ROOT, tests_dir])
        args[4:4] = ["--noconftest", "-p", "ember_harness"]
    with open(report.replace(".jsonl", ".log"), "w") as log:
        subprocess.run(args, cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    return report


def read(report: str) -> dict[str, dict]:
    entries: dict[str, dict] = {}
    if os.path.exists(report):
        with open(report) as f:
            for line in f:
                entry = json.loads(line)
                entries[entry["nodeid"]] = entry
    return entries


# Ember's names of the classes the shim stands in for Lightning's: a test parametrized by the class itself gets
# Ember's name in its id (test_x[TrainModule]); it is the same test as Lightning's test_x[LightningModule].
SHIM_CLASS_NAMES = {"TrainModule": "LightningModule", "DataModule": "LightningDataModule"}


def lightning_id(nodeid: str) -> str:
    """``nodeid`` with the shim's class names in its parameters as Lightning's.

    >>> lightning_id("t.py::test_ignore[TrainModule]"), lightning_id("t.py::test_x[DataModule-2]")
    ('t.py::test_ignore[LightningModule]', 't.py::test_x[LightningDataModule-2]')
    """
    name, bracket, params = nodeid.partition("[")
    for ember_name, lightning_name in SHIM_CLASS_NAMES.items():
        params = re.sub(rf"\b{ember_name}\b", lightning_name, params)
    return name + bracket + params


def compare(lightning: dict[str, dict], ember: dict[str, dict]) -> dict[str, list]:
    """Tests passing on Lightning, split by their Ember kind (a collection error fails the file's tests)."""
    ember = {**ember, **{lightning_id(n): e for n, e in ember.items()}}
    collection = [e for n, e in ember.items() if n.endswith("::<collection>")]
    kinds: dict[str, list] = collections.defaultdict(list)
    for nodeid, entry in lightning.items():
        if entry["outcome"] not in ("passed", "xfailed"):
            continue
        outcome = ember.get(nodeid) or (collection[0] if collection else {"outcome": "failed", "text": "not run"})
        kind, reason = classify(outcome)
        kinds[kind].append((nodeid, reason))
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", help="a Lightning checkout (the tag of the installed lightning)")
    parser.add_argument("--python", default=sys.executable, help="interpreter with lightning, pytest, Ember's deps")
    parser.add_argument("--files", nargs="*", help="test files under tests/tests_pytorch (default: issue 27's)")
    parser.add_argument("--wide", action="store_true", help="also the wider public-behaviour files")
    parser.add_argument("--folders", nargs="*", help="whole folders under tests/tests_pytorch (every test_*.py "
                        f"in them, recursively), e.g. {' '.join(FOLDERS)}; 'all' names those")
    parser.add_argument("--results", default=os.path.join("/tmp", "lightning-conformance"))
    parser.add_argument("--side", choices=("both", "lightning", "ember", "none"), default="both",
                        help="which sides to run now ('none': only report what is stored)")
    parser.add_argument("--lightning-results", help="where the Lightning side's results are (default: --results), "
                        "to compare several Ember runs with one Lightning run")
    parser.add_argument("--rerun-lightning", action="store_true")
    parser.add_argument("--missing-only", action="store_true",
                        help="run a side only for files it has no results for yet (several runners can then share "
                             "one --results folder, each taking the files the others have not started)")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (both sides)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test")
    parser.add_argument("--failures", action="store_true", help="list every Ember failure with its reason")
    parser.add_argument("--excluded", action="store_true", help="list every excluded test with its reason")
    args = parser.parse_args()
    checkout = os.path.abspath(args.checkout)
    os.makedirs(args.results, exist_ok=True)
    if args.folders:
        folders = FOLDERS if args.folders == ["all"] else tuple(args.folders)
        files = folder_files(checkout, folders) + list(args.files or [])
    else:
        files = list(args.files or NAMED) + (list(WIDER) if args.wide and not args.files else [])
    extra = ["-k", args.keyword] if args.keyword else []

    rows, failures, excluded = [], [], []
    for test_file in files:
        name = test_file.replace("/", "__").replace(".py", "")
        reports = {}
        for side in ("lightning", "ember"):
            results = args.lightning_results if side == "lightning" and args.lightning_results else args.results
            stored = os.path.join(results, f"{side}__{name}.jsonl")
            done = os.path.exists(stored) or (args.missing_only and os.path.exists(stored.replace(".jsonl", ".log")))
            run_now = args.side in ("both", side) and not (done and (side == "lightning" or args.missing_only)
                                                            and not args.rerun_lightning and not extra)
            if run_now:
                start = time.time()
                run_side(side, args.python, checkout, test_file, results, extra, args.timeout)
                print(f"  ran {side:9} {test_file} in {time.time() - start:.0f} s", file=sys.stderr, flush=True)
            reports[side] = read(stored)
        if extra:  # a -k subset: compare only the tests that ran on Ember
            reports["lightning"] = {n: e for n, e in reports["lightning"].items() if n in reports["ember"]}
        kinds = compare(reports["lightning"], reports["ember"])
        rows.append({"file": test_file, "lightning": sum(len(v) for v in kinds.values()),
                     "ember": len(kinds["passed"]), "excluded": len(kinds["excluded"]),
                     "failed": len(kinds["failed"])})
        failures += [(test_file, n, r) for n, r in kinds["failed"]]
        excluded += [(test_file, n, r) for n, r in kinds["excluded"]]
    report(rows, failures, excluded, args.failures, args.excluded)


def folder_of(test_file: str) -> str:
    return test_file.split("/", 1)[0] if "/" in test_file else "."


def report(rows: list[dict], failures: list[tuple[str, str, str]], excluded: list[tuple[str, str, str]],
           list_failures: bool, list_excluded: bool) -> None:
    """Print the per-file table, the per-folder table with the total, the exclusions by reason class and the
    largest failure classes (``--failures`` / ``--excluded``: every test)."""
    folders: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in rows:
        folders[folder_of(row["file"])].update({k: v for k, v in row.items() if k != "file"})
    total = sum(folders.values(), collections.Counter())
    width = max(len(r["file"]) for r in rows) + 2

    def table(title: str, named: list[tuple[str, collections.Counter | dict]]) -> None:
        header = f"{title:{width}}{'Lightning':>10}{'Ember':>8}{'excluded':>10}{'failing':>9}{'share':>8}"
        print(header)
        print("-" * len(header))
        for label, row in named:
            public = row["lightning"] - row["excluded"]
            share = f"{100 * row['ember'] / public:.1f}%" if public else "-"
            print(f"{label:{width}}{row['lightning']:>10}{row['ember']:>8}{row['excluded']:>10}"
                  f"{row['failed']:>9}{share:>8}")

    table("test file", [(r["file"], r) for r in rows])
    print()
    table("folder", [(f, folders[f]) for f in sorted(folders)] + [("total", total)])
    print("\nLightning: tests passing on Lightning; Ember: of those, passing on Ember; excluded: they use Lightning "
          "internals (reason classes below); failing: everything else; share: Ember / (Lightning - excluded).")
    by_class = collections.Counter(reason.split(":", 1)[0] for _, _, reason in excluded)
    print("\nExcluded, by reason class:")
    for reason_class in EXCLUSIONS:
        print(f"  {by_class.get(reason_class, 0):5}  {reason_class}")
    by_reason = collections.Counter(failure_class(reason) for _, _, reason in failures)
    print("\nLargest failure classes (first error line, numbers and paths blanked):")
    for reason, count in by_reason.most_common(25):
        print(f"  {count:5}  {reason}")
    if list_failures:
        print("\nFailing on Ember:")
        for test_file, nodeid, reason in failures:
            print(f"  {nodeid.split('::', 1)[-1]}  [{test_file}]\n      {reason}")
    if list_excluded:
        print("\nExcluded:")
        for test_file, nodeid, reason in excluded:
            print(f"  {nodeid.split('::', 1)[-1]}  [{test_file}]  {reason}")


def failure_class(reason: str) -> str:
    """A failure's first error line with the parts that differ per test (numbers, paths, quoted values) blanked,
    so that failures of one cause count together."""
    reason = re.sub(r"(/[\w.\-]+)+", "<path>", reason)
    reason = re.sub(r"\b\d+(\.\d+)?\b", "N", reason)
    return re.sub(r"(tensor|Tensor)\(.*", r"\1(...)", reason)[:160]

if __name__ == "__main__":
    main()
