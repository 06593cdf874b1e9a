"""llama.cpp peer: parsing its binaries' output (captured from real runs on smollm2-135m), finding the
binaries (and skipping when they are absent), and one short real run when they are built."""
from __future__ import annotations

import json
from argparse import Namespace
from types import SimpleNamespace

import pytest

from specdecode import registry
from specdecode.bench import peers
from specdecode.bench.peers import (block_costs, completion_cmd, find_llamacpp_bin, llamacpp_peer, parse_llama_bench,
                                    parse_perf, parse_speculative, peer_table, speculative_cmd, summarise_peers,
                                    write_prompt_file)
from testlib import SMOLLM2

# llama-speculative-simple --spec-type draft-simple --spec-draft-n-max 4 -n 15 (stderr, the lines it ends with)
SPEC_DRAFT = """\
0.00.366.728 I cmn          init: llama threadpool init, n_threads = 2
0.01.264.937 I encoded   48 tokens in    0.383 seconds, speed:  125.363 t/s
0.01.264.938 I decoded   20 tokens in    0.329 seconds, speed:   60.804 t/s
0.01.264.938 I 
0.01.264.939 I n_draft   = 4
0.01.264.939 I n_predict = 20
0.01.264.939 I n_drafted = 16
0.01.264.939 I n_accept  = 16
0.01.264.940 I accept    = 100.000%
0.01.264.940 I 
0.01.264.940 I draft:
0.01.264.985 I common_perf_print: prompt eval time =     574.99 ms /    69 tokens (    8.33 ms per token,   120.00 tokens per second)
0.01.264.986 I common_perf_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)
"""

# llama-speculative-simple --spec-type ngram-simple ... -n 63: nothing matched, nothing drafted
SPEC_NGRAM_NONE = """\
0.12.427.474 I encoded   48 tokens in    0.644 seconds, speed:   74.551 t/s
0.12.427.859 I decoded   64 tokens in   11.475 seconds, speed:    5.578 t/s
0.12.427.892 I n_draft   = 3
0.12.427.908 I n_predict = 64
0.12.427.924 I n_drafted = 0
0.12.427.940 I n_accept  = 0
0.12.427.956 I accept    = -nan%
"""

# llama-completion -n 16 ... -no-cnv (stderr, its perf print)
COMPLETION = """\
0.11.856.038 I common_perf_print:        load time =    2988.61 ms
0.11.856.052 I common_perf_print: prompt eval time =    2987.95 ms /    48 tokens (   62.25 ms per token,    16.06 tokens per second)
0.11.856.066 I common_perf_print:        eval time =    8647.55 ms /    15 runs   (  576.50 ms per token,     1.73 tokens per second)
0.11.856.080 I common_perf_print:       total time =   11651.37 ms /    63 tokens
"""

# llama-bench -t 2 -p 5,9,16 -n 16 -r 1 -o json (stdout; records cut to the fields used, pp9 left out)
BENCH_JSON = json.dumps([
    {"build_commit": "0c1e570", "build_number": 1, "cpu_info": "AMD EPYC", "model_type": "llama 256M Q4_1",
     "n_threads": 2, "n_prompt": 5, "n_gen": 0, "avg_ns": 119865573, "stddev_ns": 0, "avg_ts": 41.713395, "stddev_ts": 0.0},
    {"build_commit": "0c1e570", "build_number": 1, "cpu_info": "AMD EPYC", "model_type": "llama 256M Q4_1",
     "n_threads": 2, "n_prompt": 16, "n_gen": 0, "avg_ns": 215909506, "stddev_ns": 0, "avg_ts": 74.105121, "stddev_ts": 0.0},
    {"build_commit": "0c1e570", "build_number": 1, "cpu_info": "AMD EPYC", "model_type": "llama 256M Q4_1",
     "n_threads": 2, "n_prompt": 0, "n_gen": 16, "avg_ns": 872036200, "stddev_ns": 0, "avg_ts": 18.347862, "stddev_ts": 0.0},
], indent=2)


