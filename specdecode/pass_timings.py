"""Timing passes apart from decoding: what a target pass of each block size, and a draft pass, cost on this machine.

The adaptive K and the batch planner start from these timings. A model's timings are kept for the life of the
process, per model object and thread count: every engine over the same loaded model (those a Python program or a
test suite builds one after another) starts from them instead of timing the same passes again. A model loaded from
files (load_model calls keep_on_disk) also keeps them in the cache folder, per machine: a later process on the same
machine, model files, precision and device reads them instead of spending seconds timing passes before its first
answer. Each engine's tuner keeps its own estimates from there, refined by the steps it runs.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import threading
import time
import weakref
from pathlib import Path

import torch

# model object -> {(threads, what was timed): seconds}; a model's entry goes with the model
_TIMED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# model object -> the file its timings are kept in on this machine (models loaded from files only)
_ON_DISK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
measurements = 0  # passes this process has timed (those read from the cache folder not counted)


def wait_for_device(device) -> None:
    """Return once `device` has run the work queued on it (nothing to wait for on a CPU). A GPU pass returns as soon
    as it is launched: timed without this, a batched pass would cost what its launch costs, and the tuner would take
    verifying rows for nearly free while the draft passes (whose proposals read their logits) cost their device
    time. The pass's results are read right after anyway, so the wait adds nothing to the step."""
    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize(device)


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
    """The timing of `what` on `model` at this thread count: this process's, else this machine's (kept on disk),
    else measure() now (and kept)."""
    global measurements
    record = _TIMED.setdefault(model, {})
    key = (torch.get_num_threads(), *what)
    if key not in record:
        path, name = _ON_DISK.get(model), " ".join(map(str, key))
        stored = _read(path).get(name) if path is not None else None
        if not isinstance(stored, float):
            stored = measure()
            measurements += 1
            if path is not None:
                _write(path, name, stored)
        record[key] = stored
    return record[key]


def keep_on_disk(model, files: str) -> None:
    """Keep `model`'s timings in the cache folder; `files` identifies what it was loaded from and how (paths, sizes,
    times, precision, device). The machine's own identity is added here."""
    from .cachefiles import cache_dir

    digest = hashlib.sha256(f"{files}\n{machine_identity()}".encode("utf-8", "surrogateescape")).hexdigest()[:24]
    _ON_DISK[model] = cache_dir() / "timings" / f"{digest}.json"


def machine_identity() -> str:
    """What a pass's time depends on besides the model: the hardware (_hardware), torch, and which native kernel
    build and options run. A cache folder shared by several machines, or moved to another, times again. Never
    builds the kernel: a model on a GPU leaves it unloaded, and so does its identity."""
    from .kernels import native, options

    kernel = native.kernel_build_dir().name if native._kernel is not None else native.kernel_status()
    return f"{_hardware()}\ntorch {torch.__version__}\nkernel {kernel}\n{options.OPTIONS}"


@functools.cache
def _hardware() -> str:
    """The CPU (model, family, instruction sets, cores this process may use) and the GPUs."""
    try:
        cpu = "\n".join(sorted({line for line in Path("/proc/cpuinfo").read_text().splitlines()
                                if line.startswith(("model name", "flags", "cpu family", "model\t"))}))
    except OSError:
        cpu = platform.processor()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return f"{cpu}\ncores {cores}\ngpus {gpus}"


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # never timed here, or a damaged file: time again


def _write(path: Path, name: str, seconds: float) -> None:
    """Add one timing to the file (several processes may write: each rewrites the whole file atomically; at worst
    one's new timing is lost and measured again later)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {**_read(path), name: seconds}
        partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.partial")  # one per writer
        partial.write_text(json.dumps(record, indent=0, sort_keys=True))
        partial.replace(path)
    except OSError:
        pass  # a read-only cache folder: timings stay the process's
