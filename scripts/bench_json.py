#!/usr/bin/env python3
"""Structured outputs: JSON-schema answers with speculation (drafter auto: copies plus the tokens the grammar
forces) against plain decoding under the same grammar, same target, one process.

    .venv/bin/python scripts/bench_json.py --out bench-out/json20

Twenty extraction prompts (ten schemas, two texts each: nested objects, arrays, enums, optional fields), chat,
greedy. Each prompt runs plain, then speculative, each from an empty cache and with no copies from earlier
requests (namespace None), so neither inherits the other's prefill or answers. Reports tokens/s end to end and
in decoding (prefill excluded), target passes, the ratio of medians, and whether every speculative answer is
token for token the plain one and parses as JSON.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from specdecode.build import EngineOptions, build_engine
from specdecode.controls import LogitControls
from specdecode.grammar import GrammarSpec

S, I, B, N = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "number"}


def obj(**props):
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def array(items, most=4):
    return {"type": "array", "items": items, "maxItems": most}


def enum(*values):
    return {"type": "string", "enum": list(values)}


SCHEMAS = [
    (obj(name=S, age=I), ["Ann is 31 years old.", "Meet Bob, aged 58."]),
    (obj(name=S, address=obj(street=S, city=S, postcode=S)),
     ["Bob lives at 1 High Street, Leeds, LS1 4AB.", "Send it to Cy, 22 Rue Cler, Paris 75007."]),
    (obj(colour=enum("red", "green", "blue"), glossy=B), ["A glossy red paint.", "A matt blue finish."]),
    (obj(team=S, members=array(obj(name=S, role=enum("lead", "engineer", "designer")))),
     ["Team Apollo: Cy is the lead, Di is an engineer.", "Team Nova: Ed designs, Flo and Gus are engineers."]),
    (obj(title=S, subtitle={"anyOf": [S, {"type": "null"}]}, year={"anyOf": [I, {"type": "null"}]}),
     ["The book 'Dune' from 1965, no subtitle.", "'Python Tricks: A Buffet of Awesome Python Features', year unknown."]),
    (obj(x=N, y=N), ["The point at x 1.5 and y -2.", "Coordinates: 0.25 across, 7 up."]),
    (obj(tags=array(S)), ["Tag this post about Python and testing.", "A recipe for vegan chocolate cake."]),
    (obj(rows=array(array(I, 3), 3)), ["The 2x2 identity matrix.", "A 3x3 matrix of zeros."]),
    (obj(title=S, priority=enum("low", "high"), done=B),
     ["Write the report, urgent, not done yet.", "Water the plants some time; already done."]),
    (obj(order_id=I, customer=obj(name=S, age=I), items=array(obj(sku=S, quantity=I), 3), status=enum("open", "shipped")),
     ["Order 7 by Eve, 40: two of sku A1, one of sku B2; it has shipped.", "Order 12 for Hal (33): 5 x C3, still open."]),
]
SYSTEM = "Extract the data as JSON that follows the schema. Keep every value short."


def prompts():
    for schema, texts in SCHEMAS:
        for text in texts:
            yield schema, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


def run(engine, messages, schema, drafter: str, max_new_tokens: int):
    engine.reset()  # no inherited prefill
    controls = LogitControls(grammar=GrammarSpec("json_schema", json.dumps(schema)))
    started = time.perf_counter()
    result = engine.generate(messages, drafter=drafter, max_new_tokens=max_new_tokens, controls=controls,
                             namespace=None)
    return result, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=EngineOptions.model)
    parser.add_argument("--drafter", default="auto")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    engine, _ = build_engine(EngineOptions(model=args.model))
    rows = []
    for index, (schema, messages) in enumerate(prompts()):
        plain, plain_s = run(engine, messages, schema, "none", args.max_new_tokens)
        spec, spec_s = run(engine, messages, schema, args.drafter, args.max_new_tokens)
        try:
            valid = isinstance(json.loads(spec.text), dict)
        except ValueError:
            valid = False
        row = {"prompt": index, "tokens": len(plain.token_ids), "plain_s": plain_s, "spec_s": spec_s,
               "plain_decode_s": plain_s - plain.stats.time_prefill, "spec_decode_s": spec_s - spec.stats.time_prefill,
               "plain_passes": plain.stats.target_passes, "spec_passes": spec.stats.target_passes,
               "identical": spec.token_ids == plain.token_ids, "json": valid, "text": spec.text}
        rows.append(row)
        print(f"{index:2d} {row['tokens']:4d} tokens  plain {plain_s:6.2f}s  {args.drafter} {spec_s:6.2f}s"
              f"  passes {row['plain_passes']}/{row['spec_passes']}  identical {row['identical']}  json {valid}", flush=True)
    tokens = sum(r["tokens"] for r in rows)
    summary = {
        "prompts": len(rows), "tokens": tokens, "drafter": args.drafter,
        "plain_tok_s": tokens / sum(r["plain_s"] for r in rows), "spec_tok_s": tokens / sum(r["spec_s"] for r in rows),
        "plain_decode_tok_s": tokens / sum(r["plain_decode_s"] for r in rows),
        "spec_decode_tok_s": tokens / sum(r["spec_decode_s"] for r in rows),
        "median_speedup": statistics.median(r["plain_s"] / r["spec_s"] for r in rows),
        "tokens_per_pass": tokens / sum(r["spec_passes"] for r in rows),
        "identical": sum(r["identical"] for r in rows), "valid_json": sum(r["json"] for r in rows),
    }
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
