"""The command line on the tiny real model smollm2-135m: as a user runs it (a subprocess) where the process itself is
what is tested (its stdout, its exit status, what it reads from the environment at start), else its entry point
`main(argv)` in this process, which spares each test a Python start and the imports (about two seconds each).

Only generated text goes to stdout; statistics go to stderr; bad input gives one `error:` line on
stderr and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from specdecode.engine import Engine
from testlib import SMOLLM2


def run_cli(*args: str, env: dict | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "specdecode.cli", *args],
        capture_output=True, text=True, timeout=600, env=full_env, input=stdin,
    )


def assert_clean_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    assert result.stdout == ""


@pytest.fixture(scope="module")
def expected_hi(smollm2):
    """What the engine produces in-process for the CLI's defaults (chat template, greedy)."""
    engine = Engine(smollm2, None, max_context=512)
    return engine.generate("Hi", drafter="none", max_new_tokens=8).text


def test_generate_plain_prints_only_the_text_on_stdout(expected_hi):
    result = run_cli("generate", "--model", SMOLLM2, "--draft", "none", "--max-new-tokens", "8", "Hi")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == expected_hi + "\n"
    assert expected_hi.strip()
    assert "8 tokens" in result.stderr and "tok/s" in result.stderr
    assert "tok/s" not in result.stdout


def test_generate_with_lookup_gives_the_same_text_and_stats_on_stderr(cli, expected_hi):
    result = cli("generate", "--model", SMOLLM2, "--draft", "lookup", "--k", "3", "--max-new-tokens", "8",
                 "--stats", "Hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected_hi + "\n"  # greedy speculation is lossless
    assert "tokens in" in result.stderr and "time:" in result.stderr


def test_launch_ahead_off_the_gpu_path_decodes_as_usual(cli, expected_hi, monkeypatch):
    """--launch-ahead reaches the engine; a CPU's passes cannot be launched ahead (steps_from_device: None), so
    the usual steps run."""
    from specdecode.engine import Engine

    seen, init = [], Engine.__init__
    monkeypatch.setattr(Engine, "__init__", lambda self, *a, **kw: seen.append(kw.get("launch_ahead")) or init(self, *a, **kw))
    result = cli("generate", "--model", SMOLLM2, "--draft", "none", "--launch-ahead", "--max-new-tokens", "8", "Hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected_hi + "\n" and seen == [True]


def test_show_drafts_colours_the_same_text_by_origin_and_source(cli):
    prompt = "Repeat exactly: alpha beta gamma delta alpha beta gamma delta alpha beta gamma delta"
    # A pinned K: whether the adaptive K drafts here depends on timings of a busy machine, and this test is about colours.
    result = cli("generate", "--model", SMOLLM2, "--draft", "lookup", "--k", "4", "--max-new-tokens", "24",
                 "--show-drafts", "--chat", prompt)
    plain = cli("generate", "--model", SMOLLM2, "--draft", "none", "--max-new-tokens", "24", "--chat", prompt)
    assert result.returncode == 0 and plain.returncode == 0, result.stderr + plain.stderr
    assert re.sub(r"\033\[\d*m", "", result.stdout) == plain.stdout  # colour codes only, the same text
    assert "\033[32m" in result.stdout and "\033[35m" not in result.stdout  # copied tokens green, none from a model
    assert "legend:" in result.stderr and "accepted (draft model)" in result.stderr


def test_generate_reads_the_prompt_from_stdin(cli, expected_hi):
    result = cli("generate", "--model", SMOLLM2, "--draft", "none", "--max-new-tokens", "8", "-", stdin="Hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected_hi + "\n"


def test_small_context_with_automatic_k(cli):
    result = cli("generate", "--model", SMOLLM2, "--draft", "lookup", "--ctx", "16", "--no-chat",
                 "--max-new-tokens", "4", "Hi")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip()


def test_models_list(cli):
    result = cli("models", "list")
    assert result.returncode == 0, result.stderr
    assert SMOLLM2 in result.stdout and "qwen2.5-coder-1.5b" in result.stdout
    line = next(l for l in result.stdout.splitlines() if l.startswith(SMOLLM2))
    assert "cached" in line


# --------------------------------------------------------------------------- bad input
def test_unknown_model(cli):
    assert_clean_error(cli("generate", "--model", "no-such-model", "--draft", "none", "Hi"), "no-such-model", SMOLLM2)


def test_missing_file(cli):
    assert_clean_error(cli("generate", "--model", "/nonexistent/model.gguf", "--draft", "none", "Hi"), "not found")


def test_corrupt_file(cli, tmp_path):
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(b"this is not a model at all" * 10)
    assert_clean_error(cli("generate", "--model", str(bad), "--draft", "none", "Hi"), "corrupt.gguf")


def test_truncated_gguf(cli, tmp_path):
    from specdecode import registry

    truncated = tmp_path / "truncated.gguf"
    with open(registry.resolve(SMOLLM2), "rb") as src:
        truncated.write_bytes(src.read(1_000_000))
    result = cli("generate", "--model", str(truncated), "--draft", "none", "Hi",
                     env={"SPECDECODE_CACHE": str(tmp_path / "cache")})
    assert_clean_error(result, "truncated.gguf")


def _missing_isa() -> str | None:
    from specdecode import kernels

    paths = kernels.quant_isa_paths()
    return next((isa for isa in ("amx", "avx512-vnni") if isa not in paths), None)


@pytest.mark.parametrize("command", ["generate", "serve"])
@pytest.mark.parametrize("isa", ["avx9000", "missing"])
def test_an_instruction_set_the_cpu_cannot_run_is_refused_at_load(command, isa):
    """SPECDECODE_ISA naming a path the kernel cannot run here loaded the model, then failed every product
    (a traceback from generate, a 500 for every request from serve)."""
    from specdecode import kernels

    if kernels.load_kernel() is None:
        pytest.skip(f"CPU kernel unavailable (int8 falls back to float32): {kernels.kernel_status()}")
    if isa == "missing":
        isa = _missing_isa()
        if isa is None:
            pytest.skip(f"this CPU runs every instruction-set path ({', '.join(kernels.quant_isa_paths())})")
    args = ["--port", "0"] if command == "serve" else ["--max-new-tokens", "2", "Hi"]
    result = run_cli(command, "--model", SMOLLM2, "--draft", "none", "--precision", "int8", *args,
                     env={"SPECDECODE_ISA": isa})
    assert_clean_error(result, f"SPECDECODE_ISA={isa}")


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "0"], "top_p"),
        (["--k", "many"], "--k"),
        (["--max-new-tokens", "0"], "max_new_tokens"),
        (["--temperature", "1", "--seed", "-1"], "seed"),
        (["--temperature", "1", "--seed", str(2**63)], "seed"),
    ],
)
def test_invalid_decoding_values(cli, flags, fragment):
    assert_clean_error(cli("generate", "--model", SMOLLM2, "--draft", "none", *flags, "Hi"), fragment)


