"""Markdown tables and a PNG plot from bench results."""
from __future__ import annotations

from pathlib import Path


def _fmt(value, pattern="{:.2f}") -> str:
    return "-" if value is None else pattern.format(value)


def method_table(summary: dict) -> list[str]:
    lines = ["| method | tokens/s | speedup | median speedup | worst prompt | decode speedup | alpha | tau | mean K | identical |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for method, s in summary.items():
        identical = "-" if s["identical"] is None else f"{s['identical']}/{s['total']}"
        lines.append(
            f"| {method} | {s['tokens_per_s']:.2f} | {_fmt(s['speedup'], '{:.2f}x')} | {_fmt(s['median_speedup'], '{:.2f}x')}"
            f" | {_worst(s)} | {_fmt(s.get('decode_speedup'), '{:.2f}x')} | {_fmt(s['alpha'])} | {_fmt(s['tau'])} | {s['mean_k']:.1f} | {identical} |"
        )
    return lines


def _worst(s: dict) -> str:
    worst = _fmt(s.get("worst_speedup"), "{:.2f}x")
    return f"{worst} ({s['worst_prompt']})" if s.get("worst_prompt") else worst


def prompt_table(per_prompt: dict[str, dict[str, float]]) -> list[str]:
    """Each prompt's ratio to plain decoding per method, the prompts ordered by their worst ratio."""
    methods = list(per_prompt)
    prompts = sorted({p for ratios in per_prompt.values() for p in ratios},
                     key=lambda p: min(per_prompt[m].get(p, float("inf")) for m in methods))
    lines = ["| prompt | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for prompt in prompts:
        lines.append(f"| {prompt} | " + " | ".join(_fmt(per_prompt[m].get(prompt), "{:.2f}x") for m in methods) + " |")
    return lines


def category_table(by_category: dict) -> list[str]:
    methods = sorted({m for s in by_category.values() for m in s if m != "ar"})
    head = "| category | plain tok/s | ceiling | " + " | ".join(
        f"{m} speedup | {m} decode speedup | {m} alpha | {m} identical" for m in methods) + " |"
    lines = [head, "|" + "---|" * (3 + 4 * len(methods))]
    for category, summary in by_category.items():
        plain = summary.get("ar", {})
        cells = [category, _fmt(plain.get("tokens_per_s")), _fmt(plain.get("prefill_ceiling"), "{:.2f}x")]
        for m in methods:
            s = summary.get(m)
            if not s:
                cells += ["-", "-", "-", "-"]
                continue
            cells += [_fmt(s["speedup"], "{:.2f}x"), _fmt(s.get("decode_speedup"), "{:.2f}x"), _fmt(s["alpha"]),
                      f"{s['identical']}/{s['total']}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _command_lines(config: dict) -> list[str]:
    if not config.get("merged_from"):
        return [f"Command: `{config['command']}`"]
    lines = ["Merged from these runs (`specdecode bench-merge`); each timed plain and speculative decoding of its own"
             " prompts in one process:", ""]
    lines += [f"- `{command}`" for command in config["merged_from"]]
    if config.get("replaced"):
        lines += [""] + [f"Replaced: {line}." for line in config["replaced"]]
    return lines


def _repeats_note(config: dict) -> str:
    repeats = config.get("repeats", 1)
    if repeats <= 1:
        return ""
    return (f" Each prompt was timed {repeats} times per method (orders alternating); the median timing is kept"
            f"{' (the faster of two)' if repeats == 2 else ''}, and every repeat's answer is compared.")


def _auto_note(c: dict) -> str:
    """Whether auto drafted with the draft model in this run (older results do not say)."""
    if "auto" not in c.get("methods", []) or c.get("auto_draft_model") is None or not c.get("draft"):
        return ""
    if c["auto_draft_model"]:
        return " auto chose per step between copying and the draft model."
    return (" auto ran as the default does with this target, copying only: the draft model was loaded for the"
            " draft-model methods alone.")


CEILING = ("the speedup a method would reach if decoding cost nothing, since every method runs the same target"
           " prefill (plain decoding's total time over its prefill time).")


def _ceiling_lines(summary: dict) -> list[str]:
    ceiling = summary.get("ar", {}).get("prefill_ceiling")
    return [f"Ceiling {ceiling:.2f}x: {CEILING}", ""] if ceiling else []


def write_report(results: dict, out_dir: Path) -> str:
    c = results["config"]
    lines = [
        f"# specdecode bench: {c['suite']}",
        "",
        *_command_lines(c),
        "",
        f"Target {c['target']} ({c['target_dtype']}) on {c.get('device', 'an unrecorded device')}, draft {c['draft']} ({c['draft_dtype']}), K={c['k']},"
        f" max {c['max_new_tokens']} new tokens, temperature {c['temperature']}. Speedup = tokens/s against plain"
        " decoding of the same target in the same process (aggregate over all prompts; median and worst of the per-prompt ratios beside it)."
        " Decode speedup leaves out the target's prompt prefill, which is the same work for every method (a draft"
        " model's own prefill stays in)." + _auto_note(c) + _repeats_note(c),
        "",
        *method_table(results["summary"]),
        "",
        *_ceiling_lines(results["summary"]),
    ]
    if len(results["by_category"]) > 1:
        lines += ["## Per category", "", f"Ceiling: {CEILING}", "",
                  *category_table(results["by_category"]), ""]
    if results.get("by_turn"):
        lines += ["## Per turn", ""]
        for turn, summary in results["by_turn"].items():
            lines += [f"Turn {turn}:", "", *method_table(summary), ""]
    if results.get("acceptance_by_k"):
        lines += ["## Acceptance against the draft length K", "",
                  "alpha of the steps that drafted K tokens (number of such steps in brackets); with adaptive K the"
                  " engine chooses K, so long drafts are the confident ones.", "",
                  *acceptance_table(results["acceptance_by_k"]), ""]
    if results.get("per_prompt"):
        lines += ["## Per prompt", "", "Tokens/s against plain decoding on the same prompt, the worst first.", "",
                  *prompt_table(results["per_prompt"]), ""]
    if results.get("peers"):
        from .peers import peer_table

        lines += ["## Peers (same prompts, same machine)", "", *peer_table(results["peers"]), ""]
    text = "\n".join(lines)
    (out_dir / "report.md").write_text(text)
    try:
        plot(results, out_dir / "speedup.png")
    except Exception as exc:  # a plot is a nicety; never lose the numbers over it
        text += f"\n(plot skipped: {exc})"
    return text


def plot(results: dict, path: Path) -> None:
    """Left: speedup per category per method. Right: acceptance rate against the draft length K."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_category = results["by_category"]
    categories = list(by_category)
    methods = sorted({m for s in by_category.values() for m in s if m != "ar"})
    per_k = results.get("acceptance_by_k") or {}
    width_in = max(6, 1.0 * len(categories) * max(1, len(methods)))
    fig, (ax, ax_k) = plt.subplots(1, 2, figsize=(width_in + 5, 4), gridspec_kw={"width_ratios": [width_in, 5]})
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        values = [by_category[c].get(m, {}).get("speedup") or 0 for c in categories]
        ax.bar([x + i * width for x in range(len(categories))], values, width, label=m)
    ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.set_xticks([x + width * (len(methods) - 1) / 2 for x in range(len(categories))])
    ax.set_xticklabels(categories, rotation=30, ha="right")
    ax.set_ylabel("speedup vs plain decoding")
    ax.set_title(f"specdecode on {results['config']['suite']} ({results['config']['target']})")
    ax.legend()
    for m in methods:
        points = sorted((int(k), cell["alpha"], cell["steps"]) for k, cell in per_k.get(m, {}).items() if cell["alpha"] is not None)
        if points:
            ax_k.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=m)
    ax_k.set_xlabel("draft length K of the step")
    ax_k.set_ylabel("alpha (accepted / drafted)")
    ax_k.set_ylim(0, 1.05)
    ax_k.set_title("acceptance against K")
    if per_k:
        ax_k.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def acceptance_table(per_k: dict) -> list[str]:
    ks = sorted({int(k) for cells in per_k.values() for k in cells})
    lines = ["| method | " + " | ".join(f"K={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for method, cells in per_k.items():
        row = []
        for k in ks:
            cell = cells.get(k) or cells.get(str(k))
            row.append("-" if not cell or cell["alpha"] is None else f"{cell['alpha']:.2f} ({cell['steps']})")
        lines.append(f"| {method} | " + " | ".join(row) + " |")
    return lines
