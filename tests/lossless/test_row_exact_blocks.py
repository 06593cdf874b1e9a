"""Row-exact blocks: a token computed in a verify block (chain or tree, of any size the API allows) gets the
same bits as the token computed alone, in logits and in the keys/values it leaves in the cache. Greedy
identity then holds by construction; token-level tests on tiny models rarely meet a near-tie, so these
compare bits."""
import pytest
import torch

from testlib import TINY_CONFIGS as CONFIGS
from testlib import NEWER_KQUANT_LAYOUT, kquant_model, make_tiny_model, token_by_token, tokens_for


@pytest.mark.parametrize("name", CONFIGS)
def test_block_forward_is_bitwise_token_by_token_with_cpu_kernel(name):
    """The kernels promise (kernels/__init__.py) that "a verify block reproduces the plain decoding pass
    bit for bit (no floating-point near-tie can split them)". The linear layers keep that
    promise; the whole forward must too, or greedy speculation can diverge from plain decoding at ties."""
    from specdecode import kernels

    if kernels.load_kernel() is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    model = make_tiny_model(seed=3, **CONFIGS[name])
    tokens = tokens_for(model, 24)
    prefix, block_tokens = tokens[:15], tokens[15:]  # a verify-like block after a prefix
    cache = model.new_cache()
    model(prefix, cache, logits="none")
    block = model(block_tokens, cache)
    rows, _ = token_by_token(model, tokens)
    diff = (block - rows[15:]).abs().max().item()
    identical = torch.equal(block, rows[15:])
    assert identical, f"verify block differs from token-by-token logits (max abs diff {diff:.3g})"


def test_linear_kernel_is_row_count_invariant_bitwise():
    """The property the kernel is built for: each output row is independent of how many rows run."""
    from specdecode import kernels

    if kernels.load_kernel() is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    gen = torch.Generator().manual_seed(0)
    for out_features, in_features in [(130, 64), (49, 576)]:
        for dtype in (torch.float32, torch.bfloat16):
            weight = torch.randn(out_features, in_features, generator=gen).to(dtype)
            # 16 rows: the largest verify block (prompt lookup's K of 15) still goes through the kernel
            x = torch.randn(kernels.SKINNY_MAX_ROWS, in_features, generator=gen)
            full = kernels.linear(x, weight)
            rows = torch.cat([kernels.linear(x[i : i + 1], weight) for i in range(len(x))])
            assert torch.equal(full, rows)
            torch.testing.assert_close(full, x @ weight.float().T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(12, 2, 128), (9, 3, 64), (4, 4, 72)])
def test_block_attention_kernel_matches_pytorch_and_is_row_count_invariant(heads, kv_heads, head_dim):
    """The attention kernel for decode steps and verify blocks: each row must equal PyTorch's attention
    over the keys up to its position, and be the same bits whether it runs alone or inside a block."""
    import torch.nn.functional as F

    from specdecode import kernels

    if kernels.load_kernel() is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    gen = torch.Generator().manual_seed(7)
    for start, rows in ((0, 1), (37, 5), (600, 16)):
        room = start + rows + 9  # stale entries past the block must be ignored
        keys = torch.randn(kv_heads, room, head_dim, generator=gen)
        values = torch.randn(kv_heads, room, head_dim, generator=gen)
        q = torch.randn(rows, heads, head_dim, generator=gen) * 2
        out = kernels.block_attention(q, keys, values, start)
        assert out.shape == (rows, heads, head_dim)
        for i in range(rows):
            n = start + i + 1
            ref = F.scaled_dot_product_attention(q[i : i + 1].transpose(0, 1)[None], keys[None, :, :n], values[None, :, :n],
                                                 enable_gqa=heads != kv_heads)[0].transpose(0, 1)
            torch.testing.assert_close(out[i : i + 1], ref, rtol=1e-5, atol=1e-5)
            assert torch.equal(out[i : i + 1], kernels.block_attention(q[i : i + 1], keys, values, start + i))


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(12, 2, 128), (9, 3, 64), (5, 1, 72), (4, 4, 8)])
def test_fast_attention_scores_are_the_definitions_bits(heads, kv_heads, head_dim):
    """The attention kernel's fast path (two heads against four keys per step, eight horizontal sums as one
    transpose) must give every row the bits of its definition (one head and one key at a time, each dot product
    reduced by hsum), alone, in blocks, in windows and in trees: a change of either, in the order of a sum, is a
    change of every speculative output. Heads per group even and odd (the odd one takes the one-head steps), key
    counts with and without a remainder, head sizes of one vector and of several."""
    from specdecode import kernels
    from specdecode.models.transformer import tree_mask

    if kernels.load_kernel() is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    attention = kernels.native._kernel.block_attention
    gen = torch.Generator().manual_seed(11)
    for start, rows, window in ((0, 1, 0), (3, 2, 0), (37, 5, 0), (129, 16, 0), (600, 9, 0), (90, 7, 33)):
        keys = torch.randn(kv_heads, start + rows + 2, head_dim, generator=gen)
        values = torch.randn(kv_heads, start + rows + 2, head_dim, generator=gen)
        q = torch.randn(rows, heads, head_dim, generator=gen) * 3
        parents = [max(0, i - 1) for i in range(rows - 1)]  # the root, then two chains under it
        for visible in (None, tree_mask(start, parents, "cpu")[:, start:]):
            fast = attention(q, keys, values, start, visible, 0.0, window)
            assert torch.equal(fast, attention(q, keys, values, start, visible, 0.0, window, definition=True))


