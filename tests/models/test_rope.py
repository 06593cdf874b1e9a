"""Rotary embeddings with context-length scaling (llama3, linear, yarn) and the Qwen3 q/k norms: the native
decoder against transformers on tiny random models, from HF folders and from GGUF files, float32 and int8.

The tiny models' original context is 32 positions and the prompts run to 96, so the scaled frequencies matter
(a model that ignored the scaling differs from transformers far beyond the tolerance, checked below)."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from specdecode.errors import ModelError
from specdecode.models.config import RopeScaling
from specdecode.models.gguf_loader import load_gguf_model
from specdecode.models.hf_loader import config_from_hf, load_hf_native
from specdecode.models.rope import rope_frequencies
from testlib import run_llamacpp_converter

MAX_ABS_DIFF = 2e-3  # as test_hf_match: float32 on both sides (measured ~1e-5 here, logits of magnitude ~7)
ORIGINAL_CONTEXT = 32
SCALINGS = {
    "llama3": dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=ORIGINAL_CONTEXT),
    "linear": dict(rope_type="linear", factor=3.0),
    "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=ORIGINAL_CONTEXT),
    "yarn-attention-factor": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=ORIGINAL_CONTEXT,
                                  attention_factor=0.8, beta_fast=16, beta_slow=2),
}
IDS = [(7 * i * i + 3 * i + 1) % 320 for i in range(96)]


def tiny_hf(arch: str, rope: dict | None, seed: int = 80):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    params = dict(rope_theta=10000.0, **(rope or {"rope_type": "default"}))
    common = dict(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_parameters=params)
    torch.manual_seed(seed)
    model = (LlamaForCausalLM(LlamaConfig(**common)) if arch == "llama"
             else Qwen3ForCausalLM(Qwen3Config(head_dim=32, **common)))
    return randomize(model)


def randomize(model):
    with torch.no_grad():  # larger than the default init, so that every part (norms included) matters
        for name, param in model.named_parameters():
            param.copy_(1 + 0.1 * torch.randn_like(param) if "norm" in name else 0.2 * torch.randn_like(param))
    return model.eval()


def hf_logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def native_logits(model, ids) -> torch.Tensor:
    return model(torch.tensor(ids), model.new_cache(len(ids) + 1))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def check_matches(native, hf, ids, what: str) -> torch.Tensor:
    """Native logits within MAX_ABS_DIFF of transformers', same argmax everywhere; returns transformers' logits."""
    expected, got = hf_logits(hf, ids), native_logits(native, ids)
    diff = max_diff(got, expected)
    print(f"{what}: max abs logit difference {diff:.3g} (logit scale {expected.abs().max().item():.1f})")
    assert diff < MAX_ABS_DIFF and torch.equal(got.argmax(-1), expected.argmax(-1)), f"{what}: {diff}"
    return expected


@pytest.mark.parametrize("name", SCALINGS)
def test_frequencies_match_transformers_rope_init(name):
    """The inverse frequencies and the cos/sin factor equal those of transformers' rope_init_fn for the type."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = tiny_hf("llama", SCALINGS[name])
    config = config_from_hf(hf.config.to_dict())
    expected, expected_factor = ROPE_INIT_FUNCTIONS[SCALINGS[name]["rope_type"]](hf.config, "cpu")
    got, factor = rope_frequencies(config)
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(expected_factor, rel=1e-6)
    unscaled, _ = rope_frequencies(dataclasses.replace(config, rope_scaling=RopeScaling()))
    assert not torch.allclose(unscaled, got), "the scaling changed no frequency"


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("name", SCALINGS)
def test_scaled_hf_folder_matches_transformers_and_not_unscaled(tmp_path, arch, name):
    hf = tiny_hf(arch, SCALINGS[name])
    hf.save_pretrained(str(tmp_path))
    native = load_hf_native(tmp_path, "cpu", torch.float32, 128)
    assert native.config.rope_scaling.kind == SCALINGS[name]["rope_type"]
    expected = check_matches(native, hf, IDS, f"{arch} {name}")
    # the same weights with the scaling ignored (what the loader did before): far outside the tolerance
    native.config = dataclasses.replace(native.config, rope_scaling=RopeScaling())
    native._rope_cos = native._rope_sin = None
    ignored = max_diff(native_logits(native, IDS), expected)
    print(f"  scaling ignored: {ignored:.3g}")
    assert ignored > 50 * MAX_ABS_DIFF


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("name", SCALINGS)
def test_scaled_gguf_matches_transformers(tmp_path, arch, name):
    """The model written to GGUF the way llama.cpp's converter writes it (llama 3 as a rope_freqs tensor,
    linear and yarn as rope.scaling keys; llama Q/K rows permuted) and loaded back natively."""
    from test_loader import write_gguf

    if name == "yarn-attention-factor":
        pytest.skip("llama.cpp replaces a yarn attention factor from config.json by its own (see rope_from_gguf)")
    hf = tiny_hf(arch, SCALINGS[name])
    hf.save_pretrained(str(tmp_path / "hf"))
    path = write_gguf(tmp_path / "tiny.gguf", load_hf_native(tmp_path / "hf", "cpu", torch.float32, 128))
    native = load_gguf_model(path, "cpu", torch.float32, 128)
    scaling = native.config.rope_scaling
    assert (scaling.kind, scaling.freq_divisors is not None) == (("default", True) if name == "llama3" else (name, False))
    check_matches(native, hf, IDS, f"GGUF {arch} {name}")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_int8_model_follows_the_float32_model_with_scaling(tmp_path, arch):
    """The int8 path rotates with the same scaled tables (and, for Qwen3, normalizes q and k in C++): its logits
    stay close to float32's, and far closer than float32's with the scaling ignored."""
    from specdecode import kernels
    from specdecode.models.loader import _to_quant_weights

    if kernels.load_kernel() is None:
        pytest.skip("no CPU kernel")
    hf = tiny_hf(arch, SCALINGS["llama3"])
    hf.save_pretrained(str(tmp_path))
    reference = native_logits(load_hf_native(tmp_path, "cpu", torch.float32, 128), IDS)
    int8 = load_hf_native(tmp_path, "cpu", torch.float32, 128)
    _to_quant_weights(int8)
    quantized = native_logits(int8, IDS)
    int8.config = dataclasses.replace(int8.config, rope_scaling=RopeScaling())
    int8._rope_cos = int8._rope_sin = None
    ignored = native_logits(int8, IDS)
    close, far = max_diff(quantized, reference), max_diff(ignored, reference)
    print(f"int8 {arch}: {close:.3g} from float32; with the scaling ignored {far:.3g}")
    assert close < far / 5
    assert (quantized.argmax(-1) == reference.argmax(-1)).float().mean() > 0.9


