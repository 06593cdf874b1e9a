#!/usr/bin/env python3
"""What one target pass costs at each block size a decode step or verify block uses, next to llama.cpp.

Loads the target (and the draft), fills the cache with a 400-token context, then times forward passes of
1, 2, 5, 9, 16 and 64 tokens (or --sizes), interleaved, and reports medians, each size's cost in single steps and
the rows per second it computes (its multiply-adds per second with --macs-per-row). With
llama.cpp's binaries present (scripts/build_llamacpp.sh), llama-bench measures tg and pp5/pp9/pp16/pp64 of the
same GGUF file in the same run, at the same thread count and the same context depth (-d).

    .venv/bin/python scripts/step_costs.py [--precision int8] [--repeats 15] [--sizes 1,8,16,32,64,128,256] [--llamacpp-bin DIR]
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

CONTEXT = 400  # tokens in the cache before each timed block; blocks are slices of it
SIZES = (1, 2, 5, 9, 16, 64)  # 64: a prompt chunk (prompts go through the kernel 64 rows per call)


def time_blocks(model, context: torch.Tensor, repeats: int, sizes=SIZES) -> dict[int, float]:
    cache = model.model.new_cache(len(context) + max(sizes))
    model.model(context, cache, logits="none")
    base = cache.length
    times: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(repeats):
        for size in sizes:
            t0 = time.perf_counter()
            model.model(context[:size], cache)
            times[size].append(time.perf_counter() - t0)
            cache.truncate(base)
    return {size: statistics.median(v) for size, v in times.items()}


def print_table(ours: dict[int, float], ll: dict[int, float], precision: str, macs_per_row: float | None) -> None:
    rate = " G MAC/s |" if macs_per_row else ""
    print(f"| block | specdecode {precision} | in single steps | rows/s |{rate} llama.cpp | in single steps |")
    print("|---|---|---|---|" + ("---|" if macs_per_row else "") + "---|---|")
    for size, seconds in ours.items():
        theirs = f"{ll[size] * 1e3:.1f} ms | {ll[size] / ll[1]:.2f}" if size in ll else "- | -"
        macs = f" {size * macs_per_row / seconds:.0f} |" if macs_per_row else ""
        print(f"| {size} | {seconds * 1e3:.1f} ms | {seconds / ours[1]:.2f} | {size / seconds:.0f} |{macs} {theirs} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=registry.DEFAULT_TARGET)
    p.add_argument("--draft", default=registry.DEFAULT_DRAFT)
    p.add_argument("--precision", default="int8", choices=["int8", "float32"])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="block sizes to time (1 first: the single step)")
    p.add_argument("--macs-per-row", type=float, default=None, help="G multiply-adds a row, to print G MAC/s")
    p.add_argument("--llamacpp-bin", default=None)
    args = p.parse_args()
    threads = torch.get_num_threads()
    try:
        sizes = tuple(int(size) for size in args.sizes.split(","))
    except ValueError:
        p.error(f"--sizes must be integers separated by commas, got {args.sizes!r}")
    if 1 not in sizes or not all(1 <= size <= CONTEXT for size in sizes):
        p.error(f"--sizes must include 1 (the single step every cost is measured against) and stay in 1..{CONTEXT}")
    target = load_model(args.model, device="cpu", dtype=args.precision, max_context=1024)
    draft = load_model(args.draft, device="cpu", dtype="int8", max_context=1024)
    restrict_draft_vocabulary(draft, DRAFT_VOCAB)  # the head a drafting step computes
    context = torch.arange(1000, 1000 + CONTEXT) % target.vocab_size  # ordinary token ids: the cost does not depend on them
    ours = time_blocks(target, context, args.repeats, sizes)
    draft_step = time_blocks(draft, context, args.repeats, (1,))[1]  # only its single step is reported
    ll = {}
    folder, why = find_llamacpp_bin(args.llamacpp_bin)
    if folder:
        # -d: the same context depth as ours, so both sides pay the same attention over it
        cmd = [str(folder / "llama-bench"), "-m", str(registry.resolve(args.model)), "-t", str(threads),
               "-p", ",".join(str(s) for s in sizes if s > 2), "-n", "64", "-d", str(len(context)), "-o", "json"]
        bench = parse_llama_bench(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        ll[1] = 1.0 / bench["tg"]["tokens_per_s"]
        for size, entry in bench["pp"].items():
            ll[size] = size / entry["tokens_per_s"]
    print_table(ours, ll, args.precision, args.macs_per_row)
    print(f"draft step ({args.draft}, int8): {draft_step * 1e3:.1f} ms = {draft_step / ours[1]:.2f} of a target step")
    if ll:
        print(f"target step against llama.cpp tg: {ours[1] / ll[1]:.2f}x its time ({threads} threads)")
    else:
        print(f"llama.cpp: {why}")


if __name__ == "__main__":
    main()
