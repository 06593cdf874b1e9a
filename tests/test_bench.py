"""specdecode bench: prompt sets, the summary figures, and a real end-to-end run on smollm2-135m."""
from __future__ import annotations

import json

import pytest

from specdecode.bench.prompts import load_suite
from specdecode.bench.runner import Row, acceptance_by_k, summarise
from specdecode.errors import InputError
from testlib import SMOLLM2


@pytest.fixture
def bench_dir(tmp_path):
    (tmp_path / "humaneval.jsonl").write_text("\n".join(json.dumps(
        {"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"Return x plus {i}.\"\"\"\n"}) for i in range(3)))
    (tmp_path / "specbench.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"question_id": 1, "category": "writing", "turns": ["Write one sentence about the sea.", "Now a shorter one."]},
        {"question_id": 2, "category": "writing", "turns": ["Write one sentence about trees."]},
        {"question_id": 3, "category": "summarization", "turns": ["Summarise: the cat sat on the mat. The cat sat."]},
    ]))
    return tmp_path


def test_suites_load_with_limits_and_categories(bench_dir):
    assert [p.id for p in load_suite("humaneval", bench_dir, 2)] == ["HumanEval/0", "HumanEval/1"]
    spec = load_suite("specbench", bench_dir, 1)
    assert [(p.id, p.category, len(p.turns)) for p in spec] == [("1", "writing", 2), ("3", "summarization", 1)]
    assert [p.id for p in load_suite("specbench", bench_dir, None, ["writing"])] == ["1", "2"]
    with pytest.raises(InputError, match="unknown categories"):
        load_suite("specbench", bench_dir, 1, ["poetry"])


def test_the_prompt_sets_come_with_the_package(monkeypatch, tmp_path):
    """A fresh clone reruns every figure: the shipped HumanEval and Spec-Bench are found with no flag, whole; a named
    folder without them is one clear error."""
    from specdecode.bench.prompts import SHIPPED, find_bench_dir

    monkeypatch.delenv("SPECDECODE_BENCH_DIR", raising=False)
    assert find_bench_dir() == SHIPPED
    assert len(load_suite("humaneval", SHIPPED, None)) == 164
    specbench = load_suite("specbench", SHIPPED, None)
    assert len(specbench) == 480 and len({p.category for p in specbench}) == 13
    with pytest.raises(InputError, match="holds no humaneval.jsonl"):
        find_bench_dir(str(tmp_path))


def test_the_short_suite_needs_no_files_and_takes_limits_per_style(tmp_path):
    short = load_suite("short", tmp_path, 2)
    assert [p.id for p in short[:2]] == ["chat-1", "chat-2"]
    assert len(short) == 18 and {p.category for p in short} == {"chat", "math", "translation", "extraction", "list",
                                                                "languages", "sql", "json", "summary"}
    assert [p.id for p in load_suite("short", tmp_path, 1, ["math"], offset=2)] == ["math-3"]


def test_offset_continues_where_an_earlier_run_stopped(bench_dir):
    assert [p.id for p in load_suite("humaneval", bench_dir, 1, offset=1)] == ["HumanEval/1"]
    assert [p.id for p in load_suite("humaneval", bench_dir, None, offset=1)] == ["HumanEval/1", "HumanEval/2"]
    # per category: writing's second prompt; summarization has only one
    assert [p.id for p in load_suite("specbench", bench_dir, 1, offset=1)] == ["2"]
    with pytest.raises(InputError, match=">= 0"):
        load_suite("humaneval", bench_dir, 1, offset=-1)


def row(method, tokens, seconds, steps_by_k=None, accepted_by_k=None, identical=None, prompt="p", prefill=0.0):
    steps_by_k = steps_by_k or {}
    accepted_by_k = accepted_by_k or {}
    drafted = sum(k * n for k, n in steps_by_k.items())
    return Row(prompt, "c", 0, method, tokens, seconds, tokens / seconds, drafted, sum(accepted_by_k.values()),
               sum(steps_by_k.values()) or tokens, 0.0, identical, "length", prefill_seconds=prefill,
               steps_by_k=steps_by_k, accepted_by_k=accepted_by_k)


