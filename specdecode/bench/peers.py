"""Peers on the same prompts and machine: transformers (plain and assisted) and llama.cpp's own binaries.

llama.cpp runs as its users run it: `llama-bench` for plain decoding speed (tg128) and the cost of small
batches (pp5/pp9/pp16), `llama-speculative-simple` per prompt for speculative decoding with the draft
model (K 4 and 8) and with n-gram lookup (K 8), and `llama-completion` per prompt for plain decoding of the
same prompts. Build the binaries with scripts/build_llamacpp.sh; they are found through --llamacpp-bin,
$LLAMACPP_BIN, or <cache>/llama.cpp/bin. llama.cpp's figures are decode-only tokens/s (they leave out
the prompt prefill), so the summary carries decode-only figures for every system that has them.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .. import registry

LLAMACPP_REQUIRED = ("llama-bench", "llama-speculative-simple")
LLAMACPP_OPTIONAL = ("llama-completion",)  # plain decoding of the same prompts
BENCH_BATCHES = (5, 9, 16)  # verify-block sizes for the single-step-vs-block comparison
BENCH_TG = 128
BENCH_REPS = None  # llama-bench's own default (5)
# ngram-simple drafts the m tokens after the last earlier match of the last n tokens, and only when at
# least n tokens follow the match; llama.cpp's default n (12) is larger than m=8, which never drafts.
NGRAM_SIZE_N = 3
SPEC_CONFIGS = (  # label, draft model?, K, flags after the common ones
    ("llama.cpp-draft-k4", True, 4, ["--spec-type", "draft-simple", "--spec-draft-n-max", "4"]),
    ("llama.cpp-draft-k8", True, 8, ["--spec-type", "draft-simple", "--spec-draft-n-max", "8"]),
    ("llama.cpp-ngram-k8", False, 8, ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(NGRAM_SIZE_N),
                                      "--spec-ngram-simple-size-m", "8"]),
)
OWN_PLAIN = (("transformers-assisted", "transformers"), ("llama.cpp-lookup", "llama.cpp"),
             ("llama.cpp-draft-k4", "llama.cpp"), ("llama.cpp-draft-k8", "llama.cpp"),
             ("llama.cpp-ngram-k8", "llama.cpp"),
             ("specdecode-draft", "specdecode-ar"), ("specdecode-lookup", "specdecode-ar"),
             ("specdecode-tree", "specdecode-ar"))


def _chat_text(tokenizer, prompt) -> str:
    return tokenizer.chat_prompt([{"role": "user", "content": prompt.turns[0]}])


def _chat_ids(tokenizer, prompt) -> list[int]:
    return tokenizer.encode(_chat_text(tokenizer, prompt))


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


# --------------------------------------------------------------------------- llama.cpp: finding the binaries
def default_llamacpp_bin() -> Path:
    return registry.cache_dir() / "llama.cpp" / "bin"


def find_llamacpp_bin(explicit: str | os.PathLike | None = None) -> tuple[Path | None, str]:
    """The folder with llama.cpp's binaries: --llamacpp-bin, else $LLAMACPP_BIN, else the default folder.
    Returns (folder, "") or (None, why not)."""
    chosen = explicit or os.environ.get("LLAMACPP_BIN") or default_llamacpp_bin()
    folder = Path(chosen).expanduser()
    missing = [name for name in LLAMACPP_REQUIRED if not os.access(folder / name, os.X_OK)]
    if missing:
        return None, (f"llama.cpp binaries not found in {folder} (missing {', '.join(missing)});"
                      " build them with scripts/build_llamacpp.sh")
    return folder, ""


# --------------------------------------------------------------------------- llama.cpp: parsing the outputs
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+|inf|nan) t/s")
_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")


def _int_field(name: str, text: str) -> int | None:
    match = re.search(rf"\b{name}\s*=\s*(\d+)", text)
    return int(match.group(1)) if match else None


def parse_speculative(text: str) -> dict:
    """Figures from llama-speculative-simple's log: decode speed, drafted and accepted counts."""
    decoded = _DECODED.search(text)
    if not decoded:
        raise ValueError("no 'decoded N tokens in T seconds' line in llama-speculative-simple's output")
    encoded = _ENCODED.search(text)
    drafted, accepted = _int_field("n_drafted", text), _int_field("n_accept", text)
    new_tokens, seconds = int(decoded.group(1)), float(decoded.group(2))
    return {
        "new_tokens": new_tokens, "seconds": seconds,
        "tokens_per_s": new_tokens / seconds if seconds else float(decoded.group(3)),
        "prompt_tokens": int(encoded.group(1)) if encoded else None,
        "prompt_seconds": float(encoded.group(2)) if encoded else None,
        "draft_max": _int_field("n_draft", text),  # the draft model's n_max (not the n-gram m)
        "drafted": drafted, "accepted": accepted,
        "accept_rate": accepted / drafted if drafted else None,
    }


_PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_EVAL = re.compile(r"(?<!prompt )\beval time =\s*([\d.]+) ms /\s*(\d+) runs")


def parse_perf(text: str) -> dict:
    """Figures from llama.cpp's perf print (llama-completion): decode = the one-token evaluations, so
    new_tokens is one less than the tokens generated (the first comes from the prompt's logits)."""
    decoded = _EVAL.search(text)
    if not decoded:
        raise ValueError("no 'eval time = T ms / N runs' line in the output")
    seconds, runs = float(decoded.group(1)) / 1e3, int(decoded.group(2))
    prompt = _PROMPT_EVAL.search(text)
    return {"new_tokens": runs, "seconds": seconds, "tokens_per_s": runs / seconds if seconds else 0.0,
            "prompt_tokens": int(prompt.group(2)) if prompt else None,
            "prompt_seconds": float(prompt.group(1)) / 1e3 if prompt else None}


def parse_llama_bench(text: str) -> dict:
    """llama-bench -o json: the tg test and the pp tests, each with tokens/s and seconds per run."""
    start = text.find("[")
    records = json.JSONDecoder().raw_decode(text[start:])[0] if start >= 0 else []
    out: dict = {"tg": None, "pp": {}, "build": None, "cpu": None}
    for r in records:
        entry = {"tokens_per_s": float(r["avg_ts"]), "stddev_tokens_per_s": float(r.get("stddev_ts", 0.0)),
                 "seconds": float(r["avg_ns"]) / 1e9, "threads": r.get("n_threads")}
        out["build"] = f"{r.get('build_commit')} ({r.get('build_number')})"
        out["cpu"] = r.get("cpu_info")
        if r["n_gen"] > 0 and r["n_prompt"] == 0:
            out["tg"] = {"n_gen": int(r["n_gen"]), "depth": int(r.get("n_depth", 0)), **entry}
        elif r["n_prompt"] > 0 and r["n_gen"] == 0:
            out["pp"][int(r["n_prompt"])] = {"n_prompt": int(r["n_prompt"]), **entry}
    if out["tg"] is None and not out["pp"]:
        raise ValueError("no tg or pp records in llama-bench's JSON output")
    return out


def block_costs(bench: dict) -> dict:
    """Per pp size: the per-token time of a k-token batch relative to one decode step (tg), and the whole
    block's time in decode steps (what a verify pass of k tokens costs against plain decoding)."""
    tg = (bench.get("tg") or {}).get("tokens_per_s")
    out = {}
    for k, pp in sorted(bench.get("pp", {}).items()):
        per_token = tg / pp["tokens_per_s"] if tg and pp["tokens_per_s"] else None
        out[k] = {"tokens_per_s": pp["tokens_per_s"], "per_token_vs_tg": per_token,
                  "block_vs_step": k * per_token if per_token is not None else None}
    return out


# --------------------------------------------------------------------------- llama.cpp: running
def _run(cmd: list[str], timeout: float, stdout_only: bool = False) -> str:
    """One binary at a time. stdout and stderr together (llama.cpp logs its figures to stderr), or stdout
    alone (llama-bench's JSON)."""
    result = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                            timeout=timeout)
    text = result.stdout + "\n" + result.stderr
    if result.returncode != 0:
        tail = " | ".join(text.strip().splitlines()[-3:])
        raise RuntimeError(f"{Path(cmd[0]).name} exited with {result.returncode}: {tail}")
    return result.stdout if stdout_only else text


def llama_bench_cmd(bin_dir: Path, model: Path, threads: int, n_gen: int = BENCH_TG,
                    batches=BENCH_BATCHES, reps: int | None = None, depth: int = 0) -> list[str]:
    # One call runs the same tests as `-p 0 -n 128` plus `-p 5,9,16 -n 0` (llama-bench runs each -p and
    # each -n as a separate test), loading the model once. depth: tokens in the cache before the test (-d).
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-t", str(threads),
           "-p", ",".join(str(b) for b in batches) or "0", "-n", str(n_gen), "-o", "json"]
    return cmd + (["-r", str(reps)] if reps else []) + (["-d", str(depth)] if depth else [])


