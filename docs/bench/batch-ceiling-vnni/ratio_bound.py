"""How far can 4 clients' aggregate rise above one client's, when each client already speculates?

Greedy speculation with a per-token acceptance alpha: a draft of K tokens yields (1 - alpha^(K+1)) / (1 - alpha)
tokens per target pass. A pass of R rows costs cost(R). One client picks the K that maximises its tokens per
second; four clients share each pass and pick the K that maximises the pass's tokens per second. Two costs:

- measured: this machine's pass costs (scripts/step_costs.py, the final kernel; linear past 64 rows);
- ideal: the memory-bound step M until the arithmetic at the CPU's measured vpdpbusd peak (vnni_peak.c) takes
  longer, i.e. max(M, R * m): a kernel at 100% of peak that overlaps memory and arithmetic perfectly.

Geometric acceptance flatters batching: copied drafts come in bursts that one client alone can verify at length.

    .venv/bin/python docs/bench/batch-ceiling-vnni/ratio_bound.py
"""
import numpy as np

from specdecode.stats import expected_tokens_per_pass

MAC_PER_ROW = 1.544  # G multiply-adds a row of Qwen2.5-Coder-1.5B (28 layers of 46.8 M, the 233 M head)
PEAK = 464.0         # G MAC/s: vnni_peak.c on both cores
M = 41.0             # ms: one row, measured (scripts/step_costs.py, report.md)
ROWS = [1, 8, 16, 32, 64]
MEASURED_MS = [41.0, 74.6, 130.3, 240.2, 450.5]  # scripts/step_costs.py at the final kernel (report.md)


def best_rate(clients: int, alpha: float, cost) -> float:
    """Tokens per ms at the best K shared by every client."""
    return max(clients * expected_tokens_per_pass(alpha, k) / cost(clients * (k + 1)) for k in range(40))


def ideal(rows: int) -> float:
    return max(M, rows * MAC_PER_ROW / PEAK * 1e3)


def measured(rows: int) -> float:
    return float(np.interp(rows, ROWS, MEASURED_MS)) if rows <= ROWS[-1] else MEASURED_MS[-1] * rows / ROWS[-1]


if __name__ == "__main__":
    print("| alpha | ideal kernel: 1 client tok/s | 4 clients | ratio | measured kernel: 1 client | 4 clients | ratio |")
    print("|---|---|---|---|---|---|---|")
    for alpha in (0.6, 0.7, 0.75, 0.8, 0.85, 0.9):
        i1, i4 = (best_rate(n, alpha, ideal) * 1e3 for n in (1, 4))
        m1, m4 = (best_rate(n, alpha, measured) * 1e3 for n in (1, 4))
        print(f"| {alpha} | {i1:.0f} | {i4:.0f} | {i4 / i1:.2f}x | {m1:.0f} | {m4:.0f} | {m4 / m1:.2f}x |")
