"""Prompt reads (passes of 1..128 tokens, logits none) of the draft and the target: ms a token, median of 5."""
import time, statistics, torch
from specdecode.cli import build_parser
from specdecode.build import build_engine
args = build_parser().parse_args(["bench", "--draft", "qwen2.5-coder-0.5b", "--drafters", "ar,auto"])
engine, _ = build_engine(args, with_draft_model=True)
for name, lm in (("draft", engine.draft), ("target", engine.target)):
    m = lm.model
    cache = m.new_cache(2048)
    print(name, "int8", getattr(m, "int8", None))
    for n in (1, 2, 16, 49, 128):
        toks = torch.arange(1000, 1000 + n)
        ts = []
        for r in range(5):
            cache.truncate(0)
            m.forward(torch.arange(500, 540), cache, logits="none")
            t = time.perf_counter()
            m.forward(toks, cache, logits="none")
            ts.append(time.perf_counter() - t)
        med = statistics.median(ts)
        print(f"  {name} {n:4d} tokens: {med*1e3:7.1f} ms  {med/n*1e3:6.2f} ms/token   first {ts[0]*1e3:.1f}")