def test_summary_speedup_and_acceptance_by_draft_length():
    rows = [row("ar", 20, 10.0, prefill=4.0),
            row("draft", 20, 7.0, {4: 4, 2: 2, 0: 1}, {4: 12, 2: 1}, identical=True, prefill=4.0)]
    summary = summarise(rows)
    assert summary["draft"]["speedup"] == pytest.approx(10 / 7)
    assert summary["draft"]["decode_speedup"] == pytest.approx(2.0)  # 6 s of decoding against 3 s
    assert summary["draft"]["alpha"] == pytest.approx(13 / 20)
    assert summary["draft"]["median_speedup"] == summary["draft"]["worst_speedup"] == pytest.approx(10 / 7)
    assert summary["draft"]["identical"] == 1
    assert summary["ar"]["prefill_ceiling"] == pytest.approx(10 / 4)  # free decoding still pays the 4 s prefill
    per_k = acceptance_by_k(rows)
    assert set(per_k) == {"draft"}  # plain decoding and K=0 steps draft nothing
    assert per_k["draft"][4] == {"steps": 4, "accepted": 12, "alpha": 0.75}
    assert per_k["draft"][2]["alpha"] == pytest.approx(0.25)


def test_acceptance_by_depth_counts_each_judged_draft_token_once():
    """A chain's i-th token is judged where at least i were drafted and the first i - 1 kept."""
    from specdecode.bench.runner import acceptance_by_depth

    draft = row("draft", 20, 7.0)
    draft.outcomes = {"4/4": 2, "4/1": 1, "2/0": 3}  # 2 chains of 4 all kept; 4 keeping 1; 3 chains of 2 keeping none
    depth = acceptance_by_depth([row("ar", 20, 10.0), draft])
    assert set(depth) == {"draft"}
    assert depth["draft"][1] == {"judged": 6, "kept": 3, "rate": 0.5}
    assert depth["draft"][2] == {"judged": 3, "kept": 2, "rate": pytest.approx(2 / 3)}
    assert depth["draft"][3] == depth["draft"][4] == {"judged": 2, "kept": 2, "rate": 1.0}
    assert set(depth["draft"]) == {1, 2, 3, 4}


def test_a_generation_counts_its_chains_outcomes():
    from types import SimpleNamespace

    from specdecode.stats import GenerationStats

    stats = GenerationStats()
    for drafted, accepted, tree in ((4, 2, False), (4, 2, False), (3, 3, True), (0, 0, False)):
        draft = SimpleNamespace(drafted=drafted, is_tree=tree, forward_passes=1, source="draft")
        stats.record_step(SimpleNamespace(draft=draft, accepted=accepted, tokens=[0] * (accepted + 1),
                                          draft_seconds=0.0, verify_seconds=0.0))
    assert stats.outcomes == {(4, 2): 2}  # a tree's accepted nodes are no chain's first ones; K=0 drafts nothing


def test_every_prompts_ratio_is_reported_and_the_worst_is_named():
    """Issue 66: a drafter must not lose on any one prompt, so each prompt's ratio is kept, the worst named."""
    from specdecode.bench.report import prompt_table
    from specdecode.bench.runner import per_prompt_table

    rows = [row("ar", 20, 10.0, prompt="a"), row("auto", 20, 5.0, prompt="a"),
            row("ar", 20, 10.0, prompt="b"), row("auto", 20, 12.5, prompt="b")]
    assert summarise(rows)["auto"]["worst_prompt"] == "b"
    table = per_prompt_table(rows)
    assert table == {"auto": {"a": pytest.approx(2.0), "b": pytest.approx(0.8)}}
    assert prompt_table(table)[2:] == ["| b | 0.80x |", "| a | 2.00x |"]


def test_bench_end_to_end_on_a_real_model(cli, bench_dir, tmp_path, smollm2):
    out = tmp_path / "out"
    result = cli("bench", "--model", SMOLLM2, "--draft", "lookup", "--drafters", "ar,lookup", "--suite", "specbench",
                 "--bench-dir", str(bench_dir), "--limit", "1", "--max-new-tokens", "12", "--ctx", "512",
                 "--out", str(out))
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "results.json").read_text())
    assert set(results["summary"]) == {"ar", "lookup"}
    lookup = results["summary"]["lookup"]
    assert lookup["identical"] == lookup["total"] == 3  # 2 turns + 1, each equal to plain decoding
    assert set(results["by_category"]) == {"writing", "summarization"}
    assert {r["method"] for r in results["rows"]} == {"ar", "lookup"}
    report = (out / "report.md").read_text()
    assert "## Per category" in report and "| lookup |" in report and "| ceiling |" in report
    assert "Ceiling " in report  # the whole run's, also where there is one category
    assert (out / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot skipped" not in result.stdout


def bench_results(tmp_path, name: str, rows: list[Row], **config) -> str:
    """A bench --out folder as `specdecode bench` writes it."""
    base = {"command": f"specdecode bench --out {name}", "suite": "specbench", "target": "t", "target_dtype": "float32",
            "draft": "d", "draft_dtype": "int8", "k": "auto", "max_new_tokens": 128, "temperature": 0.0,
            "methods": ["ar", "draft"], "wall_seconds": 5.0}
    folder = tmp_path / name
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"config": {**base, **config}, "rows": [vars(r) for r in rows]}))
    return str(folder)


