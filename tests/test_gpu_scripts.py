"""The device scripts' host-side parts, tried where no GPU is: the projection of draft-model chains from a CPU
run's acceptance by depth (scripts/project_gpu_speedup.py), and the random-weight GGUF files both engines read
(scripts/gguf_random.py; llama.cpp's side is its own reader here, its binaries on the device)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import project_gpu_speedup as projection  # noqa: E402


def test_chains_project_their_expected_tokens_over_their_passes_costs():
    bench = {"acceptance_by_depth": {"draft": {"1": {"judged": 10, "kept": 5, "rate": 0.5},
                                               "2": {"judged": 5, "kept": 5, "rate": 1.0}}}}
    rates = projection.depth_rates(bench)
    assert rates == [0.5, 1.0]
    assert projection.expected_tokens(rates, 1) == 1.5
    assert projection.expected_tokens(rates, 3) == 1 + 0.5 + 0.5 + 0.5  # depth 3 keeps depth 2's rate
    target = {"step": 1.0, "verify": {1: 1.0, 2: 1.2, 3: 1.5, "4": 2.0}}  # JSON keys are strings
    speedups = projection.chain_speedups(target, {1: 0.1, 2: 0.2, 3: 0.3}, rates)
    assert speedups[1] == pytest.approx(1.5 / 1.3)
    assert speedups[3] == pytest.approx(2.5 / 2.3)
    table = projection.chain_table({"targets": {"7b": target}, "draft": {"proposals": {1: 0.1, 2: 0.2, 3: 0.3}}},
                                   bench, "run")
    assert any(line.startswith("| 7b | 2 | 2.00 | 1.18x |") for line in table)  # 2.0 / 1.7, the best K
    assert projection.chain_table({}, {}, "run")[0].startswith("- run: no draft chains")


def test_a_random_gguf_file_holds_a_q4_k_m_layout_and_loads(tmp_path):
    """A 1.5B-shaped file as llama-quantize lays out Q4_K_M (V and down matrices Q6_K by its rule), the tokenizer
    padded to the shape's vocabulary; specdecode's loader reads it and computes finite logits."""
    gguf = pytest.importorskip("gguf")
    import gguf_random

    vocab = tmp_path / "vocab.gguf"
    writer = gguf.GGUFWriter(vocab, "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["t", "1", "t1"] + [f"x{i}" for i in range(297)])
    writer.add_token_types([1] * 300)
    writer.add_token_merges(["t 1"])
    writer.add_eos_token_id(1), writer.add_bos_token_id(1), writer.add_pad_token_id(1)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    shape = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=8, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=320, tie_word_embeddings=False)
    path = tmp_path / "model.gguf"
    gguf_random.write(path, shape, "q4_k_m", vocab)
    reader = gguf.GGUFReader(path)
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["token_embd.weight"] == "Q4_K" and types["output.weight"] == "Q6_K"
    assert [types[f"blk.{i}.attn_v.weight"] for i in range(8)] == ["Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K",
                                                                   "Q6_K", "Q6_K"]
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 320  # padded
    import torch

    from specdecode.models.loader import load_model

    loaded = load_model(str(path), device="cpu", dtype="int8")
    logits = loaded.model(torch.tensor([1, 2, 3]), loaded.model.new_cache(16))
    assert logits.shape == (3, 320) and torch.isfinite(logits).all()


def _fake_cuda(tmp_path, cublas_in_toolkit: bool) -> dict:
    """A toolkit root whose nvcc (a script) says where it is, with the driver's stub, with or without cuBLAS; the
    environment that puts its nvcc first."""
    import os

    root = tmp_path / "cuda"
    (root / "bin").mkdir(parents=True)
    (root / "lib64" / "stubs").mkdir(parents=True)
    (root / "lib64" / "stubs" / "libcuda.so").touch()
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho '#$ _HERE_={root}/bin' >&2\n")
    nvcc.chmod(0o755)
    if cublas_in_toolkit:
        (root / "include").mkdir()
        (root / "include" / "cublas_v2.h").touch()
    return dict(os.environ, PATH=f"{root / 'bin'}:{os.environ['PATH']}")


def _build_flags(env) -> tuple[int, list[str]]:
    import subprocess

    done = subprocess.run(["bash", str(SCRIPTS / "cuda_build_flags.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    return done.returncode, done.stdout.split("\n")[:-1]


def test_cuda_build_flags_name_pips_cublas_where_the_toolkit_has_none(tmp_path):
    """scripts/gpu_peer.sh builds llama.cpp's CUDA backend on the device; where nvcc's toolkit lacks cuBLAS, pip's
    nvidia-cublas (CUDA 13's layout, nvidia/cu13, libraries versioned only) is named to CMake file by file."""
    site = tmp_path / "site"
    cu13 = site / "nvidia" / "cu13"
    (cu13 / "include").mkdir(parents=True)
    (cu13 / "include" / "cublas_v2.h").touch()
    (cu13 / "lib").mkdir()
    for name in ("libcublas.so.13", "libcublasLt.so.13"):
        (cu13 / "lib" / name).touch()
    assert _build_flags(_fake_cuda(tmp_path / "a", cublas_in_toolkit=True)) == (0, [])
    env = dict(_fake_cuda(tmp_path / "b", cublas_in_toolkit=False), PYTHONPATH=str(site))
    assert _build_flags(env) == (0, [f"-DCUDA_cublas_LIBRARY={cu13}/lib/libcublas.so.13",
                                     f"-DCUDA_cublasLt_LIBRARY={cu13}/lib/libcublasLt.so.13",
                                     f"-DCMAKE_CUDA_FLAGS=-I{cu13}/include", f"-DCMAKE_CXX_FLAGS=-I{cu13}/include",
                                     f"LD_LIBRARY_PATH={cu13}/lib"])
    env["PYTHONPATH"] = str(tmp_path / "empty")
    code, _ = _build_flags(env)
    assert code == 1 or pytest.skip("this machine's python3 has pip's cuBLAS: the no-cuBLAS case cannot be made here")


def test_the_device_checks_timed_parts_run_where_no_test_runs_them(tmp_path):
    """scripts/gpu_check.py's parts that only time (cost of exactness, the per-shape tile sweep, the profile) call
    the GPU path's internals directly, and no other test runs them: on tiny shapes through Triton's interpreter
    they must at least run, so that a changed signature fails here and not in a lent GPU's few minutes (part cost
    once did: scripts/device_rehearsal.sh runs every part)."""
    import os
    import subprocess

    pytest.importorskip("triton")
    root = SCRIPTS.parent
    env = dict(os.environ, PYTHONPATH=f"{root}:{root / 'tests'}", TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, str(SCRIPTS / "gpu_check.py"), "--tiny", "--out", str(tmp_path),
                           "--parts", "cost,shape_tiles,profile"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    report = (tmp_path / "report.md").read_text()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "FAILED" not in report, report
    assert "## cost of exactness" in report and "## profile of a step" in report


def test_the_gpu_paths_kernels_compile_for_an_h100_without_one(tmp_path):
    """scripts/triton_compile_check.py: every kernel specialization the GPU path launches for the 0.5B shape (its
    file's GGUF blocks) and Gemma 3 270M's (head size 256, q/k norms, sandwich norms, GeGLU), default tiles and
    SWAP_AB with the fused epilogues, each with its PDL twin, compiled for sm_90 by Triton's compiler and ptxas,
    which the interpreter never runs: a helper's str default that the compiler refuses (reduce_kernel and
    gated_act_kernel failed so), a tile over the shared memory limit, the race compiled with fused multiply-adds or
    an arrival counter counted without acquire and release (twins of each failed) fails here."""
    import json
    import os
    import subprocess

    pytest.importorskip("triton")
    root = SCRIPTS.parent
    env = dict(os.environ, PYTHONPATH=f"{root}:{root / 'tests'}")
    env.pop("TRITON_INTERPRET", None)  # the script's child sets it; the compile step must not have it
    done = subprocess.run([sys.executable, str(SCRIPTS / "triton_compile_check.py"), "--shapes", "0.5b,gemma3-270m",
                           "--quick", "--out", str(tmp_path)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads((tmp_path / "results.json").read_text())
    kernels = {row["kernel"] for row in rows}
    assert {"linear_partial_kernel", "attention_partial_kernel", "reduce_kernel", "gated_act_kernel",
            "_race_kernel", "greedy_verdict_kernel"} <= kernels, kernels
    assert any(row["pdl"] for row in rows) and all(row["registers"] > 0 for row in rows)
    assert any(row["constexprs"].get("D") == "256" for row in rows if row["kernel"] == "attention_partial_kernel")


def test_the_peer_report_reads_llama_benchs_json_and_the_speculative_log(tmp_path):
    """scripts/gpu_peer_ours.py --report: llama.cpp's figures from its tools' own output (the parsers of the CPU
    peers, specdecode.bench.peers), ours from gpu_peer_ours.py's JSON, ratios within the run."""
    import json

    import gpu_peer_ours

    record = {"build_commit": "abc", "build_number": 1, "n_threads": 16, "avg_ns": 1, "stddev_ts": 0.0}
    (tmp_path / "llama-bench-1.5b.json").write_text(json.dumps([
        {**record, "n_prompt": 512, "n_gen": 0, "avg_ts": 20000.0}, {**record, "n_prompt": 0, "n_gen": 128, "avg_ts": 400.0}]))
    (tmp_path / "ours-1.5b.json").write_text(json.dumps({
        "pp512_tok_s": 10000.0, "tg128_tok_s": 500.0, "tg128_ahead_tok_s": 520.0,
        "engine": {"none": {"tok_s": 480.0}, "auto": {"tok_s": 600.0}, "identical": True,
                   "ahead": {"tok_s": 510.0, "identical": True}}}))
    (tmp_path / "speculative-simple.log").write_text(
        "I encoded   48 tokens in    0.010 seconds, speed: 4800.000 t/s\n"
        "I decoded  128 tokens in    0.200 seconds, speed:  640.000 t/s\n"
        "I n_draft   = 16\nI n_drafted = 100\nI n_accept  = 60\nI accept    = 60.000%\n")
    gpu_peer_ours.report(tmp_path, ["1.5b", "7b"])
    report = (tmp_path / "report.md").read_text()
    assert "| 1.5b | 400.0 | 500.0 | 1.25 | 20000.0 | 10000.0 | 0.50 | 480.0 / 600.0 (True) | 520.0 (1.30) / 510.0 (True) |" in report
    assert "| 7b | - | - | - | - | - | - | - | - / - |" in report  # no files: dashes, not an error
    assert "640.0 t/s decoding, 60.0% of 100 drafts accepted" in report
