"""What a stalled pass does to auto's copies, and what copy probes and the stall clip change, in one process.

Arms, each an engine of its own (its own measured costs and per-client record) over the same loaded models, each
answering the short suite's prompts in turn in one namespace, as one client would (64 new tokens, greedy):
plain decoding; auto as before this change (`copy_probe_every=0`, `cost_stall=inf`) and as now; and both again after
one stalled two-row verify (5x its cost) at the start, planted through the cost model's own `record_target` right
after a single step, as a stall on a busy machine between drafting steps reaches it. The order of the arms rotates
per prompt. Different processes on these 2-core machines differ by up to a third, so all arms share one process and
one machine moment.

    .venv/bin/python docs/experiments/copy_probes.py [--limit 6] [--stall 5] [--suite short] [--arms before,now,...]
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from specdecode.bench.prompts import find_bench_dir, load_suite
from specdecode.bench.short_suite import short_prompts
from specdecode.build import EngineOptions, build_engine
from specdecode.engine import Engine
from specdecode.tuning_params import TuningParams

parser = argparse.ArgumentParser()
parser.add_argument("--limit", type=int, default=6, help="prompts per style")
parser.add_argument("--stall", type=float, default=5.0, help="the planted two-row verify, in its estimated cost")
parser.add_argument("--suite", default="short", help="short, or a bench suite (humaneval, specbench, ...)")
parser.add_argument("--arms", default="before,now,before+stall,now+stall", help="besides plain decoding")
parser.add_argument("--max-new-tokens", type=int, default=64)
parser.add_argument("--categories", help="short suite: only these styles (comma-separated)")
parser.add_argument("--repeats", type=int, default=1, help="passes over the prompts (each arm keeps its record)")
parser.add_argument("--out", help="a JSON file for each prompt's seconds and drafted tokens per arm")
args = parser.parse_args()

base, _ = build_engine(EngineOptions(model="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b"))
before = TuningParams(copy_probe_every=0, cost_stall=float("inf"))
arms = {name: Engine(base.target, base.draft, max_context=base.max_context, tuning_params=params)
        for name, params in (("plain", TuningParams()), ("before", before), ("now", TuningParams()),
                             ("before+stall", before), ("now+stall", TuningParams()))
        if name == "plain" or name in args.arms.split(",")}
warm = [{"role": "user", "content": "Say hi."}]
for name, engine in arms.items():  # each engine measures (or reads) its costs, then the stall arms get the stall
    engine.generate(warm, drafter="none" if name == "plain" else "auto", max_new_tokens=8, namespace="warm-up")
    if name.endswith("+stall"):
        costs = engine.tuner.costs
        costs.record_target(1, costs.target_cost(1))  # a single step just timed (as between drafting steps) ...
        costs.record_target(2, args.stall * costs.target_cost(2))  # ... so the stall is taken as the size's own
        print(f"{name}: two-row verify {costs.target_cost(2) / costs.target_cost(1):.2f} single steps after the stall")

if args.suite == "short":
    by_style: dict[str, list] = {}
    for prompt in short_prompts():
        if not args.categories or prompt.category in args.categories.split(","):
            by_style.setdefault(prompt.category, []).append(prompt)
    prompts = [prompt for style in by_style.values() for prompt in style[: args.limit]]
else:
    prompts = load_suite(args.suite, find_bench_dir(), args.limit)
prompts = prompts * args.repeats
seconds = {name: [] for name in arms}
drafted = {name: [] for name in arms}
answers_differ = 0
for index, prompt in enumerate(prompts):
    messages = [{"role": "user", "content": prompt.turns[0]}]
    names = list(arms)
    names = names[index % len(names):] + names[: index % len(names)]
    tokens = {}
    for name in names:
        engine = arms[name]
        engine.reset()
        start = time.perf_counter()
        result = engine.generate(messages, drafter="none" if name == "plain" else "auto",
                                 max_new_tokens=args.max_new_tokens, namespace="client")
        seconds[name].append(time.perf_counter() - start)
        drafted[name].append(result.stats.drafted)
        tokens[name] = result.token_ids
    answers_differ += any(ids != tokens["plain"] for ids in tokens.values())

plain = seconds["plain"]
print(f"{args.suite}: {len(prompts)} prompts, {args.max_new_tokens} new tokens; answers differing from plain decoding:"
      f" {answers_differ}")
print("| arm | total s | vs plain | median prompt | worst prompt | drafted |\n|---|---|---|---|---|---|")
for name, times in seconds.items():
    ratios = [p / t for p, t in zip(plain, times)]
    print(f"| {name} | {sum(times):.1f} | {sum(plain) / sum(times):.2f}x | {statistics.median(ratios):.2f}x |"
          f" {min(ratios):.2f}x ({prompts[ratios.index(min(ratios))].id}) | {sum(drafted[name])} |")
if args.out:
    rows = [{"prompt": prompt.id, **{name: [seconds[name][i], drafted[name][i]] for name in arms}}
            for i, prompt in enumerate(prompts)]
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "prompts": rows}, indent=1))