def speculative_cmd(bin_dir: Path, target: Path, draft: Path | None, prompt_file: Path, flags: list[str],
                    max_new_tokens: int, threads: int, ctx: int) -> list[str]:
    # llama-speculative-simple stops once it has produced more than -n tokens, so -n N-1 yields at least N
    # (its last steps may overshoot by up to K: a remaining budget of 0 reads as "no limit" on the draft).
    cmd = [str(bin_dir / "llama-speculative-simple"), "-m", str(target)]
    cmd += ["-md", str(draft)] if draft else []
    return cmd + [*flags, "-f", str(prompt_file), "-n", str(max(1, max_new_tokens - 1)), "--temp", "0",
                  "-t", str(threads), "-c", str(ctx), "-b", str(ctx), "--no-escape"]


def completion_cmd(bin_dir: Path, target: Path, prompt_file: Path, max_new_tokens: int, threads: int,
                   ctx: int) -> list[str]:
    # -no-cnv: the prompt file already holds the chat-formatted text, so no second template.
    return [str(bin_dir / "llama-completion"), "-m", str(target), "-f", str(prompt_file), "-n", str(max_new_tokens),
            "--temp", "0", "-t", str(threads), "-c", str(ctx), "-b", str(ctx), "--no-escape", "-no-cnv",
            "--no-display-prompt", "--no-warmup"]


def write_prompt_file(path: Path, text: str) -> Path:
    # llama.cpp's -f drops one trailing newline; the chat prompt ends with one, so add one to keep it.
    path.write_text(text + "\n", encoding="utf-8")
    return path


class LlamaCppPeer:
    """llama.cpp on the bench's prompts, one binary at a time: `start()` once (llama-bench's batch costs and
    its tg at depth 0), then `prompt()` per prompt, which a bench calls right after specdecode's methods ran
    that prompt, so both systems are timed in the same minutes of a machine whose memory bandwidth drifts
    (measured here from 30 to 47 GB/s within an hour). Per prompt: llama-bench's tg at the prompt's depth
    (`llama.cpp`, llama.cpp's plain decoding the way its users time it), the speculative configurations and
    llama-completion. Every run is decode-only; failures become notes, never exceptions."""

    def __init__(self, args, tokenizer):
        self.args, self.tokenizer = args, tokenizer
        self.runs: dict = {}
        self.bin_dir, why = find_llamacpp_bin(getattr(args, "llamacpp_bin", None))
        if self.bin_dir is None:
            print(f"peers: skipping llama.cpp: {why}", file=sys.stderr)
            self.info: dict = {"skipped": why}
            return
        self.threads = torch.get_num_threads()
        self.ctx = getattr(args, "ctx", 4096)
        self.target = registry.resolve(args.model)
        draft_name = getattr(args, "draft", None)
        if draft_name in (None, "none", "lookup"):  # specdecode's own draft-free choices: llama.cpp gets the default draft
            draft_name = registry.DEFAULT_DRAFT
        draft = registry.resolve(draft_name)
        self.info = {"bin": str(self.bin_dir), "target": str(self.target), "draft": str(draft), "threads": self.threads,
                     "timing": "decode-only", "commands": [], "notes": [], "ngram_size_n": NGRAM_SIZE_N,
                     "plain": f"llama-bench tg{args.max_new_tokens} at each prompt's depth, next to specdecode's runs of it"}
        self.configs = [(label, draft if with_draft else None, k, flags) for label, with_draft, k, flags in SPEC_CONFIGS]
        self.has_completion = os.access(self.bin_dir / "llama-completion", os.X_OK)
        if not self.has_completion:
            self.info["notes"].append("llama-completion not built: no plain decoding of the same prompts")
        self.tmp = tempfile.TemporaryDirectory(prefix="specdecode-llamacpp-")
        self.prompts_run = 0

    @property
    def active(self) -> bool:
        return self.bin_dir is not None

    def start(self) -> None:
        """llama-bench's tg at depth 0 and its small batches (the verify-block comparison), once."""
        if not self.active:
            return
        cmd = llama_bench_cmd(self.bin_dir, self.target, self.threads, n_gen=BENCH_TG, batches=BENCH_BATCHES, reps=BENCH_REPS)
        self.info["commands"].append(" ".join(cmd))
        print("peers: llama-bench (tg and small batches) ...", file=sys.stderr)
        try:
            bench = parse_llama_bench(_run(cmd, timeout=1800, stdout_only=True))
            self.info.update(bench=bench, build=bench["build"], block_costs=block_costs(bench))
        except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            self._note(f"llama-bench failed: {exc}")

    def prompt(self, index: int, prompt) -> None:
        """Every llama.cpp run of one prompt (its first turn)."""
        if not self.active:
            return
        text = _chat_text(self.tokenizer, prompt)
        n_prompt = len(self.tokenizer.encode(text))
        prompt_file = write_prompt_file(Path(self.tmp.name) / f"prompt{index}.txt", text)
        n_gen = self.args.max_new_tokens
        jobs = [("llama.cpp", llama_bench_cmd(self.bin_dir, self.target, self.threads, n_gen=n_gen, batches=(), reps=1,
                                              depth=n_prompt), self._parse_tg, {})]
        jobs += [(label, speculative_cmd(self.bin_dir, self.target, model, prompt_file, flags, n_gen, self.threads, self.ctx),
                  parse_speculative, {"draft_max": k}) for label, model, k, flags in self.configs]
        if self.has_completion:
            jobs.append(("llama.cpp-plain-prompts",
                         completion_cmd(self.bin_dir, self.target, prompt_file, n_gen, self.threads, self.ctx), parse_perf, {}))
        for label, cmd, parse, extra in jobs:  # one at a time, never in parallel
            if self.prompts_run == 0:
                self.info["commands"].append(" ".join(cmd))
            try:
                figures = parse(_run(cmd, timeout=120 + 4 * n_gen, stdout_only=label == "llama.cpp"))
            except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
                self._note(f"{label} on {prompt.id} failed: {exc}")
                continue
            if figures.get("prompt_tokens") not in (None, n_prompt):
                self.info["notes"].append(f"{label} on {prompt.id}: llama.cpp read {figures['prompt_tokens']} prompt"
                                          f" tokens, specdecode {n_prompt}")
            self.runs.setdefault(label, []).append({"prompt_id": prompt.id, "decode_only": True, **figures, **extra})
        self.prompts_run += 1

    @staticmethod
    def _parse_tg(text: str) -> dict:
        tg = parse_llama_bench(text)["tg"]
        if tg is None:
            raise ValueError("no tg record in llama-bench's JSON output")
        return {"new_tokens": tg["n_gen"], "seconds": tg["seconds"], "tokens_per_s": tg["tokens_per_s"], "depth": tg.get("depth")}

    def _note(self, note: str) -> None:
        self.info["notes"].append(note)
        print(f"peers: {note}", file=sys.stderr)

    def result(self) -> tuple[dict, dict]:
        if self.active:
            self.tmp.cleanup()
        return self.runs, self.info


