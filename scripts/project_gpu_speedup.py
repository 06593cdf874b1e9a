"""Projected GPU speedups: acceptance measured on a CPU, pass costs measured on a GPU.

Draft-model chains (scripts/gpu_check.py's part seed calls chain_table): a CPU run's acceptance by depth (the chance
that a chain's i-th token is kept once the first i - 1 are) gives the tokens a pass of K drafts confirms, and the
device's costs of a proposal of K tokens and a verify block of K + 1 rows give its price, for each target shape.

Copying drafters (this script's command line):

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


# ---------------------------------------------------------------------- draft-model chains (the part seed)
def depth_rates(bench: dict, method: str = "draft") -> list[float]:
    """The chance that a draft chain's i-th token is kept once its first i - 1 are (i = 1, 2, ...), from a CPU
    benchmark's acceptance_by_depth, up to the first depth that was never judged."""
    per = {int(d): cell for d, cell in (bench.get("acceptance_by_depth", {}).get(method) or {}).items()}
    rates = []
    while len(rates) + 1 in per and per[len(rates) + 1]["judged"]:
        rates.append(per[len(rates) + 1]["rate"])
    return rates


def expected_tokens(rates: list[float], k: int) -> float:
    """Tokens a pass confirms with a chain of k drafts: the target's own token, plus each draft token kept, which
    needs every one before it kept (depths past the measured ones keep the deepest measured rate)."""
    total, kept = 1.0, 1.0
    for depth in range(k):
        kept *= rates[min(depth, len(rates) - 1)]
        total += kept
    return total


def chain_speedups(target: dict, proposals: dict, rates: list[float], overhead: float = 0.0) -> dict[int, float]:
    """Projected decode speedup of chains of each K over plain decoding: a pass costs one proposal of K tokens and
    a verify block of K + 1 rows, plain decoding a step per token (overhead: the engine's time per pass beside it)."""
    def at(costs: dict, key: int) -> float:
        return costs[key] if key in costs else costs[str(key)]

    step = target["step"] + overhead
    return {int(k): expected_tokens(rates, int(k)) * step / (at(proposals, k) + at(target["verify"], int(k) + 1)
                                                               + overhead)
            for k in proposals if str(int(k) + 1) in map(str, target["verify"])}


def chain_table(data: dict, bench: dict, label: str) -> list[str]:
    """The part seed's projection for one CPU benchmark: each target's best K and its speedup, and K = 4's."""
    rates = depth_rates(bench)
    if not rates:
        return [f"- {label}: no draft chains' acceptance by depth (`specdecode bench --drafters draft`)"]
    command = bench.get("config", {}).get("command", "?")
    lines = [f"Projected, not measured: draft-model chains with the acceptance by depth of `{command}` on a CPU"
             f" ({label}; kept at depth 1..{len(rates)}: {', '.join(f'{r:.2f}' for r in rates)}), at the GPU"
             " costs above. Where no K pays, the engine stops drafting (1.0x).", "",
             "| target | best K | tokens per pass | projected speedup | K=4 |", "|---|---|---|---|---|"]
    for name, target in data["targets"].items():
        speedups = chain_speedups(target, data["draft"]["proposals"], rates)
        best = max(speedups, key=speedups.get)
        lines.append(f"| {name} | {best} | {expected_tokens(rates, best):.2f} | {max(1.0, speedups[best]):.2f}x |"
                     f" {speedups.get(4, float('nan')):.2f}x |")
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
