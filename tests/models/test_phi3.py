"""Phi-3 in the native decoder: fused Q|K|V and gate|up matrices read as they are, plain rope, a config's sliding
window as a cap on the context, longrope refused. Checked against transformers on tiny random models from HF
folders, from GGUF files (written here and by llama.cpp's own converter), float32 and int8; each exactness check
has a broken twin (the fused matrices split at the wrong place) that fails it."""
from __future__ import annotations

import json
import pytest
import torch

from specdecode.errors import ModelError
from specdecode.models.config import RopeScaling
from specdecode.models.gguf_loader import load_gguf_model
from specdecode.models.hf_loader import config_from_hf, load_hf_native
from test_rope import IDS, MAX_ABS_DIFF, check_matches, hf_logits, max_diff, native_logits, randomize
from testlib import require_llamacpp_converter, run_llamacpp_converter

PHI3 = dict(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=128, rms_norm_eps=1e-5, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)


def tiny_phi3(seed: int = 90, **overrides):
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(seed)
    return randomize(Phi3ForCausalLM(Phi3Config(**{**PHI3, "rope_parameters": dict(rope_type="default", rope_theta=10000.0),
                                                   **overrides})))


def swap_gate_up(model) -> None:
    """Broken twin: the fused gate|up matrix read as up|gate."""
    for layer in model.layers:
        gate, up = layer.gate_up.data.chunk(2)
        layer.gate_up.data = torch.cat([up, gate]).contiguous()


def shift_qkv_split(model) -> None:
    """Broken twin: the fused Q|K|V matrix split one head too late (q takes k's first head)."""
    for layer in model.layers:
        layer.qkv.data = torch.roll(layer.qkv.data, -model.config.head_dim, dims=0).contiguous()


BROKEN = {"gate/up swapped": swap_gate_up, "q/k/v split one head late": shift_qkv_split}


def check_with_twins(load, hf, what: str) -> None:
    """The model `load()` builds matches transformers; each broken twin of it misses by far more than the tolerance."""
    expected = check_matches(load(), hf, IDS, what)
    for name, breaks in BROKEN.items():
        twin = load()
        breaks(twin)
        miss = max_diff(native_logits(twin, IDS), expected)
        print(f"  broken twin ({name}): {miss:.3g}")
        assert miss > 50 * MAX_ABS_DIFF, f"the {name} twin is not caught"


def test_hf_folder_matches_transformers(tmp_path):
    hf = tiny_phi3()
    hf.save_pretrained(str(tmp_path))
    config = config_from_hf(hf.config.to_dict())
    assert (config.arch, config.qkv_bias, config.qk_norm, config.tie_embeddings) == ("phi3", False, False, False)
    check_with_twins(lambda: load_hf_native(tmp_path, "cpu", torch.float32, 128), hf, "phi3 HF folder")


def test_gguf_written_as_llamacpp_writes_it_matches_transformers(tmp_path):
    """attn_qkv and ffn_up (gate then up) as single tensors, Q/K rows not permuted (NeoX rotation in llama.cpp)."""
    from test_loader import write_gguf

    hf = tiny_phi3()
    hf.save_pretrained(str(tmp_path / "hf"))
    path = write_gguf(tmp_path / "phi3.gguf", load_hf_native(tmp_path / "hf", "cpu", torch.float32, 128))
    check_with_twins(lambda: load_gguf_model(path, "cpu", torch.float32, 128), hf, "phi3 GGUF")


def test_sliding_window_caps_the_context_and_matches_within_it(tmp_path):
    """Phi-3 configs name a window (2047 for the 4k models) that transformers applies on every layer: the native
    decoder attends fully, the same up to the window, so its context stops there."""
    hf = tiny_phi3(sliding_window=len(IDS))  # the last row sees the first: the window's edge
    hf.save_pretrained(str(tmp_path))
    native = load_hf_native(tmp_path, "cpu", torch.float32, None)
    assert native.config.context_length == len(IDS) and native.max_positions == len(IDS)
    check_matches(native, hf, IDS, "phi3 within its window")
    assert config_from_hf({**hf.config.to_dict(), "sliding_window": None}).context_length == 128


def test_longrope_is_refused_in_one_line():
    config = {**tiny_phi3().config.to_dict(), "rope_parameters": dict(
        rope_type="longrope", rope_theta=10000.0, short_factor=[1.0] * 8, long_factor=[2.0] * 8,
        original_max_position_embeddings=64)}
    with pytest.raises(ModelError, match="unsupported rope scaling 'longrope'") as info:
        config_from_hf(config)
    assert "\n" not in str(info.value)


