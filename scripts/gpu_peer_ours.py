"""specdecode on the GGUF files that scripts/gpu_peer.sh hands llama.cpp's CUDA build, counted as llama-bench counts:
pp512 (a 512-token prompt read, tokens per second) and tg128 (128 tokens decoded one pass each from an empty cache,
no sampling), medians of three; then the engine itself, which a user gets: plain decoding and the default drafter
with the draft file, greedy, 128 new tokens after a short prompt (beside llama-speculative-simple's run).

    python3 scripts/gpu_peer_ours.py --model TARGET.gguf [--draft DRAFT.gguf] --out ours.json
    python3 scripts/gpu_peer_ours.py --report FOLDER     (report.md of a gpu_peer.sh run)
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdecode.bench import peers


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_seconds(fn, repeats: int = 3) -> float:
    fn()  # compiles kernels, captures graphs
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_counts(model) -> dict:
    """pp512 and tg128 as llama-bench runs them, on the model alone (no engine)."""
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (512,), device=model.device)
    pp = median_seconds(lambda: model(prompt, model.new_cache(1024), logits="last"))

    def decode():
        cache = model.new_cache(1024)
        token = torch.zeros(1, dtype=torch.long, device=model.device)
        for _ in range(128):
            token = model(token, cache).argmax(-1)

    def decode_ahead():  # each step launched from the last one's argmax on the device, no read between (launch_ahead)
        cache = model.new_cache(1024)
        token = torch.zeros(1, dtype=torch.long, device=model.device)
        for _ in range(128):
            token = model.steps_from_device([cache], token).argmax(-1)

    tg = median_seconds(decode)
    ahead = median_seconds(decode_ahead) if model.exact_pass is not None else float("nan")
    return {"pp512_tok_s": 512 / pp, "tg128_tok_s": 128 / tg, "tg128_ahead_tok_s": 128 / ahead}


def engine_runs(model_path: str, draft_path: str | None, device: str, prompt: str) -> dict:
    """Plain and the default drafter (with the draft file where given) through the engine, greedy; whether the
    drafter's tokens are plain decoding's."""
    from specdecode.build import EngineOptions, build_engine

    engine, default = build_engine(EngineOptions(model=model_path, draft=draft_path or "auto", device=device,
                                                 ctx=2048))
    out, tokens = {}, {}
    for drafter in ("none", default):
        engine.generate(prompt, drafter=drafter, max_new_tokens=16)  # warm: kernels, graphs, cost measurements
        result = engine.generate(prompt, drafter=drafter, max_new_tokens=128)
        s = result.stats
        out[drafter] = {"tok_s": s.tokens_per_s, "tokens": s.generated_tokens, "tau": s.tau, "alpha": s.alpha}
        tokens[drafter] = result.token_ids
    out["identical"] = tokens["none"] == tokens[default]
    engine.launch_ahead = True  # plain decoding with each step launched before the last is read
    engine.generate(prompt, drafter="none", max_new_tokens=16)
    result = engine.generate(prompt, drafter="none", max_new_tokens=128)
    out["ahead"] = {"tok_s": result.stats.tokens_per_s, "identical": result.token_ids == tokens["none"]}
    return out


def report(folder: Path, shapes: list[str]) -> None:
    """report.md from the run's files: each shape's pp512 and tg128, llama.cpp's and ours, and the speculative
    runs, ratios within this run."""
    lines = ["| shape | llama.cpp tg128 | specdecode tg128 | ratio (goal >= 1.2) | llama.cpp pp512 | specdecode pp512 |"
             " ratio (goal >= 1.0) | specdecode engine: plain / default drafter (identical) |"
             " launch_ahead: tg128 (ratio) / engine plain (identical) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for shape in shapes:
        peer = llama_bench(folder / f"llama-bench-{shape}.json")
        ours = json.loads((folder / f"ours-{shape}.json").read_text()) if (folder / f"ours-{shape}.json").exists() else {}
        engine = ours.get("engine", {})
        drafted = next((k for k in engine if k not in ("none", "identical", "ahead")), None)
        ahead, tg_ahead = engine.get("ahead"), ours.get("tg128_ahead_tok_s")
        cells = [shape, peer.get("tg"), ours.get("tg128_tok_s"), ratio(ours.get("tg128_tok_s"), peer.get("tg")),
                 peer.get("pp"), ours.get("pp512_tok_s"), ratio(ours.get("pp512_tok_s"), peer.get("pp")),
                 f"{engine['none']['tok_s']:.1f} / {engine[drafted]['tok_s']:.1f} ({engine['identical']})"
                 if drafted else "-",
                 (f"{tg_ahead:.1f} ({ratio(tg_ahead, peer.get('tg')) or 0:.2f}) / " if tg_ahead else "- / ")
                 + (f"{ahead['tok_s']:.1f} ({ahead['identical']})" if ahead else "-")]
        lines.append("| " + " | ".join(c if isinstance(c, str) else "-" if c is None else
                                        f"{c:.2f}" if index in (3, 6) else f"{c:.1f}" for index, c in enumerate(cells))
                     + " |")
    spec = folder / "speculative-simple.log"
    if spec.exists():
        try:
            found = peers.parse_speculative(spec.read_text(errors="replace"))
            rate = found["accept_rate"]
            figures = (f"{found['tokens_per_s']:.1f} t/s decoding, "
                       + (f"{rate:.1%} of {found['drafted']} drafts accepted" if rate is not None else "nothing drafted"))
        except ValueError:
            figures = "no figures in its log"
        lines += ["", f"- llama-speculative-simple (1.5B with the 0.5B draft, 128 tokens, greedy): {figures}"]
    lines += ["", "Random weights in Qwen2.5 shapes (scripts/gguf_random.py): both engines read the same files. tg128"
              " and pp512 as llama-bench counts them (specdecode's: scripts/gpu_peer_ours.py, its model alone); the"
              " engine column is specdecode's own generation, greedy, 128 tokens; launch_ahead: each step launched"
              " from the last step's argmax on the device before that step is read (Transformer.steps_from_device;"
              " the engine's Engine(launch_ahead=True))."]
    (folder / "report.md").write_text("# llama.cpp CUDA beside specdecode (scripts/gpu_peer.sh)\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def llama_bench(path: Path) -> dict:
    """tok/s of llama-bench's pp512 and tg128 records ({} where the file is missing or holds neither)."""
    try:
        bench = peers.parse_llama_bench(path.read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    if 512 in bench["pp"]:
        out["pp"] = bench["pp"][512]["tokens_per_s"]
    if bench["tg"] and bench["tg"]["n_gen"] == 128:
        out["tg"] = bench["tg"]["tokens_per_s"]
    return out


def ratio(ours, peer):
    return ours / peer if ours and peer else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--draft")
    parser.add_argument("--prompt", default="Write a Python function that returns the n-th Fibonacci number.")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--device", default="cuda", help="cuda; cpu tries the script on a machine without one")
    parser.add_argument("--report", type=Path, help="write FOLDER/report.md from a gpu_peer.sh run's files")
    parser.add_argument("--shapes", default="0.5b,1.5b,7b")
    args = parser.parse_args()
    if args.report:
        report(args.report, args.shapes.split(","))
        return
    from specdecode.models.loader import load_model

    loaded = load_model(args.model, device=args.device, dtype="int8")
    result = {"model": args.model, "device": args.device, **bench_counts(loaded.model)}
    del loaded
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    result["engine"] = engine_runs(args.model, args.draft, args.device, args.prompt)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
