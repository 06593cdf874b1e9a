"""GGUF blocks multiplied by the Triton kernel itself (gpu/gguf_blocks.py) give exactly the bfloat16 pass of the
same file: the weights the kernel rebuilds are the bfloat16 weights a load-time dequantization makes, so every
product, and every logit of a model, is the same bits; and a row is still its decode step's in any block. Twins
that must fail: weights rounded to bfloat16 by truncation, nibbles and 2-bit values regrouped in the wrong order."""
from __future__ import annotations

import dataclasses

import gguf
import numpy as np
import pytest
import torch

from specdecode.gpu import gguf_blocks
from specdecode.gpu.exact_pass import ExactPass, interpreting
from gpu_models import TEST_TILES, on_gpu_path
from testlib import kquant_model, tokens_for
from testlib import random_gguf_blocks as random_blocks

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

KINDS = sorted(gguf_blocks.BLOCKS)
MATRICES = ("qkv", "out_proj", "gate_up", "down", "lm_head")
# Four splits of the tiny model's 256-wide products (fewer programs for the interpreter than TEST_TILES' eight)
TILES = dataclasses.replace(TEST_TILES, block_k=64, max_split=64)


def ggml_weights(kind: int, raw: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(kind)).reshape(raw.shape[0], -1)


@pytest.mark.parametrize("kind", KINDS, ids=[gguf_blocks.NAMES[k] for k in KINDS])
def test_regrouped_blocks_hold_ggmls_weights(kind):
    raw = random_blocks(kind, 6, 512)
    mine = gguf_blocks.dequantized(kind, gguf_blocks.regroup(kind, raw, 512))
    assert np.array_equal(mine.view(np.uint32), ggml_weights(kind, raw).view(np.uint32))


def products(runner: ExactPass, kind: int, rows: int, seed: int = 0):
    """(blocks product, bfloat16 product) of one random matrix [128, 512] and `rows` random rows."""
    raw = random_blocks(kind, 128, 512, seed)
    dense = torch.from_numpy(ggml_weights(kind, raw)).to(runner.model.device, torch.bfloat16)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(seed)).to(runner.model.device, torch.bfloat16)
    return runner.product(x, gguf_blocks.block_weight([(kind, raw)], runner.model.device))[0], runner.product(x, dense)[0]


def bf16_model(seed: int = 3):
    """A tiny model of random Q4_K/Q6_K blocks (a Q4_K_M file's layout), as bfloat16 matrices, and its blocks."""
    model, blocks = kquant_model(seed)
    for name, param in model.named_parameters():
        if name.rpartition(".")[2] in MATRICES:
            param.data = param.data.to(torch.bfloat16)
    return model, blocks


@pytest.fixture(scope="module")
def runner():
    return on_gpu_path(bf16_model()[0], tiles=TILES).exact_pass


@pytest.mark.parametrize("kind", KINDS, ids=[gguf_blocks.NAMES[k] for k in KINDS])
def test_a_product_over_blocks_is_the_bfloat16_product(runner, kind):
    for rows in (1, 5):
        got, expected = products(runner, kind, rows)
        assert torch.equal(got, expected), f"{rows} rows"


def test_a_reduced_head_of_blocks_is_the_same_rows_of_the_head(runner):
    raw = random_blocks(gguf_blocks.Q6_K, 128, 512)
    weight = gguf_blocks.block_weight([(gguf_blocks.Q6_K, raw)], runner.model.device)
    dense = torch.from_numpy(ggml_weights(gguf_blocks.Q6_K, raw)).to(runner.model.device, torch.bfloat16)
    ids = torch.tensor([7, 3, 120, 64, 5], device=runner.model.device)
    x = torch.randn(2, 512).to(runner.model.device, torch.bfloat16)
    assert torch.equal(runner.product(x, weight.index_select(0, ids))[0], runner.product(x, dense[ids])[0])


@pytest.mark.skipif(not interpreting(), reason="the GPU's own conversion rounds to nearest even either way")
def test_the_product_check_catches_truncated_weights(runner):
    runner.round_by_bits = False  # the interpreter's conversion, which truncates
    try:
        got, expected = products(runner, gguf_blocks.Q4_K, 3)
    finally:
        runner.round_by_bits = True
    assert not torch.equal(got, expected)


@triton.jit
def unrounded(w, BY_BITS: tl.constexpr):
    """A twin of triton_kernels._to_bfloat16 that leaves the weights in float32."""
    return w


@pytest.mark.skipif(not interpreting(), reason="the twin swaps a function of the kernel, which the interpreter runs")
def test_the_product_check_catches_weights_multiplied_in_float32(runner, monkeypatch):
    """Under the interpreter both products multiply in float32, so the check can only see the weights: a kernel
    that multiplied ggml's float32 weights without rounding them to bfloat16 (a product in another precision) must
    differ. The data has weights whose float32 and bfloat16 values differ, so it can."""
    from specdecode.gpu import triton_kernels

    raw = random_blocks(gguf_blocks.Q4_K, 128, 512)
    weights = torch.from_numpy(ggml_weights(gguf_blocks.Q4_K, raw))
    assert not torch.equal(weights, weights.to(torch.bfloat16).float())

    monkeypatch.setattr(triton_kernels, "_to_bfloat16", unrounded)
    got, expected = products(runner, gguf_blocks.Q4_K, 3)
    assert not torch.equal(got, expected)


