"""HumanEval, 10 problems, ar and auto through the bench's own run_bench; dumps per prompt token ids and timings."""
import json, statistics, sys
from pathlib import Path
from specdecode.bench import runner
from specdecode.bench.prompts import find_bench_dir, load_suite
from specdecode.build import EngineOptions, build_engine
from specdecode.sampling import SamplingParams

out = Path(sys.argv[1])
engine, _ = build_engine(EngineOptions())
prompts = load_suite("humaneval", find_bench_dir(None), 10)
answers = {}
real = runner.run_method
def capture(engine, prompt, method, *a, **kw):
    rows, outputs = real(engine, prompt, method, *a, **kw)
    answers[f"{prompt.id}:{method}"] = outputs
    return rows, outputs
runner.run_method = capture
rows = runner.run_bench(engine, prompts, ["ar", "auto"], "auto", SamplingParams(), 128, progress=False)
summary = runner.summarise(rows)
per = {}
for r in rows:
    per.setdefault(r.prompt_id, {})[r.method] = r.tokens_per_s
ratios = [p["auto"] / p["ar"] for p in per.values()]
result = {"summary": summary, "median_ratio": statistics.median(ratios), "ratios": ratios,
          "identical": [r.identical for r in rows if r.method == "auto"],
          "answers": {k: v for k, v in answers.items() if not k.startswith("warmup")}}
out.write_text(json.dumps(result, indent=1))
print(json.dumps({k: result[k] for k in ("median_ratio", "identical")}), json.dumps(summary)[:600])
