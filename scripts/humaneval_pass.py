#!/usr/bin/env python3
"""HumanEval pass@1 of the target at each precision: greedy answers run against their tests, one process each.

Both precisions answer the same problems with the same chat prompt as `specdecode bench --suite humaneval`,
greedy, drafting with prompt lookup (speculation is lossless, so the answer is the precision's own plain
greedy answer, only sooner). Each answer's code runs with the problem's tests in its own Python process:
isolated mode (-I), an empty temporary working directory, a minimal environment, no stdin, limits on CPU
time, memory, file size and open files, and a wall-clock timeout (limits against runaway code, not a
security boundary: run it on model answers to public problems, as here).

    .venv/bin/python scripts/humaneval_pass.py --limit 40 [--offset 0] [--precisions int8,float32]

The solutions the code-edit suite `codeedit-own` edits were written this way by the default target:

    .venv/bin/python scripts/humaneval_pass.py --limit 164 --precisions int8 \
        --solutions-out specdecode/data/humaneval_own_solutions.jsonl
"""
from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from specdecode import registry
from specdecode.bench.prompts import find_bench_dir, humaneval_turn
from specdecode.build import EngineOptions, build_engine

TIMEOUT_S = 10
MEMORY_BYTES = 1 << 30


def extract_code(answer: str) -> str:
    """The first fenced code block of the answer, or the whole answer where it has none."""
    match = re.search(r"```(?:python|py)?\n(.*?)(?:```|$)", answer, re.S)
    return match.group(1) if match else answer


def function_source(problem: dict, answer: str) -> str:
    """The answer as a whole function (the problem's imports kept), or as the body under the prompt."""
    code = extract_code(answer)
    if re.search(rf"^\s*def {re.escape(problem['entry_point'])}\s*\(", code, re.M):
        own = set(code.splitlines())
        imports = "".join(line + "\n" for line in problem["prompt"].splitlines()
                          if line.startswith(("import ", "from ")) and line not in own)
        return imports + code
    return problem["prompt"] + code


def program(problem: dict, answer: str) -> str:
    return f"{function_source(problem, answer)}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def _limits() -> None:  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_CPU, (TIMEOUT_S, TIMEOUT_S))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))


def passes(source: str) -> bool:
    with tempfile.TemporaryDirectory(prefix="humaneval-") as tmp:
        path = Path(tmp) / "candidate.py"
        path.write_text(source, encoding="utf-8")
        try:
            result = subprocess.run([sys.executable, "-I", str(path)], cwd=tmp, env={"PATH": "/usr/bin:/bin"},
                                    stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT_S + 5,
                                    preexec_fn=_limits)
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0


def run(precision: str, problems: list[dict], args, solutions: list[dict]) -> dict[str, bool]:
    engine, _ = build_engine(EngineOptions(model=args.model, precision=precision, draft="lookup"), need_draft=False)
    results = {}
    for problem in problems:
        answer = engine.generate(humaneval_turn(problem), drafter="lookup", max_new_tokens=args.max_new_tokens)
        results[problem["task_id"]] = passes(program(problem, answer.text))
        print(f"{precision} {problem['task_id']}: {'pass' if results[problem['task_id']] else 'fail'}", file=sys.stderr)
        solutions.append({"task_id": problem["task_id"], "precision": precision, "passed": results[problem["task_id"]],
                          "solution": function_source(problem, answer.text)})
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=registry.DEFAULT_TARGET)
    p.add_argument("--precisions", default="int8,float32")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--limit", type=int, default=40)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--bench-dir", default=None)
    p.add_argument("--out", default=None, help="write per-problem results as JSON here")
    p.add_argument("--solutions-out", default=None,
                   help="write each answer as a complete function (JSON lines: task_id, precision, passed, solution)")
    args = p.parse_args()
    lines = (find_bench_dir(args.bench_dir) / "humaneval.jsonl").read_text().splitlines()
    problems = [json.loads(line) for line in lines][args.offset : args.offset + args.limit]
    solutions: list[dict] = []
    results = {precision: run(precision, problems, args, solutions) for precision in args.precisions.split(",")}
    print(f"| precision | pass@1 ({len(problems)} problems, HumanEval {args.offset + 1}-{args.offset + len(problems)}) |")
    print("|---|---|")
    for precision, passed in results.items():
        print(f"| {precision} | {sum(passed.values())}/{len(problems)} |")
    if len(results) == 2:
        a, b = results.values()
        print("differ on:", ", ".join(task for task in a if a[task] != b[task]) or "none")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=1) + "\n")
    if args.solutions_out:  # the functions as the model wrote them: the codeedit-own bench suite edits these
        Path(args.solutions_out).write_text("".join(json.dumps(s) + "\n" for s in solutions))


if __name__ == "__main__":
    main()