def llamacpp_peer(args, prompts, tokenizer) -> tuple[dict, dict]:
    """(runs, info): llama.cpp's batch costs, then every prompt in turn (a bench that has already run)."""
    peer = LlamaCppPeer(args, tokenizer)
    peer.start()
    for index, prompt in enumerate(prompts):
        peer.prompt(index, prompt)
    return peer.result()


def _llamacpp_runs(args, prompts, tokenizer) -> dict:
    return llamacpp_peer(args, prompts, tokenizer)[0]


def _peers_asked(args) -> str:
    """--peers' value: all, llama.cpp or transformers (a bare flag, or a caller without one, means all)."""
    return args.peers if isinstance(getattr(args, "peers", None), str) else "all"


def wants_llamacpp(args) -> bool:
    return _peers_asked(args) in ("all", "llama.cpp")


def run_peers(args, prompts, rows, tokenizer, llamacpp: LlamaCppPeer | None = None) -> dict:
    """First turns only, greedy, same max_new_tokens; figures as ratios to specdecode's own plain decoding.
    Peers run one after the other, never in parallel. `llamacpp`: a peer that already ran each prompt
    next to specdecode's methods (bench --peers); without it llama.cpp runs every prompt now."""
    if llamacpp is not None:
        runs, info = llamacpp.result()
    else:
        runs, info = llamacpp_peer(args, prompts, tokenizer) if wants_llamacpp(args) else ({}, None)
    if _peers_asked(args) in ("all", "transformers"):
        runs.update(_transformers_runs(args, prompts, tokenizer))
    runs = {label: [{k: v for k, v in item.items() if k != "token_ids"} for item in items] for label, items in runs.items()}
    return {"runs": runs, "summary": summarise_peers(runs, [vars(r) for r in rows]), "llamacpp": info}


