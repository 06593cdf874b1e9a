"""Host time of each request's verdict in a batched pass (issue 50: the batched engine's Python per request and pass).

16 requests on smollm2 in one BatchEngine, plain decoding, 64 tokens each; every request's `_apply` (its verdict,
stop checks, detokenizing, events) timed. `wrapper` decodes through transformers' tokenizer as before stop 55,
`backend` through the tokenizers library (Tokenizer._backend_decoder). Stop 55, 2-core Xeon: 41-46 us against
32-37 us per request and pass.

    .venv/bin/python docs/experiments/host_time_per_request.py wrapper
    .venv/bin/python docs/experiments/host_time_per_request.py backend
"""
import sys
import time

import torch

import specdecode.batch as batch
from specdecode.build import EngineOptions, build_engine

engine, _ = build_engine(EngineOptions(model="smollm2-135m"))
if sys.argv[1:] == ["wrapper"]:
    engine.target.tokenizer.__dict__["_backend_decoder"] = None
gen = torch.Generator().manual_seed(0)
prompts = [torch.randint(100, 20000, (32,), generator=gen).tolist() for _ in range(16)]
total = [0.0, 0]
apply = batch.BatchEngine._apply


def timed(self, *args, **kwargs):
    started = time.perf_counter()
    apply(self, *args, **kwargs)
    total[0] += time.perf_counter() - started
    total[1] += 1


batch.BatchEngine._apply = timed
for _ in range(3):  # the last run counts: the first ones warm the slots and the code
    total[:] = [0.0, 0]
    batch.BatchEngine(engine, max_batch=16, prefill_rows=256).generate_many(prompts, drafter="none", max_new_tokens=64)
print(f"{sys.argv[1:]}: verdict per request and pass {total[0] / total[1] * 1e6:.1f} us over {total[1]}")