def test_int8_qk_norm_in_the_layer_kernel_matches_pytorch():
    """int8_attn_in's per-head q/k RMSNorm (C++): the same values as PyTorch's norm and rotation applied to the
    kernel's own QKV product, within float32 rounding."""
    from specdecode import kernels
    from specdecode.models.loader import _to_quant_weights
    from specdecode.models.transformer import apply_rope, rms_norm
    from testlib import make_tiny_model

    if kernels.load_kernel() is None:
        pytest.skip("no CPU kernel")
    model = make_tiny_model(seed=21, arch="qwen3", head_dim=32)
    _to_quant_weights(model)
    layer, c = model.layers[0], model.config
    x = torch.randn(7, c.hidden_size, generator=torch.Generator().manual_seed(1))
    cos, sin = model._rope(torch.arange(3, 10))
    got = kernels.int8_attn_in(x, layer, cos, sin, c)
    h = rms_norm(x, layer.attn_norm, c.rms_norm_eps)
    q, k, v = kernels.linear(h, layer.qkv).split((c.q_size, c.kv_size, c.kv_size), dim=-1)
    q = apply_rope(rms_norm(q.reshape(7, c.n_heads, c.head_dim), layer.q_norm, c.rms_norm_eps), cos, sin)
    k = apply_rope(rms_norm(k.reshape(7, c.n_kv_heads, c.head_dim), layer.k_norm, c.rms_norm_eps), cos, sin)
    expected = torch.cat([q.reshape(7, -1), k.reshape(7, -1), v], dim=-1)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rope, match", [
    (dict(rope_type="dynamic", factor=2.0), "unsupported rope scaling 'dynamic'.*llama3, linear and yarn"),
    (dict(rope_type="longrope", short_factor=[1.0], long_factor=[1.0]), "unsupported rope scaling 'longrope'"),
])
def test_unsupported_rope_type_fails_at_load_in_one_line(rope, match):
    config = dict(model_type="llama", vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=1,
                  num_attention_heads=4, max_position_embeddings=128, rope_parameters=dict(rope_theta=1e4, **rope))
    with pytest.raises(ModelError, match=match) as info:
        config_from_hf(config)
    assert "\n" not in str(info.value)


