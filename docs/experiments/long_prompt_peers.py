"""Long prompts on a CPU against llama.cpp, in one run: prompt prefill and plain decoding after it.

Per round and prompt length N, the two systems one after the other (which goes first alternates by round):
llama.cpp's `llama-bench -p N -n 0` and `-p 0 -n 64 -d N` (pp N, and tg64 after N positions, each with flash
attention off and on: the faster counts, as its users would pick), and specdecode's plain decoding of a prompt of
N tokens (Spec-Bench's texts, raw, no chat template) for 65 tokens: its prefill (prompt tokens / the target's
prefill time) and its decoding (64 tokens / the time after the first). Medians over the rounds. Both run the same
GGUF file with 2 threads (torch's count).

    .venv/bin/python docs/experiments/long_prompt_peers.py --lengths 512,4096 --rounds 3
"""
import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch

from specdecode import registry
from specdecode.bench.peers import find_llamacpp_bin
from specdecode.bench.prompts import find_bench_dir
from specdecode.build import EngineOptions, build_engine

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="qwen2.5-coder-1.5b")
parser.add_argument("--lengths", default="512,2048,4096")
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--out", help="a JSON file for every timing")
args = parser.parse_args()
lengths = [int(n) for n in args.lengths.split(",")]

engine, _ = build_engine(EngineOptions(model=args.model, ctx=max(lengths) + 128))
bin_dir, why = find_llamacpp_bin()
if bin_dir is None:
    raise SystemExit(why)
gguf, bench = registry.resolve(args.model), bin_dir / "llama-bench"
threads = torch.get_num_threads()
ids: list[int] = []
for line in (find_bench_dir() / "specbench.jsonl").read_text().splitlines():
    ids += engine.tokenizer.encode(json.loads(line)["turns"][0])
    if len(ids) > max(lengths):
        break


def llamacpp(n: int) -> dict:
    """llama.cpp's pp n and tg64 at depth n, tokens/s, the faster of flash attention off and on."""
    def tests(*flags: str) -> list[dict]:
        cmd = [str(bench), "-m", str(gguf), "-t", str(threads), "-fa", "0,1", "-r", "1", "-o", "json", *flags]
        return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)

    return {"prefill": max(t["avg_ts"] for t in tests("-p", str(n), "-n", "0")),
            "decode": max(t["avg_ts"] for t in tests("-p", "0", "-n", "64", "-d", str(n)))}


def ours(n: int) -> dict:
    engine.reset()
    start = time.perf_counter()
    result = engine.generate(ids[:n], chat=False, drafter="none", max_new_tokens=65)
    seconds = time.perf_counter() - start
    prefill = result.stats.time_prefill
    return {"prefill": n / prefill, "decode": (len(result.token_ids) - 1) / (seconds - prefill)}


timings = {n: {"llama.cpp": [], "specdecode": []} for n in lengths}
for round_ in range(args.rounds):
    for n in lengths:
        pair = [("llama.cpp", llamacpp), ("specdecode", ours)]
        for name, run in pair if round_ % 2 == 0 else pair[::-1]:
            timings[n][name].append(run(n))
        print(f"round {round_ + 1}, {n} tokens:", {k: v[-1] for k, v in timings[n].items()}, flush=True)

print(f"\n{args.model}, {threads} threads, medians of {args.rounds} rounds (tokens/s)\n")
print("| prompt tokens | prefill: specdecode | llama.cpp | ratio | decode after it: specdecode | llama.cpp | ratio |")
print("|---|---|---|---|---|---|---|")
for n in lengths:
    med = {name: {part: statistics.median(r[part] for r in runs) for part in ("prefill", "decode")}
           for name, runs in timings[n].items()}
    ours_, theirs = med["specdecode"], med["llama.cpp"]
    print(f"| {n} | {ours_['prefill']:.1f} | {theirs['prefill']:.1f} | {ours_['prefill'] / theirs['prefill']:.2f}x | "
          f"{ours_['decode']:.1f} | {theirs['decode']:.1f} | {ours_['decode'] / theirs['decode']:.2f}x |")
if args.out:
    Path(args.out).write_text(json.dumps({str(n): t for n, t in timings.items()}, indent=1))
