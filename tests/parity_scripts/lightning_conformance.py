"""Lightning conformance: run Lightning's own tests on Lightning, then on Ember through a shim, and compare.

    python tests/parity_scripts/lightning_conformance.py /work/lightning-src \\
        --python /work/venvs/lconf/bin/python [--files callbacks/test_timer.py ...] [--wide] [--failures]

``/work/lightning-src`` is a checkout of Lightning's repository at the tag of the installed ``lightning`` (2.6.5
here); ``--python`` is a throwaway interpreter with torch, that ``lightning``, pytest and the test requirements,
plus Ember's dependencies (safetensors, xxhash, pyyaml). Nothing of Lightning's is copied into this project: its
tests run from the checkout.

Each test file runs twice, in separate pytest processes from the checkout's root (so its pytest settings apply):

- on **Lightning**: the real package, Lightning's own conftest;
- on **Ember**: ``conformance/shim`` first on ``sys.path`` (a fake ``lightning`` whose public names are Ember's,
  see ``ember_lightning_shim``), this repository next, ``--noconftest`` and ``conformance/ember_harness.py``
  in place of Lightning's conftest (which imports Lightning's machinery).

Of the tests that pass on Lightning, each is counted as passing on Ember, **excluded** because it reads Lightning
internals (the shim's ``LightningInternalUsed``; a private attribute; ``trainer.fit_loop`` & co.; a strategy's
or accelerator object's attributes; a fixture mocking Lightning's device registry), **excluded as a promise**
(it reads a checkpoint as a file, where Ember writes a folder; it counts ``torch.save`` calls, and Ember wrote as
many checkpoints, each a folder of several files), or failing on Ember (with the first line of its error). Classification is by the failure only, and conservative: anything not recognised as
internals counts as an Ember failure. The per-file table and the total go to stdout; ``--failures`` lists every
failing test with its reason, ``--excluded`` every excluded one. Results are kept per side and file under
``--results``; the Lightning side is reused from there unless ``--rerun-lightning``.
"""

from __future__ import annotations

import argparse
import collections
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

# Trainer attributes that are Lightning's machinery (loops, plugin objects), not its public behaviour.
INTERNAL_TRAINER_ATTRIBUTES = {"fit_loop", "validate_loop", "test_loop", "predict_loop", "precision_plugin",
                               "checkpoint_io", "profiler_connector"}
# Fixtures of Lightning's conftest that mock its accelerator registry.
INTERNAL_FIXTURES = {"cuda_count_0", "cuda_count_1", "cuda_count_2", "cuda_count_4", "mps_count_0", "mps_count_1",
                     "xla_available", "tpu_available"}


def classify(entry: dict) -> tuple[str, str]:
    """(kind, reason) of one Ember outcome: kind is passed / internal / promise / failed / skipped."""
    outcome = entry["outcome"]
    if outcome in ("passed", "xfailed"):
        return "passed", ""
    if outcome == "skipped":
        return "skipped", "skipped on Ember"
    text = entry.get("text", "")
    if entry.get("folders"):
        return "promise", "checkpoints are folders (atomic, safe to load): the test reads one as a file"
    match = re.search(r"assert (\d+) == (\d+)", text)
    if match and "save_mock.call_count" in text and int(match.group(2)) and (
            int(match.group(1)) % int(match.group(2)) == 0):
        # A test counting torch.save calls (one per Lightning .ckpt file): Ember wrote as many checkpoints, each a
        # folder of several files (one torch.save per file), so the count is a whole multiple of Lightning's.
        return "promise", "counts torch.save calls: as many checkpoints, each a folder of several files"
    match = re.search(r"<lightning internal: ([\w.]+)>", text)
    if match:
        return "internal", f"uses {match.group(1)}"
    match = re.search(r"fixture '(\w+)' not found", text)
    if match and match.group(1) in INTERNAL_FIXTURES:
        return "internal", f"fixture {match.group(1)} (mocks Lightning's device registry)"
    match = re.search(r"(?:has no attribute|does not have the attribute) '(_\w+)'", text)
    if match:
        return "internal", f"private name {match.group(1)}"
    match = re.search(r"'Trainer' object has no attribute '(\w+)'", text)
    if match and match.group(1) in INTERNAL_TRAINER_ATTRIBUTES:
        return "internal", f"trainer.{match.group(1)}"
    match = re.search(r"'(\w*Strategy|Accelerator)' object has no attribute '(\w+)'", text)
    if match:
        return "internal", f"{match.group(1)}.{match.group(2)} (strategy / accelerator object)"
    first = text.strip().splitlines()[0] if text.strip() else outcome
    return "failed", first[:240]


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


