"""What a client's first-token record and the first-token factor counted once in a chain change, in one process.

Arms, each an engine of its own over the same loaded models (its own costs and per-client record), answering the
same prompts in turn, arms rotating per prompt, 64 new tokens (or --max-new-tokens), greedy: plain decoding; auto as
before (each request's stop rules start neutral, `first_token_carry=0`, and the factor of a request's failing first
tokens judges only whether a draft starts: `keep`/`extend` as they were, patched in for that arm); auto as now.
Each repeat is a new client namespace, so every prompt is first-seen in it.

    .venv/bin/python docs/experiments/first_token_record.py --suite short --categories translation --repeats 3
    .venv/bin/python docs/experiments/first_token_record.py --suite humaneval --limit 20 --max-new-tokens 128
"""
import argparse
import statistics
import time

from specdecode.bench.prompts import find_bench_dir, load_suite
from specdecode.bench.short_suite import short_prompts
from specdecode.build import EngineOptions, build_engine
from specdecode.engine import Engine
from specdecode.policy import DraftStopRule
from specdecode.tuning_params import TuningParams

parser = argparse.ArgumentParser()
parser.add_argument("--suite", default="short")
parser.add_argument("--limit", type=int, default=6, help="prompts per style (short) or in all")
parser.add_argument("--categories", help="short suite: only these styles (comma-separated)")
parser.add_argument("--repeats", type=int, default=1, help="passes over the prompts, each in a new namespace")
parser.add_argument("--max-new-tokens", type=int, default=64)
args = parser.parse_args()


def keep_before(self, drafted, chain_prob, confidence):
    if confidence < self.min_confidence and drafted > 0:
        return False
    step = self.costs.target_cost(1)
    if step is None:
        return True
    expected = self.acceptance(confidence) * (self.first_token_factor() if drafted == 0 else 1.0)
    keep = chain_prob * expected * step > self._marginal_verify(drafted)
    return self.first_or_probe(keep) if drafted == 0 and self.probes else keep


def extend_before(self, drafted, chain_prob, confidence):
    if self.cap is not None and drafted >= self.cap.value:
        return False
    step, draft = self.costs.target_cost(1), self.costs.draft_cost(self.drafter)
    if step is None or draft is None:
        return True
    return chain_prob * self.acceptance(confidence) * step > draft + self._marginal_verify(drafted)


methods = {"now": (DraftStopRule.keep, DraftStopRule.extend), "before": (keep_before, extend_before),
           "plain": (DraftStopRule.keep, DraftStopRule.extend)}
base, _ = build_engine(EngineOptions(model="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b"))
arms = {name: Engine(base.target, base.draft, max_context=base.max_context, tuning_params=params)
        for name, params in (("plain", TuningParams()), ("before", TuningParams(first_token_carry=0.0)),
                             ("now", TuningParams()))}
for name, engine in arms.items():
    DraftStopRule.keep, DraftStopRule.extend = methods[name]
    engine.generate([{"role": "user", "content": "Say hi."}], drafter="none" if name == "plain" else "auto",
                    max_new_tokens=8, namespace="warm-up")
if args.suite == "short":
    prompts = [p for p in short_prompts() if not args.categories or p.category in args.categories.split(",")]
    by_style: dict[str, list] = {}
    for prompt in prompts:
        by_style.setdefault(prompt.category, []).append(prompt)
    prompts = [prompt for style in by_style.values() for prompt in style[: args.limit]]
else:
    prompts = load_suite(args.suite, find_bench_dir(), args.limit)
seconds = {name: {p.id: [] for p in prompts} for name in arms}
counts = {name: [0, 0] for name in arms}  # drafted, accepted
differ = 0
for repeat in range(args.repeats):
    for index, prompt in enumerate(prompts):
        names = list(arms)[index % 3:] + list(arms)[: index % 3]
        tokens = {}
        for name in names:
            DraftStopRule.keep, DraftStopRule.extend = methods[name]
            engine = arms[name]
            engine.reset()
            start = time.perf_counter()
            result = engine.generate([{"role": "user", "content": prompt.turns[0]}],
                                     drafter="none" if name == "plain" else "auto",
                                     max_new_tokens=args.max_new_tokens, namespace=f"client-{repeat}")
            seconds[name][prompt.id].append(time.perf_counter() - start)
            counts[name][0] += result.stats.drafted
            counts[name][1] += result.stats.accepted
            tokens[name] = result.token_ids
        differ += any(ids != tokens["plain"] for ids in tokens.values())
print(f"{args.suite} {args.categories or ''}: {len(prompts)} prompts x {args.repeats}, {args.max_new_tokens} new "
      f"tokens; answers differing from plain decoding: {differ}")
print("| arm | total s | vs plain | median prompt (median of repeats) | worst prompt | drafted | accepted |")
print("|---|---|---|---|---|---|---|")
plain = {pid: statistics.median(times) for pid, times in seconds["plain"].items()}
for name in arms:
    mine = {pid: statistics.median(times) for pid, times in seconds[name].items()}
    ratios = {pid: plain[pid] / mine[pid] for pid in mine}
    worst = min(ratios, key=ratios.get)
    total = sum(sum(times) for times in seconds[name].values())
    total_plain = sum(sum(times) for times in seconds["plain"].values())
    print(f"| {name} | {total:.1f} | {total_plain / total:.2f}x | {statistics.median(ratios.values()):.2f}x | "
          f"{ratios[worst]:.2f}x ({worst}) | {counts[name][0]} | {counts[name][1]} |", flush=True)
