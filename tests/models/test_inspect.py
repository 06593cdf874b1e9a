"""`specdecode models inspect`: a registry model, a tiny file converted by llama.cpp, a Hugging Face folder and an
unsupported file, from metadata alone (dequantizing any tensor fails the test)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specdecode.models.inspect import inspect_model
from testlib import SMOLLM2


@pytest.fixture
def no_weights_read(monkeypatch):
    import gguf

    def refuse(*args, **kwargs):
        raise AssertionError("inspect dequantized a tensor")

    monkeypatch.setattr(gguf.quants, "dequantize", refuse)


def test_smollm2_through_the_cli():
    result = subprocess.run([sys.executable, "-m", "specdecode.cli", "models", "inspect", SMOLLM2],
                            capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for expected in ("architecture: llama (native decoder)", "30 layers, hidden 576", "9 heads / 3 kv heads, head_dim 64",
                     "vocab 49152 rows, tied output", "context: 8192 positions", "rope: theta 100000, scaling none",
                     "qkv       90 Q4_1: int8 kernel", "lm_head   1 Q8_0: int8 kernel",
                     "tokenizer: gpt2 (smollm pre-tokenizer), 49152 tokens", "eos 2 '<|im_end|>'", "chat template: yes"):
        assert expected in out, (expected, out)


def test_a_tiny_f16_file_from_llamacpps_converter(tmp_path, smollm2, no_weights_read):
    from test_phi3 import converted_phi3

    _, path = converted_phi3(tmp_path, smollm2.tokenizer.hf, outtype="f16")
    out = "\n".join(inspect_model(str(path)))
    for expected in ("architecture: phi3 (native decoder)", "2 layers, hidden 64, intermediate 160, 4 heads / 4 kv heads",
                     "context: 128 positions", "qkv       2 F16: not the int8 kernel: --precision int8 refuses it",
                     "gate_up   2 F16", "lm_head   1 F16", "tokenizer: gpt2", "49152 tokens"):
        assert expected in out, (expected, out)


def test_a_hugging_face_folder(tmp_path, smollm2):
    from test_phi3 import tiny_phi3

    tiny_phi3(vocab_size=len(smollm2.tokenizer.hf), sliding_window=64).save_pretrained(str(tmp_path))
    smollm2.tokenizer.hf.save_pretrained(str(tmp_path))
    out = "\n".join(inspect_model(str(tmp_path)))
    for expected in ("(Hugging Face folder)", "architecture: phi3", "context: 64 positions", "tensors: 15 F32",
                     "--precision int8 refuses them", "tokenizer: BPE, 49152 tokens", "chat template: yes"):
        assert expected in out, (expected, out)


def test_an_unsupported_file_says_why_and_still_lists_it(tmp_path, no_weights_read):
    from test_loader import write_gguf
    from testlib import make_tiny_model

    path = write_gguf(tmp_path / "gpt2.gguf", make_tiny_model(seed=61), arch_name="gpt2", tokenizer=True)
    out = "\n".join(inspect_model(str(path)))
    assert "architecture: gpt2: not runnable here (unsupported architecture 'gpt2'" in out
    assert "tensors: 21 (21 F32)" in out and "tokenizer: gpt2" in out
