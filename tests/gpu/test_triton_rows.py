"""The GPU path's kernels are row-exact: a row's logits and the keys/values it caches are bitwise the same whether
it runs alone (a decode step), in a verify block of any size, in a token tree, in a prompt chunk, or beside other
sequences' rows in a batch. Under Triton's interpreter on a CPU, on CUDA where there is one. Each check has broken
twins (a split chosen from the row count, attention split by count, another tile shape at some row count) that it
must catch."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from specdecode.gpu.exact_pass import ExactPass, ShapeTiles, Tiles
from specdecode.models.transformer import Segment, tree_mask, tree_positions
from gpu_models import TEST_TILES, tiny_gpu_model
from testlib import tokens_for

PROMPT = 9
BLOCKS = (2, 3, 5, 8, 16)
SHORT_BLOCKS = (3, 8)  # the twins' (the interpreter takes ~0.2 s a row-pass)
# The windowed model's: positions reach PROMPT + 15 = 24, so with a window of 6 and segments of 16 keys the last rows
# see no key of segment 0 (their lowest key is 19): a segment skipped whole, in the partials and in the merge.
WINDOW_BLOCKS = (3, 16)


def steps_reference(model, tokens):
    """Logits of every position, one decode step at a time, and the cache they leave."""
    cache = model.new_cache()
    return torch.cat([model(tokens[i : i + 1], cache) for i in range(len(tokens))]), cache


def blocks_match_steps(model, blocks=BLOCKS, seed=5) -> list[str]:
    """Mismatches of blocks against single steps: the prompt as one block, then each block size from its end."""
    tokens = tokens_for(model, PROMPT + max(blocks), seed=seed)
    reference, cache_ref = steps_reference(model, tokens)
    problems = []
    cache = model.new_cache()
    prompt = model(tokens[:PROMPT], cache)
    if not torch.equal(prompt, reference[:PROMPT]):
        problems.append(f"prompt block of {PROMPT}")
    for size in blocks:
        cache.truncate(PROMPT)
        got = model(tokens[PROMPT : PROMPT + size], cache)
        if not torch.equal(got, reference[PROMPT : PROMPT + size]):
            problems.append(f"block of {size}")
    n = PROMPT + max(blocks)
    if not (torch.equal(cache.keys[:, :, :n], cache_ref.keys[:, :, :n])
            and torch.equal(cache.values[:, :, :n], cache_ref.values[:, :, :n])):
        problems.append("cached keys/values")
    return problems


@pytest.mark.parametrize("name,blocks,parallel_sums", [("qwen2-gqa-bias", BLOCKS, False),
                                                        ("gemma3-windowed", WINDOW_BLOCKS, True)])
def test_every_block_size_gives_each_row_the_bits_of_its_decode_step(name, blocks, parallel_sums):
    """qwen2: biases, grouped heads; gemma3: per-head q/k norms, sandwich norms, GeGLU, windows of 6 with their own
    rope base, a softcap. A prompt block, then verify blocks of 2..16 rows, against one row at a time. With
    parallel_sums the residuals' splits are first summed by column blocks (as for the long reductions of large
    models)."""
    tiles = dataclasses.replace(TEST_TILES, serial_sum_limit=0) if parallel_sums else TEST_TILES
    model = tiny_gpu_model(name, tiles=tiles)
    if model.config.sliding_window:  # some row's window starts past the first segment
        assert PROMPT + max(blocks) - model.config.sliding_window >= tiles.attn_split
    assert blocks_match_steps(model, blocks) == []


def test_the_gpu_path_computes_the_model():
    """The Triton pass agrees with the PyTorch reference decoder on the same weights (float32 here, so closely)."""
    model = tiny_gpu_model("qwen3-qknorm")
    tokens = tokens_for(model, 20, seed=2)
    got = model(tokens, model.new_cache())
    runner, model.exact_pass = model.exact_pass, None
    expected = model.cpu()(tokens.cpu(), model.new_cache())
    model.exact_pass = runner
    assert (got.cpu() - expected).abs().max() < 1e-3 * expected.abs().max()


# two branches from the root, one from the first child; and a tree whose last node is not its deepest
@pytest.mark.parametrize("parents", [[0, 1, 0, 3, 1], [0, 1, 0]])
def test_a_token_tree_gives_each_node_the_bits_of_its_path_as_a_chain(parents):
    model = tiny_gpu_model()
    tokens = tokens_for(model, PROMPT + len(parents) + 1, seed=7).tolist()
    block = tokens[PROMPT : PROMPT + len(parents) + 1]
    cache = model.new_cache()
    model(torch.tensor(tokens[:PROMPT]), cache, logits="none")
    tree = model(torch.tensor(block), cache, positions=tree_positions(PROMPT, parents, "cpu"),
                 attn_mask=tree_mask(PROMPT, parents, "cpu"))
    paths = [[0]]
    for index, parent in enumerate(parents, start=1):
        paths.append(paths[parent] + [index])
    for node, path in enumerate(paths):
        cache.truncate(PROMPT)
        chain = model(torch.tensor([block[i] for i in path]), cache)
        assert torch.equal(tree[node], chain[-1]), f"node {node} (path {path})"


def test_a_trees_depth_is_its_deepest_paths():
    """The metadata's ancestor table is as wide as the deepest path, wherever the deepest node sits."""
    from specdecode.gpu.exact_pass import max_depth

    class Cache:
        length, max_len, slot = 5, 64, 1

    assert max_depth([Segment([1, 2, 3, 4], Cache(), "all", [0, 1, 0])]) == 3
    assert max_depth([Segment([1, 2, 3], Cache(), "all", [0, 0]), Segment([1], Cache())]) == 2


