"""F16, BF16 and F32 GGUF files (made by llama.cpp's converter with --outtype): float32 loads them exactly (every
weight is the file's, widened) on the row-exact path; --precision int8 refuses them in one line, since the int8
kernel reads none of their blocks; --precision q8_0 quantizes them at load and says so."""
from __future__ import annotations

import pytest
import torch

from specdecode.errors import ModelError
from test_phi3 import converted_phi3

ROUNDING = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


@pytest.fixture(scope="module", params=list(ROUNDING))
def converted(request, tmp_path_factory, smollm2):
    """One conversion per type for the module (llama.cpp's converter: a few seconds each)."""
    folder = tmp_path_factory.mktemp(request.param)
    hf, path = converted_phi3(folder, smollm2.tokenizer.hf, outtype=request.param)
    return request.param, hf, path, folder / "cache"


@pytest.fixture
def float_file(converted, monkeypatch):
    """The file, with a cache of its own type: the first test to load it converts it (and the int8 refusal reads
    the matrices' types saved by that conversion)."""
    outtype, hf, path, cache = converted
    monkeypatch.setenv("SPECDECODE_CACHE", str(cache))
    return outtype, hf, path


def widened(hf, rounding):
    return hf.model.layers[1].self_attn.qkv_proj.weight.detach().to(rounding).float()


def test_float32_holds_the_files_weights_exactly_and_speculates_exactly(float_file):
    from specdecode.engine import Engine
    from specdecode.models.loader import load_model

    outtype, hf, path = float_file
    loaded = load_model(str(path), device="cpu", dtype="float32", max_context=128)
    qkv = loaded.model.layers[1].qkv
    assert torch.equal(qkv, widened(hf, ROUNDING[outtype]))
    other = {"f16": torch.bfloat16, "bf16": torch.float16, "f32": torch.float16}[outtype]
    assert not torch.equal(qkv, widened(hf, other)), "broken twin: another rounding of the same weights passes"
    prompt = [(5 * i + 11) % 300 for i in range(12)] * 2
    plain = Engine(loaded, None, max_context=128).generate(prompt, drafter="none", max_new_tokens=30).token_ids
    result = Engine(loaded, None, max_context=128, check_invariants=True).generate(prompt, drafter="lookup", k=4,
                                                                                   max_new_tokens=30)
    assert result.token_ids == plain and result.stats.drafted > 0


def test_int8_refuses_in_one_line_and_q8_0_quantizes_saying_so(float_file, capsys):
    from specdecode import kernels
    from specdecode.models.loader import load_model

    if kernels.load_kernel() is None:
        pytest.skip("no CPU kernel")
    outtype, hf, path = float_file
    with pytest.raises(ModelError, match=rf"9 matrices hold blocks the int8 kernel does not read \(.*{outtype.upper()}"
                                         r".*--precision float32.*--precision q8_0") as info:
        load_model(str(path), device="cpu", dtype="int8", max_context=128)
    assert "\n" not in str(info.value)
    capsys.readouterr()
    loaded = load_model(str(path), device="cpu", dtype="q8_0", max_context=128)
    assert "quantizing 9 matrices" in capsys.readouterr().err and "Q8_0 at load" in loaded.precision
    assert loaded.dtype == "int8" and loaded.requantized == 9 and loaded.model.layers[0].qkv.types == [kernels.Q8_0]


def test_a_hugging_face_folder_at_int8_is_refused_and_q8_0_says_so(tmp_path, capsys, smollm2):
    from specdecode import kernels
    from specdecode.models.loader import load_model
    from test_phi3 import tiny_phi3

    if kernels.load_kernel() is None:
        pytest.skip("no CPU kernel")
    tiny_phi3(vocab_size=len(smollm2.tokenizer.hf)).save_pretrained(str(tmp_path))
    smollm2.tokenizer.hf.save_pretrained(str(tmp_path))
    with pytest.raises(ModelError, match="does not read.*--precision q8_0"):
        load_model(str(tmp_path), device="cpu", dtype="int8", max_context=64)
    capsys.readouterr()
    assert load_model(str(tmp_path), device="cpu", dtype="q8_0", max_context=64).requantized == 9
    assert "quantizing 9 matrices" in capsys.readouterr().err
