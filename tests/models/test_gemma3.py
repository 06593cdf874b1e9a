"""Gemma 3 and Mistral's sliding window in the native decoder, against transformers on tiny random models: from HF
folders and from GGUF files written by llama.cpp's own converter, float32 and int8.

The prompts run to 96 positions and the windows are 8 (Gemma 3's windowed layers) and 7 (Mistral's every layer),
so the window cuts most rows. Each fact the native decoder must get right has a broken twin here (the same
weights with that fact wrong: window off by one, no window, the local rope base ignored, Gemma's norms without
their +1, the attention scale or softcap dropped), and each twin must miss transformers' logits by far more than
the tolerance."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from specdecode.errors import ModelError
from specdecode.models.gguf_loader import load_gguf_model
from specdecode.models.hf_loader import config_from_hf, load_hf_native
from test_rope import hf_logits, max_diff, native_logits

MAX_ABS_DIFF = 2e-3  # float32 on both sides, as test_hf_match and test_rope
TWIN_MIN_DIFF = 20 * MAX_ABS_DIFF  # a broken twin must miss by at least this much
PROMPT_LENGTH = 96
GEMMA_WINDOW, MISTRAL_WINDOW = 8, 7


def ids_for(vocab: int) -> list[int]:
    return [(7 * i * i + 3 * i + 1) % vocab for i in range(PROMPT_LENGTH)]


def tiny_gemma3(vocab: int = 320, seed: int = 90, **overrides):
    """Layers 0, 1 and 3 windowed (base 1e4), layer 2 global (base 1e6); hidden 96 so that sqrt(hidden) is
    rounded; q.k scaled by 1/sqrt(20) rather than 1/sqrt(head_dim 32); logits softcapped at 15."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    params = dict(vocab_size=vocab, hidden_size=96, intermediate_size=160, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, max_position_embeddings=128, rms_norm_eps=1e-6,
                  sliding_window=GEMMA_WINDOW, query_pre_attn_scalar=20, final_logit_softcapping=15.0,
                  layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
                  rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                  pad_token_id=0, bos_token_id=2, eos_token_id=1)
    params.update(overrides)
    torch.manual_seed(seed)
    return randomize(Gemma3ForCausalLM(Gemma3TextConfig(**params)))


def tiny_mistral(vocab: int = 320, seed: int = 91, **overrides):
    from transformers import MistralConfig, MistralForCausalLM

    params = dict(vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, sliding_window=MISTRAL_WINDOW,
                  rope_theta=10000.0)
    params.update(overrides)
    torch.manual_seed(seed)
    return randomize(MistralForCausalLM(MistralConfig(**params)))


def randomize(model):
    """Weights larger than the default init, so every part matters; Gemma's norm weights are offsets from 1
    (0.3 randn), the others around 1."""
    gemma = model.config.model_type == "gemma3_text"
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(0.3 * torch.randn_like(param) + (0.0 if gemma else 1.0))
            else:
                param.copy_(0.2 * torch.randn_like(param))
    return model.eval()


def check_matches(native, expected, ids, what: str) -> None:
    got = native_logits(native, ids)
    diff = max_diff(got, expected)
    print(f"{what}: max abs logit difference {diff:.3g} (logit scale {expected.abs().max().item():.1f})")
    assert diff < MAX_ABS_DIFF and torch.equal(got.argmax(-1), expected.argmax(-1)), f"{what}: {diff}"


def folder_of(hf, path):
    hf.save_pretrained(str(path))
    return path


# --------------------------------------------------------------------------- broken twins
def window_off_by_one(model):
    for layer in model.layers:
        layer.window += 1 if layer.window else 0


def window_ignored(model):
    for layer in model.layers:
        layer.window = 0


def local_rope_base_ignored(model):
    model.config = dataclasses.replace(model.config, rope_local_theta=0.0)


def norms_without_plus_one(model):
    for name, param in model.named_parameters():
        if "norm" in name:
            param.data -= 1


def attention_scale_ignored(model):
    model.config = dataclasses.replace(model.config, query_pre_attn_scalar=0.0)
    for layer in model.layers:
        layer.config = model.config


def softcap_ignored(model):
    model.config = dataclasses.replace(model.config, final_logit_softcap=0.0)


def embeddings_unscaled(model):
    model.embed_scale = None


GEMMA_TWINS = [window_off_by_one, window_ignored, local_rope_base_ignored, norms_without_plus_one,
               attention_scale_ignored, softcap_ignored, embeddings_unscaled]
MISTRAL_TWINS = [window_off_by_one, window_ignored]


