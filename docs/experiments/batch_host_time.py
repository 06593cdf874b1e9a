"""The host's time per request and pass in BatchEngine, the device's work left out (issue 50: on a GPU this time is
spent while the device waits, and it bounds the batched throughput).

16 greedy requests on smollm2 (its real tokenizer, detokenizing included), plain decoding, 128 tokens each. The
target's pass is replaced by a stub that advances the caches and hands out rows of fixed random logits over the
first 1,024 token ids: small, so that the argmax (a GPU's work, a CPU's costly one) stays out of the figure, as the
pass itself does. Everything else a pass does on the host is in it: admission, plans, segments, the argmax read,
verdicts, stop checks, detokenizing, events. Prints the last of three runs (the first warms the slots).

    .venv/bin/python docs/experiments/batch_host_time.py            # per pass and per request
    .venv/bin/python docs/experiments/batch_host_time.py profile    # and a profile of the last run
"""
import cProfile
import pstats
import sys
import time

import torch

from specdecode.batch import BatchEngine
from specdecode.build import EngineOptions, build_engine

REQUESTS, TOKENS, WIDTH = 16, 128, 1024

engine, _ = build_engine(EngineOptions(model="smollm2-135m"))
gen = torch.Generator().manual_seed(0)
rows = torch.randn(4096, WIDTH, generator=gen)
rows[:, [i for i in engine.target.tokenizer.eos_ids if i < WIDTH]] = float("-inf")  # every answer runs its length
cursor = [0]


def stub_pass(segments):
    out = []
    for seg in segments:
        seg.cache.length += seg.rows
        count = {"all": seg.rows, "last": 1}.get(seg.logits, 0)
        first = cursor[0] % (len(rows) - 64)
        cursor[0] += count
        out.append(rows[first : first + count] if count else None)
    return out


engine.target.model.forward_batch = stub_pass
prompts = [torch.randint(100, 20000, (32,), generator=gen).tolist() for _ in range(REQUESTS)]
batch = BatchEngine(engine, max_batch=REQUESTS, prefill_rows=256)
profile = cProfile.Profile()
for run in range(3):
    if run == 2 and sys.argv[1:] == ["profile"]:
        profile.enable()
    passes, started = batch.passes, time.perf_counter()
    batch.generate_many(prompts, drafter="none", max_new_tokens=TOKENS)
    seconds = (time.perf_counter() - started) / (batch.passes - passes)
    profile.disable()
print(f"{REQUESTS} requests: {seconds * 1e3:.2f} ms of host time per pass, {seconds / REQUESTS * 1e6:.1f} us per request")
if sys.argv[1:] == ["profile"]:
    pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
