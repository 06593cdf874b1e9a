"""The int8 target's matmul (kernels/quant_dot.cpp): right values, and every row of a block bitwise equal
to the same row computed alone, for every block type and instruction-set path the machine has."""
import numpy as np
import pytest
import torch

from specdecode import kernels

TYPES = ("Q4_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q5_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS", "Q5_1")
# float16 fields of each block type, as byte offsets (random bytes there could be inf or NaN)
SCALE_OFFSETS = {"Q6_K": [208], "Q4_K": [0, 2], "Q4_1": [0, 2], "Q8_0": [0], "Q4_0": [0], "Q5_0": [0],
                 "Q5_K": [0, 2], "Q3_K": [108], "Q2_K": [80, 82], "IQ4_NL": [0], "IQ4_XS": [0], "Q5_1": [0, 2]}


def activation_block(name: str) -> int:
    """Values per activation scale: 256 for the types with 256-weight blocks (k-quants, IQ4_XS), else 32."""
    import gguf

    return 256 if gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]][0] == 256 else 32


@pytest.fixture(scope="module")
def kernel():
    k = kernels.load_kernel()
    if k is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    return k


def isa_paths(kernel) -> list[str]:
    return kernel.quant_isa_paths()


def random_blocks(name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """[rows, bytes] of random blocks of a ggml type, every float16 scale finite and moderate."""
    import gguf

    qtype = gguf.GGMLQuantizationType[name]
    block_weights, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * cols // block_weights, block_bytes), dtype=np.uint8)
    for offset in SCALE_OFFSETS[name]:
        scales = rng.uniform(1e-3, 2e-2, size=len(blocks)).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def quantized_activations(x: np.ndarray, block: int) -> np.ndarray:
    """The kernel's activation rounding, in float64: int8 with one scale (max|x|/127) per block of a row."""
    v = x.astype(np.float32).reshape(x.shape[0], -1, block)
    amax = np.abs(v).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.clip(np.rint(v * inv), -127, 127)
    return (q * (amax.astype(np.float64) / 127)).reshape(x.shape)


def make_parts(names, rows_each, cols, seed=0):
    import gguf

    parts, dense = [], []
    for i, name in enumerate(names):
        blocks = random_blocks(name, rows_each + 3 * i, cols, seed + i)
        qtype = gguf.GGMLQuantizationType[name]
        parts.append((int(qtype), torch.from_numpy(blocks)))
        dense.append(gguf.quants.dequantize(blocks, qtype).astype(np.float64))
    return parts, np.concatenate(dense)


def run(kernel, x, parts, isa="auto", perturb=-1):
    return kernel.quant_linear(x, [p for _, p in parts], [t for t, _ in parts], isa, perturb)


@pytest.mark.parametrize("name", TYPES)
def test_values_are_the_dequantized_weights_times_the_quantized_activations(kernel, name):
    """Against float64 arithmetic on the same integers: only float32 rounding of the scales may differ,
    so a wrong nibble, bit or scale shows as a large error."""
    cols = 512
    parts, dense = make_parts([name], 13, cols)
    x = torch.randn(5, cols, generator=torch.Generator().manual_seed(1))
    reference = quantized_activations(x.numpy(), activation_block(name)) @ dense.T
    for isa in isa_paths(kernel):
        y = run(kernel, x, parts, isa).numpy()
        scale = np.abs(reference).max()
        assert np.abs(y - reference).max() <= 1e-5 * scale, (name, isa)
    # and close to the float product the int8 activations approximate
    exact = x.numpy().astype(np.float64) @ dense.T
    assert np.abs(y - exact).max() <= 0.05 * np.abs(exact).max()


def other_isa_paths(kernel) -> list[str]:
    """The paths besides AVX2, for the checks that compare paths with each other: with none (an AVX2-only CPU)
    such a check would compare AVX2 with itself and pass having checked nothing, so it skips, saying why."""
    others = [isa for isa in isa_paths(kernel) if isa != "avx2"]
    if not others:
        pytest.skip("only the avx2 path runs on this CPU (no AVX-512 VNNI or AMX): nothing to compare it with")
    return others


ROW_BLOCK_NAMES = [(n,) for n in TYPES] + [("Q4_K", "Q4_K", "Q6_K"), ("Q5_0", "Q8_0"), ("Q5_K", "Q3_K", "Q2_K", "IQ4_XS"),
                                           ("IQ4_NL", "Q5_1")]


def rows_alone_and_in_blocks(kernel, names, isa):
    """Blocks of 1..16 rows, every row against the same row alone; returns the rows alone."""
    cols = 768 if any(activation_block(n) == 256 for n in names) else 224
    parts, _ = make_parts(names, 70, cols, seed=5)
    x = torch.randn(16, cols, generator=torch.Generator().manual_seed(2)) * 3
    alone = torch.cat([run(kernel, x[i : i + 1], parts, isa) for i in range(16)])
    for rows in range(2, 17):
        block = run(kernel, x[:rows], parts, isa)
        assert torch.equal(block, alone[:rows]), (names, isa, rows)
    return alone


@pytest.mark.parametrize("names", ROW_BLOCK_NAMES)
def test_each_row_of_a_block_is_bitwise_the_row_alone(kernel, names):
    """On each instruction-set path. Row counts of the weight leave tile and chunk remainders."""
    for isa in isa_paths(kernel):
        rows_alone_and_in_blocks(kernel, names, isa)


@pytest.mark.parametrize("names", ROW_BLOCK_NAMES)
def test_every_isa_path_gives_the_avx2_bits(kernel, names):
    """The paths agree with each other bit for bit (skipped, visibly, where AVX2 is the only one)."""
    others = other_isa_paths(kernel)
    reference = rows_alone_and_in_blocks(kernel, names, "avx2")
    for isa in others:
        assert torch.equal(rows_alone_and_in_blocks(kernel, names, isa), reference), (names, isa)


def test_the_row_check_fails_when_one_rows_summation_order_changes(kernel):
    """The broken variant: row 3 of a block sums its lanes in another order. The comparison of the
    previous test must catch it, on every path."""
    assert_a_broken_row_is_caught(kernel, make_parts(("Q4_K", "Q6_K"), 70, 768, seed=5)[0])


@pytest.mark.parametrize("name", ["Q5_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS", "Q5_1"])
def test_the_row_check_fails_for_each_newer_type_when_one_rows_summation_order_changes(kernel, name):
    """The same broken variant on the block types added for GGUF files of every common quantization: full tiles
    (8 or 16 tokens) and remainders."""
    parts = make_parts((name,), 37, 768, seed=5)[0]
    for rows in (5, 9, 16):
        assert_a_broken_row_is_caught(kernel, parts, rows)


def assert_a_broken_row_is_caught(kernel, parts, rows: int = 9):
    x = torch.randn(rows, 768, generator=torch.Generator().manual_seed(2))
    for isa in isa_paths(kernel):
        alone = torch.cat([run(kernel, x[i : i + 1], parts, isa) for i in range(rows)])
        broken = run(kernel, x, parts, isa, perturb=3)
        assert torch.equal(broken[:3], alone[:3]) and torch.equal(broken[4:], alone[4:])
        assert not torch.equal(broken[3], alone[3])


def test_unpacked_q4_k_gives_the_q4_k_bits(kernel):
    """QuantWeight repacks Q4_K at load (scales and mins unpacked to bytes, kernels.Q4_K_UNPACKED): every row
    count and path gives the bits of the GGUF layout, so the repack changes speed only. A repack that
    swaps two scales must fail here (checked by the second half)."""
    parts, _ = make_parts(("Q4_K", "Q6_K"), 70, 768, seed=8)
    unpacked = [(kernels.Q4_K_UNPACKED, kernel.repack_q4k(parts[0][1])), parts[1]]
    x = torch.randn(16, 768, generator=torch.Generator().manual_seed(4)) * 3
    for isa in isa_paths(kernel):
        for rows in (1, 2, 5, 9, 16):
            assert torch.equal(run(kernel, x[:rows], unpacked, isa), run(kernel, x[:rows], parts, isa)), (isa, rows)
    swapped = unpacked[0][1].clone()
    swapped[:, [4, 5]] = swapped[:, [5, 4]]  # scales 0 and 1 of every first block
    broken = [(kernels.Q4_K_UNPACKED, swapped), parts[1]]
    assert not torch.equal(run(kernel, x[:1], broken), run(kernel, x[:1], parts))


def interleaved(kernel, parts):
    """The parts in the kernel's 16-row interleaved layouts (Q4_K via its unpacked form)."""
    out = []
    for block_type, blocks in parts:
        if block_type == 12:
            block_type, blocks = kernels.Q4_K_UNPACKED, kernel.repack_q4k(blocks)
        out.append((kernels.weights.INTERLEAVED[block_type], kernel.interleave_k(blocks, block_type, True)))
    return out


def test_interleaved_k_quants_give_the_gguf_bits(kernel):
    """Q4_K and Q6_K in groups of 16 interleaved rows (kernels.Q4_K_X16, Q6_K_X16): every row count 1..16, some
    larger ones, and every path (AMX tiles for 16 tokens included, where present) give the bits of the GGUF layout,
    and the interleave undoes exactly. A layout with two rows' scales swapped must fail, alone and in a block."""
    parts, _ = make_parts(("Q4_K", "Q6_K"), 80, 768, seed=11)  # 80 and 83 rows: 83 is not interleaved
    parts[1] = (parts[1][0], parts[1][1][:80])
    x16 = interleaved(kernel, parts)
    assert torch.equal(kernel.interleave_k(x16[0][1], kernels.Q4_K_UNPACKED, False), kernel.repack_q4k(parts[0][1]))
    assert torch.equal(kernel.interleave_k(x16[1][1], 14, False), parts[1][1])
    x = torch.randn(40, 768, generator=torch.Generator().manual_seed(4)) * 3
    for isa in isa_paths(kernel):
        for rows in (*range(1, 17), 31, 32, 40):
            assert torch.equal(run(kernel, x[:rows], x16, isa), run(kernel, x[:rows], parts, isa)), (isa, rows)
    for i, scale_at in ((0, 64), (1, 32)):  # sub-block 0's scale of rows 0 and 1, first group and block
        swapped = x16[i][1].clone().view(-1, 16 * x16[i][1].shape[1] // 3)
        swapped[0, [scale_at, scale_at + 1 + i]] = swapped[0, [scale_at + 1 + i, scale_at]]
        broken = [(t, swapped.view(b.shape) if j == i else b) for j, (t, b) in enumerate(x16)]
        for isa in isa_paths(kernel):
            for rows in (1, 16):
                assert not torch.equal(run(kernel, x[:rows], broken, isa), run(kernel, x[:rows], parts, isa)), (i, isa, rows)


def test_the_fast_interleave_moves_every_bit_as_the_field_walk(kernel):
    """Loading assembles the interleaved Q4_K, Q6_K and Q5_0 group blocks byte by byte (q4k_group_to_x16,
    q6k_group_to_x16, q50_group_to_x16); the field-by-field walk defines the layout. On random bytes (every bit pattern, not only
    valid blocks), over several groups and blocks, the two agree bit for bit, and the walk's inverse gives the
    input back."""
    gen = torch.Generator().manual_seed(17)
    for block_type, bytes_per_block in ((kernels.Q4_K_UNPACKED, 148), (14, 210), (6, 22)):
        blocks = torch.randint(0, 256, (48, 3 * bytes_per_block), dtype=torch.uint8, generator=gen)
        fast = kernel.interleave_k(blocks, block_type, True)
        assert torch.equal(fast, kernel.interleave_k(blocks, block_type, True, field_walk=True)), block_type
        assert torch.equal(kernel.interleave_k(fast, block_type, False), blocks), block_type


def test_interleaved_q5_0_gives_the_gguf_bits(kernel):
    """Q5_0 in groups of 16 interleaved rows (kernels.Q5_0_X16, the 0.5B draft's matrices): every row count 1..16
    and path gives the bits of the GGUF layout, and the interleave undoes exactly. Layouts with two rows' scales
    swapped, or one fifth bit moved, must fail."""
    parts, _ = make_parts(("Q5_0",), 48, 224, seed=13)
    x16 = interleaved(kernel, parts)
    assert torch.equal(kernel.interleave_k(x16[0][1], 6, False), parts[0][1])
    x = torch.randn(16, 224, generator=torch.Generator().manual_seed(4)) * 3
    for isa in isa_paths(kernel):
        for rows in range(1, 17):
            assert torch.equal(run(kernel, x[:rows], x16, isa), run(kernel, x[:rows], parts, isa)), (isa, rows)
    group_block = x16[0][1].view(-1, 16 * 22)
    for a, b in (([0, 1], [2, 3]), ([288], [289])):  # scales of rows 0 and 1; fifth bits of rows 0-1 and 2-3
        swapped = group_block.clone()
        swapped[0, a + b] = swapped[0, b + a]
        for isa in isa_paths(kernel):
            broken = [(kernels.Q5_0_X16, swapped.view(x16[0][1].shape))]
            assert not torch.equal(run(kernel, x[:1], broken, isa), run(kernel, x[:1], parts, isa)), (a, isa)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q5_0"])
def test_the_interleaved_row_check_fails_when_one_rows_summation_order_changes(kernel, name):
    parts = interleaved(kernel, make_parts((name,), 32, 768, seed=12)[0])
    for rows in (9, 16, 40):  # 16 and 40: full tiles of 16 and 32 tokens (the AMX tiles, where present)
        assert_a_broken_row_is_caught(kernel, parts, rows)


def draft_sums(kernel, parts):
    """Q5_0 parts in the draft models' layout (kernels.Q5_0_X16_SUMS): Q5_0_X16's bytes, each block's sum whole."""
    return [(kernels.Q5_0_X16_SUMS, blocks) for _, blocks in interleaved(kernel, parts)]


def test_the_draft_q5_0_layout_has_the_right_values_and_every_row_its_own_bits(kernel):
    """The draft models' Q5_0 (block sums whole before their one FMA, where Q5_0 keeps 8 float lanes): against
    float64 arithmetic on the same integers, every row of blocks of 1..40 tokens (tiles of 8, remainders) bitwise
    the row alone on every path, the paths alike; and its roundings are not Q5_0's (it is for drafts only)."""
    parts, dense = make_parts(("Q5_0",), 48, 224, seed=13)
    sums = draft_sums(kernel, parts)
    x = torch.randn(40, 224, generator=torch.Generator().manual_seed(4)) * 3
    reference = quantized_activations(x.numpy(), 32) @ dense.T
    results = {}
    for isa in isa_paths(kernel):
        y = run(kernel, x, sums, isa)
        assert np.abs(y.numpy() - reference).max() <= 1e-5 * np.abs(reference).max(), isa
        alone = torch.cat([run(kernel, x[i : i + 1], sums, isa) for i in range(40)])
        for rows in (1, 2, 7, 8, 9, 16, 23, 40):
            assert torch.equal(run(kernel, x[:rows], sums, isa), alone[:rows]), (isa, rows)
        assert not torch.equal(y, run(kernel, x, parts, isa)), isa
        results[isa] = y
    assert all(torch.equal(y, results["avx2"]) for y in results.values())


def test_the_draft_q5_0_row_check_fails_when_one_rows_summation_order_changes(kernel):
    sums = draft_sums(kernel, make_parts(("Q5_0",), 32, 768, seed=12)[0])
    for rows in (5, 8, 9, 16, 40):
        assert_a_broken_row_is_caught(kernel, sums, rows)


def test_a_draft_model_takes_the_draft_layouts_and_a_target_keeps_the_files(kernel):
    """QuantWeight.as_draft relabels Q5_0_X16 only; the rows it selects back out (a draft's head) are Q5_0's."""
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(5))
    q5 = kernels.QuantWeight(make_parts(("Q5_0",), 32, 512, seed=9)[0])
    target_bits = q5.matmul(x)
    q4 = kernels.QuantWeight(make_parts(("Q4_K",), 32, 512, seed=9)[0]).as_draft()
    assert q4.types == [kernels.Q4_K_X16]
    assert q5.as_draft().types == [kernels.Q5_0_X16_SUMS]
    assert not torch.equal(q5.matmul(x), target_bits)
    assert q5.index_select(0, torch.tensor([7, 30])).types == [6]


def test_quant_weight_unpacks_q4_k(kernel):
    parts, _ = make_parts(("Q4_K",), 64, 512, seed=9)
    weight = kernels.QuantWeight(parts)
    assert weight.types == [kernels.Q4_K_X16] and weight.shape == (64, 512)
    picked = weight.index_select(0, torch.tensor([3, 1]))
    assert picked.types == [kernels.Q4_K_UNPACKED] and picked.shape == (2, 512)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(5))
    assert torch.equal(picked.matmul(x), weight.matmul(x)[:, [3, 1]])
    odd = kernels.QuantWeight(make_parts(("Q4_K",), 40, 512, seed=9)[0])
    assert odd.types == [kernels.Q4_K_UNPACKED]  # not a multiple of 16 rows: not interleaved
    q6 = kernels.QuantWeight(make_parts(("Q6_K",), 48, 512, seed=9)[0])
    assert q6.types == [kernels.Q6_K_X16]
    assert torch.equal(q6.index_select(0, torch.tensor([5, 40])).matmul(x), q6.matmul(x)[:, [5, 40]])
    q5 = kernels.QuantWeight(make_parts(("Q5_0",), 32, 512, seed=9)[0])
    assert q5.types == [kernels.Q5_0_X16]
    assert torch.equal(q5.index_select(0, torch.tensor([7, 30])).matmul(x), q5.matmul(x)[:, [7, 30]])


