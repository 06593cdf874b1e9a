"""The int8 kernel (kernels/quant_dot.cpp) on blocks that llama.cpp's own quantizer made: Q5_K, Q3_K, Q2_K, IQ4_NL,
IQ4_XS and Q5_1 (the fallback of Q5_K for rows that are not a multiple of 256).

A one-layer float32 GGUF with heavy-tailed weights is quantized by `llama-quantize --pure` to each type (skipped, with
the reason, where the binary is absent: scripts/build_llamacpp.sh builds it). On those real blocks, on every
instruction-set path of this CPU:
(a) every row of a block of 1..16 rows is bitwise the same row computed alone, and every path gives the AVX2 bits;
(b) the result equals gguf-py's reference dequantization (gguf.quants.dequantize) times the int8-rounded activations,
    within float32 rounding of the scales: |y - ref| <= 1e-5 * max|ref| (a wrong nibble, bit, scale, min or table
    entry moves the result by orders of magnitude more).
Broken twins show each check can fail: a row summed in another order for (a); for (b) blocks with one scale, min,
high bit or index changed, and a reference whose IQ4 table has one entry off by one.
"""
import os
import subprocess

import numpy as np
import pytest
import torch

from specdecode import registry
from test_quant_dot import assert_a_broken_row_is_caught, isa_paths, quantized_activations, run

# Our type -> llama-quantize's name for a file of that type (with --pure every matrix gets the type itself).
QUANTIZE_AS = {"Q5_K": "Q5_K_M", "Q3_K": "Q3_K_M", "Q2_K": "Q2_K", "IQ4_NL": "IQ4_NL", "IQ4_XS": "IQ4_XS", "Q5_1": "Q5_1"}
EMBED, FF = 512, 768  # ffn_down: 512 rows of 768 (three 256-weight blocks a row), ffn_gate: 768 rows of 512


@pytest.fixture(scope="module")
def kernel():
    from specdecode import kernels

    k = kernels.load_kernel()
    if k is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    return k


def llama_quantize() -> str:
    folder = os.environ.get("LLAMACPP_BIN") or str(registry.cache_dir() / "llama.cpp" / "bin")
    path = os.path.join(folder, "llama-quantize")
    if not os.access(path, os.X_OK):
        pytest.skip(f"llama.cpp's llama-quantize is not built ({path}): run scripts/build_llamacpp.sh")
    return path