def test_bench_merge_pools_the_rows_of_runs_over_different_prompts(cli, tmp_path):
    first = [row("ar", 20, 10.0, prompt="1", prefill=2.0), row("draft", 20, 5.0, {4: 4}, {4: 12}, True, prompt="1", prefill=2.0)]
    second = [row("ar", 30, 12.0, prompt="2", prefill=3.0), row("draft", 30, 10.0, {2: 10}, {2: 8}, True, prompt="2", prefill=3.0)]
    a, b = bench_results(tmp_path, "a", first), bench_results(tmp_path, "b", second)
    result = cli("bench-merge", a, b, "--out", str(tmp_path / "both"))
    assert result.returncode == 0, result.stderr
    merged = json.loads((tmp_path / "both" / "results.json").read_text())
    expected = summarise(first + second)
    assert merged["summary"]["draft"]["speedup"] == pytest.approx(expected["draft"]["speedup"])
    assert merged["summary"]["draft"]["speedup"] == pytest.approx((50 / 15) / (50 / 22))
    assert merged["summary"]["draft"]["identical"] == 2 and merged["acceptance_by_k"]["draft"]["2"]["steps"] == 10
    report = (tmp_path / "both" / "report.md").read_text()
    assert "`specdecode bench --out a`" in report and "`specdecode bench --out b`" in report


def test_bench_merge_replace_swaps_whole_categories_measured_again(cli, tmp_path):
    def pair(prompt, category, draft_seconds):
        rows = [row("ar", 20, 10.0, prompt=prompt), row("draft", 20, draft_seconds, {4: 4}, {4: 12}, True, prompt=prompt)]
        for r in rows:
            r.category = category
        return rows

    first = bench_results(tmp_path, "a", pair("1", "writing", 20.0) + pair("2", "math", 5.0))
    again = bench_results(tmp_path, "b", pair("1", "writing", 8.0))
    refused = cli("bench-merge", first, again, "--out", str(tmp_path / "m"))
    assert refused.returncode == 2 and "prompt 1 (ar) is in two runs" in refused.stderr
    result = cli("bench-merge", first, again, "--replace", "--out", str(tmp_path / "m"))
    assert result.returncode == 0, result.stderr
    merged = json.loads((tmp_path / "m" / "results.json").read_text())
    assert merged["by_category"]["writing"]["draft"]["speedup"] == pytest.approx(10 / 8)
    assert merged["by_category"]["math"]["draft"]["speedup"] == pytest.approx(2.0)
    assert len(merged["rows"]) == 4
    assert "Replaced: writing of `specdecode bench --out a` replaced by `specdecode bench --out b`" in (
        tmp_path / "m" / "report.md").read_text()


def test_bench_merge_refuses_runs_that_differ_or_overlap(cli, tmp_path):
    rows = [row("ar", 20, 10.0, prompt="1"), row("draft", 20, 5.0, {4: 4}, {4: 12}, True, prompt="1")]
    a = bench_results(tmp_path, "a", rows)
    other_budget = bench_results(tmp_path, "b", [row("ar", 20, 10.0, prompt="2")], max_new_tokens=1024)
    same_prompt = bench_results(tmp_path, "c", rows)
    for folder, message in [(other_budget, "different max_new_tokens"), (same_prompt, "prompt 1 (ar) is in two runs"),
                            (str(tmp_path / "missing"), "holds no results.json")]:
        result = cli("bench-merge", a, folder, "--out", str(tmp_path / "m"))
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert message in result.stderr


def test_bench_refuses_an_unknown_method(cli, bench_dir, tmp_path):
    result = cli("bench", "--model", SMOLLM2, "--draft", "lookup", "--drafters", "ar,magic", "--bench-dir",
                     str(bench_dir), "--limit", "1", "--max-new-tokens", "4", "--out", str(tmp_path / "o"))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "unknown method 'magic'" in result.stderr


def test_tune_sweeps_k_and_plots_alpha_against_k(cli, bench_dir, tmp_path):
    out = tmp_path / "tune"
    result = cli("tune", "--model", SMOLLM2, "--draft", "none", "--suite", "humaneval", "--bench-dir", str(bench_dir),
                 "--limit", "1", "--max-new-tokens", "8", "--ctx", "512", "--out", str(out))
    assert result.returncode == 0, result.stderr
    sweep = json.loads((out / "tune.json").read_text())["sweep"]
    assert set(sweep["lookup"]) == {"1", "2", "4", "8", "auto"}
    assert "| lookup | 8 |" in result.stdout
    assert "adaptive (--k auto)" in result.stdout or "best: plain" in result.stdout
    assert (out / "alpha_vs_k.png").read_bytes()[:4] == b"\x89PNG"


