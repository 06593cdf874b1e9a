"""specdecode tune: measure alpha and costs on sample prompts, predict the best drafter and K, check it."""
from __future__ import annotations

import sys

from ..sampling import SamplingParams
from ..stats import predicted_speedup
from .prompts import find_bench_dir, load_suite


def run_tune_cli(args) -> int:
    from ..cli import build_engine

    prompts = load_suite(args.suite, find_bench_dir(args.bench_dir), args.limit)
    engine, default_drafter = build_engine(args)
    drafters = (["draft"] if engine.draft is not None else []) + ["lookup"]
    max_k = 8
    engine.calibrate(max_k, engine.drafter("draft") if engine.draft is not None else None)
    greedy = SamplingParams()

    def run(drafter, k):
        tokens = seconds = accepted = drafted = 0
        for p in prompts:
            engine.reset()
            r = engine.generate(p.turns[0], drafter=drafter, k=k, sampling=greedy, max_new_tokens=args.max_new_tokens)
            tokens += r.stats.generated_tokens
            seconds += r.stats.time_total
            accepted += r.stats.accepted
            drafted += r.stats.drafted
        return tokens / seconds, (accepted / drafted if drafted else 0.0)

    print(f"measuring plain decoding on {len(prompts)} {args.suite} prompts ...", file=sys.stderr)
    base_tps, _ = run("none", 0)
    single = engine.costs.target_cost(1)
    best = ("none", 0, 1.0)
    print(f"plain decoding: {base_tps:.2f} tok/s; target step {1000 * single:.0f} ms")
    print("| drafter | alpha (at K=8) | c | best K | predicted speedup |")
    print("|---|---|---|---|---|")
    for drafter in drafters:
        _, alpha = run(drafter, max_k)
        c = engine.costs.draft.get(drafter, 0.0) / single
        options = []
        for k in range(1, max_k + 1):
            verify_ratio = engine.costs.target_cost(k + 1) / single
            options.append((predicted_speedup(alpha, k, c, verify_ratio), k))
        speed, k = max(options)
        print(f"| {drafter} | {alpha:.2f} | {c:.3f} | {k} | {speed:.2f}x |")
        if speed > best[2]:
            best = (drafter, k, speed)
    drafter, k, predicted = best
    if drafter == "none":
        print("best: plain decoding (no drafter is predicted to pay on these prompts)")
        return 0
    measured_tps, alpha = run(drafter, k)
    print(f"best: --draft {'lookup' if drafter == 'lookup' else engine.draft.name} --k {k}: predicted {predicted:.2f}x,"
          f" measured {measured_tps / base_tps:.2f}x ({measured_tps:.2f} vs {base_tps:.2f} tok/s, alpha {alpha:.2f})")
    return 0
