"""Join bench runs over different prompts (e.g. --offset 0 and --offset 5) into one report.

Every speedup stays a ratio inside one process: each run timed plain and speculative decoding of its
own prompts, and the merged summary only pools those rows. Runs must agree on everything that shapes
the figures (models, precision, K, budget, temperature, methods) and may not repeat a prompt.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputError
from .report import write_report
from .runner import Row, acceptance_by_depth, acceptance_by_k, per_prompt_table, summarise, summarise_by_category

# Config fields that must be equal across merged runs.
MUST_MATCH = ("suite", "target", "target_dtype", "draft", "draft_dtype", "k", "max_new_tokens", "temperature", "methods")


def _read(folder: Path) -> dict:
    path = folder / "results.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{folder} holds no results.json (is it a bench --out folder?)") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path} is unreadable: {exc}") from None


def merge_results(runs: list[dict], replace: bool = False) -> dict:
    """replace: a category that a later run measured again replaces that whole category of the earlier runs
    (for a run disturbed by other work on the machine); whole categories only, never single prompts."""
    first = runs[0]["config"]
    for run in runs[1:]:
        for key in MUST_MATCH:
            if run["config"].get(key) != first.get(key):
                raise InputError(
                    f"cannot merge runs with different {key}: {first.get(key)!r} and {run['config'].get(key)!r}"
                    f" ({first['command']} / {run['config']['command']})"
                )
    replaced: list[str] = []
    if replace:
        runs = [dict(run) for run in runs]
        for later_index, later in enumerate(runs):
            categories = {data["category"] for data in later["rows"]}
            for earlier in runs[:later_index]:
                dropped = sorted(categories & {data["category"] for data in earlier["rows"]})
                if dropped:
                    earlier["rows"] = [data for data in earlier["rows"] if data["category"] not in categories]
                    replaced.append(f"{', '.join(dropped)} of `{earlier['config']['command']}` replaced by"
                                    f" `{later['config']['command']}`")
    rows: list[Row] = []
    seen: dict[tuple, str] = {}
    for run in runs:
        for data in run["rows"]:
            key = (data["prompt_id"], data["turn"], data["method"])
            if key in seen:
                raise InputError(f"prompt {data['prompt_id']} ({data['method']}) is in two runs: {seen[key]} and {run['config']['command']}")
            seen[key] = run["config"]["command"]
            # JSON keys of the per-K counts are strings; the summaries want the draft length as an int.
            data = dict(data, steps_by_k={int(k): v for k, v in data["steps_by_k"].items()},
                        accepted_by_k={int(k): v for k, v in data["accepted_by_k"].items()})
            rows.append(Row(**data))
    config = {key: first.get(key) for key in MUST_MATCH}
    config["command"] = " + ".join(run["config"]["command"] for run in runs)
    config["merged_from"] = [run["config"]["command"] for run in runs]
    config["replaced"] = replaced
    config["wall_seconds"] = sum(run["config"].get("wall_seconds", 0.0) for run in runs)
    return {
        "config": config,
        "summary": summarise(rows),
        "by_category": summarise_by_category(rows),
        "acceptance_by_k": acceptance_by_k(rows),
        "acceptance_by_depth": acceptance_by_depth(rows),
        "per_prompt": per_prompt_table(rows),
        "rows": [vars(r) for r in rows],
        "peers": None,  # peer runs are per prompt set and are not pooled
    }


def merge_cli(args) -> int:
    runs = [_read(Path(folder)) for folder in args.folders]
    results = merge_results(runs, replace=args.replace)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    print(write_report(results, out_dir))
    return 0
