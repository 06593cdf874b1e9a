"""What finding the top-p nucleus in a partial ranking saves, plain and speculative, in one process.

Arms over the same loaded model, alternating per prompt: greedy; temperature 0.7 with top_p 0.9 (seeded) with the
nucleus found by sorting the whole vocabulary (`NUCLEUS_HEADS = ()`, the cost of the code before); the same with the
partial ranking (now). Both top-p arms must give the same text (the floor is the same bits: tests/test_sampling.py).

    .venv/bin/python docs/experiments/nucleus_cost.py [--suite humaneval] [--limit 6] [--max-new-tokens 96]
"""
import argparse
import statistics
import time

from specdecode import sampling
from specdecode.bench.prompts import find_bench_dir, load_suite
from specdecode.build import EngineOptions, build_engine
from specdecode.sampling import SamplingParams

parser = argparse.ArgumentParser()
parser.add_argument("--suite", default="humaneval")
parser.add_argument("--limit", type=int, default=6)
parser.add_argument("--max-new-tokens", type=int, default=96)
parser.add_argument("--drafters", default="none,auto")
args = parser.parse_args()

engine, _ = build_engine(EngineOptions(model="qwen2.5-coder-1.5b"))
prompts = load_suite(args.suite, find_bench_dir(), args.limit)
nucleus = SamplingParams(temperature=0.7, top_p=0.9, seed=7)
arms = {"greedy": (SamplingParams(), sampling.NUCLEUS_HEADS), "top_p sorted": (nucleus, ()),
        "top_p ranked": (nucleus, sampling.NUCLEUS_HEADS)}
engine.generate([{"role": "user", "content": "Say hi."}], drafter="none", max_new_tokens=8)
print(f"| drafter | {' | '.join(arms)} (tokens/s, median of {len(prompts)} prompts) | top-p texts equal |")
print("|---|" + "---|" * (len(arms) + 1))
for drafter in args.drafters.split(","):
    rates, texts = {name: [] for name in arms}, {name: [] for name in arms}
    for index, prompt in enumerate(prompts):
        names = list(arms)[index % len(arms):] + list(arms)[: index % len(arms)]
        for name in names:
            params, sampling.NUCLEUS_HEADS = arms[name]
            engine.reset()
            start = time.perf_counter()
            result = engine.generate([{"role": "user", "content": prompt.turns[0]}], drafter=drafter, sampling=params,
                                     max_new_tokens=args.max_new_tokens, namespace=f"{name}-{index}")
            rates[name].append(len(result.token_ids) / (time.perf_counter() - start))
            texts[name].append(result.token_ids)
    same = sum(a == b for a, b in zip(texts["top_p sorted"], texts["top_p ranked"]))
    print(f"| {drafter} | " + " | ".join(f"{statistics.median(rates[name]):.1f}" for name in arms)
          + f" | {same}/{len(prompts)} |", flush=True)