# ------------------------------------------------------------------ batches
SHAPES = [(7, 8, "all", None), (18, 1, "all", None), (0, 6, "none", None), (12, 6, "all", [0, 1, 0, 3, 1]),
          (9, 3, "last", None), (3, 1, "all", None)]


def batch_of(model, shapes, seed=0):
    out = []
    for index, (prefix, rows, logits, parents) in enumerate(shapes):
        tokens = tokens_for(model, prefix + rows, seed=seed + index).tolist()
        cache = model.new_cache()
        if prefix:
            model(torch.tensor(tokens[:prefix]), cache, logits="none")
        out.append(Segment(tokens[prefix:], cache, logits, parents))
    return out


def batch_problems(model) -> list[str]:
    batch = batch_of(model, SHAPES)
    solo = []
    for seg in batch:
        own = model.new_cache()
        own.keys.copy_(seg.cache.keys), own.values.copy_(seg.cache.values)
        own.length = seg.cache.length
        solo.append((model.forward_batch([dataclasses.replace(seg, cache=own)])[0], own))
    together = model.forward_batch(batch)
    problems = []
    for index, ((expected, own), got, seg) in enumerate(zip(solo, together, batch)):
        n = own.length
        if (expected is None) != (got is None) or (got is not None and not torch.equal(got, expected)):
            problems.append(f"sequence {index}: logits")
        if not (torch.equal(seg.cache.keys[:, :, :n], own.keys[:, :, :n])
                and torch.equal(seg.cache.values[:, :, :n], own.values[:, :, :n])):
            problems.append(f"sequence {index}: cache")
    return problems


def test_a_row_among_other_sequences_rows_is_the_row_alone():
    """Six sequences in one pass: verify blocks, decode steps, a prompt chunk, a tree; each against its pass alone."""
    assert batch_problems(tiny_gpu_model()) == []


# ------------------------------------------------------------------ broken twins
class SplitFromRows(ExactPass):
    """Broken: a product's split length chosen from the row count (a 'more rows, fewer splits' heuristic)."""

    def product(self, x, weight, **gated):
        if x.shape[0] == 1:
            return super().product(x, weight, **gated)
        self.tiles, saved = dataclasses.replace(self.tiles, max_split=self.tiles.max_split * 2,
                                                block_k=self.tiles.block_k * 2), self.tiles
        try:
            return super().product(x, weight, **gated)
        finally:
            self.tiles = saved


class AttentionSplitByCount(ExactPass):
    """Broken: attention split into a fixed number of segments (their size from the cache, not a fixed size)."""

    def _attention(self, layer, index, h, meta, pool, n_keys):
        self.tiles, saved = dataclasses.replace(self.tiles, attn_split=8 if h.shape[0] > 1 else 16), self.tiles
        try:
            return super()._attention(layer, index, h, meta, pool, n_keys)
        finally:
            self.tiles = saved


