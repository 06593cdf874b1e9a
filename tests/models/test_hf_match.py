"""Native decoder logits == Hugging Face transformers logits on the same weights.

- tiny random HF models (llama and qwen2, tied and untied) through the HF-folder loader;
- the real smollm2-135m GGUF (llama arch: checks the Q/K un-permutation) dequantized by
  transformers itself (`from_pretrained(folder, gguf_file=...)`) vs our GGUF loader;
- the same model saved as an HF folder, loaded natively and through the transformers adapter;
- qwen2.5-coder-0.5b (qwen2 arch: QKV bias), marked slow but required.
"""
from __future__ import annotations

import functools
import struct
from pathlib import Path
from unittest import mock

import gguf
import numpy as np
import pytest
import torch

from specdecode.engine import Engine
from specdecode.models.gguf_header import GGUFHeader
from specdecode.models.hf_adapter import HFAdapter
from specdecode.models.hf_loader import config_from_hf, load_hf_native, read_hf_config
from specdecode.models.loader import load_model
from testlib import QWEN_05B, SMOLLM2, reference_greedy

PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n'
MAX_ABS_DIFF = 2e-3  # float32 on both sides; measured ~1e-4 on smollm2 (logits of magnitude ~40)


def compare(native_logits: torch.Tensor, hf_logits: torch.Tensor, what: str) -> float:
    diff = (native_logits.float() - hf_logits.float()).abs().max().item()
    print(f"{what}: max abs logit difference {diff:.3g} over {native_logits.shape[0]} positions"
          f" (logit scale {hf_logits.abs().max().item():.1f})")
    assert diff < MAX_ABS_DIFF, f"{what}: max abs diff {diff}"
    assert torch.equal(native_logits.argmax(-1), hf_logits.argmax(-1)), f"{what}: argmax differs"
    return diff


def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(input_ids=torch.tensor([ids])).logits[0].float()


def native_logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor(ids), model.new_cache(len(ids) + 1))


# --------------------------------------------------------------------------- tiny HF models
def tiny_hf_model(arch: str, tied: bool, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(rope_parameters=dict(rope_type="default", rope_theta=50000.0), **common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(rope_theta=1000000.0, **common))
    else:  # heads of 32 with hidden 64: q_size 128, head_dim given explicitly as Qwen3 configs do
        model = Qwen3ForCausalLM(Qwen3Config(rope_theta=1000000.0, head_dim=32, **common))
    with torch.no_grad():  # default init is tiny (std 0.02), norms 1, biases 0: make every part matter
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.1 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.5 * torch.randn_like(param))
            else:
                param.copy_(0.2 * torch.randn_like(param))
    return model.eval()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_tiny_hf_folder_native_matches_transformers(tmp_path, arch, tied):
    hf = tiny_hf_model(arch, tied, seed=70)
    hf.save_pretrained(str(tmp_path))
    config = config_from_hf(read_hf_config(tmp_path))
    assert config.arch == arch and config.tie_embeddings == tied and config.qkv_bias == (arch == "qwen2")
    assert config.qk_norm == (arch == "qwen3") and config.head_dim == (32 if arch == "qwen3" else 16)
    assert config.rope_theta == hf.config.rope_parameters["rope_theta"] if hasattr(hf.config, "rope_parameters") else True
    native = load_hf_native(tmp_path, "cpu", torch.float32, 128)
    ids = [3, 141, 59, 26, 53, 58, 97, 93, 238, 46, 264, 33, 83, 279, 50, 28, 84, 197, 169, 39]
    compare(native_logits(native, ids), hf_logits(hf, ids), f"tiny {arch} {'tied' if tied else 'untied'}")


# --------------------------------------------------------------------------- real GGUF: smollm2 (llama)
# The tokenizer's arrays: transformers parses them element by element whenever it opens a GGUF file, tens of seconds
# for Qwen's 151k tokens and merges, though its model loader reads only their count.
VOCABULARY_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.scores")


