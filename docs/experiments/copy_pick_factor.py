"""A/B in one process: the pick between a copy from this request and one from the client's earlier requests
(suffix.expected_accepted) with each source's first-token factor (now, 33f68a3) or pooled chances only (before).
Engines of their own over the same loaded models, arms rotating per prompt, plain decoding as the reference; one
client namespace per arm, greedy.

    .venv/bin/python docs/experiments/copy_pick_factor.py humaneval   # first 20, 128 new tokens
    .venv/bin/python docs/experiments/copy_pick_factor.py short       # 54 prompts, 64 new tokens
"""
import statistics, sys, time
import specdecode.drafters.suffix as suffix
from specdecode.bench.prompts import find_bench_dir, load_suite
from specdecode.bench.short_suite import short_prompts
from specdecode.build import EngineOptions, build_engine
from specdecode.engine import Engine

now = suffix.expected_accepted
def before(draft, rule):
    expected, chain = 0.0, 1.0
    for confidence in draft.confidences:
        chain *= rule.acceptance(confidence)
        expected += chain
    return expected

base, _ = build_engine(EngineOptions(model="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b"))
arms = {name: Engine(base.target, base.draft, max_context=base.max_context) for name in ("plain", "before", "now")}
fns = {"plain": now, "before": before, "now": now}
suite = sys.argv[1]
if suite == "short":
    prompts, n = [p.turns[0] for p in short_prompts()], 64
else:
    prompts, n = [p.turns[0] for p in load_suite("humaneval", find_bench_dir(), 20)], 128
for name, e in arms.items():
    suffix.expected_accepted = fns[name]
    e.generate([{"role": "user", "content": "Say hi."}], drafter="none" if name == "plain" else "auto", max_new_tokens=8, namespace="w")
secs = {k: [] for k in arms}; differ = 0; drafted = {k: [0, 0] for k in arms}
for i, text in enumerate(prompts):
    names = list(arms)[i % 3:] + list(arms)[:i % 3]; toks = {}
    for name in names:
        suffix.expected_accepted = fns[name]
        e = arms[name]; e.reset()
        t0 = time.perf_counter()
        r = e.generate([{"role": "user", "content": text}], drafter="none" if name == "plain" else "auto", max_new_tokens=n, namespace="c")
        secs[name].append(time.perf_counter() - t0); toks[name] = r.token_ids
        drafted[name][0] += r.stats.drafted; drafted[name][1] += r.stats.accepted
    differ += any(t != toks["plain"] for t in toks.values())
for name in arms:
    ratios = [p / m for p, m in zip(secs["plain"], secs[name])]
    print(f"{suite} {name}: total {sum(secs[name]):.1f} s, {sum(secs['plain'])/sum(secs[name]):.2f}x plain, median prompt {statistics.median(ratios):.2f}x, worst {min(ratios):.2f}x, drafted/accepted {drafted[name]}")
print("answers differing from plain:", differ)