@pytest.mark.parametrize("window", [1, 6, 40])
def test_windowed_scaled_block_attention_matches_pytorch_and_is_row_count_invariant(window):
    """With a sliding window and a scale of its own (Gemma 3, Mistral): row i sees the keys at positions after
    start + i - window, as PyTorch's attention over exactly those keys does, with the same bits alone or in a
    block, chain or tree. Its broken twin (the window one larger) must be told apart."""
    import torch.nn.functional as F

    from specdecode import kernels
    from specdecode.models.transformer import tree_mask

    if kernels.load_kernel() is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    gen = torch.Generator().manual_seed(8)
    heads, kv_heads, head_dim, scale = 8, 2, 32, 0.3
    for start, rows in ((0, 9), (37, 5), (100, 16)):
        keys = torch.randn(kv_heads, start + rows + 3, head_dim, generator=gen)
        values = torch.randn(kv_heads, start + rows + 3, head_dim, generator=gen)
        q = torch.randn(rows, heads, head_dim, generator=gen)
        out = kernels.block_attention(q, keys, values, start, None, scale, window)
        wider = kernels.block_attention(q, keys, values, start, None, scale, window + 1)
        for i in range(rows):
            first, n = max(0, start + i + 1 - window), start + i + 1
            ref = F.scaled_dot_product_attention(q[i : i + 1].transpose(0, 1)[None], keys[None, :, first:n],
                                                 values[None, :, first:n], enable_gqa=True, scale=scale)[0].transpose(0, 1)
            torch.testing.assert_close(out[i : i + 1], ref, rtol=1e-5, atol=1e-5)
            assert torch.equal(out[i : i + 1], kernels.block_attention(q[i : i + 1], keys, values, start + i, None, scale, window))
            if first > 0:  # the twin sees one key more
                assert (wider[i] - out[i]).abs().max() > 1e-4
        # a tree: root, a chain of the block's rows, and a sibling of each (rows at depth d sit at start + d)
        parents = list(range(rows - 1))
        chain_tree = kernels.block_attention(q, keys, values, start, tree_mask(start, parents, "cpu")[:, start:], scale, window)
        assert torch.equal(chain_tree, out)


def whole_model(precision: str, name: str):
    """A tiny model of that shape: float32, Q8_0 (int8), the default target's Q4_K/Q6_K tiles (kquant: its fixed
    k-quant shape), or the 0.5B draft's Q5_0 blocks in their interleaved 16-row layout."""
    import gguf

    from specdecode import kernels
    from specdecode.models.loader import _matrix_keys, _to_quant_weights

    if precision == "kquant":
        model, blocks = kquant_model(seed=11, arch=CONFIGS[name].get("arch", "llama"))
        _to_quant_weights(model, blocks)
        assert kernels.Q4_K_X16 in model.layers[0].qkv.types
        return model
    if precision == "newer-kquant":  # Q5_K, Q3_K, Q2_K, IQ4_XS blocks in their GGUF layouts
        model, blocks = kquant_model(seed=11, arch=CONFIGS[name].get("arch", "llama"), layout=NEWER_KQUANT_LAYOUT)
        _to_quant_weights(model, blocks)
        assert model.layers[0].qkv.types == [13, 11, 10]
        return model
    model = make_tiny_model(seed=11, **CONFIGS[name])
    if precision == "q5_0":
        blocks = {}
        for key in _matrix_keys(model.config):
            owner = model.embed if key == "lm_head" and model.lm_head is None else model.get_parameter(key)
            weight = owner.data.numpy()
            blocks[key] = [(int(gguf.GGMLQuantizationType.Q5_0),
                            torch.from_numpy(gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q5_0)))]
        _to_quant_weights(model, blocks)
        assert kernels.Q5_0_X16 in model.layers[0].qkv.types
    elif precision == "int8":
        _to_quant_weights(model)
        assert isinstance(model.layers[0].qkv, kernels.QuantWeight)
    return model