class _Layout(GGUFHeader):
    """Where each metadata pair, the tensor table and the data of a GGUF file lie (byte ranges)."""

    def __init__(self, path: Path):
        self.data = np.memmap(path, mode="r")
        self._buf, self._pos = memoryview(self.data), 8
        n_tensors, n_fields = self._unpack("<QQ")
        self.pairs, self.metadata = [], {}
        for _ in range(n_fields):
            begin, key = self._pos, self._string()
            self.metadata[key] = self._value(gguf.GGUFValueType(self._unpack("<I")[0]))
            self.pairs.append((key, begin, self._pos))
        table_start = self._pos
        for _ in range(n_tensors):
            self._tensor_info()
        self.n_tensors, self.table = n_tensors, (table_start, self._pos)
        self.alignment = int(self.metadata.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT))
        self.data_start = -(-self._pos // self.alignment) * self.alignment


def without_vocabulary(source: Path, target: Path) -> Path:
    """The GGUF file without VOCABULARY_KEYS, its vocabulary size written where transformers reads it first
    ({arch}.vocab_size, as it would count the tokens); every other pair, the tensor table and the weights byte for
    byte the same (the weights' offsets count from the data's start, which only moves)."""
    layout = _Layout(source)
    raw = layout.data
    kept = [(key, begin, end) for key, begin, end in layout.pairs if key not in VOCABULARY_KEYS]
    arch = layout.metadata["general.architecture"]
    extra = b""
    if f"{arch}.vocab_size" not in layout.metadata:
        key = f"{arch}.vocab_size".encode()
        extra = struct.pack("<Q", len(key)) + key + struct.pack("<II", gguf.GGUFValueType.UINT32,
                                                                len(layout.metadata["tokenizer.ggml.tokens"]))
    with open(target, "wb") as out:
        out.write(bytes(raw[:8]) + struct.pack("<QQ", layout.n_tensors, len(kept) + bool(extra)))
        for _, begin, end in kept:
            out.write(bytes(raw[begin:end]))
        out.write(extra + bytes(raw[layout.table[0]:layout.table[1]]))
        out.write(b"\0" * (-out.tell() % layout.alignment))
        out.write(raw[layout.data_start:])
    return target


def gguf_reference(name: str, folder: Path):
    """transformers' own model from the GGUF file (it dequantizes and un-permutes by itself), given the file without
    its vocabulary (a copy in `folder`), which its model loader does not use."""
    try:
        import accelerate  # noqa: F401  (transformers refuses GGUF files without it)
    except ImportError:
        pytest.fail("the HF logits-match check needs `accelerate` installed (transformers loads GGUF only with it)")
    from transformers import AutoModelForCausalLM

    from specdecode import registry

    path = without_vocabulary(registry.resolve(name), folder / "model.gguf")
    # transformers parses the file's header twice (its config, then its weights) with gguf's reader, and builds
    # gguf's tensor-name table once per module of the model: both are read-only, the second and later ones reused.
    with mock.patch.object(gguf, "GGUFReader", functools.cache(gguf.GGUFReader)), \
            mock.patch.object(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map)):
        return AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def smollm2_hf(tmp_path_factory):
    return gguf_reference(SMOLLM2, tmp_path_factory.mktemp("smollm2-gguf"))


def test_smollm2_gguf_native_matches_transformers(smollm2, smollm2_hf):
    ids = smollm2.tokenizer.encode(PROMPT)
    assert 20 <= len(ids) <= 40
    compare(native_logits(smollm2.model, ids), hf_logits(smollm2_hf, ids), "smollm2-135m GGUF (llama)")


@pytest.fixture(scope="module")
def smollm2_folder(smollm2, smollm2_hf, tmp_path_factory):
    folder = tmp_path_factory.mktemp("smollm2-hf")
    # a model loaded from GGUF refuses save_pretrained ("quantized with gguf"): copy it into a plain one
    config = smollm2_hf.config
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    plain = type(smollm2_hf)(config)
    plain.load_state_dict(smollm2_hf.state_dict())
    plain.save_pretrained(str(folder))
    smollm2.tokenizer.hf.save_pretrained(str(folder))
    return folder


