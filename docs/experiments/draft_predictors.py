"""Can a request tell, before its draft model reads the prompt, that the draft will predict its answer badly?

Issue 66: on short first-seen answers the draft model's prompt read and its failed probes cost ~10% of the answer,
and the engine cannot tell those prompts apart before paying the read. This measures, per prompt, teacher-forced
(greedy answers of the target, 64 new tokens):
- outcome: how often the draft's argmax, with the whole prompt read, equals the target's token, over the answer's
  tokens after the first `--seen` (what drafting would get there);
- signals known before the read, over the first `--seen` answer tokens: the target's mean top-1 probability (its
  logits are computed anyway), and a blind draft's agreement (the draft reading only the answer so far, no prompt).

    .venv/bin/python docs/experiments/draft_predictors.py [--suite short] [--limit 6] [--seen 16] [--out F.json]
"""
import argparse
import json
import statistics

import torch

from specdecode.bench.prompts import find_bench_dir, load_suite
from specdecode.bench.short_suite import short_prompts
from specdecode.build import EngineOptions, build_engine

parser = argparse.ArgumentParser()
parser.add_argument("--suite", default="short")
parser.add_argument("--limit", type=int, default=6, help="prompts per style (short) or in all (other suites)")
parser.add_argument("--seen", type=int, default=16, help="answer tokens known before the read")
parser.add_argument("--max-new-tokens", type=int, default=64)
parser.add_argument("--out")
args = parser.parse_args()

engine, _ = build_engine(EngineOptions(model="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b"))
target, draft = engine.target.model, engine.draft.model


def logits_of(model, ids: list[int]) -> torch.Tensor:
    cache = model.new_cache(len(ids))
    with torch.inference_mode():
        return torch.cat([model(torch.tensor(ids[start : start + 64]), cache, logits="all").float()
                          for start in range(0, len(ids), 64)])


def agreement(logits: torch.Tensor, tokens: list[int]) -> float:
    return (logits.argmax(-1) == torch.tensor(tokens)).float().mean().item() if tokens else float("nan")


if args.suite == "short":
    by_style: dict[str, list] = {}
    for prompt in short_prompts():
        by_style.setdefault(prompt.category, []).append(prompt)
    prompts = [prompt for style in by_style.values() for prompt in style[: args.limit]]
else:
    prompts = load_suite(args.suite, find_bench_dir(), args.limit)

rows = []
for prompt in prompts:
    result = engine.generate([{"role": "user", "content": prompt.turns[0]}], drafter="none",
                             max_new_tokens=args.max_new_tokens)
    ids, answer = list(result.prompt_ids), list(result.token_ids)
    n, seen = len(ids), min(args.seen, len(answer) - 1)
    full = ids + answer
    t_logits = logits_of(target, full)[n - 1 : n - 1 + seen]
    d_logits = logits_of(draft, full)[n - 1 : -1]
    blind = logits_of(draft, answer[:seen])[:-1]
    rows.append({
        "name": f"{prompt.category}-{len(rows)}", "prompt_tokens": n, "answer_tokens": len(answer),
        "outcome": agreement(d_logits[seen:], answer[seen:]),
        "draft_seen": agreement(d_logits[:seen], answer[:seen]),
        "target_top1": torch.softmax(t_logits, -1).max(-1).values.mean().item(),
        "blind_draft": agreement(blind, answer[1:seen]),
    })
    r = rows[-1]
    print(f"{r['name']:16} prompt {n:4} answer {len(answer):3}  outcome {r['outcome']:.2f}  "
          f"draft_seen {r['draft_seen']:.2f}  target_top1 {r['target_top1']:.2f}  blind {r['blind_draft']:.2f}",
          flush=True)


def ranks(values):
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    for rank, index in enumerate(order):
        out[index] = float(rank)
    return out


valid = [r for r in rows if r["outcome"] == r["outcome"]]
for key in ("draft_seen", "target_top1", "blind_draft"):
    print(f"Spearman(outcome, {key}) = "
          f"{statistics.correlation(ranks([r['outcome'] for r in valid]), ranks([r[key] for r in valid])):.2f}")
if args.out:
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