def test_tune_prediction_counts_steps_without_a_proposal_as_plain_steps():
    from specdecode.bench.tune import predict

    assert predict(0.9, 4, 0.2, 1.5, coverage=0.0) == pytest.approx(1.0)
    assert predict(1.0, 4, 0.0, 1.0, coverage=1.0) == pytest.approx(5.0)
    # lookup matching on half the steps: half the steps gain, half are plain
    assert predict(1.0, 4, 0.0, 1.0, coverage=0.5) == pytest.approx(3.0)


def test_peer_summary_gives_ratios_to_specdecode_plain_and_to_each_systems_own_plain():
    from specdecode.bench.peers import summarise_peers

    rows = [vars(row("ar", 20, 10.0)), vars(row("draft", 20, 5.0, {4: 4}, {4: 12}))]
    runs = {"transformers": [{"prompt_id": "p", "new_tokens": 10, "seconds": 10.0}],
            "transformers-assisted": [{"prompt_id": "p", "new_tokens": 15, "seconds": 10.0}]}
    summary = summarise_peers(runs, rows, earlier={"llama.cpp": {"tokens_per_s": 8.0}})
    assert summary["transformers"]["vs_specdecode_plain"] == pytest.approx(0.5)
    assert summary["transformers-assisted"]["vs_own_plain"] == pytest.approx(1.5)
    assert summary["specdecode-draft"]["vs_own_plain"] == pytest.approx(2.0)
    assert summary["llama.cpp"]["vs_specdecode_plain"] == pytest.approx(4.0)  # kept from an earlier run


def test_copy_suites_restate_the_humaneval_function(tmp_path):
    from specdecode.bench.prompts import load_suite

    (tmp_path / "humaneval.jsonl").write_text("\n".join(json.dumps(
        {"task_id": f"HumanEval/{i}", "entry_point": f"f{i}", "prompt": f"def f{i}(x):\n    \"\"\"Plus {i}.\"\"\"\n",
         "canonical_solution": f"    return x + {i}\n"}) for i in range(5)))
    edits = load_suite("codeedit", tmp_path, 4)
    assert [p.category for p in edits] == ["codeedit"] * 4 and all(len(p.turns) == 1 for p in edits)
    assert "return x + 0" in edits[0].turns[0]  # the solution is in the prompt
    assert "f0_v2" not in edits[0].turns[0] and "f1_v2" in edits[1].turns[0]  # the edits rotate
    chats = load_suite("chat3", tmp_path, 3, offset=1)
    assert [len(p.turns) for p in chats] == [3, 3, 3] and chats[0].id == "HumanEval/1"
    assert "return x" not in chats[0].turns[0]  # the model writes the function in turn 1


def test_codeedit_own_edits_the_models_passing_functions_only(tmp_path, monkeypatch):
    from specdecode.bench import copy_suites
    from specdecode.bench.prompts import load_suite

    (tmp_path / "humaneval.jsonl").write_text("\n".join(json.dumps(
        {"task_id": f"HumanEval/{i}", "entry_point": f"f{i}", "prompt": f"def f{i}(x):\n", "canonical_solution": "    pass\n"})
        for i in range(4)))
    own = tmp_path / "own.jsonl"
    own.write_text("".join(json.dumps({"task_id": f"HumanEval/{i}", "precision": "int8", "passed": i != 1,
                                       "solution": f"def f{i}(x):\n    return x * {i}"}) + "\n" for i in range(3)))
    monkeypatch.setattr(copy_suites, "OWN_SOLUTIONS", own)
    edits = load_suite("codeedit-own", tmp_path, None)
    assert [p.id for p in edits] == ["HumanEval/0", "HumanEval/2"]  # failed (1) and missing (3) left out
    assert edits[1].category == "codeedit-own" and "return x * 2\n```" in edits[1].turns[0]
    assert "f2_v2" in edits[1].turns[0]  # the edits rotate over the prompts kept


def test_the_committed_own_solutions_are_whole_python_functions():
    import ast

    from specdecode.bench.copy_suites import own_functions

    functions = own_functions()
    assert len(functions) >= 40
    for task_id, code in functions.items():
        tree = ast.parse(code)
        assert any(isinstance(node, ast.FunctionDef) for node in tree.body), task_id


