"""--profile: where the time of a generation went, and what a verify block costs against one step."""
from __future__ import annotations

from . import kernels


def profile_report(engine, stats) -> str:
    total = stats.time_total or 1e-9
    phases = [("prefill", stats.time_prefill), ("draft", stats.time_draft),
              ("verify (target pass + accept/reject)", stats.time_verify), ("bookkeeping, detokenize, stop checks", stats.time_other)]
    lines = ["profile:", f"  matmul backend: {kernels.kernel_status()}; target {engine.target.name} ({engine.target.precision})"
             + (f", draft {engine.draft.name} ({engine.draft.dtype})" if engine.draft else "")]
    for name, seconds in phases:
        lines.append(f"  {name:40s} {seconds:8.3f}s  {100 * seconds / total:5.1f}%")
    single = engine.tuner.costs.target_cost(1)
    if single:
        lines.append(f"  target pass, 1 token: {1000 * single:.1f} ms")
        for block in sorted(engine.tuner.costs.target):
            if block > 1:
                cost = engine.tuner.costs.target_cost(block)
                lines.append(f"  target pass, {block:2d} tokens: {1000 * cost:7.1f} ms = {cost / single:.2f} single steps")
    for name in engine.tuner.costs.draft:
        cost = engine.tuner.costs.draft_cost(name)
        ratio = f" (c = {cost / single:.3f} of a target step)" if single else ""
        lines.append(f"  draft step ({name}): {1000 * cost:.1f} ms{ratio}")
    return "\n".join(lines)