def test_smollm2_hf_folder_native_and_adapter_match_transformers(smollm2, smollm2_hf, smollm2_folder):
    ids = smollm2.tokenizer.encode(PROMPT)
    expected = hf_logits(smollm2_hf, ids)

    native = load_model(str(smollm2_folder), device="cpu", max_context=256)
    assert native.backend == "native" and native.model.config.arch == "llama"
    assert native.tokenizer.fingerprint() == smollm2.tokenizer.fingerprint()
    compare(native_logits(native.model, ids), expected, "smollm2 HF folder, native")

    adapter = load_model(str(smollm2_folder), device="cpu", max_context=256, backend="transformers")
    assert adapter.backend == "transformers" and isinstance(adapter.model, HFAdapter)
    assert adapter.vocab_size == 49152
    compare(native_logits(adapter.model, ids), expected, "smollm2 HF folder, transformers adapter")


# --------------------------------------------------------------------------- transformers adapter
@pytest.fixture(scope="module")
def tiny_folder(smollm2, tmp_path_factory):
    """A tiny random llama HF folder that shares smollm2's tokenizer (so smollm2 can draft for it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama-hf")
    torch.manual_seed(71)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0.0, 0.2)
    model.save_pretrained(str(folder))
    smollm2.tokenizer.hf.save_pretrained(str(folder))
    return folder, model.eval()


def test_tiny_folder_through_load_model_native_and_adapter(tiny_folder):
    folder, hf = tiny_folder
    ids = [1, 200, 3000, 45, 49151, 7, 8, 9, 1000, 20000]
    expected = hf_logits(hf, ids)
    native = load_model(str(folder), device="cpu", max_context=128)
    assert native.backend == "native"
    compare(native_logits(native.model, ids), expected, "tiny HF folder, native")
    adapter = load_model(str(folder), device="cpu", max_context=128, backend="transformers")
    assert adapter.backend == "transformers" and isinstance(adapter.model, HFAdapter)
    compare(native_logits(adapter.model, ids), expected, "tiny HF folder, transformers adapter")


def test_transformers_adapter_cache_rolls_back(tiny_folder):
    """HFCache.truncate must work like KVCache.truncate (transformers' DynamicCache.crop underneath)."""
    folder, _ = tiny_folder
    adapter = load_model(str(folder), device="cpu", max_context=128, backend="transformers").model
    ids = [5, 17, 300, 4000, 2, 99, 123, 77, 6, 1, 2, 3]
    cache = adapter.new_cache()
    block = adapter(torch.tensor(ids), cache)
    assert cache.length == 12
    cache.truncate(8)
    assert cache.length == 8
    again = adapter(torch.tensor(ids[8:]), cache)
    torch.testing.assert_close(again, block[8:], rtol=1e-4, atol=1e-4)
    with pytest.raises(NotImplementedError):
        adapter(torch.tensor(ids[:2]), adapter.new_cache(), attn_mask=torch.ones(2, 2, dtype=torch.bool))


def test_speculation_through_the_transformers_adapter_is_lossless(tiny_folder):
    folder, _ = tiny_folder
    target = load_model(str(folder), device="cpu", max_context=128, backend="transformers")
    draft = load_model(str(folder), device="cpu", max_context=128)  # the same weights, natively
    engine = Engine(target, draft, max_context=128, check_invariants=True)
    ids = [5, 17, 300, 4000, 2, 99, 123, 77, 6, 5, 17, 300]
    plain = engine.generate(ids, drafter="none", max_new_tokens=16)
    assert plain.token_ids == reference_greedy(target.model, ids, 16)
    for drafter, k in (("lookup", 3), ("draft", 4)):
        assert engine.generate(ids, drafter=drafter, k=k, max_new_tokens=16).token_ids == plain.token_ids
    other = [9, 8, 7, 6, 5]  # a new prompt: the engine rolls its cache back to the common prefix
    assert engine.generate(other, drafter="none", max_new_tokens=8).token_ids == reference_greedy(target.model, other, 8)


# --------------------------------------------------------------------------- real GGUF: qwen 0.5b (qwen2)
@pytest.mark.slow
def test_qwen_05b_gguf_native_matches_transformers(tmp_path):
    native = load_model(QWEN_05B, device="cpu", max_context=256)
    assert native.model.config.arch == "qwen2" and native.model.config.qkv_bias
    ids = native.tokenizer.encode(PROMPT)
    hf = gguf_reference(QWEN_05B, tmp_path)
    compare(native_logits(native.model, ids), hf_logits(hf, ids), "qwen2.5-coder-0.5b GGUF (qwen2)")
