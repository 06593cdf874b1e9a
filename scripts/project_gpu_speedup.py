"""Projected GPU speedups of copying drafters: acceptance measured on a CPU, pass costs measured on a GPU.

A projection, not a measurement: a workload's tokens per target pass (tau) and mean draft length (K) from a CPU
benchmark run of the real models (`specdecode bench`, results.json), combined with what the device check measured
on the GPU (scripts/gpu_check.py, results.json): the cost of a verify block of K+1 rows in single steps, and the
engine's own time per step beside the pass. For drafters whose drafts cost nothing to make (lookup, suffix), the
decode speedup over plain decoding is then

    tau * step / (pass(K+1) + overhead)

with step the engine's plain time per token, pass(R) the GPU pass of R rows and overhead the engine's time per
step outside the pass (engine step minus model step). Assumed, not known: that acceptance carries over. The GPU
computes the model in bfloat16 and the CPU in int8 (each exact against itself, not against the other), so their
greedy texts differ here and there; and the CPU's adaptive K chose its draft lengths from CPU costs, where a GPU's
cheaper verify blocks would let it draft more.

    .venv/bin/python scripts/project_gpu_speedup.py GPU_RESULTS.json BENCH_RESULTS.json [...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

COPYING = ("lookup", "suffix")


def pass_cost(costs: dict, rows: int) -> float:
    """Seconds of a pass of `rows` rows, interpolated between the measured row counts (1..16; beyond, the last)."""
    measured = sorted((int(r), s) for r, s in costs.items())
    for (r0, s0), (r1, s1) in zip(measured, measured[1:]):
        if r0 <= rows <= r1:
            return s0 + (s1 - s0) * (rows - r0) / (r1 - r0)
    return measured[-1][1]


def project(gpu: dict, bench: dict) -> list[str]:
    costs = gpu["verify blocks (1.5B shape, after 256 positions)"]["costs"]
    plain = gpu["plain decoding"]["1.5b"]
    step = 1 / plain["engine"]
    overhead = max(0.0, step - 1 / plain["ours"])
    lines = []
    for method, row in bench["summary"].items():
        if method not in COPYING or not row.get("tau") or row.get("mean_k") is None:
            continue
        rows = 1 + row["mean_k"]
        speedup = row["tau"] * step / (pass_cost(costs, round(rows)) + overhead)
        lines.append(f"| {bench['config']['suite']} | {method} | {row['tau']:.2f} | {row['mean_k']:.1f} |"
                     f" {row.get('decode_speedup', float('nan')):.2f}x | {speedup:.2f}x |")
    return lines


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit(__doc__)
    gpu = json.loads(Path(argv[0]).read_text())
    print("| workload | drafter | tau (CPU) | mean K | measured on the CPU | projected on the GPU |")
    print("|---|---|---|---|---|---|")
    for path in argv[1:]:
        print("\n".join(project(gpu, json.loads(Path(path).read_text()))))


if __name__ == "__main__":
    main(sys.argv[1:])
