"""Timing passes apart from decoding: what a target pass of each block size, and a draft pass, cost on this machine.

The adaptive K and the batch planner start from these timings. A model's timings are kept for the life of the
process, per model object and thread count: every engine over the same loaded model (those a Python program or a
test suite builds one after another) starts from them instead of timing the same passes again. Each engine's
tuner keeps its own estimates from there, refined by the steps it runs.
"""
from __future__ import annotations

import time
import weakref

import torch

# model object -> {(threads, what was timed): seconds}; a model's entry goes with the model
_TIMED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fastest(run, repeats: int) -> float:
    """The shortest of `repeats` timed calls of run(): a one-off stall (page faults, another process) must not make
    a pass look dear, since the policy would then avoid it and never time it again."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


def remembered(model, what: tuple, measure) -> float:
    """The process's timing of `what` on `model` at this thread count: measure() the first time it is asked for."""
    record = _TIMED.setdefault(model, {})
    key = (torch.get_num_threads(), *what)
    if key not in record:
        record[key] = measure()
    return record[key]
