#!/usr/bin/env python3
"""What one target pass costs at each block size a decode step or verify block uses, next to llama.cpp.

Loads the target (and the draft), fills the cache with a 400-token context, then times forward passes of
1, 2, 5, 9, 16 and 64 tokens, interleaved, and reports medians and each size's cost in single steps. With
llama.cpp's binaries present (scripts/build_llamacpp.sh), llama-bench measures tg and pp5/pp9/pp16/pp64 of the
same GGUF file in the same run, at the same thread count and the same context depth (-d).

    .venv/bin/python scripts/step_costs.py [--precision int8] [--repeats 15] [--llamacpp-bin DIR]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch

from specdecode import registry
from specdecode.bench.peers import find_llamacpp_bin, parse_llama_bench
from specdecode.drafters.vocab import restrict_draft_vocabulary
from specdecode.engine import DRAFT_VOCAB
from specdecode.models.loader import load_model

SIZES = (1, 2, 5, 9, 16, 64)  # 64: a prompt chunk (prompts go through the kernel 64 rows per call)


def time_blocks(model, context: torch.Tensor, repeats: int) -> dict[int, float]:
    cache = model.model.new_cache(1024)
    model.model(context, cache, logits="none")
    base = cache.length
    times: dict[int, list[float]] = {size: [] for size in SIZES}
    for _ in range(repeats):
        for size in SIZES:
            t0 = time.perf_counter()
            model.model(context[:size], cache)
            times[size].append(time.perf_counter() - t0)
            cache.truncate(base)
    return {size: statistics.median(v) for size, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=registry.DEFAULT_TARGET)
    p.add_argument("--draft", default=registry.DEFAULT_DRAFT)
    p.add_argument("--precision", default="int8", choices=["int8", "float32"])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--llamacpp-bin", default=None)
    args = p.parse_args()
    threads = torch.get_num_threads()
    target = load_model(args.model, device="cpu", dtype=args.precision, max_context=1024)
    draft = load_model(args.draft, device="cpu", dtype="int8", max_context=1024)
    restrict_draft_vocabulary(draft, DRAFT_VOCAB)  # the head a drafting step computes
    context = torch.arange(1000, 1400) % target.vocab_size  # 400 ordinary token ids: the cost does not depend on them
    ours = time_blocks(target, context, args.repeats)
    draft_step = time_blocks(draft, context, args.repeats)[1]
    print(f"| block | specdecode {args.precision} | in single steps | llama.cpp | in single steps |")
    print("|---|---|---|---|---|")
    ll = {}
    folder, why = find_llamacpp_bin(args.llamacpp_bin)
    if folder:
        # -d: the same context depth as ours, so both sides pay the same attention over it
        cmd = [str(folder / "llama-bench"), "-m", str(registry.resolve(args.model)), "-t", str(threads),
               "-p", ",".join(str(s) for s in SIZES[2:]), "-n", "64", "-d", str(len(context)), "-o", "json"]
        bench = parse_llama_bench(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        ll[1] = 1.0 / bench["tg"]["tokens_per_s"]
        for size, entry in bench["pp"].items():
            ll[size] = size / entry["tokens_per_s"]
    for size in SIZES:
        theirs = f"{ll[size] * 1e3:.1f} ms | {ll[size] / ll[1]:.2f}" if size in ll else "- | -"
        print(f"| {size} | {ours[size] * 1e3:.1f} ms | {ours[size] / ours[1]:.2f} | {theirs} |")
    print(f"draft step ({args.draft}, int8): {draft_step * 1e3:.1f} ms = {draft_step / ours[1]:.2f} of a target step")
    if ll:
        print(f"target step against llama.cpp tg: {ours[1] / ll[1]:.2f}x its time ({threads} threads)")
    else:
        print(f"llama.cpp: {why}")


if __name__ == "__main__":
    main()