@pytest.mark.parametrize("precision", ["float32", "int8", "kquant", "newer-kquant", "q5_0"])
@pytest.mark.parametrize("name", CONFIGS)
def test_rows_are_bitwise_the_same_in_any_block(name, precision):
    """A token computed alone (decode step), in a verify block of up to 65 rows (K = 64, the API's
    largest) or in a prompt gives the same bits: logits and the keys/values it leaves in the cache.
    Token-level identity tests on tiny models rarely hit a near-tie, so this compares the bits."""
    from specdecode import kernels

    if kernels.load_kernel() is None:
        pytest.skip("no CPU kernel")
    model = whole_model(precision, name)
    tokens = tokens_for(model, 74)
    before = torch.get_num_threads()
    try:
        # Decode steps on one thread, blocks on two or more: the test workers run one thread each
        # (scripts/test.sh), and a served model runs several, so the bits must not depend on the split either.
        torch.set_num_threads(1)
        one_by_one = model.new_cache()
        model(tokens[:4], one_by_one, logits="none")
        singles = torch.cat([model(tokens[i : i + 1], one_by_one) for i in range(4, 74)])
        torch.set_num_threads(max(2, before))
        for block in (2, 5, 16, 26, 33, 64, 65):  # 26+ rows: more than one tile; 33-64: prompt chunks; 65: two calls
            cache = model.new_cache()
            model(tokens[:4], cache, logits="none")
            logits = torch.cat([model(tokens[i : i + block], cache) for i in range(4, 74, block)])
            assert torch.equal(logits, singles), block
            assert torch.equal(cache.keys[:, :, :74], one_by_one.keys[:, :, :74]), block
            assert torch.equal(cache.values[:, :, :74], one_by_one.values[:, :, :74]), block
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("precision", ["float32", "int8"])
@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-gqa-bias", "gemma3-windowed", "mistral-window"])
def test_tree_nodes_are_bitwise_the_same_nodes_in_a_chain(name, precision):
    """A token tree's node computes the bits of the same token at the same depth in a plain chain: logits
    and keys/values. The chain here is 8 verify rows; the tree holds it with a sibling leaf at every depth."""
    from specdecode import kernels
    from specdecode.models.loader import _to_quant_weights
    from specdecode.models.transformer import tree_mask, tree_positions

    if kernels.load_kernel() is None:
        pytest.skip("no CPU kernel")
    model = make_tiny_model(seed=12, **CONFIGS[name])
    if precision == "int8":
        _to_quant_weights(model)
    tokens = tokens_for(model, 14)
    chain_cache, tree_cache = model.new_cache(), model.new_cache()
    for c in (chain_cache, tree_cache):
        model(tokens[:6], c, logits="none")
    chain = tokens[6:14]  # root + 7 drafted tokens
    chain_logits = model(chain, chain_cache)
    nodes, parents, chain_index = [int(chain[0])], [], [0]
    for depth in range(1, 8):  # the chain's token, then a sibling that differs
        parents.append(chain_index[-1])
        nodes.append(int(chain[depth]))
        chain_index.append(len(nodes) - 1)
        parents.append(chain_index[-2])
        nodes.append((int(chain[depth]) + 1) % model.config.vocab_size)
    tree_logits = model(torch.tensor(nodes), tree_cache, positions=tree_positions(6, parents, "cpu"),
                        attn_mask=tree_mask(6, parents, "cpu"))
    assert torch.equal(tree_logits[chain_index], chain_logits)
    rows = [6 + i for i in chain_index]
    assert torch.equal(tree_cache.keys[:, :, rows], chain_cache.keys[:, :, 6:14])
    assert torch.equal(tree_cache.values[:, :, rows], chain_cache.values[:, :, 6:14])


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-gqa-bias", "gemma3-windowed", "mistral-window"])
def test_the_one_call_int8_layer_gives_the_three_call_bits(name, monkeypatch):
    """The int8 layer runs as one native call (attn_in, cache write, attention, attn_out); the three-call
    path it replaced is the reference: logits and cache bits equal, for a prompt, a step, a verify block
    and a token tree."""
    from specdecode import kernels
    from specdecode.models.loader import _to_quant_weights
    from specdecode.models.transformer import tree_mask, tree_positions

    if kernels.load_kernel() is None:
        pytest.skip("no CPU kernel")
    model = make_tiny_model(seed=5, **CONFIGS[name])
    _to_quant_weights(model)
    tokens = tokens_for(model, 31)
    parents = [0, 0, 1, 2]  # a root and four nodes

    def run(fused: bool):
        monkeypatch.setattr(kernels.dispatch, "FUSED_LAYER", fused)
        cache = model.new_cache()
        outs = [model(tokens[:20], cache), model(tokens[20:21], cache), model(tokens[21:26], cache)]
        start = cache.length
        mask, positions = tree_mask(start, parents, "cpu"), tree_positions(start, parents, "cpu")
        outs.append(model(tokens[26:31], cache, positions=positions, attn_mask=mask))
        return outs, cache

    (fused, fused_cache), (split, split_cache) = run(True), run(False)
    for a, b in zip(fused, split):
        assert torch.equal(a, b)
    assert torch.equal(fused_cache.keys, split_cache.keys) and torch.equal(fused_cache.values, split_cache.values)
