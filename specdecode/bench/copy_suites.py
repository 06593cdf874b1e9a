"""Workloads where copying is the point, built from HumanEval's public problems and solutions.

- codeedit: the complete function (prompt + canonical solution) and an edit that keeps most of it
  (add type hints, rename the function, add comments, add a docstring example): the answer
  restates the input.
- chat3: three-turn chats: write the function, then restate it with an edit, then restate it again
  with another; later answers repeat earlier ones.
The edits rotate over the problems so that each kind appears; the prompts are deterministic.
"""
from __future__ import annotations

from .prompts import BenchPrompt

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


def codeedit_prompts(problems: list[dict]) -> list[BenchPrompt]:
    out = []
    for index, problem in enumerate(problems):
        turn = (f"{_edit(index, problem)} Reply with the complete edited code only.\n\n```python\n"
                f"{_function(problem)}```")
        out.append(BenchPrompt(problem["task_id"], "codeedit", (turn,)))
    return out


def chat3_prompts(problems: list[dict]) -> list[BenchPrompt]:
    out = []
    for index, problem in enumerate(problems):
        first = ("Complete the following Python function. Reply with the code only.\n\n```python\n"
                 f"{problem['prompt']}```")
        second = f"{_edit(index, problem)} Reply with the complete function."
        third = f"{_edit(index + 1, problem)} Keep the previous change, and reply with the complete function."
        out.append(BenchPrompt(problem["task_id"], "chat3", (first, second, third)))
    return out
