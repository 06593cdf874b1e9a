"""Loading: GGUF files (tiny ones written here, and the real smollm2), HF folders, and clear errors."""
import dataclasses
import json
import multiprocessing
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from specdecode.errors import ModelError
from specdecode.models.config import SUPPORTED_ARCHS
from specdecode.models.gguf_loader import load_gguf_model
from specdecode.models.loader import GGUF_TOKENIZER_CLASSES, load_model
from specdecode.models.transformer import Transformer
from testlib import QWEN_05B, SMOLLM2, make_tiny_model


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """Conversions (and anything else cached) go to a temporary folder, never the real cache."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECDECODE_CACHE", str(root))
    return root


def smollm2_file():
    from specdecode import registry

    return registry.resolve(SMOLLM2)


# --------------------------------------------------------------------------- tiny GGUF files
def llama_cpp_permute(weights: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to llama-family Q/K rows."""
    return weights.reshape(n_heads, 2, weights.shape[0] // n_heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def add_byte_tokenizer(writer, vocab_size: int) -> None:
    """A byte-level BPE vocabulary without merges (token i spells byte i; vocab_size <= 256): enough for
    transformers to build the tokenizer a conversion saves, so a tiny file loads like a real one."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([spelling[b] for b in range(vocab_size)])
    writer.add_token_types([1] * vocab_size)
    writer.add_token_scores([0.0] * vocab_size)
    writer.add_eos_token_id(vocab_size - 1)


def add_rope_scaling(writer, c) -> None:
    """The model's rope scaling as llama.cpp's convert_hf_to_gguf.py writes it: llama 3's as a rope_freqs tensor of
    per-frequency divisors (computed here its way, not by specdecode's code), linear and yarn as keys."""
    import gguf
    import math

    s = c.rope_scaling
    if s.kind == "llama3":
        divisors = []
        for freq in 1.0 / (c.rope_theta ** (np.arange(0, c.head_dim, 2, dtype=np.float32) / c.head_dim)):
            wavelen = 2 * math.pi / freq
            if wavelen < s.original_context / s.high_freq_factor:
                divisors.append(1)
            elif wavelen > s.original_context / s.low_freq_factor:
                divisors.append(s.factor)
            else:
                smooth = (s.original_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
                divisors.append(1 / ((1 - smooth) / s.factor + smooth))
        writer.add_tensor("rope_freqs.weight", np.array(divisors, dtype=np.float32))
    elif s.kind in ("linear", "yarn"):
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR if s.kind == "linear" else gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(s.factor)
        if s.kind == "yarn":
            writer.add_rope_scaling_orig_ctx_len(s.original_context)


def write_gguf(path, model: Transformer, arch_name=None, skip=(), quant=None, tokenizer=False, extra_kv=None):
    """quant: a gguf.GGMLQuantizationType for every matrix (norms and biases stay float32).
    tokenizer: add a byte-level vocabulary (the tiny models' 256 tokens) so that load_model can convert it.
    extra_kv: called with the writer to add more keys."""
    import gguf

    c = model.config
    arch = arch_name or c.arch
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(c.context_length)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.n_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.n_heads)
    writer.add_head_count_kv(c.n_kv_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_freq_base(c.rope_theta)
    add_rope_scaling(writer, c)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    if tokenizer:
        add_byte_tokenizer(writer, c.vocab_size)
    if extra_kv:
        extra_kv(writer)

    def add(name, tensor):
        if name in skip:
            return
        array = np.ascontiguousarray(tensor.detach().float().numpy())
        if quant is not None and array.ndim == 2:
            writer.add_tensor(name, gguf.quants.quantize(array, quant), raw_dtype=quant)
        else:
            writer.add_tensor(name, array)

    def qk(tensor, heads):
        array = tensor.detach().float().numpy()
        return torch.from_numpy(llama_cpp_permute(array, heads) if c.arch == "llama" else array)

    add("token_embd.weight", model.embed)
    add("output_norm.weight", model.final_norm)
    if model.lm_head is not None:
        add("output.weight", model.lm_head)
    for i, layer in enumerate(model.layers):
        p = f"blk.{i}."
        q, k, v = layer.qkv.split((c.q_size, c.kv_size, c.kv_size))
        add(p + "attn_norm.weight", layer.attn_norm)
        add(p + "ffn_norm.weight", layer.mlp_norm)
        if c.architecture.fused_qkv:  # Phi-3, as llama.cpp's converter writes it: one attn_qkv, one ffn_up (gate|up)
            add(p + "attn_qkv.weight", layer.qkv)
            add(p + "attn_output.weight", layer.out_proj)
            add(p + "ffn_up.weight", layer.gate_up)
            add(p + "ffn_down.weight", layer.down)
            continue
        add(p + "attn_q.weight", qk(q, c.n_heads))
        add(p + "attn_k.weight", qk(k, c.n_kv_heads))
        add(p + "attn_v.weight", v)
        if layer.qkv_bias is not None:
            qb, kb, vb = layer.qkv_bias.split((c.q_size, c.kv_size, c.kv_size))
            add(p + "attn_q.bias", qb)
            add(p + "attn_k.bias", kb)
            add(p + "attn_v.bias", vb)
        if layer.q_norm is not None:
            add(p + "attn_q_norm.weight", layer.q_norm)
            add(p + "attn_k_norm.weight", layer.k_norm)
        add(p + "attn_output.weight", layer.out_proj)
        gate, up = layer.gate_up.chunk(2)
        add(p + "ffn_gate.weight", gate)
        add(p + "ffn_up.weight", up)
        add(p + "ffn_down.weight", layer.down)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    "config",
    [dict(arch="llama"), dict(arch="llama", tie_embeddings=True, n_kv_heads=4), dict(arch="qwen2"),
     dict(arch="qwen2", tie_embeddings=True), dict(arch="qwen3", head_dim=32)],
    ids=["llama", "llama-tied-mha", "qwen2", "qwen2-tied", "qwen3-wide-heads"],
)
def test_gguf_round_trip_restores_the_native_layout(tmp_path, config):
    """Written like llama.cpp writes it (Q/K rows permuted for llama), read back to the same model."""
    source = make_tiny_model(seed=60, **config)
    path = write_gguf(tmp_path / "tiny.gguf", source)
    loaded = load_gguf_model(path, "cpu", torch.float32, None)
    # GGUF stores the epsilon as float32: equal once rounded the same way
    assert dataclasses.replace(loaded.config, rms_norm_eps=1e-6) == source.config
    assert loaded.config.rms_norm_eps == pytest.approx(1e-6, rel=1e-6)
    for (name, a), (_, b) in zip(source.named_parameters(), loaded.named_parameters()):
        assert torch.equal(a, b), name
    tokens = torch.tensor([1, 50, 7, 200, 3])
    assert torch.equal(source(tokens, source.new_cache()), loaded(tokens, loaded.new_cache()))


@pytest.mark.parametrize(
    "config",
    [dict(arch="llama"), dict(arch="llama", tie_embeddings=True, n_kv_heads=4), dict(arch="qwen2"),
     dict(arch="qwen2", tie_embeddings=True)],
    ids=["llama", "llama-tied-mha", "qwen2", "qwen2-tied"],
)
@pytest.mark.parametrize("quant", ["Q8_0", "Q4_1"])
def test_gguf_blocks_reproduce_the_float32_model_bit_for_bit(tmp_path, config, quant, monkeypatch):
    """A quantized GGUF: the model reading its blocks (llama Q/K rows permuted like the float32 rows,
    tied heads reading the embedding's blocks) gives exactly the logits of its dequantized float32 weights."""
    import gguf

    from specdecode import kernels
    from specdecode.models.gguf_loader import attach_gguf_blocks, read_gguf_blocks

    if kernels.load_kernel() is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    source = make_tiny_model(seed=62, intermediate_size=160, **config)
    path = write_gguf(tmp_path / "tiny-q.gguf", source, quant=getattr(gguf.GGMLQuantizationType, quant))
    model = load_gguf_model(path, "cpu", torch.float32, None)
    blocks = read_gguf_blocks(path, model.config)
    assert attach_gguf_blocks(model, blocks) == 4 * model.config.n_layers + 1
    assert isinstance(model.layers[1].qkv, kernels.GGUFWeight) and isinstance(model.output_weight(), kernels.GGUFWeight)
    tokens = torch.randint(0, model.config.vocab_size, (40,), generator=torch.Generator().manual_seed(5))

    def run(read_blocks):
        monkeypatch.setattr(kernels.dispatch, "READ_GGUF_BLOCKS", read_blocks)
        cache = model.new_cache()
        outputs = [model(tokens[:20], cache)]  # prompt-sized: the float32 copy either way
        for start, size in ((20, 1), (21, 5), (26, 1), (27, 13)):
            outputs.append(model(tokens[start : start + size], cache))
        return outputs

    for with_blocks, float32_only in zip(run(True), run(False)):
        assert torch.equal(with_blocks, float32_only)
    # the float32 copy is the file's dequantized blocks: within one quantization step of the source weights
    step = float(source.layers[0].down.abs().max()) / (15 if quant == "Q4_1" else 127)
    torch.testing.assert_close(model.layers[0].down.dense, source.layers[0].down, rtol=0, atol=step)


def test_gguf_of_an_unsupported_architecture(tmp_path, private_cache):
    path = write_gguf(tmp_path / "gpt2.gguf", make_tiny_model(seed=61), arch_name="gpt2", tokenizer=True)
    supported = r"unsupported architecture 'gpt2' \(the native decoder covers " + re.escape(", ".join(SUPPORTED_ARCHS)) + r"\)"
    with pytest.raises(ModelError, match=supported):
        load_gguf_model(path, "cpu", torch.float32, None)
    with pytest.raises(ModelError, match=supported):  # what the CLI prints as one line, converting nothing
        load_model(str(path), device="cpu")


def test_gguf_missing_a_tensor(tmp_path):
    path = write_gguf(tmp_path / "holey.gguf", make_tiny_model(seed=62), skip={"blk.1.ffn_down.weight"})
    with pytest.raises(ModelError, match="blk.1.ffn_down.weight"):
        load_gguf_model(path, "cpu", torch.float32, None)


def test_gguf_without_tokenizer_metadata_is_a_model_error(tmp_path, private_cache):
    path = write_gguf(tmp_path / "notok.gguf", make_tiny_model(seed=63))
    with pytest.raises(ModelError, match="tokenizer"):
        load_model(str(path), device="cpu")
    converted = private_cache / "converted"
    assert not converted.exists() or not any(p.name.startswith("notok") for p in converted.iterdir())


# --------------------------------------------------------------------------- the conversion cache
def tiny_gguf(tmp_path, name="tiny.gguf", seed=70):
    """A tiny llama GGUF with a tokenizer: load_model converts and loads it like a real file."""
    model = make_tiny_model(seed=seed)
    return write_gguf(tmp_path / name, model, tokenizer=True), model


def assert_valid_conversion(path, model):
    """The file loads (from its converted folder) as the model it was written from."""
    loaded = load_model(str(path), device="cpu", max_context=64)
    tokens = torch.tensor([1, 50, 7, 200, 3])
    assert torch.equal(loaded.model(tokens, loaded.model.new_cache(8)), model(tokens, model.new_cache(8)))
    return loaded


def test_a_tiny_gguf_with_a_tokenizer_converts_and_loads(tmp_path, private_cache):
    path, model = tiny_gguf(tmp_path)
    loaded = assert_valid_conversion(path, model)
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("hi there")) == "hi there"
    from specdecode.models.loader import _converted_dir

    config = json.loads((_converted_dir(path) / "tokenizer" / "tokenizer_config.json").read_text())
    assert "added_tokens_decoder" in config  # recorded by the conversion (a faster load of the same tokenizer)


def tokenizer_facts(hf) -> dict:
    """What decides how a tokenizer reads and writes text, as comparable values."""
    text = "<|im_start|>user\ndef f(x):\n    return x  # héllo 世界<|im_end|>\n<|endoftext|>"
    added = {index: (t.content, t.single_word, t.lstrip, t.rstrip, t.normalized, t.special)
             for index, t in hf.added_tokens_decoder.items()}
    return {"class": type(hf).__name__, "backend": hf.backend_tokenizer.to_str(), "added": added,
            "special": (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id, hf.unk_token_id, hf.all_special_ids),
            "template": hf.chat_template, "ids": hf.encode(text, add_special_tokens=True), "length": len(hf)}


@pytest.mark.parametrize("name", [SMOLLM2, QWEN_05B])
def test_added_tokens_recorded_in_the_config_load_the_same_tokenizer(name, tmp_path):
    """A conversion copies the tokenizer's added tokens into tokenizer_config.json, where transformers 5 finds them
    without parsing tokenizer.json once more; the tokenizer loaded is the one loaded without that record."""
    from specdecode import registry
    from specdecode.models.loader import _load_hf_tokenizer, _record_added_tokens, convert_gguf

    saved = convert_gguf(registry.pull(name), quiet=True) / "tokenizer"
    bare, recorded = tmp_path / "bare", tmp_path / "recorded"
    for folder in (bare, recorded):
        shutil.copytree(saved, folder)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("added_tokens_decoder", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    (recorded / "tokenizer_config.json").write_text(json.dumps(config))
    _record_added_tokens(recorded)
    assert json.loads((recorded / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    assert tokenizer_facts(_load_hf_tokenizer(recorded)) == tokenizer_facts(_load_hf_tokenizer(bare))


@pytest.mark.parametrize("arch", sorted(GGUF_TOKENIZER_CLASSES))
def test_a_gguf_tokenizer_of_a_known_architecture_is_the_one_autotokenizer_finds(arch, tmp_path):
    """A conversion loads the tokenizer class AutoTokenizer picks for a known architecture (GGUF_TOKENIZER_CLASSES)
    without letting it parse the file's whole metadata to find it: the saved tokenizer is the same, file for file."""
    from transformers import AutoTokenizer

    from specdecode.models.loader import _load_hf_tokenizer

    path = write_gguf(tmp_path / f"{arch}.gguf", make_tiny_model(seed=71, arch=arch), tokenizer=True)
    named = _load_hf_tokenizer(path.parent, path.name, arch)
    found = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    named.save_pretrained(str(tmp_path / "named"))
    found.save_pretrained(str(tmp_path / "found"))
    files = sorted(p.name for p in (tmp_path / "found").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "named").iterdir()) and "tokenizer.json" in files
    for name in files:
        assert (tmp_path / "named" / name).read_bytes() == (tmp_path / "found" / name).read_bytes(), name


def _convert_in_child(path: str, barrier, results) -> None:
    """In a spawned process: wait for the other one, then convert `path` as load_model does, slowly enough
    that the two overlap; report the folder and whether this process dequantized the file itself."""
    from specdecode.models import gguf_loader, loader

    dequantized = []
    real = gguf_loader.load_gguf_model

    def slow_load(*args, **kwargs):
        dequantized.append(True)
        model = real(*args, **kwargs)
        time.sleep(1.5)
        return model

    gguf_loader.load_gguf_model = slow_load
    try:
        barrier.wait(timeout=120)
        folder = loader.convert_gguf(Path(path), quiet=True)
        results.put((str(folder), len(dequantized), None))
    except Exception as exc:  # reported, not raised: the parent asserts on it
        results.put((None, len(dequantized), f"{type(exc).__name__}: {exc}"))


def test_two_processes_converting_the_same_file_at_once_share_one_conversion(tmp_path, private_cache):
    """`serve --replicas 2` on a fresh machine: both replicas convert the same file at the same moment. One
    converts; the other waits for it (an flock per converted folder) and reuses its folder; both end valid."""
    path, model = tiny_gguf(tmp_path)
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    children = [context.Process(target=_convert_in_child, args=(str(path), barrier, results)) for _ in range(2)]
    for child in children:
        child.start()
    try:
        reports = [results.get(timeout=300) for _ in children]
    finally:
        for child in children:
            child.join(timeout=60)
    assert [error for _, _, error in reports] == [None, None], reports
    assert reports[0][0] == reports[1][0], reports
    assert sorted(count for _, count, _ in reports) == [0, 1], "both processes converted the file"
    converted = private_cache / "converted"
    assert [p.name for p in converted.iterdir()] == [Path(reports[0][0]).name]  # no temporaries left
    assert_valid_conversion(path, model)


def test_prepare_model_files_converts_before_anything_loads(tmp_path, private_cache):
    """What `serve --replicas` runs once before Serve starts the replicas: the pull and the conversion."""
    from specdecode.build import prepare_model_files
    from specdecode.models.loader import _converted_dir

    path, _ = tiny_gguf(tmp_path)
    assert prepare_model_files({"model": str(path), "draft": "none"}) == [str(path)]
    assert (_converted_dir(path) / "config.json").is_file()


def test_two_files_of_the_same_name_and_size_get_their_own_conversions(tmp_path, private_cache):
    """Two fine-tunes saved as model.gguf in two folders, same size, same second: the cache keyed by file name,
    size and whole-second mtime gave the second one the first one's weights."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, first_model = tiny_gguf(tmp_path / "a", "model.gguf", seed=71)
    second, second_model = tiny_gguf(tmp_path / "b", "model.gguf", seed=72)
    assert first.stat().st_size == second.stat().st_size
    second_time = first.stat().st_mtime_ns // 10**9 * 10**9
    for path in (first, second):
        os.utime(path, ns=(second_time, second_time))
    assert_valid_conversion(first, first_model)
    assert_valid_conversion(second, second_model)


def test_a_file_replaced_within_the_same_second_is_converted_again(tmp_path, private_cache):
    path, old_model = tiny_gguf(tmp_path, seed=73)
    second_time = path.stat().st_mtime_ns // 10**9 * 10**9
    os.utime(path, ns=(second_time, second_time))
    assert_valid_conversion(path, old_model)
    _, new_model = tiny_gguf(tmp_path, seed=74)  # the same name and size, 0.3 s later within that second
    os.utime(path, ns=(second_time + 300_000_000,) * 2)
    assert_valid_conversion(path, new_model)


def fake_registry_file(monkeypatch, cache, tmp_path, sha=None):
    """A registry entry whose cached file is a tiny GGUF (already in the cache: nothing to pull)."""
    import hashlib

    from specdecode import registry
    from specdecode.registry import RegistryEntry

    source, model = tiny_gguf(tmp_path, "tiny-registered.gguf", seed=75)
    cached = cache / "models" / source.name
    cached.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, cached)
    data = cached.read_bytes()
    entry = RegistryEntry("tiny-registered", "test", cached.name, len(data), sha or hashlib.sha256(data).hexdigest(), ())
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    return entry, model


def test_a_registry_file_that_fails_its_sha256_is_refused_when_converted(tmp_path, private_cache, monkeypatch):
    """A cached registry file is taken on its size alone; converting reads it whole, so its sha256 is checked then."""
    entry, _ = fake_registry_file(monkeypatch, private_cache, tmp_path, sha="0" * 64)
    with pytest.raises(ModelError, match="fails its sha256 check for tiny-registered"):
        load_model(entry.name, device="cpu", max_context=64)
    converted = private_cache / "converted"
    assert not any(converted.iterdir()), "a file that failed its check was converted"


def test_a_registry_file_with_the_right_sha256_converts(tmp_path, private_cache, monkeypatch):
    entry, model = fake_registry_file(monkeypatch, private_cache, tmp_path)
    loaded = load_model(entry.name, device="cpu", max_context=64)
    tokens = torch.tensor([1, 50, 7])
    assert torch.equal(loaded.model(tokens, loaded.model.new_cache(8)), model(tokens, model.new_cache(8)))


def no_space(*args, **kwargs):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_while_saving_blocks_leaves_no_temporary(tmp_path, private_cache, monkeypatch):
    """A folder converted by an older version gets its blocks file on first load; a full disk left the partial
    `.gguf_blocks-*.tmp` (GBs for the real target) behind for good."""
    from specdecode.models import loader

    path, _ = tiny_gguf(tmp_path)
    folder = loader.convert_gguf(path, quiet=True)
    (folder / loader.BLOCKS_FILE).unlink()
    config = loader.ModelConfig(**json.loads((folder / "config.json").read_text()))

    def save_half_then_fail(gguf_path, config, target, reader=None):
        target.write_bytes(b"\0" * 4096)
        no_space()

    monkeypatch.setattr(loader, "_save_blocks", save_half_then_fail)
    with pytest.raises(ModelError, match="no space left"):
        loader._read_blocks(path, folder, config)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "tokenizer", "weights.safetensors"]


def test_a_full_disk_while_converting_is_a_model_error_and_leaves_no_temporary(tmp_path, private_cache, monkeypatch):
    import safetensors.torch

    path, _ = tiny_gguf(tmp_path)
    monkeypatch.setattr(safetensors.torch, "save_file", no_space)
    with pytest.raises(ModelError, match="no space left on the device of .*converting tiny.gguf"):
        load_model(str(path), device="cpu")
    assert not any((private_cache / "converted").iterdir())


def _convert_and_hang(path: str) -> None:
    """In a spawned process: convert `path`, stopping for good after the weights are written (to be SIGKILLed)."""
    from specdecode.models import loader

    loader._record_added_tokens = lambda *args: time.sleep(600)
    loader.convert_gguf(Path(path), quiet=True)


def test_a_conversion_killed_midway_leaves_a_temporary_that_the_next_one_removes(tmp_path, private_cache):
    """SIGKILL runs no `finally`: its `.convert*` folder (GBs) stayed for good. The next conversion sees that the
    owner is gone, removes it, and converts (the dead process's flock is gone with it)."""
    path, model = tiny_gguf(tmp_path)
    converted = private_cache / "converted"
    child = multiprocessing.get_context("spawn").Process(target=_convert_and_hang, args=(str(path),))
    child.start()
    try:
        deadline = time.monotonic() + 120
        while not list(converted.glob(".convert*/weights.safetensors")):
            assert child.is_alive() and time.monotonic() < deadline, "the child never started converting"
            time.sleep(0.1)
    finally:
        child.kill()
        child.join(timeout=30)
    assert list(converted.glob(".convert*")), "the killed conversion left no temporary"
    assert_valid_conversion(path, model)
    assert not list(converted.glob(".convert*"))


def test_the_sweep_removes_old_temporaries_and_those_of_dead_owners_only(tmp_path, monkeypatch):
    """Older temporaries carry no owner: an hour untouched makes them stale. One named by a live process stays."""
    import subprocess
    import sys

    from specdecode import cachefiles

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    hour_ago = time.time() - 2 * cachefiles.STALE_AFTER_S
    names = {
        "dead owner": f".convert~{dead.pid}@{cachefiles.PID_SPACE}~abc",
        "live owner, old": cachefiles.temp_prefix(".convert") + "def",
        "other host": ".convert~1@00000000~ghi",
        "old format, old": ".convert-jkl",
        "old format, fresh": ".convert-mno",
        "blocks, dead owner": f".gguf_blocks-v2.safetensors~{dead.pid}@{cachefiles.PID_SPACE}~.tmp",
        "not a temporary": "model-0123456789abcdef",
    }
    for kind, name in names.items():
        if kind.startswith("blocks"):
            (tmp_path / name).write_bytes(b"x")
        else:
            (tmp_path / name).mkdir()
            (tmp_path / name / "weights.safetensors").write_bytes(b"x")
    for kind in ("live owner, old", "old format, old", "not a temporary"):
        for target in [tmp_path / names[kind], *(tmp_path / names[kind]).iterdir()]:
            os.utime(target, (hour_ago, hour_ago))
    removed = {p.name for p in cachefiles.sweep(tmp_path)}
    # an hour untouched is stale whoever owns it (a live process's temporary is written to continuously)
    assert removed == {names[k] for k in ("dead owner", "live owner, old", "old format, old", "blocks, dead owner")}
    assert {p.name for p in tmp_path.iterdir()} == {names[k] for k in ("other host", "old format, fresh", "not a temporary")}


# --------------------------------------------------------------------------- corrupt files
@pytest.mark.parametrize("keep_bytes", [1_000_000, 60_000_000], ids=["1MB", "60MB-metadata-intact"])
def test_truncated_gguf_is_a_model_error(tmp_path, private_cache, keep_bytes):
    truncated = tmp_path / "SmolLM2-truncated.gguf"
    with open(smollm2_file(), "rb") as src, open(truncated, "wb") as dst:
        dst.write(src.read(keep_bytes))
    with pytest.raises(ModelError, match="SmolLM2-truncated.gguf"):
        load_model(str(truncated), device="cpu")
    converted = private_cache / "converted"
    assert not converted.exists() or not any(converted.iterdir()), "a failed load left a converted folder"


@pytest.mark.parametrize("content", [b"", b"hello, I am not a model\n", b"PK\x03\x04" + b"\x00" * 100])
def test_non_gguf_file_is_a_model_error(tmp_path, private_cache, content):
    path = tmp_path / "fake.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelError, match="not a GGUF file"):
        load_model(str(path), device="cpu")


def test_missing_file_is_a_model_error():
    with pytest.raises(ModelError, match="not found"):
        load_model("/nonexistent/dir/model.gguf", device="cpu")


def test_unknown_name_is_a_model_error():
    with pytest.raises(ModelError, match="unknown model"):
        load_model("gpt-17", device="cpu")


def test_unknown_dtype_is_a_model_error():
    with pytest.raises(ModelError, match="dtype"):
        load_model(SMOLLM2, dtype="int3")


def test_transformers_backend_needs_a_folder():
    with pytest.raises(ModelError, match="folder"):
        load_model(SMOLLM2, backend="transformers", device="cpu")


# --------------------------------------------------------------------------- HF folders
def test_folder_without_config_is_a_model_error(tmp_path):
    (tmp_path / "weights.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match="config.json"):
        load_model(str(tmp_path), device="cpu")


def test_folder_with_broken_config_is_a_model_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="config.json"):
        load_model(str(tmp_path), device="cpu")


@pytest.fixture
def folder_with_tokenizer(tmp_path, smollm2):
    smollm2.tokenizer.hf.save_pretrained(str(tmp_path))
    return tmp_path


def test_folder_of_unsupported_architecture_with_native_backend(folder_with_tokenizer):
    (folder_with_tokenizer / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 49152}))
    with pytest.raises(ModelError, match="unsupported architecture 'gpt2'"):
        load_model(str(folder_with_tokenizer), device="cpu", backend="native")


def test_folder_without_weights_is_a_model_error(folder_with_tokenizer):
    config = dict(model_type="llama", vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    (folder_with_tokenizer / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="safetensors"):
        load_model(str(folder_with_tokenizer), device="cpu")


def test_folder_with_corrupt_safetensors_is_a_model_error(folder_with_tokenizer):
    config = dict(model_type="llama", vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    (folder_with_tokenizer / "config.json").write_text(json.dumps(config))
    (folder_with_tokenizer / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage")
    with pytest.raises(ModelError, match="model.safetensors"):
        load_model(str(folder_with_tokenizer), device="cpu")


# --------------------------------------------------------------------------- the real tiny model
def test_smollm2_loads_natively(smollm2):
    assert smollm2.backend == "native" and smollm2.dtype == "float32"
    config = smollm2.model.config
    assert config.arch == "llama" and config.vocab_size == 49152 and config.tie_embeddings and not config.qkv_bias
    assert smollm2.vocab_size == smollm2.tokenizer.vocab_size == 49152
    assert smollm2.tokenizer.eos_ids and smollm2.tokenizer.has_chat_template
    assert smollm2.model.max_positions == 1024  # capped by max_context
    text = "Hello, world! def f(x): return x"
    assert smollm2.tokenizer.decode(smollm2.tokenizer.encode(text)) == text


def test_smollm2_in_bfloat16_is_close_to_float32(smollm2):
    low = load_model(SMOLLM2, device="cpu", dtype="bfloat16", max_context=64)
    assert low.model.layers[0].qkv.dtype == torch.bfloat16
    assert low.model.lm_head is not None and low.model.lm_head.dtype == torch.bfloat16  # its own output copy
    tokens = torch.tensor(smollm2.tokenizer.encode("The quick brown fox jumps over the lazy"))
    high_logits = smollm2.model(tokens, smollm2.model.new_cache(64))
    low_logits = low.model(tokens, low.model.new_cache(64))
    # bfloat16 weights move logits a little but keep the model recognisably the same
    agree = (high_logits.argmax(-1) == low_logits.argmax(-1)).float().mean().item()
    assert agree >= 0.7, agree


def test_smollm2_in_int8_reads_its_gguf_blocks_and_is_close_to_float32(smollm2):
    from specdecode.kernels import QuantWeight

    low = load_model(SMOLLM2, device="cpu", dtype="int8", max_context=64)
    assert isinstance(low.model.layers[0].qkv, QuantWeight) and low.model.layers[0].qkv.types == [3, 3, 3]  # Q4_1
    assert isinstance(low.model.output_weight(), QuantWeight) and low.model.output_weight().types == [8]  # tied Q8_0
    assert low.dtype == "int8" and low.model.embed.dtype == torch.float32  # lookups and the cache stay float32
    tokens = torch.tensor(smollm2.tokenizer.encode("The quick brown fox jumps over the lazy"))
    high_logits = smollm2.model(tokens, smollm2.model.new_cache(64))
    low_logits = low.model(tokens, low.model.new_cache(64))
    agree = (high_logits.argmax(-1) == low_logits.argmax(-1)).float().mean().item()
    assert agree >= 0.7, agree


def test_an_instruction_set_the_cpu_lacks_is_a_model_error_at_load(monkeypatch):
    """SPECDECODE_ISA=amx on a CPU without AMX (as the kernel reports its paths): refused by load_model, not
    loaded to fail in every product."""
    from specdecode import kernels

    if kernels.load_kernel() is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    monkeypatch.setattr(kernels.options, "OPTIONS", dataclasses.replace(kernels.options.OPTIONS, isa="amx"))
    monkeypatch.setattr(kernels.weights, "quant_isa_paths", lambda: ["avx2"], raising=False)
    with pytest.raises(ModelError, match="SPECDECODE_ISA=amx: this CPU lacks"):
        load_model(SMOLLM2, device="cpu", dtype="int8", max_context=64)
    monkeypatch.setattr(kernels.options, "OPTIONS", dataclasses.replace(kernels.options.OPTIONS, isa="avx-512"))
    with pytest.raises(ModelError, match="names no instruction-set path"):
        load_model(SMOLLM2, device="cpu", dtype="int8", max_context=64)


def test_an_unknown_dtype_is_a_clear_error():
    with pytest.raises(ModelError, match="unknown dtype 'int3'.*int8"):
        load_model(SMOLLM2, device="cpu", dtype="int3")


def test_a_gguf_path_and_its_registry_name_load_the_same_model(smollm2, tmp_path):
    by_path = load_model(str(smollm2_file()), device="cpu", max_context=64)
    assert by_path.name == smollm2_file().name and smollm2.name == SMOLLM2
    tokens = torch.tensor([1, 2, 3, 4])
    assert torch.equal(by_path.model(tokens, by_path.model.new_cache(8)), smollm2.model(tokens, smollm2.model.new_cache(8)))
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_the_real_tiny_model_decodes_from_its_gguf_blocks_with_float32_outputs(smollm2, monkeypatch):
    """smollm2 (Q4_1 layers, a tied Q8_0 head, llama Q/K rows) reads its blocks for decode steps and
    verify blocks, and every logit equals the float32 weights' own."""
    from specdecode import kernels

    if kernels.load_kernel() is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    model = smollm2.model
    assert all(isinstance(layer.qkv, kernels.GGUFWeight) and isinstance(layer.down, kernels.GGUFWeight) for layer in model.layers)
    assert isinstance(model.output_weight(), kernels.GGUFWeight) and model.output_weight().types == [8]
    tokens = torch.tensor(smollm2.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n" * 3))

    def run(read_blocks):
        monkeypatch.setattr(kernels.dispatch, "READ_GGUF_BLOCKS", read_blocks)
        cache = model.new_cache(256)
        outputs = [model(tokens[:30], cache, logits="last")]
        for start, size in ((30, 1), (31, 16), (47, 4)):
            outputs.append(model(tokens[start : start + size], cache))
        return outputs

    for with_blocks, float32_only in zip(run(True), run(False)):
        assert torch.equal(with_blocks, float32_only)


# --------------------------------------------------------------------------- unsupported files, as a user meets them
def _unsupported_files(folder):
    """(file, what the one error line must say) for an unknown architecture, longrope and blocks int8 cannot read."""
    import numpy as np

    def longrope(writer):
        writer.add_tensor("rope_factors_long.weight", np.full(8, 2.0, dtype=np.float32))

    return [
        (write_gguf(folder / "gpt2.gguf", make_tiny_model(seed=61), arch_name="gpt2", tokenizer=True),
         r"unsupported architecture 'gpt2' \(the native decoder covers " + re.escape(", ".join(SUPPORTED_ARCHS))),
        (write_gguf(folder / "phi3-longrope.gguf", make_tiny_model(seed=62, arch="phi3", n_kv_heads=4), tokenizer=True,
                    extra_kv=longrope), r"unsupported rope scaling 'longrope'.*covers llama3, linear and yarn"),
        (write_gguf(folder / "f32.gguf", make_tiny_model(seed=63), tokenizer=True),
         r"9 matrices hold blocks the int8 kernel does not read \(15 F32 tensors; it reads Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,"
         r" Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS\); run --precision float32 .* or --precision q8_0"),
    ]


def test_generate_on_an_unsupported_file_prints_one_line_naming_what_is_supported(cli, tmp_path):
    from specdecode import kernels

    env = {"SPECDECODE_CACHE": str(tmp_path / "cache")}  # conversions go there
    for path, expected in _unsupported_files(tmp_path):
        if "int8 kernel" in expected and kernels.load_kernel() is None:
            continue
        result = cli("generate", "hi", "--model", str(path), "--draft", "none", "--max-new-tokens", "2", env=env)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode == 2 and "Traceback" not in result.stderr and len(errors) == 1, result.stderr
        assert re.search(expected, errors[0]), (path.name, result.stderr)


def test_an_int8_first_run_dequantizes_no_matrix_the_kernel_reads_and_float32_gets_them_later(tmp_path, monkeypatch):
    """Converting dequantized every matrix to float32 (7.1 GB and ~45 s for the 1.5B target), which the default int8
    path never reads. Now the conversion leaves the kernel-readable matrices to their blocks; the first float32 load
    dequantizes them once into their own file, and its model equals the one made straight from the GGUF file."""
    from safetensors import safe_open

    from specdecode.models.loader import MATRICES_FILE, _converted_dir

    from specdecode import kernels

    if kernels.load_kernel() is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    path = smollm2_file()  # the real cache's file, converted in a private cache
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    int8 = load_model(str(path), device="cpu", dtype="int8", max_context=64)
    folder = _converted_dir(path)
    with safe_open(str(folder / "weights.safetensors"), framework="pt") as f:
        assert not any(".qkv" in name or ".down" in name for name in f.keys())
    assert not (folder / MATRICES_FILE).exists()
    float32 = load_model(str(path), device="cpu", dtype="float32", max_context=64)
    assert (folder / MATRICES_FILE).is_file()
    direct = load_gguf_model(path, "cpu", torch.float32, 64)
    with safe_open(str(folder / MATRICES_FILE), framework="pt") as f:
        assert f.keys() and all(torch.equal(f.get_tensor(name), direct.get_parameter(name)) for name in f.keys())
    tokens = torch.tensor([1, 50, 7, 200, 3])
    assert torch.equal(float32.model(tokens, float32.model.new_cache(8)), direct(tokens, direct.new_cache(8)))
    assert int8.model(tokens, int8.model.new_cache(8)).shape == (5, direct.config.vocab_size)