def test_each_bench_method_remembers_only_its_own_earlier_answers(smollm2):
    """The suffix store must not hand one method the answer another method just gave to the same prompt."""
    from specdecode.bench.prompts import BenchPrompt
    from specdecode.bench.runner import run_method
    from specdecode.engine import Engine
    from specdecode.sampling import SamplingParams

    engine = Engine(smollm2, max_context=512)
    prompt = BenchPrompt("p", "c", ("Say hello.",))
    for method in ("auto", "suffix"):
        run_method(engine, prompt, method, "auto", SamplingParams(), 8, None)
    assert set(engine.suffix_store._latest) == {"bench:auto", "bench:suffix"}


def test_repeated_timings_keep_the_median_and_never_copy_an_earlier_repeat(smollm2):
    from specdecode.bench.prompts import BenchPrompt
    from specdecode.bench.runner import _median_repeat, run_bench
    from specdecode.engine import Engine
    from specdecode.sampling import SamplingParams

    engine = Engine(smollm2, max_context=512)
    prompts = [BenchPrompt("p", "c", ("Count from one to five.",))]
    rows = run_bench(engine, prompts, ["ar", "suffix"], "auto", SamplingParams(), 12, progress=False, repeats=3)
    assert [(r.method, r.identical) for r in rows] == [("ar", None), ("suffix", True)]
    # Each repeat has its own store: the second cannot copy the first's answer to the same prompt.
    assert {"bench:suffix:0", "bench:suffix:1", "bench:suffix:2"} <= set(engine.suffix_store._latest)
    timed = [[row("ar", 10, seconds)] for seconds in (3.0, 1.0, 2.0)]
    assert _median_repeat(timed)[0].seconds == 2.0 and _median_repeat(timed[:2])[0].seconds == 1.0


def test_peers_run_each_prompt_right_after_specdecodes_methods_ran_it(smollm2):
    """bench --peers times llama.cpp in the same minutes as specdecode, prompt by prompt, not after all of them."""
    from specdecode.bench.prompts import BenchPrompt
    from specdecode.bench.runner import run_bench
    from specdecode.engine import Engine
    from specdecode.sampling import SamplingParams

    engine = Engine(smollm2, max_context=512)
    prompts = [BenchPrompt(f"p{i}", "c", (text,)) for i, text in enumerate(("Say hi.", "Name a colour."))]
    calls, seen = [], []
    generate = engine.generate
    engine.generate = lambda *args, **kwargs: calls.append(kwargs.get("drafter")) or generate(*args, **kwargs)
    run_bench(engine, prompts, ["ar", "lookup"], "auto", SamplingParams(), 4, progress=False,
              after_prompt=lambda index, prompt: seen.append((index, prompt.id, len(calls))))
    assert seen == [(0, "p0", 4), (1, "p1", 6)]  # two warm-up calls, then both methods of each prompt


def test_a_nostore_method_runs_its_drafter_without_earlier_requests(smollm2):
    """auto:nostore is auto with the cross-request store out of reach: the ablation of the store in one run."""
    from specdecode.bench.prompts import BenchPrompt
    from specdecode.bench.runner import run_bench
    from specdecode.engine import Engine
    from specdecode.sampling import SamplingParams

    engine = Engine(smollm2, max_context=512)
    store, matches = engine.suffix_store, []
    best_match = store.best_match
    store.best_match = lambda namespace, *args: matches.append((namespace, best_match(namespace, *args))) or matches[-1][1]
    text = ("Count from one to ten in words.", "Again, the same way.")
    prompts = [BenchPrompt(f"p{i}", "c", text) for i in range(2)]  # the same chat twice: the store has it
    calls = []
    generate = engine.generate
    engine.generate = lambda *args, **kwargs: calls.append(kwargs["drafter"]) or generate(*args, **kwargs)
    rows = run_bench(engine, prompts, ["ar", "auto", "auto:nostore"], "auto", SamplingParams(), 24, progress=False)
    assert sorted((r.method, r.identical) for r in rows if r.method != "ar") == [("auto", True)] * 4 + [("auto:nostore", True)] * 4
    assert calls.count("auto") == 10  # auto:nostore runs the auto drafter (a warm-up and 4 turns each)
    assert "bench:auto" in {ns for ns, match in matches if match is not None}  # the second chat copies the first
    # auto:nostore neither looks into the store nor leaves its requests there.
    assert {ns for ns, _ in matches} == {"bench:auto", "bench:warm-up"}
    assert {namespace for namespace, _ in store._docs.values()} == {"bench:auto", "bench:warm-up"}
