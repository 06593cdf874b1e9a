"""specdecode tune: sweep drafters and fixed K on sample prompts, predict from alpha and costs, measure.

For each drafter and each K the sweep measures alpha, the share of steps on which the drafter
proposed anything (prompt lookup often finds no match) and tokens/s. The prediction is Leviathan's
expected tokens per pass with the measured verify cost of each block size, applied only to the
steps that drafted; the rest are plain steps. The adaptive policy (K=auto) is measured last.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..build import build_engine
from ..sampling import SamplingParams
from ..stats import expected_tokens_per_pass
from .prompts import find_bench_dir, load_suite

SWEEP_K = (1, 2, 4, 8)


def predict(alpha: float, k: int, c: float, verify_ratio: float, coverage: float) -> float:
    """Speedup when a fraction `coverage` of steps drafts k tokens (alpha, cost c each) and the rest are plain."""
    tokens = coverage * expected_tokens_per_pass(alpha, k) + (1 - coverage)
    cost = coverage * (k * c + verify_ratio) + (1 - coverage)
    return tokens / cost


def run_tune_cli(args) -> int:
    prompts = load_suite(args.suite, find_bench_dir(args.bench_dir), args.limit)
    engine, _ = build_engine(args, with_draft_model=True)
    drafters = (["draft"] if engine.draft is not None else []) + ["lookup"]
    max_k = max(SWEEP_K)
    engine.measure_costs(max_k, engine.drafter("draft") if engine.draft is not None else None)
    greedy = SamplingParams()

    def run(drafter, k) -> dict:
        tokens = seconds = accepted = drafted = steps = drafting_steps = 0
        for p in prompts:
            engine.reset()
            s = engine.generate(p.turns[0], drafter=drafter, k=k, sampling=greedy, max_new_tokens=args.max_new_tokens,
                                max_k=max_k).stats
            tokens += s.generated_tokens
            seconds += s.time_total - s.time_prefill  # decoding only: prefill is the same for every method
            accepted += s.accepted
            drafted += s.drafted
            steps += s.target_passes
            drafting_steps += sum(n for kk, n in s.steps_by_k.items() if kk > 0)
        return {"tokens_per_s": tokens / seconds if seconds else 0.0, "alpha": accepted / drafted if drafted else 0.0,
                "coverage": drafting_steps / steps if steps else 0.0, "tau": tokens / steps if steps else 0.0}

    print(f"measuring plain decoding on {len(prompts)} {args.suite} prompts ...", file=sys.stderr)
    base = run("none", 0)["tokens_per_s"]
    single = engine.tuner.costs.target_cost(1)
    print(f"plain decoding: {base:.2f} tok/s (decoding only, prefill excluded); target step {1000 * single:.0f} ms")
    print("| drafter | K | alpha | steps drafting | c | tau | predicted | measured |")
    print("|---|---|---|---|---|---|---|---|")
    sweep: dict[str, dict] = {}
    best = ("none", 0, 1.0)
    for drafter in drafters:
        c = (engine.tuner.costs.draft_cost(drafter) or 0.0) / single
        for k in (*SWEEP_K, "auto"):
            m = run(drafter, k)
            m["measured"] = m["tokens_per_s"] / base
            if k != "auto":
                m["predicted"] = predict(m["alpha"], k, c, engine.tuner.costs.target_cost(k + 1) / single, m["coverage"])
                if m["measured"] > best[2]:
                    best = (drafter, k, m["measured"])
            sweep.setdefault(drafter, {})[str(k)] = m
            pred = f"{m['predicted']:.2f}x" if "predicted" in m else "-"
            print(f"| {drafter} | {k} | {m['alpha']:.2f} | {m['coverage']:.0%} | {c:.3f} | {m['tau']:.2f} | {pred}"
                  f" | {m['measured']:.2f}x |", flush=True)
    drafter, k, measured = best
    auto = {d: sweep[d]["auto"]["measured"] for d in sweep}
    if drafter == "none":
        print("best: plain decoding (no drafter paid on these prompts)")
    else:
        name = "lookup" if drafter == "lookup" else engine.draft.name
        print(f"best fixed: --draft {name} --k {k}: measured {measured:.2f}x;"
              f" adaptive (--k auto): " + ", ".join(f"{d} {v:.2f}x" for d, v in auto.items()))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "tune.json").write_text(json.dumps({"plain_tokens_per_s": base, "sweep": sweep}, indent=1))
        plot_sweep(sweep, out / "alpha_vs_k.png", f"{args.suite}, {len(prompts)} prompts, {engine.target.name}")
        print(f"wrote {out / 'tune.json'} and {out / 'alpha_vs_k.png'}", file=sys.stderr)
    return 0


def plot_sweep(sweep: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_a, ax_s) = plt.subplots(1, 2, figsize=(10, 4))
    for drafter, by_k in sweep.items():
        ks = [int(k) for k in by_k if k != "auto"]
        ax_a.plot(ks, [by_k[str(k)]["alpha"] for k in ks], marker="o", label=drafter)
        ax_s.plot(ks, [by_k[str(k)]["measured"] for k in ks], marker="o", label=f"{drafter} measured")
        ax_s.plot(ks, [by_k[str(k)]["predicted"] for k in ks], linestyle="--", label=f"{drafter} predicted")
        if "auto" in by_k:
            ax_s.axhline(by_k["auto"]["measured"], linestyle=":", color=ax_s.lines[-1].get_color(), label=f"{drafter} auto K")
    ax_a.set(xlabel="K (draft length, fixed)", ylabel="alpha (accepted / drafted)", ylim=(0, 1.05), title="acceptance against K")
    ax_s.axhline(1.0, color="grey", linewidth=1)
    ax_s.set(xlabel="K (draft length, fixed)", ylabel="speedup vs plain decoding", title=title)
    ax_a.legend()
    ax_s.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