def check_twins_fail(load, expected, ids, twins) -> None:
    for twin in twins:
        model = load()
        twin(model)
        model._rope_cos = model._rope_sin = model._local_rope = None
        diff = max_diff(native_logits(model, ids), expected)
        print(f"  broken twin {twin.__name__}: {diff:.3g}")
        assert diff > TWIN_MIN_DIFF, f"the broken twin {twin.__name__} still matches transformers ({diff:.3g})"


# --------------------------------------------------------------------------- Hugging Face folders
@pytest.mark.parametrize("arch", ["gemma3", "mistral"])
def test_hf_folder_matches_transformers_and_broken_twins_do_not(tmp_path, arch):
    hf = tiny_gemma3() if arch == "gemma3" else tiny_mistral()
    folder = folder_of(hf, tmp_path)
    load = lambda: load_hf_native(folder, "cpu", torch.float32, 128)  # noqa: E731
    native = load()
    c = native.config
    if arch == "gemma3":
        assert (c.arch, c.sliding_window, c.sliding_layers, c.rope_local_theta) == ("gemma3", 8, (0, 1, 3), 1e4)
        assert (c.rope_theta, c.query_pre_attn_scalar, c.final_logit_softcap) == (1e6, 20.0, 15.0)
        assert native.embed_scale == float(torch.tensor(96 ** 0.5)) != 96 ** 0.5  # rounded to float32 as transformers does
    else:
        assert (c.arch, c.sliding_window, c.sliding_layers) == ("mistral", 7, (0, 1))
    ids = ids_for(c.vocab_size)
    expected = hf_logits(hf, ids)
    check_matches(native, expected, ids, f"{arch} HF folder")
    check_twins_fail(load, expected, ids, GEMMA_TWINS if arch == "gemma3" else MISTRAL_TWINS)


@pytest.mark.parametrize("arch", ["gemma3", "mistral"])
def test_prompt_sized_masked_block_matches_transformers(tmp_path, monkeypatch, arch):
    """A float32 block past the rows computed row by row takes one masked attention call: its mask narrowed to each
    layer's window. Broken twin: the mask left unnarrowed."""
    from specdecode import kernels
    from specdecode.models.transformer import Transformer

    hf = tiny_gemma3() if arch == "gemma3" else tiny_mistral()
    native = load_hf_native(folder_of(hf, tmp_path), "cpu", torch.float32, 128)
    monkeypatch.setattr(kernels, "FLOAT32_CHUNKED_MAX_ROWS", 16)  # so the 96-row prompt is "prompt-sized"
    ids = ids_for(320)
    expected = hf_logits(hf, ids)
    check_matches(native, expected, ids, f"{arch} masked prompt")
    monkeypatch.setattr(Transformer, "_window_masks", lambda self, mask, start, positions: {})
    assert max_diff(native_logits(native, ids), expected) > TWIN_MIN_DIFF


def test_older_gemma3_config_json(tmp_path):
    """config.json as the Hub's Gemma 3 files have it: rope_theta, rope_local_base_freq and sliding_window_pattern
    instead of rope_parameters and layer_types."""
    hf = tiny_gemma3()
    cfg = hf.config.to_dict()
    for key in ("rope_parameters", "layer_types"):
        cfg.pop(key)
    cfg.update(rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=3)
    parsed = config_from_hf(cfg)
    assert (parsed.rope_theta, parsed.rope_local_theta, parsed.sliding_layers) == (1e6, 1e4, (0, 1, 3))


def test_mistral_without_a_window_is_llama(tmp_path):
    hf = tiny_mistral(sliding_window=None)
    native = load_hf_native(folder_of(hf, tmp_path), "cpu", torch.float32, 128)
    assert native.config.sliding_layers == () and all(layer.window == 0 for layer in native.layers)
    ids = ids_for(320)
    check_matches(native, hf_logits(hf, ids), ids, "mistral without a window")


@pytest.mark.parametrize("change, match", [
    (dict(attn_logit_softcapping=50.0), "'gemma3' with attention logit softcapping"),
    (dict(use_bidirectional_attention=True), "'gemma3' with bidirectional attention"),
    (dict(hidden_activation="gelu"), "'gemma3' with the activation 'gelu' \\(it runs gelu_tanh\\)"),
    (dict(layer_types=["sliding_attention", "chunked_attention", "full_attention", "sliding_attention"]),
     "layer_types .*covers full_attention and sliding_attention"),
    (dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                           "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}),
     "unsupported rope scaling 'linear' in config.json's sliding_attention layers"),
])
def test_what_is_not_implemented_fails_at_load_in_one_line(change, match):
    cfg = {**tiny_gemma3().config.to_dict(), **change}
    with pytest.raises(ModelError, match=match) as info:
        config_from_hf(cfg)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- int8
