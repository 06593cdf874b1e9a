"""specdecode bench: plain vs speculative decoding of the same target, same prompts, same process."""
from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from ..build import build_engine, parse_k
from ..drafters.registry import ALIASES, DRAFTERS
from ..errors import InputError
from ..sampling import SamplingParams
from .peers import LlamaCppPeer, run_peers, wants_llamacpp
from .prompts import BenchPrompt, find_bench_dir, load_suite
from .report import write_report



@dataclass
class Row:
    prompt_id: str
    category: str
    turn: int
    method: str
    new_tokens: int
    seconds: float
    tokens_per_s: float
    drafted: int
    accepted: int
    target_passes: int
    mean_k: float
    identical: bool | None  # token ids equal to plain decoding's (None for plain itself)
    finish_reason: str
    prefill_seconds: float = 0.0  # the target reading the prompt: the same work for every method
    steps_by_k: dict[int, int] = field(default_factory=dict)  # target passes by draft length
    accepted_by_k: dict[int, int] = field(default_factory=dict)  # accepted draft tokens by draft length
    outcomes: dict[str, int] = field(default_factory=dict)  # drafting passes by "drafted/accepted"


# A method spelled DRAFTER:nostore runs that drafter without the cross-request store (namespace None: its
# requests neither copy from earlier ones nor are kept), to measure the store in the same run.
NO_STORE = ":nostore"


def method_drafter(method: str) -> str:
    """The drafter a bench method runs (the method name less its :nostore)."""
    return method[: -len(NO_STORE)] if method.endswith(NO_STORE) else method


def run_method(engine, prompt: BenchPrompt, method: str, k, sampling, max_new_tokens, max_k,
               namespace: str | None = None) -> tuple[list[Row], list[list[int]]]:
    """Answer every turn of one prompt with one method, as a chat; returns rows and token ids per turn.

    Each method remembers earlier requests in its own namespace (the suffix store): a method must not
    copy the answer another method just gave to the same prompt, only what it answered before itself.
    """
    engine.reset()
    history: list[dict] = []
    rows, outputs = [], []
    namespace = None if method.endswith(NO_STORE) else namespace or f"bench:{method}"
    for turn_index, turn in enumerate(prompt.turns):
        history.append({"role": "user", "content": turn})
        result = engine.generate(
            list(history), drafter=method_drafter(method), k=k if method != "ar" else 0,
            sampling=sampling, max_new_tokens=max_new_tokens, max_k=max_k, namespace=namespace,
        )
        history.append({"role": "assistant", "content": result.text})
        s = result.stats
        rows.append(Row(prompt.id, prompt.category, turn_index, method, s.generated_tokens, s.time_total,
                        s.tokens_per_s, s.drafted, s.accepted, s.target_passes, s.mean_k, None, s.finish_reason,
                        s.time_prefill, dict(s.steps_by_k), dict(s.accepted_by_k),
                        {f"{d}/{a}": n for (d, a), n in sorted(s.outcomes.items())}))
        outputs.append(result.token_ids)
    return rows, outputs


def run_bench(engine, prompts: list[BenchPrompt], methods: list[str], k, sampling: SamplingParams,
              max_new_tokens: int, max_k: int | None = None, progress: bool = True, repeats: int = 1,
              after_prompt=None) -> list[Row]:
    """Every prompt with every method; with repeats > 1 each prompt is timed that many times per method and
    the median timing kept (the faster of two), so one slow moment of the machine does not decide a prompt.

    Repeat r of a method keeps its own suffix store (namespace bench:METHOD:r): no repeat can copy the
    answer an earlier repeat gave to the same prompt. Every repeat's answer must equal plain decoding's.
    after_prompt(index, prompt), if given, runs after each prompt's methods (peers timed in the same minutes).
    """
    # Warm-up: first calls pay for page faults, kernel loading and cost calibration.
    warm = prompts[0]
    for method in methods:
        run_method(engine, BenchPrompt("warmup", warm.category, warm.turns[:1]), method, k, sampling, 8, max_k,
                   namespace="bench:warm-up")
    rows: list[Row] = []
    bar = tqdm(total=len(prompts) * len(methods) * repeats, desc="bench", disable=not progress, file=sys.stderr)
    for index, prompt in enumerate(prompts):
        timings: dict[str, list[list[Row]]] = {m: [] for m in methods}
        outputs: dict[str, list[list[list[int]]]] = {m: [] for m in methods}
        for repeat in range(repeats):
            # Alternate the order so slow drift of the machine does not favour one method.
            order = methods if (index + repeat) % 2 == 0 else list(reversed(methods))
            for method in order:
                namespace = f"bench:{method}" + (f":{repeat}" if repeats > 1 else "")
                method_rows, answer = run_method(engine, prompt, method, k, sampling, max_new_tokens, max_k, namespace)
                timings[method].append(method_rows)
                outputs[method].append(answer)
                bar.update(1)
        prompt_rows = [row for method in methods for row in _median_repeat(timings[method])]
        if "ar" in outputs:
            for row in prompt_rows:
                if row.method != "ar":
                    row.identical = all(answer[row.turn] == plain[row.turn]
                                        for answer in outputs[row.method] for plain in outputs["ar"])
        rows.extend(prompt_rows)
        if after_prompt is not None:
            after_prompt(index, prompt)
        bar.set_postfix_str(_progress_note(rows))
    bar.close()
    return rows


