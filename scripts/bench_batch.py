#!/usr/bin/env python3
"""N clients at once on one `BatchEngine`, speculative (auto) against batched plain decoding, per Spec-Bench
category (or HumanEval), in one process.

    .venv/bin/python scripts/bench_batch.py --suite specbench --clients 4 --limit 8 --max-new-tokens 128 --out bench-out/batch4

For each category its first `--limit` prompts (first turns, as chat) are shared among `--clients` clients; each
client sends its next prompt as soon as its previous answer is done, so the batch holds `--clients` requests
until the prompts run out. Once with plain decoding, once with the default drafter, repeated `--repeats` times
in alternation (the median kept). It reports the aggregate tokens/s of each (all tokens over the wall time,
prompts included), their ratio, and whether every speculative answer is token for token the plain one.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from specdecode.batch import BatchEngine
from specdecode.bench.prompts import find_bench_dir, load_suite
from specdecode.build import EngineOptions, build_engine


def timed(engine, prompts, drafter: str, max_new_tokens: int, clients: int):
    """Every client sends its next prompt when its previous answer is done. Returns (tokens/s, results)."""
    batch = BatchEngine(engine, max_batch=clients)
    waiting = list(enumerate(prompts))
    tickets = {}

    def send() -> None:
        index, prompt = waiting.pop(0)
        # namespace None: no request copies from another's answer (each method starts from the same knowledge)
        tickets[index] = batch.submit(prompt, drafter=drafter, max_new_tokens=max_new_tokens, namespace=None)

    started = time.perf_counter()
    for _ in range(min(clients, len(waiting))):
        send()
    while batch.busy:
        batch.step()
        while waiting and len(batch.running) + len(batch.waiting) < clients:
            send()
    seconds = time.perf_counter() - started
    results = [tickets[i].result() for i in range(len(prompts))]
    return sum(len(r.token_ids) for r in results) / seconds, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="specbench", choices=["specbench", "humaneval"])
    parser.add_argument("--categories", default=None, help="comma-separated Spec-Bench categories (default: all)")
    parser.add_argument("--clients", type=int, default=4, help="requests run together")
    parser.add_argument("--limit", type=int, default=8, help="prompts per category")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--model", default=None)
    parser.add_argument("--bench-dir", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    options = EngineOptions() if args.model is None else EngineOptions(model=args.model)
    engine, _ = build_engine(options)
    engine.measure_costs(None, engine.drafter("auto"))
    engine.measure_batch_costs(args.clients * 16)
    categories = args.categories.split(",") if args.categories else None
    suite = load_suite(args.suite, find_bench_dir(args.bench_dir), args.limit, categories)
    by_category = defaultdict(list)
    for prompt in suite:
        by_category[prompt.category].append(prompt.turns[0])
    engine.generate("Say hi.", drafter="none", max_new_tokens=4)  # warm-up
    rows = []
    for category, prompts in by_category.items():
        speeds = {"none": [], "auto": []}
        identical = True
        for _ in range(args.repeats):
            for drafter in ("none", "auto"):
                speed, results = timed(engine, prompts, drafter, args.max_new_tokens, args.clients)
                speeds[drafter].append(speed)
                if drafter == "none":
                    plain = [r.token_ids for r in results]
                else:
                    identical &= [r.token_ids for r in results] == plain
        row = {"category": category, "requests": len(prompts), "plain_tok_s": statistics.median(speeds["none"]),
               "auto_tok_s": statistics.median(speeds["auto"]), "identical": identical}
        row["ratio"] = row["auto_tok_s"] / row["plain_tok_s"]
        rows.append(row)
        print(f"bench-batch: {row}", file=sys.stderr, flush=True)
    lines = [f"| category | requests ({args.clients} at once) | batched plain tok/s | batched auto tok/s | auto / plain | identical |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['category']} | {r['requests']} | {r['plain_tok_s']:.1f} | {r['auto_tok_s']:.1f} | {r['ratio']:.2f}x"
                     f" | {'yes' if r['identical'] else 'NO'} |")
    report = "\n".join(lines)
    print(report)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        command = "scripts/bench_batch.py " + " ".join(sys.argv[1:])
        (out / "results.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
        (out / "report.md").write_text(f"`{command}`\n\n{report}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
