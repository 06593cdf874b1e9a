"""Native decoder on tiny random-weight models: block vs token-by-token, rollback, masks, positions."""
from dataclasses import replace

import numpy as np
import pytest
import torch

from specdecode.models.transformer import Transformer, causal_mask
from testlib import TINY_CONFIGS as CONFIGS
from testlib import fill_random, make_tiny_model, tiny_config, token_by_token, tokens_for


def random_gguf_blocks(qtype, rows: int, cols: int, seed: int) -> np.ndarray:
    """[rows, bytes] of random blocks of a ggml type, with every float16 scale finite and moderate."""
    import gguf

    block_weights, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * cols // block_weights, block_bytes), dtype=np.uint8)
    scale_offsets = {"Q6_K": [208], "Q4_K": [0, 2], "Q4_1": [0, 2], "Q8_0": [0]}[qtype.name]
    for offset in scale_offsets:
        scales = rng.uniform(1e-3, 2e-2, size=len(blocks)).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("qtypes", [("Q4_K",), ("Q6_K",), ("Q4_1",), ("Q8_0",), ("Q4_K", "Q4_K", "Q6_K")])
def test_gguf_kernel_equals_the_float32_kernel_on_the_dequantized_blocks(qtypes):
    """The kernel reading GGUF blocks returns, bit for bit, the float32 kernel's product with the
    gguf package's dequantized weights, at every block size a decode step or verify pass uses."""
    import gguf

    from specdecode import kernels

    if kernels.load_kernel() is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    cols = 512
    parts, dense = [], []
    for i, name in enumerate(qtypes):
        qtype = gguf.GGMLQuantizationType[name]
        blocks = random_gguf_blocks(qtype, 7 + 3 * i, cols, seed=i)  # row counts that leave tile remainders
        parts.append((int(qtype), torch.from_numpy(blocks)))
        dense.append(torch.from_numpy(gguf.quants.dequantize(blocks, qtype).astype(np.float32)))
    dense = torch.cat(dense)
    weight = kernels.GGUFWeight(dense, parts)
    bias = torch.randn(dense.shape[0], generator=torch.Generator().manual_seed(4))
    gen = torch.Generator().manual_seed(9)
    # decode steps and verify blocks, prompt chunks (with a short tail) and the GEMM beyond them
    for rows in (1, 2, 3, 4, 5, 9, 16, 17, 40, kernels.FLOAT32_CHUNKED_MAX_ROWS + 3):
        x = torch.randn(rows, cols, generator=gen)
        y = kernels.linear(x, weight, bias)
        torch.testing.assert_close(y, x @ dense.T + bias, rtol=1e-4, atol=1e-4)
        assert torch.equal(y, kernels.linear(x, dense, bias))  # the float32 path, kernel or GEMM
        if rows <= kernels.FLOAT32_CHUNKED_MAX_ROWS:  # each row is exactly its single-row result
            assert torch.equal(y[-1:], kernels.linear(x[-1:], weight, bias))


def test_the_gguf_block_types_python_keeps_are_the_ones_the_kernel_reads():
    from specdecode import kernels

    kernel = kernels.load_kernel()
    if kernel is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    assert set(kernel.gguf_block_types()) == kernels.GGUF_KERNEL_TYPES