def compare(lightning: dict[str, dict], ember: dict[str, dict]) -> dict[str, list]:
    """Tests passing on Lightning, split by their Ember kind (a collection error fails the file's tests)."""
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
    parser.add_argument("--results", default=os.path.join("/tmp", "lightning-conformance"))
    parser.add_argument("--side", choices=("both", "lightning", "ember", "none"), default="both",
                        help="which sides to run now ('none': only report what is stored)")
    parser.add_argument("--rerun-lightning", action="store_true")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (both sides)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test")
    parser.add_argument("--failures", action="store_true", help="list every Ember failure with its reason")
    parser.add_argument("--excluded", action="store_true", help="list every test excluded as internals")
    args = parser.parse_args()
    checkout = os.path.abspath(args.checkout)
    os.makedirs(args.results, exist_ok=True)
    files = list(args.files or NAMED) + (list(WIDER) if args.wide and not args.files else [])
    extra = ["-k", args.keyword] if args.keyword else []

    rows, totals = [], collections.Counter()
    failures, excluded = [], []
    for test_file in files:
        name = test_file.replace("/", "__").replace(".py", "")
        reports = {}
        for side in ("lightning", "ember"):
            stored = os.path.join(args.results, f"{side}__{name}.jsonl")
            run_now = args.side in ("both", side) and not (side == "lightning" and os.path.exists(stored)
                                                            and not args.rerun_lightning and not extra)
            if run_now:
                start = time.time()
                run_side(side, args.python, checkout, test_file, args.results, extra, args.timeout)
                print(f"  ran {side:9} {test_file} in {time.time() - start:.0f} s", file=sys.stderr)
            reports[side] = read(stored)
        if extra:  # a -k subset: compare only the tests that ran on Ember
            reports["lightning"] = {n: e for n, e in reports["lightning"].items() if n in reports["ember"]}
        kinds = compare(reports["lightning"], reports["ember"])
        on_lightning = sum(len(v) for v in kinds.values())
        row = {"file": test_file, "lightning": on_lightning, "ember": len(kinds["passed"]),
               "internal": len(kinds["internal"]), "promise": len(kinds["promise"]),
               "failed": len(kinds["failed"]) + len(kinds["skipped"])}
        rows.append(row)
        totals.update({k: v for k, v in row.items() if k != "file"})
        failures += [(test_file, n, r) for n, r in kinds["failed"] + kinds["skipped"]]
        excluded += [(test_file, n, r) for n, r in kinds["internal"] + kinds["promise"]]

    width = max(len(r["file"]) for r in rows) + 2
    header = (f"{'test file':{width}}{'Lightning':>10}{'Ember':>8}{'internals':>11}{'promises':>10}"
              f"{'failing':>9}{'share':>8}")
    print(header)
    print("-" * len(header))
    for row in rows + [{"file": "total", **totals}]:
        public = row["lightning"] - row["internal"] - row["promise"]
        share = f"{100 * row['ember'] / public:.0f}%" if public else "-"
        print(f"{row['file']:{width}}{row['lightning']:>10}{row['ember']:>8}{row['internal']:>11}"
              f"{row['promise']:>10}{row['failed']:>9}{share:>8}")
    print("\nLightning: tests passing on Lightning; Ember: of those, passing on Ember; internals: excluded (they "
          "read Lightning's machinery); promises: excluded (they contradict one of Ember's promises, e.g. a "
          "checkpoint read as a file, or its torch.save calls counted); share: Ember / (Lightning - internals - promises).")
    if args.failures:
        print("\nFailing on Ember:")
        for test_file, nodeid, reason in failures:
            print(f"  {nodeid.split('::', 1)[-1]}  [{test_file}]\n      {reason}")
    if args.excluded:
        print("\nExcluded as internals:")
        for test_file, nodeid, reason in excluded:
            print(f"  {nodeid.split('::', 1)[-1]}  [{test_file}]  {reason}")


if __name__ == "__main__":
    main()