def test_prompt_longer_than_the_context(cli):
    prompt = "Tell me everything about speculative decoding and why it is lossless, in detail, please."
    assert_clean_error(cli("generate", "--model", SMOLLM2, "--draft", "none", "--ctx", "16", "--no-chat", prompt),
                       "context")


def test_mismatched_draft_model(cli, tmp_path):
    """A draft whose tokenizer differs from the target's is refused with one clear line."""
    import json

    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers.models import WordLevel

    folder = tmp_path / "other-vocab"
    vocab = {f"w{i}": i for i in range(64)}
    raw = RawTokenizer(WordLevel(vocab, unk_token="w0"))
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="w0").save_pretrained(str(folder))
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(str(folder))
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llama"
    result = cli("generate", "--model", SMOLLM2, "--draft", str(folder), "--draft-dtype", "float32",
                 "--max-new-tokens", "4", "Hi")
    assert_clean_error(result, "tokenizer")


def test_auto_draft_precision_is_int8_through_the_cpu_kernel_else_bfloat16(smollm2, monkeypatch):
    from specdecode import kernels
    from specdecode.build import draft_dtype

    assert draft_dtype("float32", smollm2) == "float32"  # an explicit choice is kept
    if kernels.load_kernel() is not None:
        assert draft_dtype("auto", smollm2) == "int8"
    monkeypatch.setattr(kernels, "load_kernel", lambda: None)
    assert draft_dtype("auto", smollm2) == "bfloat16"


@pytest.mark.parametrize("precision, auto_drafts", [("int8", False), ("float32", True)])
def test_a_benchmark_loads_the_draft_model_but_auto_uses_it_only_where_the_default_would(monkeypatch, precision, auto_drafts):
    """bench --drafters ar,draft,auto loads the draft model for `draft`; its auto column must still be the default's."""
    from specdecode import registry
    from specdecode.build import EngineOptions, build_engine

    monkeypatch.setattr(registry, "DEFAULT_TARGET", SMOLLM2)
    monkeypatch.setattr(registry, "DEFAULT_DRAFT", SMOLLM2)
    options = EngineOptions(model=SMOLLM2, precision=precision, draft_dtype="float32", ctx=256)
    engine, drafter = build_engine(options, with_draft_model=True)
    assert drafter == "auto" and engine.draft is not None
    assert engine.auto_draft_model is auto_drafts
    assert ("draft" in engine.drafter("auto").sources) is auto_drafts


def test_a_draft_model_loaded_to_draft_takes_the_draft_arithmetic_and_the_target_does_not(monkeypatch):
    """build_engine's draft (a fresh model object, drafting only) switches to the draft layouts (kernels'
    QuantWeight.as_draft: cheaper roundings of its Q5_0 matrices); the target keeps its file's arithmetic."""
    from specdecode.build import EngineOptions, build_engine
    from specdecode.models.transformer import Transformer

    switched = []
    monkeypatch.setattr(Transformer, "use_draft_arithmetic", lambda self: switched.append(self))
    engine, drafter = build_engine(EngineOptions(model=SMOLLM2, draft=SMOLLM2, ctx=256))
    assert drafter == "draft" and engine.draft.model is not engine.target.model
    assert switched == [engine.draft.model]


def test_a_command_whose_extra_is_missing_says_which_extra_in_one_line():
    """The core install has no server: `specdecode serve` without fastapi names the extra to install."""
    code = "import sys; sys.modules['fastapi'] = None; from specdecode.cli import main; sys.exit(main(['serve']))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert_clean_error(result, "'serve' extra", "fastapi", "scripts/setup.sh serve")