@pytest.mark.parametrize("gemm", ["numpy", "torch"])
def test_prefill_sized_float32_products_agree_whichever_gemm_runs_them(gemm, monkeypatch):
    from specdecode import kernels

    monkeypatch.setattr(kernels.options, "OPTIONS", replace(kernels.options.OPTIONS, prefill_gemm=gemm))
    gen = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(70, 64, generator=gen), torch.randn(70, generator=gen)
    x = torch.randn(2, kernels.FLOAT32_CHUNKED_MAX_ROWS, 64, generator=gen)  # GEMM-sized, in a batch shape
    with torch.inference_mode():
        y = kernels.linear(x, weight, bias)
    assert y.shape == (2, kernels.FLOAT32_CHUNKED_MAX_ROWS, 70) and y.dtype == torch.float32
    torch.testing.assert_close(y, x @ weight.T + bias, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", CONFIGS)
def test_block_forward_matches_token_by_token(name, matmul_path):
    model = make_tiny_model(seed=3, **CONFIGS[name])
    tokens = tokens_for(model, 24)
    block = model(tokens, model.new_cache())
    rows, _ = token_by_token(model, tokens)
    assert block.shape == (24, model.config.vocab_size)
    torch.testing.assert_close(block, rows, rtol=1e-5, atol=1e-4)
    assert torch.equal(block.argmax(-1), rows.argmax(-1))


def test_bfloat16_weights_run_prefill_sized_blocks_through_the_kernel_in_chunks():
    from specdecode import kernels

    if kernels.load_kernel() is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(70, 64, generator=gen).to(torch.bfloat16)
    bias = torch.randn(70, generator=gen)
    for rows in (17, 40, kernels.LOW_PRECISION_CHUNKED_MAX_ROWS + 3):  # chunked, chunked with a short tail, GEMM
        x = torch.randn(rows, 64, generator=gen)
        y = kernels.linear(x, weight, bias)
        assert y.shape == (rows, 70)
        torch.testing.assert_close(y, x @ weight.float().T + bias, rtol=1e-4, atol=1e-4)
        if rows <= kernels.LOW_PRECISION_CHUNKED_MAX_ROWS:  # chunks give each row exactly its single-row result
            assert torch.equal(y[rows - 1 :], kernels.linear(x[rows - 1 :], weight, bias))


@pytest.mark.parametrize("name", CONFIGS)
def test_chunked_prefill_matches_one_block(name):
    model = make_tiny_model(seed=4, **CONFIGS[name])
    tokens = tokens_for(model, 30)
    whole = model(tokens, model.new_cache())
    cache = model.new_cache()
    parts = [model(tokens[a:b], cache) for a, b in [(0, 7), (7, 8), (8, 20), (20, 30)]]
    assert cache.length == 30
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", CONFIGS)
def test_truncate_then_rerun_reproduces_logits_exactly(name):
    model = make_tiny_model(seed=5, **CONFIGS[name])
    tokens = tokens_for(model, 20)
    other = tokens_for(model, 6, seed=9)
    cache = model.new_cache()
    model(tokens[:12], cache, logits="none")
    first = model(tokens[12:], cache)
    assert cache.length == 20
    # roll back and run a different continuation (a rejected draft), then roll back again
    cache.truncate(12)
    model(other, cache)
    assert cache.length == 18
    cache.truncate(12)
    again = model(tokens[12:], cache)
    assert torch.equal(first, again)
    # and a single-token step after rollback scores like a fresh run of the same prefix
    # (the prefix entries were computed in other block shapes, so close rather than bitwise)
    cache.truncate(15)
    step = model(tokens[15:16], cache)
    fresh = model.new_cache()
    model(tokens[:15], fresh, logits="none")
    torch.testing.assert_close(step, model(tokens[15:16], fresh), rtol=1e-5, atol=1e-4)


def test_stale_entries_beyond_length_are_ignored():
    model = make_tiny_model(seed=6)
    tokens = tokens_for(model, 10)
    cache = model.new_cache()
    model(tokens[:6], cache, logits="none")
    cache.keys[:, :, 6:] = 1e4  # garbage where the next block will be written / beyond it
    cache.values[:, :, 6:] = -1e4
    got = model(tokens[6:], cache)
    clean = model.new_cache()
    model(tokens[:6], clean, logits="none")
    assert torch.equal(got, model(tokens[6:], clean))


@pytest.mark.parametrize("name", CONFIGS)
def test_explicit_causal_mask_equals_default(name):
    model = make_tiny_model(seed=7, **CONFIGS[name])
    tokens = tokens_for(model, 16)
    prefix = 5
    default_cache, explicit_cache, hand_cache = model.new_cache(), model.new_cache(), model.new_cache()
    for c in (default_cache, explicit_cache, hand_cache):
        model(tokens[:prefix], c, logits="none")
    default = model(tokens[prefix:], default_cache)
    explicit = model(tokens[prefix:], explicit_cache, attn_mask=causal_mask(prefix, 11, model.device))
    hand = torch.ones(11, prefix + 11, dtype=torch.bool).tril(diagonal=prefix)
    assert torch.equal(hand, causal_mask(prefix, 11, "cpu"))
    by_hand = model(tokens[prefix:], hand_cache, attn_mask=hand)
    # The default path attends row by row (bitwise equal to single steps), the explicit mask in one
    # call: the same function, rounded differently.
    assert torch.equal(explicit, by_hand)
    torch.testing.assert_close(default, explicit, rtol=1e-5, atol=1e-5)


def test_mask_really_restricts_attention():
    """A mask that hides the prefix changes the logits: the argument is not ignored."""
    model = make_tiny_model(seed=8)
    tokens = tokens_for(model, 10)
    a, b = model.new_cache(), model.new_cache()
    model(tokens[:6], a, logits="none")
    model(tokens[:6], b, logits="none")
    causal = model(tokens[6:], a)
    no_prefix = causal_mask(6, 4, "cpu")
    no_prefix[:, :6] = False
    hidden = model(tokens[6:], b, attn_mask=no_prefix)
    assert not torch.allclose(causal, hidden)


def test_default_positions_equal_explicit_positions():
    model = make_tiny_model(seed=9)
    tokens = tokens_for(model, 12)
    a, b = model.new_cache(), model.new_cache()
    model(tokens[:4], a, logits="none")
    model(tokens[:4], b, logits="none")
    default = model(tokens[4:], a)
    explicit = model(tokens[4:], b, positions=torch.arange(4, 12))
    assert torch.equal(default, explicit)
    shifted_cache = model.new_cache()
    model(tokens[:4], shifted_cache, logits="none")
    shifted = model(tokens[4:], shifted_cache, positions=torch.arange(5, 13))
    assert not torch.allclose(default, shifted)  # positions reach RoPE


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-gqa-bias"])
def test_token_tree_block_with_positions_mask_and_compact(name):
    """Two branches verified in one block (tree attention) score like two separate linear runs;
    compacting the cache to one branch continues exactly like the linear run of that branch."""
    model = make_tiny_model(seed=10, **CONFIGS[name])
    prefix = tokens_for(model, 8).tolist()
    branch_a, branch_b = [3, 17, 40], [99, 5, 61]
    p = len(prefix)

    cache = model.new_cache()
    model(torch.tensor(prefix), cache, logits="none")
    tree_tokens = torch.tensor(branch_a + branch_b)
    positions = torch.tensor([p, p + 1, p + 2, p, p + 1, p + 2])
    mask = torch.zeros(6, p + 6, dtype=torch.bool)
    mask[:, :p] = True
    for row in range(6):
        first = 0 if row < 3 else 3
        mask[row, p + first : p + row + 1] = True
    tree = model(tree_tokens, cache, positions=positions, attn_mask=mask)

    def linear(branch):
        c = model.new_cache()
        model(torch.tensor(prefix), c, logits="none")
        return model(torch.tensor(branch), c), c

    linear_a, _ = linear(branch_a)
    linear_b, cache_b = linear(branch_b)
    torch.testing.assert_close(tree[:3], linear_a, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(tree[3:], linear_b, rtol=1e-5, atol=1e-4)

    cache.compact(p, [3, 4, 5])  # keep branch b
    assert cache.length == p + 3
    next_tree = model(torch.tensor([7]), cache)
    next_linear = model(torch.tensor([7]), cache_b)
    torch.testing.assert_close(next_tree, next_linear, rtol=1e-5, atol=1e-4)


def test_logits_last_and_none():
    model = make_tiny_model(seed=11)
    tokens = tokens_for(model, 9)
    full = model(tokens, model.new_cache())
    cache = model.new_cache()
    last = model(tokens, cache, logits="last")
    assert last.shape == (1, model.config.vocab_size) and cache.length == 9
    torch.testing.assert_close(last[0], full[-1], rtol=1e-5, atol=1e-5)
    cache = model.new_cache()
    assert model(tokens, cache, logits="none") is None
    assert cache.length == 9


def test_block_that_does_not_fit_raises_and_leaves_cache_alone():
    model = make_tiny_model(seed=12, max_positions=16)
    cache = model.new_cache()
    assert cache.max_len == 16
    model(tokens_for(model, 12), cache, logits="none")
    with pytest.raises(ValueError, match="does not fit"):
        model(tokens_for(model, 5), cache)
    assert cache.length == 12
    model(tokens_for(model, 4), cache)  # exactly fills it
    assert cache.length == 16 and cache.room == 0


def test_new_cache_is_capped_by_max_positions():
    model = make_tiny_model(seed=13, max_positions=32)
    assert model.new_cache().max_len == 32
    assert model.new_cache(8).max_len == 8
    assert model.new_cache(1000).max_len == 32


def test_vocab_subset_head():
    model = make_tiny_model(seed=14)
    tokens = tokens_for(model, 6)
    full = model(tokens, model.new_cache())
    subset = torch.tensor([0, 5, 17, 200, 255])
    model.set_vocab_subset(subset)
    try:
        partial = model(tokens, model.new_cache())
    finally:
        model.set_vocab_subset(None)
    torch.testing.assert_close(partial[:, subset], full[:, subset], rtol=1e-5, atol=1e-5)
    others = torch.ones(model.config.vocab_size, dtype=torch.bool)
    others[subset] = False
    assert torch.isinf(partial[:, others]).all() and (partial[:, others] < 0).all()
    assert torch.equal(model(tokens, model.new_cache()), full)  # removing the subset restores the head


def test_bfloat16_weights_close_to_float32_of_the_same_values():
    cfg = tiny_config(arch="qwen2")
    low = fill_random(Transformer(cfg, weight_dtype=torch.bfloat16), seed=15)
    high = Transformer(cfg, weight_dtype=torch.float32)
    for (name, p_low), (_, p_high) in zip(low.named_parameters(), high.named_parameters()):
        p_high.data = p_low.data.float()
    assert low.layers[0].qkv.dtype == torch.bfloat16
    tokens = tokens_for(low, 10)
    torch.testing.assert_close(low(tokens, low.new_cache()), high(tokens, high.new_cache()), rtol=1e-4, atol=1e-4)


def test_real_model_block_matches_token_by_token(smollm2):
    """The same property on the real smollm2-135m (30 layers), reporting how far apart they are."""
    model = smollm2.model
    tokens = torch.tensor(smollm2.tokenizer.encode("def add(a, b):\n    return a + b"))
    prefix = len(tokens) - 5
    cache = model.new_cache(64)
    model(tokens[:prefix], cache, logits="none")
    block = model(tokens[prefix:], cache)
    rows, _ = token_by_token(model, tokens, model.new_cache(64))
    rows = rows[prefix:]
    diff = (block - rows).abs().max().item()
    assert diff < 1e-3, f"max abs diff {diff}"
    assert torch.equal(block.argmax(-1), rows.argmax(-1))