def _median_repeat(repeats: list[list[Row]]) -> list[Row]:
    """The rows of the repeat with the median total time (the faster one of two)."""
    ranked = sorted(repeats, key=lambda rows: sum(r.seconds for r in rows))
    return ranked[(len(ranked) - 1) // 2]


def _progress_note(rows: list[Row]) -> str:
    summary = summarise(rows)
    return " ".join(f"{m}={v['speedup']:.2f}x" for m, v in summary.items() if m != "ar" and v.get("speedup"))


def summarise(rows: list[Row]) -> dict:
    """Per method: aggregate tokens/s, speedup against plain decoding, alpha, tau, identical/total."""
    by_method: dict[str, list[Row]] = {}
    for row in rows:
        by_method.setdefault(row.method, []).append(row)
    base = by_method.get("ar")
    base_tps = _tps(base) if base else None
    base_decode = _tps(base, decode_only=True) if base else None
    base_by_key = {(r.prompt_id, r.turn): r for r in base or []}
    out = {}
    for method, items in by_method.items():
        tps = _tps(items)
        decode = _tps(items, decode_only=True)
        drafted = sum(r.drafted for r in items)
        per_prompt = prompt_ratios(items, base_by_key)
        ratios = list(per_prompt.values())
        compared = [r for r in items if r.identical is not None]
        out[method] = {
            "tokens_per_s": tps,
            "speedup": tps / base_tps if base_tps else None,
            "decode_tokens_per_s": decode,
            "decode_speedup": decode / base_decode if base_decode else None,
            "median_speedup": statistics.median(ratios) if ratios and method != "ar" else None,
            # The prompt where this method fared worst against plain decoding (a drafter must not lose anywhere).
            "worst_speedup": min(ratios) if ratios and method != "ar" else None,
            "worst_prompt": min(per_prompt, key=per_prompt.get) if ratios and method != "ar" else None,
            "alpha": sum(r.accepted for r in items) / drafted if drafted else None,
            "tau": sum(r.new_tokens for r in items) / max(1, sum(r.target_passes for r in items)),
            "mean_k": statistics.fmean(r.mean_k for r in items),
            "identical": sum(bool(r.identical) for r in compared) if method != "ar" else None,
            "total": len(items),
            "tokens": sum(r.new_tokens for r in items),
            "seconds": sum(r.seconds for r in items),
        }
    if base:
        # Every method runs the same target prefill, so even a drafter that made decoding free could not beat
        # this ratio: the ceiling a prefill-heavy category (long prompt, short answer) puts on any speedup.
        prefill = sum(r.prefill_seconds for r in base)
        out["ar"]["prefill_ceiling"] = sum(r.seconds for r in base) / prefill if prefill > 0 else None
    return out


def prompt_ratios(items: list[Row], base_by_key: dict) -> dict[str, float]:
    """Per prompt (and turn, for multi-turn suites): tokens/s against plain decoding's on the same prompt."""
    out = {}
    for r in items:
        base = base_by_key.get((r.prompt_id, r.turn))
        if base is not None and base.tokens_per_s > 0:
            out[r.prompt_id if r.turn == 0 else f"{r.prompt_id} turn {r.turn + 1}"] = r.tokens_per_s / base.tokens_per_s
    return out


def per_prompt_table(rows: list[Row]) -> dict[str, dict[str, float]]:
    """Per method other than plain decoding: every prompt's ratio to plain decoding (issue 66: a drafter must not
    lose on any one prompt, so the report lists them, the worst first)."""
    base_by_key = {(r.prompt_id, r.turn): r for r in rows if r.method == "ar"}
    methods = dict.fromkeys(r.method for r in rows if r.method != "ar")
    return {m: prompt_ratios([r for r in rows if r.method == m], base_by_key) for m in methods} if base_by_key else {}


def _tps(rows: list[Row], decode_only: bool = False) -> float:
    """Aggregate tokens/s; decode_only leaves out the target's prompt prefill (a draft model's prefill stays in)."""
    seconds = sum(r.seconds - (r.prefill_seconds if decode_only else 0.0) for r in rows)
    return sum(r.new_tokens for r in rows) / seconds if seconds else 0.0


def acceptance_by_depth(rows: list[Row]) -> dict[str, dict[int, dict]]:
    """Per method and depth i: the drafting passes whose i-th draft token the target judged (drafted at least i,
    the first i - 1 accepted), and the share of them that accepted it: the chance that a chain's i-th token is
    kept once its first i - 1 are, wherever the drafter cut its chains (a model of chains of any length K:
    scripts/project_gpu_speedup.py)."""
    out: dict[str, dict[int, dict]] = {}
    for row in rows:
        for key, passes in row.outcomes.items():
            drafted, accepted = map(int, key.split("/"))
            for depth in range(1, min(drafted, accepted + 1) + 1):
                cell = out.setdefault(row.method, {}).setdefault(depth, {"judged": 0, "kept": 0})
                cell["judged"] += passes
                cell["kept"] += passes * (accepted >= depth)
    for per_depth in out.values():
        for cell in per_depth.values():
            cell["rate"] = cell["kept"] / cell["judged"]
    return {m: dict(sorted(v.items())) for m, v in out.items()}


def acceptance_by_k(rows: list[Row]) -> dict[str, dict[int, dict]]:
    """Per method and draft length K: steps, and alpha = accepted / drafted over the steps of that K."""
    out: dict[str, dict[int, dict]] = {}
    for row in rows:
        for k, steps in row.steps_by_k.items():
            k = int(k)
            if k == 0:
                continue
            cell = out.setdefault(row.method, {}).setdefault(k, {"steps": 0, "accepted": 0})
            cell["steps"] += steps
            cell["accepted"] += row.accepted_by_k.get(k, row.accepted_by_k.get(str(k), 0))
    for per_k in out.values():
        for k, cell in per_k.items():
            cell["alpha"] = cell["accepted"] / (k * cell["steps"]) if cell["steps"] else None
    return {m: dict(sorted(v.items())) for m, v in out.items()}


def summarise_by_turn(rows: list[Row]) -> dict[str, dict]:
    """Multi-turn suites: later turns restate earlier answers, so each turn is summarised apart."""
    turns = sorted({r.turn for r in rows})
    return {str(t + 1): summarise([r for r in rows if r.turn == t]) for t in turns} if len(turns) > 1 else {}


def summarise_by_category(rows: list[Row]) -> dict[str, dict]:
    categories = sorted({r.category for r in rows})
    return {c: summarise([r for r in rows if r.category == c]) for c in categories}


def run_bench_cli(args) -> int:
    k = parse_k(args.k)
    bench_dir = find_bench_dir(args.bench_dir)
    categories = args.categories.split(",") if args.categories else None
    prompts = load_suite(args.suite, bench_dir, args.limit, categories, args.offset)
    if not prompts:
        raise InputError(f"no prompts left after --offset {args.offset}")
    requested = args.drafters.split(",") if args.drafters else []
    engine, drafter = build_engine(args, with_draft_model=any(
        method_drafter(m) in DRAFTERS and DRAFTERS[method_drafter(m)].needs_draft_model for m in requested))
    methods = requested or ["ar", drafter]
    methods = [m for m in dict.fromkeys(["ar"] + methods) if m != "none"]
    for m in methods:
        if method_drafter(m) not in DRAFTERS and m not in ALIASES:
            raise InputError(f"unknown method '{m}' in --drafters (choose from ar, {', '.join(DRAFTERS)}; "
                             f"DRAFTER{NO_STORE} runs one without the cross-request store)")
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    started = time.time()
    if args.repeats < 1:
        raise InputError("--repeats must be >= 1")
    llamacpp = None
    if args.peers and wants_llamacpp(args):  # llama.cpp runs each prompt right after specdecode's methods
        llamacpp = LlamaCppPeer(args, engine.tokenizer)
        llamacpp.start()
    rows = run_bench(engine, prompts, methods, k, sampling, args.max_new_tokens, args.max_k, repeats=args.repeats,
                     after_prompt=llamacpp.prompt if llamacpp is not None else None)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "command": "specdecode " + " ".join(sys.argv[1:]),
        "suite": args.suite, "limit": args.limit, "offset": args.offset, "categories": categories, "methods": methods, "k": k,
        "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "repeats": args.repeats,
        "target": engine.target.name, "target_dtype": engine.target.precision,
        "device": device_description(getattr(engine.target.model, "device", None)),
        "draft": engine.draft.name if engine.draft else None, "draft_dtype": engine.draft.dtype if engine.draft else None,
        "auto_draft_model": engine.auto_draft_model,
        "wall_seconds": time.time() - started,
    }
    results = {
        "config": config,
        "summary": summarise(rows),
        "by_category": summarise_by_category(rows),
        "by_turn": summarise_by_turn(rows),
        "acceptance_by_k": acceptance_by_k(rows),
        "acceptance_by_depth": acceptance_by_depth(rows),
        "per_prompt": per_prompt_table(rows),
        "rows": [asdict(r) for r in rows],
        "peers": None,
    }
    # Written before the peers run, so a failing peer never costs the specdecode figures.
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    if args.peers:
        results["peers"] = run_peers(args, prompts, rows, engine.tokenizer, llamacpp=llamacpp)
        (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    report = write_report(results, out_dir)
    print(report)
    return 0


def device_description(device) -> str:
    """What ran the target: the GPU's name, or the CPU's model and the int8 kernel's instruction-set paths."""
    import platform

    import torch

    if device is not None and device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    from .. import kernels

    paths = kernels.quant_isa_paths()
    return f"cpu: {name}" + (f" (int8 paths {', '.join(paths)}; running {kernels.quant_isa()})" if paths else "")