def test_gguf_longrope_factors_are_refused(tmp_path):
    """llama.cpp's converter writes Phi-3's longrope as rope_factors_long/short tensors, not as a scaling type."""
    import numpy as np

    from test_loader import write_gguf
    from testlib import make_tiny_model

    def factors(writer):
        writer.add_tensor("rope_factors_long.weight", np.full(8, 2.0, dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.ones(8, dtype=np.float32))

    path = write_gguf(tmp_path / "longrope.gguf", make_tiny_model(seed=3, arch="phi3", n_kv_heads=4), extra_kv=factors)
    with pytest.raises(ModelError, match="unsupported rope scaling 'longrope' in the GGUF file"):
        load_gguf_model(path, "cpu", torch.float32, None)


def test_int8_follows_float32(tmp_path):
    """The int8 path reads the fused matrices as one part each: close to float32 (not bitwise: int8 activations)."""
    from specdecode import kernels
    from specdecode.models.loader import _to_quant_weights

    if kernels.load_kernel() is None:
        pytest.skip("no CPU kernel")
    tiny_phi3().save_pretrained(str(tmp_path))
    reference = native_logits(load_hf_native(tmp_path, "cpu", torch.float32, 128), IDS)
    int8 = load_hf_native(tmp_path, "cpu", torch.float32, 128)
    _to_quant_weights(int8)
    twin = load_hf_native(tmp_path, "cpu", torch.float32, 128)
    swap_gate_up(twin)
    _to_quant_weights(twin)
    close, far = max_diff(native_logits(int8, IDS), reference), max_diff(native_logits(twin, IDS), reference)
    print(f"int8 phi3: {close:.3g} from float32; gate/up swapped {far:.3g}")
    assert close < far / 5


# --------------------------------------------------------------------------- llama.cpp's converter, load_model
def converted_phi3(tmp_path, tokenizer, outtype: str = "f32", **overrides):
    """A tiny random Phi-3 with a real tokenizer (the converter needs one it knows) converted by llama.cpp's script:
    (transformers model, GGUF path); skips where the converter is absent."""
    require_llamacpp_converter()  # before the tiny model is built
    hf = tiny_phi3(vocab_size=len(tokenizer), **overrides)
    folder = tmp_path / "phi3-hf"
    hf.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    # The converter reads a Phi-3 vocabulary from tokenizer.model (SentencePiece) unless tokenizer_config.json names
    # GPT2Tokenizer, as Phi-4's files (model_type phi3) do: smollm2's byte-level BPE, named so.
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "tokenizer_class": "GPT2Tokenizer"}))
    out = tmp_path / f"phi3-{outtype}.gguf"
    run_llamacpp_converter(folder, out, outtype)
    return hf, out


def test_llamacpp_converted_gguf_matches_transformers(tmp_path, smollm2):
    hf, path = converted_phi3(tmp_path, smollm2.tokenizer.hf)
    ids = [(7 * i * i + 3 * i + 1) % hf.config.vocab_size for i in range(96)]
    native = load_gguf_model(path, "cpu", torch.float32, 128)
    assert native.config.arch == "phi3" and native.config.rope_scaling == RopeScaling()
    check_matches(native, hf, ids, "llama.cpp-converted phi3")
    swap_gate_up(native)
    assert max_diff(native_logits(native, ids), hf_logits(hf, ids)) > 50 * MAX_ABS_DIFF


@pytest.fixture(scope="module")
def phi3_q8_0(tmp_path_factory, smollm2):
    """The q8_0 file llama.cpp's converter writes, loaded as users load it: (int8 target, float32 copy). Once for
    the module: converting and loading cost more than the generations that use them."""
    from specdecode import kernels
    from specdecode.models.loader import load_model

    if kernels.load_kernel() is None:
        pytest.skip("no CPU kernel")
    folder = tmp_path_factory.mktemp("phi3-q8_0")
    _, path = converted_phi3(folder, smollm2.tokenizer.hf, outtype="q8_0")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDECODE_CACHE", str(folder / "cache"))  # after finding the converter in the real cache
        return (load_model(str(path), device="cpu", dtype="int8", max_context=128),
                load_model(str(path), device="cpu", dtype="float32", max_context=128))


@pytest.mark.parametrize("drafter", ["lookup", "draft"])
def test_int8_speculative_equals_plain_through_load_model(phi3_q8_0, drafter):
    """The converted file loaded as users load it (load_model, --precision int8: the fused blocks as one part of the
    int8 kernel each), greedy speculative output == plain output; the draft is the same file at float32."""
    from specdecode import kernels
    from specdecode.engine import Engine

    target, float32 = phi3_q8_0
    assert target.model.int8 and target.model.config.arch == "phi3"
    assert target.model.layers[0].qkv.types == [kernels.Q8_0]  # the fused attn_qkv, one part
    draft = float32 if drafter == "draft" else None
    prompt = [(5 * i + 11) % 300 for i in range(12)] * 2
    plain = Engine(target, None, max_context=128).generate(prompt, drafter="none", max_new_tokens=40).token_ids
    result = Engine(target, draft, max_context=128, check_invariants=True).generate(prompt, drafter=drafter, k=4,
                                                                                    max_new_tokens=40)
    assert result.token_ids == plain and result.stats.drafted > 0

