"""Peers on the same prompts and machine: transformers (plain and assisted) and llama.cpp when installed."""
from __future__ import annotations

import sys
import time

import torch

from .. import registry


def _chat_ids(tokenizer, prompt) -> list[int]:
    return tokenizer.encode(tokenizer.chat_prompt([{"role": "user", "content": prompt.turns[0]}]))


def _transformers_runs(args, prompts, tokenizer) -> dict:
    from transformers import AutoModelForCausalLM

    def load(name):
        path = registry.resolve(name)
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()

    print("peers: loading the target and draft into transformers (dequantizing GGUF) ...", file=sys.stderr)
    target = load(args.model)
    draft = load(args.draft or registry.DEFAULT_DRAFT)
    out = {"transformers": [], "transformers-assisted": []}
    for prompt in prompts:
        ids = torch.tensor([_chat_ids(tokenizer, prompt)])
        for label, extra in (("transformers", {}), ("transformers-assisted", {"assistant_model": draft})):
            t0 = time.perf_counter()
            with torch.inference_mode():
                result = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                                         do_sample=False, **extra)
            seconds = time.perf_counter() - t0
            new = result[0, ids.shape[1]:].tolist()
            out[label].append({"prompt_id": prompt.id, "new_tokens": len(new), "seconds": seconds, "token_ids": new})
    return out


def _llamacpp_runs(args, prompts, tokenizer) -> dict:
    try:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError:
        return {}
    path = str(registry.resolve(args.model))
    out = {}
    for label, extra in (("llama.cpp", {}), ("llama.cpp-lookup", {"draft_model": LlamaPromptLookupDecoding(num_pred_tokens=8)})):
        llm = Llama(model_path=path, n_ctx=args.ctx, n_threads=torch.get_num_threads(), verbose=False, **extra)
        rows = []
        for prompt in prompts:
            ids = _chat_ids(tokenizer, prompt)
            t0 = time.perf_counter()
            tokens = []
            for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
                if token in tokenizer.eos_ids or len(tokens) >= args.max_new_tokens:
                    break
                tokens.append(token)
            rows.append({"prompt_id": prompt.id, "new_tokens": len(tokens), "seconds": time.perf_counter() - t0})
        out[label] = rows
    return out


def run_peers(args, prompts, rows, tokenizer) -> dict:
    """First turns only, greedy, same max_new_tokens; figures as ratios to specdecode's own plain decoding."""
    runs = {}
    runs.update(_llamacpp_runs(args, prompts, tokenizer))
    runs.update(_transformers_runs(args, prompts, tokenizer))
    runs = {label: [{k: v for k, v in item.items() if k != "token_ids"} for item in items] for label, items in runs.items()}
    return {"runs": runs, "summary": summarise_peers(runs, [vars(r) for r in rows])}


def summarise_peers(runs: dict, rows: list[dict], earlier: dict | None = None) -> dict:
    """tokens/s per system, next to specdecode's own methods (first turns), as ratios to specdecode plain
    and to each system's own plain decoding. `earlier` keeps summary entries of systems not rerun."""
    everything = dict(runs)
    for method in sorted({r["method"] for r in rows}):
        everything[f"specdecode-{method}"] = [r for r in rows if r["method"] == method and r["turn"] == 0]
    summary = {label: dict(entry) for label, entry in (earlier or {}).items() if label not in everything}
    for label, items in everything.items():
        tokens = sum(i["new_tokens"] for i in items)
        seconds = sum(i["seconds"] for i in items)
        summary[label] = {"tokens_per_s": tokens / seconds if seconds else 0.0, "prompts": len(items)}
    base = summary.get("specdecode-ar", {}).get("tokens_per_s")
    for entry in summary.values():
        entry["vs_specdecode_plain"] = entry["tokens_per_s"] / base if base else None
    for fast, plain in (("transformers-assisted", "transformers"), ("llama.cpp-lookup", "llama.cpp"),
                        ("specdecode-draft", "specdecode-ar"), ("specdecode-lookup", "specdecode-ar")):
        if fast in summary and plain in summary and summary[plain]["tokens_per_s"]:
            summary[fast]["vs_own_plain"] = summary[fast]["tokens_per_s"] / summary[plain]["tokens_per_s"]
    return summary


def peer_table(peers: dict) -> list[str]:
    lines = ["| system | tokens/s | vs specdecode plain | vs its own plain |", "|---|---|---|---|"]
    for label, s in peers["summary"].items():
        vs = s.get("vs_specdecode_plain")
        own = s.get("vs_own_plain")
        lines.append(f"| {label} | {s['tokens_per_s']:.2f} | {'-' if vs is None else f'{vs:.2f}x'} | {'-' if own is None else f'{own:.2f}x'} |")
    return lines
