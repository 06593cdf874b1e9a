"""Public prompt sets: HumanEval and Spec-Bench, shipped in specdecode/data/bench (or read from --bench-dir),
copy-heavy workloads built from HumanEval (copy_suites.py), and short everyday answers of our own (short_suite.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import InputError
from .bench_prompt import BenchPrompt

SUITE_FILES = {"humaneval": "humaneval.jsonl", "specbench": "specbench.jsonl", "codeedit": "humaneval.jsonl",
               "codeedit-own": "humaneval.jsonl", "chat3": "humaneval.jsonl", "short": None}
SUITES = tuple(SUITE_FILES)


# The prompt sets as shipped (their provenance and licences: README.md beside them)
SHIPPED = Path(__file__).resolve().parents[1] / "data" / "bench"


def find_bench_dir(explicit: str | None = None) -> Path:
    """--bench-dir, else SPECDECODE_BENCH_DIR, else the shipped sets."""
    for candidate in (explicit, os.environ.get("SPECDECODE_BENCH_DIR")):
        if candidate:
            if not (Path(candidate) / SUITE_FILES["humaneval"]).is_file():
                raise InputError(f"{candidate} holds no {SUITE_FILES['humaneval']} (the prompt sets' folder)")
            return Path(candidate)
    return SHIPPED


def humaneval_turn(problem: dict) -> str:
    return "Complete the following Python function. Reply with the code only.\n\n```python\n" + problem["prompt"] + "```"


def load_suite(name: str, bench_dir: Path, limit: int | None, categories: list[str] | None = None,
               offset: int = 0) -> list[BenchPrompt]:
    """The first `limit` prompts (per category for Spec-Bench) after skipping `offset`: a later run with
    --offset continues where an earlier one stopped, and bench-merge joins the two."""
    if offset < 0 or (limit is not None and limit < 0):
        raise InputError("--limit and --offset must be >= 0")

    def window(items: list[BenchPrompt]) -> list[BenchPrompt]:
        return items[offset : offset + limit] if limit else items[offset:]

    if name == "short":
        from .short_suite import short_prompts

        return _per_category(short_prompts(), categories, window)
    path = bench_dir / SUITE_FILES[name]

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if name == "humaneval":
        prompts = [BenchPrompt(r["task_id"], "humaneval", (humaneval_turn(r),)) for r in rows]
        return window(prompts)
    if name in ("codeedit", "codeedit-own", "chat3"):
        from .copy_suites import chat3_prompts, codeedit_prompts, own_functions

        if name == "codeedit-own":
            return window(codeedit_prompts(rows, own_functions(), category=name))
        return window(codeedit_prompts(rows) if name == "codeedit" else chat3_prompts(rows))
    prompts = [BenchPrompt(str(r["question_id"]), r["category"], tuple(r["turns"])) for r in rows]
    return _per_category(prompts, categories, window)


def _per_category(prompts: list[BenchPrompt], categories: list[str] | None, window) -> list[BenchPrompt]:
    """The window of each category's prompts (only the named categories when given)."""
    per_category: dict[str, list[BenchPrompt]] = {}
    for prompt in prompts:
        per_category.setdefault(prompt.category, []).append(prompt)
    if categories:
        unknown = set(categories) - set(per_category)
        if unknown:
            raise InputError(f"unknown categories {sorted(unknown)}; known: {sorted(per_category)}")
        per_category = {c: per_category[c] for c in categories}
    out: list[BenchPrompt] = []
    for items in per_category.values():
        out.extend(window(items))
    return out