@pytest.mark.parametrize("arch", ["gemma3", "mistral"])
def test_int8_model_follows_the_float32_model(tmp_path, arch):
    """The int8 layer (C++: GeGLU, the extra norms, the window, the attention scale) stays close to float32,
    and far closer than float32 with the window ignored."""
    from specdecode import kernels
    from specdecode.models.loader import _to_quant_weights

    if kernels.load_kernel() is None:
        pytest.skip("no CPU kernel")
    folder = folder_of(tiny_gemma3() if arch == "gemma3" else tiny_mistral(), tmp_path)
    ids = ids_for(320)
    reference = native_logits(load_hf_native(folder, "cpu", torch.float32, 128), ids)
    int8 = load_hf_native(folder, "cpu", torch.float32, 128)
    _to_quant_weights(int8)
    quantized = native_logits(int8, ids)
    window_ignored(int8)
    ignored = native_logits(int8, ids)
    close, far = max_diff(quantized, reference), max_diff(ignored, reference)
    agreement = (quantized.argmax(-1) == reference.argmax(-1)).float().mean().item()
    print(f"int8 {arch}: {close:.3g} from float32, top-1 agreement {agreement:.3f}; with the window ignored {far:.3g}")
    assert close < far / 5 and agreement > 0.9


def test_int8_gelu_and_norms_in_the_layer_kernel_match_pytorch():
    """int8_attn_out (C++) for a Gemma layer: the float32 ops applied to the kernel's own products, within rounding."""
    from specdecode import kernels
    from specdecode.models.loader import _to_quant_weights
    from specdecode.models.transformer import gate_activation, rms_norm
    from testlib import TINY_CONFIGS, make_tiny_model

    if kernels.load_kernel() is None:
        pytest.skip("no CPU kernel")
    model = make_tiny_model(seed=22, **TINY_CONFIGS["gemma3-windowed"])
    _to_quant_weights(model)
    layer, c = model.layers[0], model.config
    gen = torch.Generator().manual_seed(3)
    x, attn = torch.randn(5, c.hidden_size, generator=gen), torch.randn(5, c.q_size, generator=gen)
    got = kernels.int8_attn_out(x, attn, layer, c)
    y = x + rms_norm(kernels.linear(attn, layer.out_proj), layer.post_attn_norm, c.rms_norm_eps)
    gate, up = kernels.linear(rms_norm(y, layer.mlp_norm, c.rms_norm_eps), layer.gate_up).chunk(2, dim=-1)
    down = kernels.linear(gate_activation(gate, "gelu_tanh") * up, layer.down)
    expected = y + rms_norm(down, layer.post_mlp_norm, c.rms_norm_eps)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    silu = y + rms_norm(kernels.linear(torch.nn.functional.silu(gate) * up, layer.down), layer.post_mlp_norm, c.rms_norm_eps)
    assert max_diff(silu, got) > 1e-2  # the broken twin: SiLU in place of the tanh GELU is told apart


# --------------------------------------------------------------------------- llama.cpp's converter
def convert_with_llamacpp(folder, out, tokenizer_source) -> None:
    from testlib import require_llamacpp_converter, run_llamacpp_converter

    require_llamacpp_converter()  # before the tokenizer files are written
    tokenizer_source(folder)
    run_llamacpp_converter(folder, out)