def test_results_do_not_depend_on_the_thread_count(kernel):
    parts, _ = make_parts(("Q4_K", "Q6_K"), 70, 768, seed=6)
    x = torch.randn(5, 768, generator=torch.Generator().manual_seed(3))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run(kernel, x, parts)
        torch.set_num_threads(max(2, before))
        assert torch.equal(one, run(kernel, x, parts))
    finally:
        torch.set_num_threads(before)


def test_q8_0_requantization_round_trips_within_half_a_step(kernel):
    import gguf

    w = torch.randn(10, 96, generator=torch.Generator().manual_seed(4))
    blocks = kernel.quantize_q8_0(w)
    back = gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType.Q8_0).reshape(10, 96)
    step = np.abs(w.numpy().reshape(10, 3, 32)).max(-1, keepdims=True) / 127
    assert (np.abs(back - w.numpy()).reshape(10, 3, 32) <= step * 0.51 + 1e-6).all()


def test_bad_arguments_are_errors_not_crashes(kernel):
    parts, _ = make_parts(("Q4_K",), 4, 256)
    with pytest.raises(RuntimeError, match="rows"):
        run(kernel, torch.zeros(65, 256), parts)  # more rows than one call takes
    with pytest.raises(RuntimeError, match="row size"):
        run(kernel, torch.zeros(1, 512), parts)
    with pytest.raises(RuntimeError, match="unsupported"):
        kernel.quant_linear(torch.zeros(1, 256), [parts[0][1]], [16], "auto", -1)  # IQ2_XXS
    assert set(kernel.quant_block_types()) == kernels.QUANT_KERNEL_TYPES
