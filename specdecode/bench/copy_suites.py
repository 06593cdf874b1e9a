"""Workloads where copying is the point, built from HumanEval's public problems and solutions.

- codeedit: the complete function (prompt + canonical solution) and an edit that keeps most of it
  (add type hints, rename the function, add comments, add a docstring example): the answer
  restates the input.
- codeedit-own: the same edits of functions the default target wrote itself (its greedy answers that
  pass the problem's tests, in data/humaneval_own_solutions.jsonl, made by scripts/humaneval_pass.py):
  code in the model's own style, as when an assistant edits what it wrote.
- chat3: three-turn chats: write the function, then restate it with an edit, then restate it again
  with another; later answers repeat earlier ones.
The edits rotate over the problems so that each kind appears; the prompts are deterministic.
"""
from __future__ import annotations

import json
from pathlib import Path

from .bench_prompt import BenchPrompt

OWN_SOLUTIONS = Path(__file__).resolve().parents[1] / "data" / "humaneval_own_solutions.jsonl"

EDITS = (
    "Add type hints to every parameter, local helper and the return value.",
    "Rename the function to `{name}_v2` everywhere, including the docstring examples.",
    "Add a short comment above every loop and every if statement saying what it does.",
    "Add one more example to the docstring, in the same doctest style as the others.",
)


def _function(problem: dict) -> str:
    return problem["prompt"] + problem["canonical_solution"]


def _edit(index: int, problem: dict) -> str:
    return EDITS[index % len(EDITS)].format(name=problem["entry_point"])


def codeedit_prompts(problems: list[dict], functions: dict[str, str] | None = None,
                     category: str = "codeedit") -> list[BenchPrompt]:
    """One edit per problem of its canonical function, or of functions[task_id] (problems without one skipped)."""
    out = []
    for problem in problems:
        code = _function(problem) if functions is None else functions.get(problem["task_id"])
        if code is None:
            continue
        code = code if code.endswith("\n") else code + "\n"
        turn = f"{_edit(len(out), problem)} Reply with the complete edited code only.\n\n```python\n{code}```"
        out.append(BenchPrompt(problem["task_id"], category, (turn,)))
    return out


def own_functions(path: Path | None = None) -> dict[str, str]:
    """The model's own functions that passed their problem's tests, by task id."""
    rows = [json.loads(line) for line in (path or OWN_SOLUTIONS).read_text().splitlines() if line.strip()]
    return {r["task_id"]: r["solution"] for r in rows if r["passed"]}


def chat3_prompts(problems: list[dict]) -> list[BenchPrompt]:
    out = []
    for index, problem in enumerate(problems):
        first = ("Complete the following Python function. Reply with the code only.\n\n```python\n"
                 f"{problem['prompt']}```")
        second = f"{_edit(index, problem)} Reply with the complete function."
        third = f"{_edit(index + 1, problem)} Keep the previous change, and reply with the complete function."
        out.append(BenchPrompt(problem["task_id"], "chat3", (first, second, third)))
    return out