def test_gguf_from_llamacpp_converter_matches_transformers(tmp_path, smollm2):
    """A tiny Gemma 3 (smollm2's tokenizer, which the converter reads as GPT-2 style) converted to a float32 GGUF by
    llama.cpp's own script: its norms carry the +1, the local rope base is a key (rope.freq_base_swa), the window
    pattern is llama.cpp's default of 6 (the converter writes none, so the model keeps transformers' default
    layer types to match), and q.k is scaled by 1/sqrt(head_dim) (llama.cpp's scale for every Gemma 3 but the 27B,
    so the model's query_pre_attn_scalar is its head size, as in the real ones). Loaded natively, transformers'
    logits; the broken twins miss."""
    vocab = len(smollm2.tokenizer.hf)
    hf = tiny_gemma3(vocab, num_hidden_layers=6, layer_types=None, query_pre_attn_scalar=32,
                     rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                      "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}})
    out = tmp_path / "tiny.gguf"
    convert_with_llamacpp(folder_of(hf, tmp_path / "hf"), out, lambda folder: smollm2.tokenizer.hf.save_pretrained(str(folder)))
    load = lambda: load_gguf_model(out, "cpu", torch.float32, 128)  # noqa: E731
    native = load()
    c = native.config
    assert (c.arch, c.sliding_window, c.sliding_layers, c.rope_local_theta, c.final_logit_softcap) == (
        "gemma3", GEMMA_WINDOW, (0, 1, 2, 3, 4), 2e4, 15.0)
    ids = ids_for(vocab)
    expected = hf_logits(hf, ids)
    check_matches(native, expected, ids, "llama.cpp-converted gemma3")
    # the attention scale is not in the file (llama.cpp knows it by the model's size): not a twin here
    check_twins_fail(load, expected, ids, [t for t in GEMMA_TWINS if t is not attention_scale_ignored])


def test_gguf_of_mistral_runs_as_llamacpp_runs_it(tmp_path, smollm2):
    """llama.cpp's converter writes Mistral as `llama` without its window, and llama.cpp runs such a file with full
    attention: so does the native decoder (the file is the model); it equals transformers' Mistral with the
    window taken away, and differs from the windowed one."""
    vocab = len(smollm2.tokenizer.hf)
    hf = tiny_mistral(vocab)
    folder = folder_of(hf, tmp_path / "hf")
    out = tmp_path / "tiny.gguf"
    convert_with_llamacpp(folder, out, lambda f: smollm2.tokenizer.hf.save_pretrained(str(f)))
    native = load_gguf_model(out, "cpu", torch.float32, 128)
    assert native.config.arch == "llama" and native.config.sliding_layers == ()
    ids = ids_for(vocab)
    unwindowed = load_hf_native(folder, "cpu", torch.float32, 128)
    window_ignored(unwindowed)
    check_matches(native, native_logits(unwindowed, ids), ids, "llama.cpp-converted mistral vs unwindowed")
    assert max_diff(native_logits(native, ids), hf_logits(hf, ids)) > TWIN_MIN_DIFF


def test_gguf_window_keys_read_as_llamacpp_reads_them():
    from specdecode.models.config import ARCHITECTURES
    from specdecode.models.gguf_loader import gguf_windows

    gemma, llama = ARCHITECTURES["gemma3"], ARCHITECTURES["llama"]

    def keys(**values):
        return lambda key, default: values.get(key.rpartition(".")[2], default)

    assert gguf_windows(keys(sliding_window=512), gemma, 18) == (512, tuple(i for i in range(18) if i % 6 != 5))
    assert gguf_windows(keys(sliding_window=512, sliding_window_pattern=3), gemma, 6) == (512, (0, 1, 3, 4))
    assert gguf_windows(keys(sliding_window=64, sliding_window_pattern=[True, False, True]), gemma, 3) == (64, (0, 2))
    assert gguf_windows(keys(), gemma, 6) == (0, ())
    assert gguf_windows(keys(sliding_window=4096), llama, 6) == (0, ())  # llama.cpp runs llama files unwindowed


# --------------------------------------------------------------------------- the real Gemma 3 270M's tokenizer
def test_gemma3_270m_tokenizer_turns_and_bos():
    """The registry's Gemma 3 270M file carries no chat template: Gemma's turn format is supplied, a turn's end
    (<end_of_turn>) stops generation, and prompts start with the <bos> Gemma needs (once, with a template too)."""
    from transformers import AutoTokenizer

    from specdecode import registry
    from specdecode.tokenizer import Tokenizer

    if not registry.is_cached("gemma3-270m"):
        pytest.skip("gemma3-270m is not pulled (specdecode models pull gemma3-270m)")
    path = registry.cached_path("gemma3-270m")
    tok = Tokenizer.from_hf(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name))
    assert tok.prompt_prefix == [2] and {1, 106} <= tok.eos_ids
    chat = tok.chat_prompt([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}])
    assert chat == "<bos><start_of_turn>user\nBe brief.\n\nHi?<end_of_turn>\n<start_of_turn>model\n"
    ids = tok.encode_prompt(chat)
    assert ids[:2] == [2, 105] and ids.count(2) == 1
    assert tok.encode_prompt("The capital of France is")[:2] == [2, 818]


def test_prompts_of_tokenizers_without_a_bos_are_unchanged():
    from testlib import fake_tokenizer

    tok = fake_tokenizer(16)
    assert tok.prompt_prefix == [] and tok.encode_prompt("<t3><t4>") == [3, 4]


def test_multimodal_gemma3_config_is_refused_in_one_line():
    """model_type gemma3 in a config.json is the image-and-text model (its decoder under text_config): refused, not
    read as the text decoder's config."""
    with pytest.raises(ModelError, match="unsupported architecture 'gemma3' .*model types .*gemma3_text"):
        config_from_hf(dict(model_type="gemma3", text_config={}))