def test_older_config_json_rope_scaling_key():
    """config.json files written before transformers 5: rope_theta at the top, `rope_scaling` with `type`."""
    config = dict(model_type="llama", vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=1,
                  num_attention_heads=4, max_position_embeddings=131072, rope_theta=500000.0,
                  rope_scaling=dict(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=8192))
    parsed = config_from_hf(config)
    assert parsed.rope_theta == 500000.0
    assert parsed.rope_scaling == RopeScaling("llama3", factor=8.0, original_context=8192)


def test_unsupported_gguf_rope_type(tmp_path):
    import gguf

    from test_loader import write_gguf
    from testlib import make_tiny_model

    model = make_tiny_model(seed=4)
    path = tmp_path / "longrope.gguf"
    write_gguf(path, model, extra_kv=lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE))
    with pytest.raises(ModelError, match="unsupported rope scaling 'longrope' in the GGUF file"):
        load_gguf_model(path, "cpu", torch.float32, None)


def test_unsupported_hf_architecture_names_the_supported_ones(tmp_path):
    from specdecode.models.config import SUPPORTED_ARCHS

    supported = r"unsupported architecture 'gemma2' \(the native decoder covers " + re.escape(", ".join(SUPPORTED_ARCHS))
    with pytest.raises(ModelError, match=supported + r"; Hugging Face model types .*gemma3_text"):
        config_from_hf(dict(model_type="gemma2"))


# --------------------------------------------------------------------------- llama.cpp's own converter
@pytest.mark.parametrize("arch, name", [("llama", "llama3"), ("llama", "linear"), ("qwen3", "yarn"), ("qwen3", None)])
def test_gguf_from_llamacpp_converter_matches_transformers(tmp_path, smollm2, arch, name):
    """The tiny model (smollm2's tokenizer, which the converter knows) converted by llama.cpp's own script to a
    float32 GGUF, loaded natively: transformers' logits."""
    small = tiny_hf(arch, SCALINGS[name] if name else None)
    config = small.config
    config.vocab_size = len(smollm2.tokenizer.hf)
    torch.manual_seed(81)
    hf = randomize(type(small)(config))
    hf.save_pretrained(str(tmp_path))
    smollm2.tokenizer.hf.save_pretrained(str(tmp_path))
    out = tmp_path / "tiny.gguf"
    run_llamacpp_converter(tmp_path, out)
    native = load_gguf_model(out, "cpu", torch.float32, 128)
    assert native.config.arch == arch and native.config.qk_norm == (arch == "qwen3")
    check_matches(native, hf, [(7 * i * i + 3 * i + 1) % config.vocab_size for i in range(96)], f"llama.cpp-converted {arch} {name}")


@pytest.mark.parametrize("dtype", ["float32", "q8_0"])  # q8_0: the float32 file's matrices quantized at load
def test_scaling_survives_the_converted_folder(tmp_path, monkeypatch, dtype):
    """load_model converts a GGUF file once and later reads its config.json: the rope scaling (llama 3's
    divisors here) is kept there, so the loaded model rotates as the file says."""
    from test_loader import write_gguf
    from testlib import make_tiny_model

    from specdecode import kernels
    from specdecode.models.loader import load_model

    if dtype == "q8_0" and kernels.load_kernel() is None:
        pytest.skip("no CPU kernel")
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    source = make_tiny_model(seed=30, arch="qwen3", head_dim=32)
    source.config = dataclasses.replace(source.config, rope_scaling=RopeScaling("llama3", factor=4.0, original_context=32))
    path = write_gguf(tmp_path / "scaled.gguf", source, tokenizer=True)
    direct = load_gguf_model(path, "cpu", torch.float32, None)
    for _ in range(2):  # converting, then reading the converted folder
        loaded = load_model(str(path), device="cpu", dtype=dtype).model
        assert loaded.config == direct.config and loaded.config.rope_scaling.freq_divisors is not None
        assert torch.equal(loaded._rope(torch.arange(100))[0], direct._rope(torch.arange(100))[0])
    ids = list(range(0, 250, 3))
    if dtype == "float32":
        assert torch.equal(native_logits(loaded, ids), native_logits(direct, ids))


def test_sliding_window_layers_are_refused_not_ignored():
    from transformers import Qwen3Config

    config = Qwen3Config(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                         head_dim=32, use_sliding_window=True, sliding_window=16, max_window_layers=1).to_dict()
    with pytest.raises(ModelError, match="'qwen3' with sliding-window attention is not supported"):
        config_from_hf(config)
