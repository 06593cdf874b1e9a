"""What sampling costs on the host against greedy decoding, before and after two changes, in one process.

Arms over the same loaded model, alternating per prompt: greedy; temperature 1.0 (seeded) with the race as before
(both halves of every token's hash computed per row, a fresh array per operation) and as now (the tokens' half read
from `token_words`, hashed in place); temperature 0.7 with top_p 0.9 with the nucleus found by sorting the whole
vocabulary (`NUCLEUS_HEADS = ()`, the cost before) and in a partial ranking (now). Each before/now pair must give the
same text (tests/test_sampling.py shows both give the same bits).

    .venv/bin/python docs/experiments/sampling_cost.py [--suite humaneval] [--limit 6] [--max-new-tokens 96]
    .venv/bin/python docs/experiments/sampling_cost.py --batch 8 --max-new-tokens 48   # as a server batches them

--batch N: the prompts answered N at a time by one BatchEngine (plain decoding, each arm --repeats times in turn),
the total tokens/s of each arm's batches.
"""
import argparse
import statistics
import time

import numpy as np

from specdecode import sampling
from specdecode.batch import BatchEngine
from specdecode.bench.prompts import find_bench_dir, load_suite
from specdecode.build import EngineOptions, build_engine
from specdecode.sampling import GOLDEN, SPLITMIX_MULTIPLIERS, PositionNoise, SamplingParams, neg_log

parser = argparse.ArgumentParser()
parser.add_argument("--suite", default="humaneval")
parser.add_argument("--limit", type=int, default=6)
parser.add_argument("--max-new-tokens", type=int, default=96)
parser.add_argument("--drafters", default="none,auto")
parser.add_argument("--batch", type=int, default=0, help="answer the prompts N at a time in one BatchEngine")
parser.add_argument("--repeats", type=int, default=2, help="with --batch: passes over the arms")
args = parser.parse_args()


def mix_before(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(SPLITMIX_MULTIPLIERS[0])
    z = (z ^ (z >> np.uint64(27))) * np.uint64(SPLITMIX_MULTIPLIERS[1])
    return z ^ (z >> np.uint64(31))


def race_before(self, p, position):
    """The race as it was: the same winner, every hash recomputed per row with a fresh array per operation."""
    support = np.flatnonzero(p > 0)
    if support.size == 0:
        return -1
    with np.errstate(over="ignore"):
        words = mix_before(support.astype(np.uint64) * np.uint64(GOLDEN) + np.uint64(1))
        bits = mix_before(self._position_key(position) ^ words)
    uniform = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
    fast = p[support] / (0.0 - np.log(uniform))
    near = np.flatnonzero(fast >= fast.max() * (1 - 1e-12))
    exact = p[support[near]] / neg_log(uniform[near])
    return int(support[near[int(np.argmax(exact))]])


race_now, heads_now = PositionNoise.race, sampling.NUCLEUS_HEADS
hot, nucleus = SamplingParams(temperature=1.0, seed=7), SamplingParams(temperature=0.7, top_p=0.9, seed=7)
arms = {"greedy": (SamplingParams(), race_now, heads_now), "t=1 before": (hot, race_before, heads_now),
        "t=1 now": (hot, race_now, heads_now), "top_p before": (nucleus, race_before, ()),
        "top_p now": (nucleus, race_now, heads_now)}
engine, _ = build_engine(EngineOptions(model="qwen2.5-coder-1.5b"))
prompts = load_suite(args.suite, find_bench_dir(), args.limit)
engine.generate([{"role": "user", "content": "Say hi."}], drafter="none", max_new_tokens=8)


def batched() -> None:
    batch = BatchEngine(engine, max_batch=args.batch)
    messages = [[{"role": "user", "content": prompt.turns[0]}] for prompt in prompts]
    rates, texts = {name: [] for name in arms}, {}
    for _ in range(args.repeats):
        for name, (params, PositionNoise.race, sampling.NUCLEUS_HEADS) in arms.items():
            start, tokens, texts[name] = time.perf_counter(), 0, []
            for first in range(0, len(messages), args.batch):
                results = batch.generate_many(messages[first : first + args.batch], drafter="none", sampling=params,
                                              max_new_tokens=args.max_new_tokens, namespace=None)
                tokens += sum(len(result.token_ids) for result in results)
                texts[name] += [result.token_ids for result in results]
            rates[name].append(tokens / (time.perf_counter() - start))
    greedy = statistics.median(rates["greedy"])
    print(f"batches of {args.batch}, {len(prompts)} prompts, {args.max_new_tokens} new tokens, tokens/s "
          f"(median of {args.repeats})")
    print("| " + " | ".join(arms) + " | t=1 same | top_p same |\n|" + "---|" * (len(arms) + 2))
    same = [texts[f"{kind} before"] == texts[f"{kind} now"] for kind in ("t=1", "top_p")]
    print("| " + " | ".join(f"{statistics.median(rates[name]):.1f} ({statistics.median(rates[name]) / greedy:.2f}x)"
                            for name in arms) + f" | {same[0]} | {same[1]} |")


if args.batch:
    batched()
    raise SystemExit
print(f"tokens/s, median of {len(prompts)} prompts ({args.suite}, {args.max_new_tokens} new tokens); "
      "'same': prompts where before and now gave the same text")
print("| drafter | " + " | ".join(arms) + " | t=1 same | top_p same |")
print("|---|" + "---|" * (len(arms) + 2))
for drafter in args.drafters.split(","):
    rates, texts = {name: [] for name in arms}, {name: [] for name in arms}
    for index, prompt in enumerate(prompts):
        for name in list(arms)[index % len(arms):] + list(arms)[: index % len(arms)]:
            params, PositionNoise.race, sampling.NUCLEUS_HEADS = arms[name]
            engine.reset()
            start = time.perf_counter()
            result = engine.generate([{"role": "user", "content": prompt.turns[0]}], drafter=drafter, sampling=params,
                                     max_new_tokens=args.max_new_tokens, namespace=f"{name}-{index}")
            rates[name].append(len(result.token_ids) / (time.perf_counter() - start))
            texts[name].append(result.token_ids)
    same = [sum(a == b for a, b in zip(texts[f"{kind} before"], texts[f"{kind} now"])) for kind in ("t=1", "top_p")]
    greedy = statistics.median(rates["greedy"])
    cells = [f"{greedy:.1f}"] + [f"{statistics.median(rates[name]):.1f} ({statistics.median(rates[name]) / greedy:.2f}x)"
                                 for name in list(arms)[1:]]
    print(f"| {drafter} | " + " | ".join(cells) + f" | {same[0]}/{len(prompts)} | {same[1]}/{len(prompts)} |",
          flush=True)
