#!/usr/bin/env python3
"""How close the int8 target is to the float32 target: teacher-forced next-token agreement on real text.

Both precisions of one model read the same documents (HumanEval prompts with their canonical solutions,
and Spec-Bench questions); at every position we compare the two argmax tokens and the log-likelihood of
the actual next token. Nothing here is generated, so neither precision steers the text.

    .venv/bin/python scripts/precision_quality.py --positions 2000 [--model qwen2.5-coder-1.5b]
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from specdecode.models.loader import load_model

BENCH = Path(__file__).resolve().parent.parent.parent / "shared" / "bench"


def documents() -> list[str]:
    """HumanEval problems (prompt + canonical solution), then Spec-Bench first turns, alternating."""
    code = [json.loads(line) for line in (BENCH / "humaneval.jsonl").read_text().splitlines()]
    chat = [json.loads(line) for line in (BENCH / "specbench.jsonl").read_text().splitlines()]
    docs = []
    for a, b in zip(code, chat):
        docs += [a["prompt"] + a["canonical_solution"], b["turns"][0]]
    return docs


def int8_block_types(model) -> dict[str, int]:
    """How many matrix parts of the int8 model hold each block type: the file's own types where the kernel reads them
    (an internal layout named by its number), Q8_0 where a matrix was requantized from float32."""
    import gguf

    from specdecode import kernels

    counts: dict[str, int] = {}
    for module in [model.model, *model.model.layers]:
        for value in vars(module).values():
            if isinstance(value, kernels.QuantWeight):
                for t in value.types:
                    name = gguf.GGMLQuantizationType(t).name if t in gguf.GGMLQuantizationType._value2member_map_ else str(t)
                    counts[name] = counts.get(name, 0) + 1
    return counts


def score(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model.model(torch.tensor(ids), model.model.new_cache(len(ids)))  # [T, vocab]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--positions", type=int, default=2000)
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args()
    int8 = load_model(args.model, device="cpu", dtype="int8", max_context=2048)
    ref = load_model(args.model, device="cpu", dtype="float32", max_context=2048)
    agree = positions = 0
    nll = {"int8": 0.0, "float32": 0.0}
    for doc in documents():
        ids = int8.tokenizer.encode_prompt(doc)[:512]  # with the <bos> a model like Gemma reads text after
        if len(ids) < 2:
            continue
        a, b = score(int8, ids)[:-1].double(), score(ref, ids)[:-1].double()
        nxt = torch.tensor(ids[1:])[:, None]
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        positions += len(ids) - 1
        nll["int8"] -= float(torch.log_softmax(a, -1).gather(1, nxt).sum())
        nll["float32"] -= float(torch.log_softmax(b, -1).gather(1, nxt).sum())
        if positions >= args.positions:
            break
    result = {
        "model": args.model, "positions": positions, "top1_agreement": agree / positions,
        "perplexity_int8": math.exp(nll["int8"] / positions), "perplexity_float32": math.exp(nll["float32"] / positions),
        "int8_block_types": int8_block_types(int8),
    }
    print(f"{args.model}: {positions} positions, top-1 agreement int8 vs float32 {result['top1_agreement']:.2%}, "
          f"perplexity int8 {result['perplexity_int8']:.4f} vs float32 {result['perplexity_float32']:.4f}; int8 matrix parts"
          f" by block type {result['int8_block_types']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