class TileSwitchAtFourRows(ExactPass):
    """Broken: another reduction tile from 4 rows on (as a library picks a kernel by shape)."""

    def product(self, x, weight, **gated):
        if x.shape[0] < 4:
            return super().product(x, weight, **gated)
        self.tiles, saved = dataclasses.replace(self.tiles, block_k=self.tiles.block_k // 2), self.tiles
        try:
            return super().product(x, weight, **gated)
        finally:
            self.tiles = saved


TWINS = [SplitFromRows, AttentionSplitByCount, TileSwitchAtFourRows]


@pytest.mark.parametrize("twin", TWINS, ids=lambda t: t.__name__)
def test_the_block_check_catches_a_twin(twin):
    assert blocks_match_steps(tiny_gpu_model(pass_type=twin), SHORT_BLOCKS) != []


def test_the_batch_check_catches_a_twin():
    assert batch_problems(tiny_gpu_model(pass_type=SplitFromRows)) != []


def test_the_test_tiles_split_every_product_and_the_attention():
    """The twins' mechanisms act in these tests: each product of the tiny model has several splits, and the
    caches span several attention segments."""
    model = tiny_gpu_model()
    c = model.config
    for k in (c.hidden_size, c.q_size, c.intermediate_size):
        assert -(-k // TEST_TILES.split_size(k)) > 1
    assert model.new_cache().max_len // TEST_TILES.attn_split >= 4


# ------------------------------------------------------------------ tiles per weight shape
def shape_table(model, block_n: int, split: int) -> Tiles:
    """TEST_TILES with other tiles for every product shape of `model` but the head (warps and stages left alone: the
    interpreter does not run them)."""
    c = model.config
    shapes = {(c.q_size + 2 * c.kv_size, c.hidden_size), (c.hidden_size, c.q_size),
              (2 * c.intermediate_size, c.hidden_size), (c.hidden_size, c.intermediate_size)}
    return dataclasses.replace(TEST_TILES, shapes=tuple((shape, ShapeTiles(block_n=block_n, split=split))
                                                         for shape in sorted(shapes)))


def test_tiles_chosen_per_weight_shape_keep_every_row_exact_and_take_effect():
    """Issue 64: a product launches with the tiles its [N, K] chose (Tiles.shapes, from a device sweep); rows stay
    exact, since the choice never sees the rows, and the table acts (another split of K gives other bits)."""
    plain = tiny_gpu_model()
    tiles = shape_table(plain, block_n=64, split=64)
    model = tiny_gpu_model(tiles=tiles)
    assert blocks_match_steps(model, SHORT_BLOCKS) == []
    tokens = tokens_for(model, PROMPT, seed=5)
    assert not torch.equal(model(tokens, model.new_cache()), plain(tokens, plain.new_cache()))
    assert tiles.for_shape(7, 7) is tiles and tiles.for_shape(*tiles.shapes[0][0]).split_size(7) == 64


class ShapeTableFromFourRows(ExactPass):
    """Broken: the per-shape table consulted from 4 rows on (tiles chosen by rows as well as by the matrix)."""

    def product(self, x, weight, **gated):
        if x.shape[0] >= 4:
            return super().product(x, weight, **gated)
        self.tiles, saved = dataclasses.replace(self.tiles, shapes=()), self.tiles
        try:
            return super().product(x, weight, **gated)
        finally:
            self.tiles = saved


def test_the_block_check_catches_a_shape_table_chosen_by_rows():
    tiles = shape_table(tiny_gpu_model(), block_n=64, split=64)
    assert blocks_match_steps(tiny_gpu_model(pass_type=ShapeTableFromFourRows, tiles=tiles), SHORT_BLOCKS) != []


# ------------------------------------------------------------------ fused split sums
class SumsInReverse(ExactPass):
    """Broken: a product's splits summed last to first (the activation by its own kernel, over these sums)."""

    def __init__(self, model, tiles, **options):
        super().__init__(model, dataclasses.replace(tiles, fused_act=False), **options)

    def product(self, x, weight):
        self.tiles, saved = dataclasses.replace(self.tiles, fused_sums=False), self.tiles
        try:
            part, splits = super().product(x, weight)
        finally:
            self.tiles = saved
        total = torch.zeros_like(part[0])
        for split in reversed(range(splits)):
            total += part[split]
        return total[None], 1


def fused_matches_unfused(pass_type, **change) -> bool:
    """A prompt block's logits with the splits summed by each product's last split against the consumers' sums."""
    fused = tiny_gpu_model("gemma3-windowed", pass_type=pass_type, tiles=dataclasses.replace(TEST_TILES, **change))
    plain = tiny_gpu_model("gemma3-windowed", tiles=dataclasses.replace(TEST_TILES, fused_sums=False))
    tokens = tokens_for(plain, 6, seed=4)
    return torch.equal(fused(tokens, fused.new_cache()), plain(tokens, plain.new_cache()))


def test_sums_fused_into_the_products_are_the_consumers_sums():
    assert TEST_TILES.fused_sums and fused_matches_unfused(ExactPass)


def test_sums_are_the_same_whichever_split_arrives_last():
    """Programs take the splits and attention segments last to first (Tiles.reversed), so in the interpreter's grid
    order split 0 arrives last and adds the others: the same bits. A GPU's arrival order varies by itself; the
    device check runs this twin there too."""
    assert fused_matches_unfused(ExactPass, reversed=True)


def test_the_fused_sum_check_catches_another_order():
    assert not fused_matches_unfused(SumsInReverse)


# ------------------------------------------------------------------ the gated activation in the gate|up product
class PairedWithTheNeighbour(ExactPass):
    """Broken: the product pairs each gate column with the next column's up (the up half rolled by one)."""

    def _gated(self, gate_up, h):
        gate, up = gate_up.chunk(2)
        return super()._gated(torch.cat([gate, up.roll(1, 0)]), h)


def fused_act_matches_kernel(name: str, pass_type=ExactPass, intermediate: int = 96) -> bool:
    """A prompt block's logits with act(gate) * up computed in the gate|up product's tiles against the activation
    kernel's. 96 pairs: the second 64-pair tile of the test tiles is half empty."""
    from gpu_models import on_gpu_path
    from testlib import TINY_CONFIGS, make_tiny_model

    def model(pass_type, tiles):
        built = make_tiny_model(seed=9, max_positions=64, intermediate_size=intermediate, **TINY_CONFIGS[name])
        return on_gpu_path(built, pass_type, tiles)

    fused = model(pass_type, TEST_TILES)
    plain = model(ExactPass, dataclasses.replace(TEST_TILES, fused_act=False))
    tokens = tokens_for(plain, 6, seed=4)
    return torch.equal(fused(tokens, fused.new_cache()), plain(tokens, plain.new_cache()))


@pytest.mark.parametrize("name", ["qwen2-gqa-bias", "gemma3-windowed"])  # SiLU, GELU
def test_the_activation_in_the_gate_up_product_is_the_activation_kernels(name):
    assert TEST_TILES.fused_act and fused_act_matches_kernel(name)


def test_the_fused_activation_check_catches_a_gate_paired_with_the_wrong_up():
    assert not fused_act_matches_kernel("qwen2-gqa-bias", PairedWithTheNeighbour)


# ------------------------------------------------------------------ weights on the MMA's M side (issue 64)
def test_products_with_the_weights_on_the_mmas_m_side_keep_every_row_exact():
    """Tiles.swapped(): every product's tiles transposed over 16-row tiles (a decode step multiplies 16 rows, not 64).
    Every pass takes them, so blocks, trees' chains and batched rows keep their decode steps' bits; and the
    transposed tile computes the same product (to float32 rounding). Under the interpreter the transposed tile gives
    the other's bits (its float32 dot is NumPy's either way), so no twin choosing the tile by rows can fail here: the
    device check's part `swap` compares them on a GPU's MMA."""
    tiles = TEST_TILES.swapped()
    assert tiles.swap_ab and tiles.block_m == 16
    model = tiny_gpu_model(tiles=tiles)
    assert blocks_match_steps(model, SHORT_BLOCKS) == []
    assert batch_problems(model) == []
    plain = tiny_gpu_model()
    tokens = tokens_for(model, PROMPT, seed=5)
    torch.testing.assert_close(model(tokens, model.new_cache()), plain(tokens, plain.new_cache()), rtol=1e-4, atol=1e-4)



# ------------------------------------------------------------------ a sublayer's end in its last product (issue 64)
# Two tiles of 32 columns across the tiny models' hidden width of 64: a row block's last tile ends the sublayer
RESIDUAL_TILES = dataclasses.replace(TEST_TILES, block_n=32, fused_residual=True)


class EndsATileEarly(ExactPass):
    """Broken: a product ends its rows (a sublayer, the QKV epilogue) when the last tile but one of a row block is
    summed (the last one's sums not yet there). With two tiles a block, every tile ends the sublayer."""

    def _product_end(self, parts, t, n, residual, qkv):
        args, consts = super()._product_end(parts, t, n, residual, qkv)
        return (args[:5] + (args[5] - 1,) + args[6:] if consts else args), consts


def fused_residual_matches_kernel(name: str, pass_type=ExactPass, tiles: Tiles = RESIDUAL_TILES) -> bool:
    """A prompt block's logits with each sublayer (or QKV epilogue) ended in its product's last tiles against the
    residual (and QKV epilogue) kernel's."""
    fused = tiny_gpu_model(name, pass_type=pass_type, tiles=tiles)
    plain = tiny_gpu_model(name, tiles=dataclasses.replace(tiles, fused_residual=False, fused_qkv=False))
    tokens = tokens_for(plain, 6, seed=4)
    return torch.equal(fused(tokens, fused.new_cache()), plain(tokens, plain.new_cache()))


@pytest.mark.parametrize("name", ["qwen2-gqa-bias", "gemma3-windowed"])  # Gemma 3: its norms after the sublayers
def test_a_sublayer_ended_in_its_products_tiles_is_the_residual_kernels(name):
    """Tiles.fused_residual: x += the product and the next RMSNorm run in the output and down products' last tile of
    each row block (two launches a layer fewer), by the residual kernel's formula on the same sums."""
    model = tiny_gpu_model(name, tiles=RESIDUAL_TILES)
    assert model.config.hidden_size // RESIDUAL_TILES.block_n == 2  # the row block's counter decides
    assert fused_residual_matches_kernel(name)


def test_a_sublayer_ended_in_its_products_tiles_keeps_every_row_exact():
    """With 16-row transposed tiles (a row block of a pass holds rows of several lengths): blocks keep their steps'
    bits."""
    assert blocks_match_steps(tiny_gpu_model(tiles=RESIDUAL_TILES.swapped()), SHORT_BLOCKS) == []


def test_the_fused_residual_check_catches_an_end_before_the_last_tile():  # x += the sum, twice
    assert not fused_residual_matches_kernel("qwen2-gqa-bias", EndsATileEarly)


# ------------------------------------------------------------------ the QKV epilogue in the QKV product (issue 64)
QKV_TILES = dataclasses.replace(TEST_TILES, block_n=32, fused_qkv=True)


@pytest.mark.parametrize("name", ["qwen2-gqa-bias", "gemma3-windowed"])  # biases; per-head q/k norms
def test_the_qkv_epilogue_in_its_products_tiles_is_the_epilogue_kernels(name):
    """Tiles.fused_qkv: bias, q/k norms, rotary embedding and cache writes run in the QKV product's last tile of each
    row block (one launch a layer fewer), by the epilogue kernel's formula on the same sums."""
    model = tiny_gpu_model(name, tiles=QKV_TILES)
    c = model.config
    assert (c.q_size + 2 * c.kv_size) // QKV_TILES.block_n >= 4  # the twin's early end misses a tile's sums
    assert fused_residual_matches_kernel(name, tiles=QKV_TILES)


def test_every_fusion_together_keeps_every_row_exact():
    """Five launches a layer: QKV with its epilogue, attention with its merge, output with the residual, gate|up with
    the activation, down with the residual; 16-row transposed tiles; blocks keep their steps' bits."""
    tiles = dataclasses.replace(RESIDUAL_TILES, fused_qkv=True).swapped()
    assert blocks_match_steps(tiny_gpu_model("gemma3-windowed", tiles=tiles), SHORT_BLOCKS) == []


def test_the_fused_qkv_check_catches_an_end_before_the_last_tile():
    assert not fused_residual_matches_kernel("qwen2-gqa-bias", EndsATileEarly, tiles=QKV_TILES)