def write_float32_model(path) -> None:
    """A one-layer llama GGUF, float32, with Student-t weights (heavier tails than a Gaussian, as trained weights)."""
    import gguf

    rng = np.random.default_rng(37)
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("context_length", 128), ("embedding_length", EMBED), ("block_count", 1),
                       ("feed_forward_length", FF), ("attention.head_count", 8), ("attention.head_count_kv", 8)):
        getattr(w, f"add_{key.replace('attention.', '').replace('.', '_')}")(value)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(256)
    shapes = {"token_embd.weight": (256, EMBED), "output.weight": (256, EMBED), "blk.0.attn_q.weight": (EMBED, EMBED),
              "blk.0.attn_k.weight": (EMBED, EMBED), "blk.0.attn_v.weight": (EMBED, EMBED),
              "blk.0.attn_output.weight": (EMBED, EMBED), "blk.0.ffn_gate.weight": (FF, EMBED),
              "blk.0.ffn_up.weight": (FF, EMBED), "blk.0.ffn_down.weight": (EMBED, FF)}
    for name, shape in shapes.items():
        w.add_tensor(name, (rng.standard_t(5, size=shape) * 0.02).astype(np.float32))
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        w.add_tensor(name, np.ones(EMBED, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """name -> {tensor name: (ggml type, [rows, bytes] uint8)} of the file llama-quantize made for that type."""
    import gguf

    binary = llama_quantize()
    folder = tmp_path_factory.mktemp("llamacpp-quants")
    source = folder / "f32.gguf"
    write_float32_model(source)
    files = {}
    for name, ftype in QUANTIZE_AS.items():
        out = folder / f"{name}.gguf"
        done = subprocess.run([binary, "--pure", str(source), str(out), ftype], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        reader = gguf.GGUFReader(str(out))
        files[name] = {t.name: (int(t.tensor_type), np.array(t.data, dtype=np.uint8).reshape(t.data.shape[0], -1))
                       for t in reader.tensors if t.name.endswith(("ffn_down.weight", "ffn_gate.weight"))}
    return files


def real_parts(quantized, name: str, tensor: str = "blk.0.ffn_down.weight", rows: int = 70):
    """The first `rows` rows of one matrix of that type's file as a kernel part, and their gguf-py dequantization."""
    import gguf

    qtype, blocks = quantized[name][tensor]
    assert gguf.GGMLQuantizationType(qtype).name == name, "llama-quantize --pure gave another type"
    blocks = np.ascontiguousarray(blocks[:rows])
    return [(qtype, torch.from_numpy(blocks))], gguf.quants.dequantize(blocks, qtype).astype(np.float64)


def close_to_reference(y: torch.Tensor, x: torch.Tensor, dense: np.ndarray, name: str) -> bool:
    """(b): y within 1e-5 * max|ref| of the reference weights times the kernel's int8 rounding of x."""
    import gguf

    block = 256 if gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]][0] == 256 else 32
    reference = quantized_activations(x.numpy(), block) @ dense.T
    return bool(np.abs(y.numpy() - reference).max() <= 1e-5 * np.abs(reference).max())


def activations(rows: int, cols: int, seed: int = 3) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 2


@pytest.mark.parametrize("name", QUANTIZE_AS)
def test_real_blocks_give_the_reference_values_on_every_path(kernel, quantized, name):
    for tensor in ("blk.0.ffn_down.weight", "blk.0.ffn_gate.weight"):
        parts, dense = real_parts(quantized, name, tensor)
        x = activations(7, dense.shape[1])
        for isa in isa_paths(kernel):
            assert close_to_reference(run(kernel, x, parts, isa), x, dense, name), (name, tensor, isa)


@pytest.mark.parametrize("name", QUANTIZE_AS)
def test_real_blocks_each_row_of_a_block_is_the_row_alone_with_the_avx2_bits(kernel, quantized, name):
    parts, dense = real_parts(quantized, name)
    x = activations(20, dense.shape[1])
    reference = torch.cat([run(kernel, x[i : i + 1], parts, "avx2") for i in range(20)])
    for isa in isa_paths(kernel):
        alone = torch.cat([run(kernel, x[i : i + 1], parts, isa) for i in range(20)])
        assert torch.equal(alone, reference), (name, isa)
        for rows in (*range(2, 17), 20):
            assert torch.equal(run(kernel, x[:rows], parts, isa), alone[:rows]), (name, isa, rows)


@pytest.mark.parametrize("name", QUANTIZE_AS)
def test_broken_twin_a_row_summed_in_another_order_is_caught(kernel, quantized, name):
    parts, _ = real_parts(quantized, name)
    for rows in (9, 16):
        assert_a_broken_row_is_caught(kernel, parts, rows)


# One field of the first block of every row changed: (byte offset, xor mask). A kernel that read that field wrongly
# would compute what the kernel computes on these blocks.
FIELD_CHANGES = {
    "Q5_K": {"scale of sub-block 1": (5, 0x01), "min of sub-block 6": (14, 0x10), "fifth bit, sub-block 3": (16 + 7, 0x08)},
    "Q3_K": {"low nibble of scale 2": (96 + 2, 0x01), "high bits of scale 13": (96 + 9, 0x40), "third bit, sub-block 5": (4, 0x20)},
    "Q2_K": {"scale of sub-block 4": (4, 0x01), "min of sub-block 11": (11, 0x10), "two bits, sub-block 6": (16 + 32 + 5, 0x20)},
    "IQ4_NL": {"index of weight 20": (2 + 4, 0x10)},
    "IQ4_XS": {"high bits of scale 7": (3, 0x40), "low nibble of scale 2": (5, 0x01), "index, sub-block 4": (8 + 64 + 3, 0x01)},
    "Q5_1": {"min": (3, 0x04), "fifth bit of weight 9": (5, 0x02)},
}


@pytest.mark.parametrize("name", QUANTIZE_AS)
def test_broken_twin_a_misread_field_is_caught_by_the_value_check(kernel, quantized, name):
    """Each change moves the kernel's result off the reference of the unchanged blocks, on every path."""
    import gguf

    parts, dense = real_parts(quantized, name)
    qtype, blocks = parts[0]
    block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)][1]
    x = activations(4, dense.shape[1])
    for what, (offset, mask) in FIELD_CHANGES[name].items():
        changed = blocks.clone()
        changed[:, offset] ^= mask
        assert offset < block_bytes and not torch.equal(changed, blocks)
        for isa in isa_paths(kernel):
            assert not close_to_reference(run(kernel, x, [(qtype, changed)], isa), x, dense, name), (name, what, isa)


@pytest.mark.parametrize("name", ["IQ4_NL", "IQ4_XS"])
def test_broken_twin_an_iq4_table_entry_off_by_one_is_caught(kernel, quantized, name, monkeypatch):
    """Against a reference whose value table has entry i off by one (for each i), the kernel's result must fail (b)."""
    import gguf

    parts, dense = real_parts(quantized, name, rows=40)
    qtype, blocks = parts[0]
    x = activations(3, dense.shape[1])
    y = {isa: run(kernel, x, parts, isa) for isa in isa_paths(kernel)}
    table = gguf.quants.IQ4_NL.kvalues
    for i in range(16):
        wrong = tuple(v + (i == j) for j, v in enumerate(table))
        monkeypatch.setattr(gguf.quants.IQ4_NL, "kvalues", wrong)
        dense = gguf.quants.dequantize(blocks.numpy(), qtype).astype(np.float64)
        for isa, result in y.items():
            assert not close_to_reference(result, x, dense, name), (name, i, isa)
    monkeypatch.setattr(gguf.quants.IQ4_NL, "kvalues", table)
    dense = gguf.quants.dequantize(blocks.numpy(), qtype).astype(np.float64)
    assert all(close_to_reference(result, x, dense, name) for result in y.values())
