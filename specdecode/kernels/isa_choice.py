"""Which int8 path SPECDECODE_ISA=auto runs where the CPU has AMX: the tiles or the AVX-512 VNNI lanes, measured.

The two give the same bits (tests/models/test_quant_dot.py); they differ only in speed, and only for products of 16
rows or more (the tiles multiply interleaved Q4_K against 16 or 32 tokens; everything else runs VNNI's code on both).
Which of them is faster is not a property of the instruction set: the tiles are shared by a core's two hardware
threads, and on virtual machines of one Xeon class they read prompt chunks faster on one host and slower on another.
So the first process that needs the choice times both on a matrix the size of a 1.5B model's MLP projection and
keeps the winner next to the compiled kernel (one file per build, with the CPU it was measured on); every later
process reads it. Without AMX there is nothing to choose: auto is the kernel's best path (VNNI, else AVX2).
"""
from __future__ import annotations

import fcntl
import functools
import json
import statistics
import time
from pathlib import Path

import torch

from . import native
from .block_types import Q4_K_UNPACKED, Q4_K_X16

CHOICE_FILE = "isa_choice.json"
CANDIDATES = ("amx", "avx512-vnni")
# The measured work: 64-row prompt chunks and 16-row verify blocks over MATRICES matrices of ROWS x COLUMNS Q4_K
# weights (~8 MB each, 64 MB in all: more than the caches hold, as a model's weights are).
ROWS, COLUMNS, MATRICES, BLOCK_SIZES, REPEATS = 8960, 1536, 8, (16, 64), 5


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")


@functools.cache
def auto_isa() -> str:
    """The path "auto" means on this machine (measured at most once per kernel build and CPU model)."""
    kernel = native.load_kernel()
    if kernel is None:
        return "avx2"
    if "amx" not in kernel.quant_isa_paths():
        return kernel.quant_isa()
    return measured_choice(native.kernel_build_dir())["isa"]


def measured_choice(folder: Path, measure=None) -> dict:
    """The record of the choice kept in folder (measuring it first, under a lock, where it is missing, unreadable or
    made on another CPU model): {"isa", "cpu", "seconds": {path: median seconds of the measured work}}."""
    path = folder / CHOICE_FILE
    record = _read(path)
    if record is not None:
        return record
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "isa_choice.flock", "w") as guard:  # two first processes must not time each other
        fcntl.flock(guard, fcntl.LOCK_EX)
        record = _read(path)
        if record is None:
            seconds = (measure or time_paths)()
            record = {"isa": min(seconds, key=seconds.get), "cpu": cpu_model(), "seconds": seconds}
            partial = path.with_suffix(".partial")
            partial.write_text(json.dumps(record, indent=1))
            partial.replace(path)
    return record


def _read(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("isa") not in CANDIDATES or record.get("cpu") != cpu_model():
        return None
    return record


def time_paths(repeats: int = REPEATS) -> dict[str, float]:
    """Median seconds of the measured work on each candidate path, the paths taking turns within each repeat."""
    kernel = native.load_kernel()
    gen = torch.Generator().manual_seed(0)
    weights = [synthetic_q4k_x16(kernel, gen) for _ in range(MATRICES)]
    blocks = [torch.randn(rows, COLUMNS, generator=gen) for rows in BLOCK_SIZES]
    times: dict[str, list[float]] = {isa: [] for isa in CANDIDATES}
    for _ in range(repeats + 1):  # the first round only warms up
        for isa in CANDIDATES:
            started = time.perf_counter()
            for x in blocks:
                for w in weights:
                    kernel.quant_linear(x, [w], [Q4_K_X16], isa, -1)
            times[isa].append(time.perf_counter() - started)
    return {isa: round(statistics.median(t[1:]), 6) for isa, t in times.items()}


def synthetic_q4k_x16(kernel, gen: torch.Generator) -> torch.Tensor:
    """A ROWS x COLUMNS matrix of random Q4_K blocks (scales of 2^-7, so every product stays finite) in the kernel's
    interleaved layout."""
    blocks = torch.randint(0, 256, (ROWS, COLUMNS // 256, 144), dtype=torch.uint8, generator=gen)
    blocks[:, :, 0:4] = torch.tensor([0x00, 0x20, 0x00, 0x20], dtype=torch.uint8)  # d and dmin: float16 2^-7
    unpacked = kernel.repack_q4k(blocks.reshape(ROWS, -1))
    return kernel.interleave_k(unpacked, Q4_K_UNPACKED, True)
