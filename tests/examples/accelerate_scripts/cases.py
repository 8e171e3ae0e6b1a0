"""The runs recorded with the real Accelerate (record.py) and repeated with the engine (the tests).

Each case: (script, processes, [argument lists]); the runs go in order in one working folder, and the last
one's result is the recorded value (earlier runs write the checkpoints it resumes from).
"""

from __future__ import annotations

# 1 process: 7 training batches per epoch; 2 processes: 4 per process (56 samples, batches of 8).
CASES: dict[str, tuple[str, int, list[list[str]]]] = {}
for procs, per_epoch in ((1, 7), (2, 4)):
    mid = per_epoch + 2  # two batches into epoch 1
    CASES |= {
        f"checkpointing_full_{procs}": ("checkpointing.py", procs, [["--checkpointing_steps", "1"]]),
        f"checkpointing_mid_epoch_{procs}": ("checkpointing.py", procs, [
            ["--checkpointing_steps", str(mid)], ["--resume_from_checkpoint", f"step_{mid}"]]),
        f"checkpointing_epoch_end_step_{procs}": ("checkpointing.py", procs, [
            ["--checkpointing_steps", str(per_epoch)], ["--resume_from_checkpoint", f"step_{per_epoch}"]]),
        f"checkpointing_epoch_{procs}": ("checkpointing.py", procs, [
            ["--checkpointing_steps", "epoch"], ["--resume_from_checkpoint", "epoch_0"]]),
        f"local_sgd_{procs}": ("local_sgd.py", procs, [["--local_sgd_steps", "3"]]),
        f"profiler_{procs}": ("profiler.py", procs, [["--record_shapes", "--with_flops", "--output_trace_dir",
                                                       "traces"]]),
        f"memory_{procs}": ("memory.py", procs, [[]]),
        f"early_stopping_{procs}": ("early_stopping.py", procs, [[]]),
        f"multi_process_metrics_{procs}": ("multi_process_metrics.py", procs, [[]]),
        f"autoregressive_accumulation_{procs}": ("autoregressive_accumulation.py", procs, [[]]),
    }