# --------------------------------------------------------------------------- summary and table
def summarise_peers(runs: dict, rows: list[dict], earlier: dict | None = None) -> dict:
    """tokens/s per system, next to specdecode's own methods (first turns), as ratios to specdecode plain
    and to each system's own plain decoding. `earlier` keeps summary entries of systems not rerun.
    `timing` says what the seconds cover: llama.cpp reports decode-only figures (no prompt prefill);
    `decode_tokens_per_s` is the decode-only figure wherever a system gives one (specdecode: its time less
    the target's prefill), and `decode_vs_specdecode_plain` compares those."""
    everything = dict(runs)
    for method in sorted({r["method"] for r in rows}):
        everything[f"specdecode-{method}"] = [r for r in rows if r["method"] == method and r["turn"] == 0]
    summary = {label: dict(entry) for label, entry in (earlier or {}).items() if label not in everything}
    for label, items in everything.items():
        tokens = sum(i["new_tokens"] for i in items)
        seconds = sum(i["seconds"] for i in items)
        entry = {"tokens_per_s": tokens / seconds if seconds else 0.0, "prompts": len(items)}
        if items and all(i.get("decode_only") for i in items):
            entry["timing"] = "decode-only"
            entry["decode_tokens_per_s"] = entry["tokens_per_s"]
        elif items and all("prefill_seconds" in i for i in items):
            entry["timing"] = "prefill+decode"
            decode = seconds - sum(i["prefill_seconds"] for i in items)
            entry["decode_tokens_per_s"] = tokens / decode if decode > 0 else None
        else:
            entry["timing"] = "prefill+decode"
            entry["decode_tokens_per_s"] = None
        drafted = sum(i.get("drafted") or 0 for i in items)
        if drafted and label.startswith("llama.cpp"):
            entry["accept_rate"] = sum(i.get("accepted") or 0 for i in items) / drafted
        summary[label] = entry
    base = summary.get("specdecode-ar", {}).get("tokens_per_s")
    base_decode = summary.get("specdecode-ar", {}).get("decode_tokens_per_s")
    for entry in summary.values():
        entry["vs_specdecode_plain"] = entry["tokens_per_s"] / base if base else None
        decode = entry.get("decode_tokens_per_s")
        entry["decode_vs_specdecode_plain"] = decode / base_decode if decode and base_decode else None
    for fast, plain in OWN_PLAIN:
        if fast in summary and plain in summary and summary[plain]["tokens_per_s"]:
            summary[fast]["vs_own_plain"] = summary[fast]["tokens_per_s"] / summary[plain]["tokens_per_s"]
    return summary


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def peer_table(peers: dict) -> list[str]:
    lines = ["| system | tokens/s | vs specdecode plain | vs its own plain | timing | decode tokens/s | decode vs specdecode plain |",
             "|---|---|---|---|---|---|---|"]
    for label, s in peers["summary"].items():
        decode = s.get("decode_tokens_per_s")
        lines.append(f"| {label} | {s['tokens_per_s']:.2f} | {_ratio(s.get('vs_specdecode_plain'))}"
                     f" | {_ratio(s.get('vs_own_plain'))} | {s.get('timing', '-')}"
                     f" | {'-' if decode is None else f'{decode:.2f}'} | {_ratio(s.get('decode_vs_specdecode_plain'))} |")
    info = peers.get("llamacpp") or {}
    if info.get("skipped"):
        lines += ["", f"llama.cpp skipped: {info['skipped']}"]
    elif info:
        lines += ["", f"llama.cpp ({info.get('build') or 'build unknown'}, {info.get('threads')} threads): figures are"
                  " decode-only tokens/s (prompt prefill left out); `llama.cpp` is llama-bench's tg figure"
                  + (" at each prompt's depth, run right after specdecode's methods on that prompt" if info.get("plain") else "")
                  + ", its own plain for the speculative rows; `llama.cpp-plain-prompts` is llama-completion on the"
                  " same prompts."]
        tg0 = (info.get("bench") or {}).get("tg")
        if tg0 and info.get("plain"):
            lines.append(f"llama-bench tg{tg0['n_gen']} at depth 0, once before the prompts: {tg0['tokens_per_s']:.2f} tokens/s.")
        costs = info.get("block_costs") or {}
        if costs:
            lines += ["", "| llama.cpp batch | tokens/s | per-token time vs one decode step | block time in decode steps |",
                      "|---|---|---|---|"]
            for k, c in costs.items():
                lines.append(f"| pp{k} | {c['tokens_per_s']:.2f} | {_ratio(c['per_token_vs_tg'])} | {_ratio(c['block_vs_step'])} |")
        for note in info.get("notes", []):
            lines.append(f"- {note}")
    return lines