def test_the_product_check_catches_nibbles_in_the_wrong_order(runner, monkeypatch):
    monkeypatch.setattr(gguf_blocks, "pairs", lambda v: (v[:, 1::2] | v[:, 0::2] << 4).astype(np.uint8))
    got, expected = products(runner, gguf_blocks.Q4_K, 3)
    assert not torch.equal(got, expected)


def test_the_product_check_catches_two_bit_values_in_the_wrong_order(runner, monkeypatch):
    monkeypatch.setattr(gguf_blocks, "quads", lambda v: (v[:, 3::4] | v[:, 2::4] << 2 | v[:, 1::4] << 4
                                                         | v[:, 0::4] << 6).astype(np.uint8))
    got, expected = products(runner, gguf_blocks.Q3_K, 3)
    assert not torch.equal(got, expected)


# Issue 64's tiles (off in production): 16-row transposed tiles, every epilogue in its product. The QKV matrix's two
# block types are two launches, so its epilogue waits for the row block's tiles over both.
FUSED = dataclasses.replace(TILES, fused_residual=True, fused_qkv=True).swapped()


@pytest.mark.parametrize("tiles", [TILES, FUSED], ids=["tiles", "fused-transposed"])
def test_a_model_of_blocks_is_its_bfloat16_model_and_its_rows_are_exact(tiles):
    """Every matrix as blocks (Q4_K and Q6_K parts in one QKV matrix, a Q6_K head): a prompt block's logits are the
    bfloat16 model's bits, and each row's are its decode step's."""
    dense, _ = bf16_model()
    model, blocks = bf16_model()
    assert gguf_blocks.attach(model, gguf_blocks.gpu_readable(blocks)) == len(blocks) == 2 * 4 + 1
    dense, model = on_gpu_path(dense, tiles=tiles), on_gpu_path(model, tiles=tiles)
    assert isinstance(model.output_weight(), gguf_blocks.BlockWeight)
    assert model.layers[0].qkv.kinds == ["Q4_K", "Q6_K"] and model.layers[0].gate_up.kinds == ["Q4_K"]  # runs merged
    tokens = tokens_for(model, 4, seed=2)
    block = model(tokens, model.new_cache())
    assert torch.equal(block, dense(tokens, dense.new_cache()))
    cache = model.new_cache()
    steps = torch.cat([model(tokens[i : i + 1], cache) for i in range(len(tokens))])
    assert torch.equal(steps, block)


def test_a_gguf_file_loads_its_readable_matrices_as_blocks():
    """SmolLM2's file: Q4_1 layers and a Q8_0 embedding, which the tied head reads as blocks; a layer's product and
    the head's rows are the products of the bfloat16 copies a plain bfloat16 load makes."""
    from specdecode import registry
    from specdecode.models.loader import _load_gguf_native, convert_gguf
    from testlib import SMOLLM2

    path = registry.resolve(SMOLLM2)
    folder = convert_gguf(path, quiet=True)
    model, _, blocks, _ = _load_gguf_native(path, folder, torch.device("cpu"), "bfloat16", 64, gpu_blocks=True)
    plain, _, none, _ = _load_gguf_native(path, folder, torch.device("cpu"), "bfloat16", 64)
    assert (blocks, none) == (4 * model.config.n_layers + 1, 0)
    head, qkv = model.output_weight(), model.layers[0].qkv
    assert head.kinds == ["Q8_0"] and qkv.kinds == ["Q4_1"]
    runner = on_gpu_path(model, tiles=TILES).exact_pass
    x = torch.randn(2, model.config.hidden_size).to(torch.bfloat16)
    assert torch.equal(runner.product(x, qkv)[0], runner.product(x, plain.layers[0].qkv)[0])
    ids = torch.arange(0, model.config.vocab_size, 397)
    expected = runner.product(x, plain.output_weight().index_select(0, ids).contiguous())[0]
    assert torch.equal(runner.product(x, head.index_select(0, ids))[0], expected)


class CountsOneLaunch(ExactPass):
    """Broken: a product's row block counts only its first launch's tiles (one run of block types), so the QKV
    epilogue runs before the V matrix's launch has summed anything."""

    def _product_end(self, parts, t, n, residual, qkv):
        args, consts = super()._product_end(parts, t, n, residual, qkv)
        return (args[:5] + (-(-parts[0].rows // t.block_n),) + args[6:] if consts else args), consts


def test_the_block_check_catches_an_epilogue_counting_one_launch():
    dense, _ = bf16_model()
    model, blocks = bf16_model()
    gguf_blocks.attach(model, gguf_blocks.gpu_readable(blocks))
    dense, model = on_gpu_path(dense, tiles=FUSED), on_gpu_path(model, CountsOneLaunch, tiles=FUSED)
    tokens = tokens_for(model, 4, seed=2)
    assert not torch.equal(model(tokens, model.new_cache()), dense(tokens, dense.new_cache()))
