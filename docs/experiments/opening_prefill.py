"""What the template's opening (specdecode/opening.py) saves a chat request, in one process: the short suite's
prompts, each read by the target (its prefill, plain decoding's first token) and by the draft model (auto's prompt
read) with the opening copied and without it, alternating, median of --repeats. Different processes on these
2-core machines differ by up to a third, so both arms share one process, one engine's models and one machine moment.

    .venv/bin/python docs/experiments/opening_prefill.py [--repeats 5] [--limit 2]
"""
import argparse
import statistics
import time

from specdecode.bench.short_suite import short_prompts
from specdecode.build import EngineOptions, build_engine
from specdecode.engine import Engine

parser = argparse.ArgumentParser()
parser.add_argument("--repeats", type=int, default=5)
parser.add_argument("--limit", type=int, default=2, help="prompts per style")
args = parser.parse_args()

on, _ = build_engine(EngineOptions(model="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b"))
off = Engine(on.target, on.draft, max_context=on.max_context, opening=[])
print(f"opening: {len(on.opening.ids)} tokens {on.tokenizer.decode(on.opening.ids)!r}")


def target_prefill(engine, messages) -> float:
    engine.reset()
    return engine.generate(messages, drafter="none", max_new_tokens=1).stats.time_prefill


def draft_read(engine, messages) -> float:
    drafter = engine.drafter("draft")
    drafter.reset()
    ids = engine.encode_prompt(messages)
    start = time.perf_counter()
    drafter.prefill(ids)
    return time.perf_counter() - start


by_style: dict[str, list] = {}
for prompt in short_prompts():
    by_style.setdefault(prompt.category, []).append(prompt)
prompts = [prompt for style in by_style.values() for prompt in style[: args.limit]]
table = {(what, arm): [] for what in ("target", "draft") for arm in ("on", "off")}
for prompt in prompts:
    messages = [{"role": "user", "content": prompt.turns[0]}]
    for repeat in range(args.repeats):
        arms = (("on", on), ("off", off)) if repeat % 2 == 0 else (("off", off), ("on", on))
        for arm, engine in arms:
            table["target", arm].append(target_prefill(engine, messages))
            table["draft", arm].append(draft_read(engine, messages))
tokens = statistics.median(len(on.encode_prompt([{"role": "user", "content": p.turns[0]}])) for p in prompts)
print(f"{len(prompts)} prompts (median {tokens:.0f} tokens), {args.repeats} repeats each, medians:")
print("| read | without the opening | with it | ratio |\n|---|---|---|---|")
for what in ("target", "draft"):
    a, b = statistics.median(table[what, "off"]), statistics.median(table[what, "on"])
    print(f"| {what} | {a * 1e3:.0f} ms | {b * 1e3:.0f} ms | {b / a:.2f} |")