def test_speculative_output_gives_decode_speed_and_acceptance():
    f = parse_speculative(SPEC_DRAFT)
    assert (f["new_tokens"], f["seconds"], f["prompt_tokens"]) == (20, pytest.approx(0.329), 48)
    assert f["tokens_per_s"] == pytest.approx(20 / 0.329)
    assert (f["draft_max"], f["drafted"], f["accepted"], f["accept_rate"]) == (4, 16, 16, 1.0)


def test_speculative_output_without_drafts_has_no_accept_rate():
    f = parse_speculative(SPEC_NGRAM_NONE)
    assert (f["new_tokens"], f["drafted"], f["accepted"], f["accept_rate"]) == (64, 0, 0, None)
    with pytest.raises(ValueError, match="decoded"):
        parse_speculative("error: invalid argument: --draft-max")


def test_completion_perf_print_gives_the_one_token_evaluations():
    f = parse_perf(COMPLETION)
    assert (f["new_tokens"], f["seconds"], f["prompt_tokens"]) == (15, pytest.approx(8.64755), 48)
    assert f["tokens_per_s"] == pytest.approx(15 / 8.64755)
    # the "eval time" inside "prompt eval time" is not the decode figure
    with pytest.raises(ValueError):
        parse_perf(COMPLETION.splitlines()[1])


def test_llama_bench_json_gives_tg_and_batch_costs():
    bench = parse_llama_bench(BENCH_JSON + "\n")
    assert bench["tg"] == {"n_gen": 16, "depth": 0, "tokens_per_s": pytest.approx(18.347862), "stddev_tokens_per_s": 0.0,
                           "seconds": pytest.approx(0.8720362), "threads": 2}
    assert sorted(bench["pp"]) == [5, 16] and bench["build"] == "0c1e570 (1)"
    costs = block_costs(bench)
    assert costs[5]["per_token_vs_tg"] == pytest.approx(18.347862 / 41.713395)
    assert costs[16]["block_vs_step"] == pytest.approx(16 * 18.347862 / 74.105121)
    with pytest.raises(ValueError):
        parse_llama_bench("[]")


def test_commands_keep_the_prompt_text_as_it_is(tmp_path):
    text = "<|im_start|>user\nprint('a\\nb')<|im_end|>\n<|im_start|>assistant\n"
    prompt = write_prompt_file(tmp_path / "p.txt", text)
    assert prompt.read_text() == text + "\n"  # -f drops one trailing newline
    spec = speculative_cmd(tmp_path, tmp_path / "t.gguf", tmp_path / "d.gguf", prompt,
                           ["--spec-type", "draft-simple", "--spec-draft-n-max", "4"], 64, 2, 4096)
    assert spec[spec.index("-n") + 1] == "63" and spec[spec.index("-md") + 1].endswith("d.gguf")
    assert "--no-escape" in spec and spec[spec.index("-t") + 1] == "2" and spec[spec.index("--temp") + 1] == "0"
    plain = completion_cmd(tmp_path, tmp_path / "t.gguf", prompt, 64, 2, 4096)
    assert {"-no-cnv", "--no-escape"} <= set(plain) and plain[plain.index("-n") + 1] == "64"


def test_binaries_are_found_by_flag_then_environment_then_default(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LLAMACPP_BIN", raising=False)
    folder, why = find_llamacpp_bin()
    assert folder is None and str(tmp_path / "cache" / "llama.cpp" / "bin") in why and "build_llamacpp.sh" in why
    built = tmp_path / "built"
    built.mkdir()
    for name in peers.LLAMACPP_REQUIRED:
        (built / name).write_text("#!/bin/sh\n")
        (built / name).chmod(0o755)
    assert find_llamacpp_bin(built) == (built, "")
    monkeypatch.setenv("LLAMACPP_BIN", str(built))
    assert find_llamacpp_bin()[0] == built
    assert find_llamacpp_bin(tmp_path / "elsewhere")[0] is None  # the flag wins over the environment


def test_absent_binaries_skip_llamacpp_with_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(peers, "_transformers_runs", lambda args, prompts, tokenizer: {})
    args = Namespace(model="x", draft=None, ctx=512, max_new_tokens=8, llamacpp_bin=str(tmp_path))
    result = peers.run_peers(args, [], [], tokenizer=None)
    assert result["runs"] == {} and "not found" in result["llamacpp"]["skipped"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("peers: skipping llama.cpp")
    assert any("llama.cpp skipped" in line for line in peer_table(result))


def test_the_cli_takes_the_binaries_folder():
    from specdecode.cli import build_parser

    assert build_parser().parse_args(["bench", "--llamacpp-bin", "/opt/llama"]).llamacpp_bin == "/opt/llama"
    assert build_parser().parse_args(["bench"]).llamacpp_bin is None


def test_summary_marks_llamacpp_as_decode_only_and_compares_it_with_its_own_plain():
    rows = [{"method": "ar", "turn": 0, "new_tokens": 20, "seconds": 10.0, "prefill_seconds": 2.0},
            {"method": "draft", "turn": 0, "new_tokens": 20, "seconds": 5.0, "prefill_seconds": 2.0}]
    runs = {"llama.cpp": [{"prompt_id": "llama-bench tg128", "new_tokens": 128, "seconds": 16.0, "decode_only": True}],
            "llama.cpp-draft-k4": [{"prompt_id": "p", "new_tokens": 30, "seconds": 2.0, "decode_only": True,
                                    "drafted": 20, "accepted": 15}]}
    s = summarise_peers(runs, rows)
    assert s["llama.cpp"]["timing"] == "decode-only" and s["llama.cpp"]["decode_tokens_per_s"] == pytest.approx(8.0)
    assert s["llama.cpp-draft-k4"]["vs_own_plain"] == pytest.approx(15.0 / 8.0)
    assert s["llama.cpp-draft-k4"]["accept_rate"] == pytest.approx(0.75)
    assert s["specdecode-ar"]["timing"] == "prefill+decode"
    assert s["specdecode-ar"]["decode_tokens_per_s"] == pytest.approx(2.5)  # 20 tokens in 10 - 2 s
    assert s["llama.cpp"]["decode_vs_specdecode_plain"] == pytest.approx(8.0 / 2.5)
    table = peer_table({"summary": s, "llamacpp": {"build": "0c1e570 (1)", "threads": 2,
                                                  "block_costs": block_costs(parse_llama_bench(BENCH_JSON))}})
    assert table[0].count("|") == 8 and any(line.startswith("| pp16 |") for line in table)
    assert any("| llama.cpp | 8.00 |" in line and "decode-only" in line for line in table)


# --------------------------------------------------------------------------- a real run, when built
@pytest.mark.skipif(find_llamacpp_bin()[0] is None, reason="llama.cpp binaries not built (scripts/build_llamacpp.sh)")
def test_real_short_run_on_smollm2(smollm2, monkeypatch):
    monkeypatch.setattr(peers, "BENCH_TG", 16)
    monkeypatch.setattr(peers, "BENCH_REPS", 1)
    monkeypatch.setattr(peers, "BENCH_BATCHES", (5,))
    prompt = SimpleNamespace(id="sum", turns=["Write a Python function that returns the sum of a list."])
    args = Namespace(model=str(registry.resolve(SMOLLM2)), draft=SMOLLM2, ctx=512, max_new_tokens=16, llamacpp_bin=None)
    runs, info = llamacpp_peer(args, [prompt], smollm2.tokenizer)
    assert not info["notes"], info["notes"]  # no failure, and llama.cpp read the same prompt tokens
    assert runs["llama.cpp"][0]["new_tokens"] == 16 and sorted(info["block_costs"]) == [5]
    # llama.cpp's plain figure: llama-bench's tg at the prompt's depth; its tg at depth 0 stays in info.
    n_prompt = len(smollm2.tokenizer.encode(peers._chat_text(smollm2.tokenizer, prompt)))
    assert runs["llama.cpp"][0]["depth"] == n_prompt and info["bench"]["tg"]["depth"] == 0
    for label in ("llama.cpp-draft-k4", "llama.cpp-draft-k8", "llama.cpp-ngram-k8"):
        (row,) = runs[label]
        assert row["decode_only"] and row["new_tokens"] >= 16 and row["tokens_per_s"] > 0
    assert runs["llama.cpp-draft-k4"][0]["drafted"] > 0  # the model drafting for itself
    assert runs["llama.cpp-draft-k4"][0]["accept_rate"] > 0.9
    summary = summarise_peers(runs, [])
    assert summary["llama.cpp-draft-k4"]["vs_own_plain"] > 0
