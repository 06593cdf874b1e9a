"""The exponential race on the device (gpu/noise_kernel.py) draws the host's token (PositionNoise.race) for every
seed, position and distribution: the noise is bitwise the host's (the hash, and -log written in correctly rounded
float64 operations), the race keeps numpy's tie rule, a row without mass gives -1. Under Triton's interpreter on a
CPU, on CUDA where there is one. Broken twins that must fail: noise drawn one position late, and noise whose -log
is the device's own log (one ulp off on a fifth of the draws, which flips a crafted near tie)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from specdecode.sampling import PositionNoise, SamplingParams, choose_rows, neg_log, probabilities, read_tokens

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
from specdecode.gpu import noise_kernel  # noqa: E402  (Triton first: skipped without it)
from specdecode.gpu.noise_kernel import _uniform, exponentials, neg_log as device_neg_log  # noqa: E402
from testlib import near_tie  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEEDS = (0, 1, 12345, 2**62 + 7, 2**63 - 1)
POSITIONS = (0, 1, 17, 4095, 2**40, 2**62)
SMALL = dict(block=64, blocks=2)  # chunks of 128 tokens: many blocks and chunks on a small vocabulary


@triton.jit
def _neg_log_kernel(u_ptr, out_ptr, n, BLOCK: tl.constexpr):
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = at < n
    tl.store(out_ptr + at, device_neg_log(tl.load(u_ptr + at, mask=inside, other=1.0)), mask=inside)


@triton.jit
def _noise_kernel(keys_ptr, positions_ptr, out_ptr, vocab, BLOCK: tl.constexpr, NOISE: tl.constexpr):
    """E of every token of each row's (key, position), as NOISE draws them on the device."""
    row = tl.program_id(0)
    ids = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    key = tl.load(keys_ptr + row).to(tl.uint64, bitcast=True)
    position = tl.load(positions_ptr + row).to(tl.uint64, bitcast=True)
    tl.store(out_ptr + row * vocab + ids, NOISE(key, position, ids.to(tl.uint64)), mask=ids < vocab)


@triton.jit
def one_position_late(key, position, ids):
    """Broken twin: the draws of the next position (an off-by-one in the position a row is sampled at)."""
    return exponentials(key, position + 1, ids)


@triton.jit
def device_log(key, position, ids):
    """Broken twin: -log from the device's log (libdevice; numpy's log under the interpreter) instead of neg_log."""
    return -tl.log(_uniform(key, position, ids))


def rows_of(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=DEVICE)


def device_noise(noise: PositionNoise, position: int, vocab: int, twin=exponentials) -> np.ndarray:
    out = torch.empty(1, vocab, dtype=torch.float64, device=DEVICE)
    _noise_kernel[(1, triton.cdiv(vocab, 256))](rows_of([noise.key_bits]), rows_of([position]), out, vocab, BLOCK=256,
                                                NOISE=twin, enable_fp_fusion=False)
    return out[0].cpu().numpy()


def uniforms() -> np.ndarray:
    """u as PositionNoise makes them, ((k + 0.5) * 2**-53), over random k and the ends of the range, and the points
    where neg_log's reduction changes: powers of two and the neighbours of sqrt(1/2) * 2**e."""
    k = np.random.default_rng(0).integers(0, 2**53, 20_000, dtype=np.uint64)
    ends = np.concatenate([np.arange(64, dtype=np.uint64), np.uint64(2**53) - np.arange(1, 64, dtype=np.uint64)])
    u = (np.concatenate([k, ends]).astype(np.float64) + 0.5) * 2.0**-53
    powers = 2.0 ** -np.arange(55.0)
    root = np.sqrt(0.5) * powers[1:]
    near_root = np.concatenate([np.nextafter(root, 0), root, np.nextafter(root, 1)])
    return np.concatenate([u, powers, near_root[near_root >= 2.0**-54]])


def test_neg_log_is_bitwise_the_same_on_the_device():
    """(tests/test_sampling.py checks it against np.log.)"""
    u = uniforms()
    host = neg_log(u)
    out = torch.empty(u.size, dtype=torch.float64, device=DEVICE)
    _neg_log_kernel[(triton.cdiv(u.size, 1024),)](torch.from_numpy(u).to(DEVICE), out, u.size, BLOCK=1024,
                                                  enable_fp_fusion=False)
    device = out.cpu().numpy()
    assert np.array_equal(device.view(np.uint64), host.view(np.uint64)), f"{np.sum(device != host)} draws differ"


@pytest.mark.parametrize("seed", SEEDS)
def test_device_draws_are_the_hosts_bit_for_bit(seed):
    noise, vocab = PositionNoise(seed), 700
    for position in POSITIONS:
        host = noise.exponentials(position, np.arange(vocab))
        assert np.array_equal(device_noise(noise, position, vocab).view(np.uint64), host.view(np.uint64)), position


def test_the_draw_check_catches_the_devices_own_log():
    noise, vocab = PositionNoise(3), 700
    host = noise.exponentials(9, np.arange(vocab))
    twin = device_noise(noise, 9, vocab, twin=device_log)
    assert np.sum(twin != host) > vocab // 20  # a fifth of the draws, one ulp apart under the interpreter


def distributions(rows: int, vocab: int, seed: int) -> list[torch.Tensor]:
    """Processed probabilities [rows, vocab] of random logits: full support, top-k, top-p and min-p truncated."""
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    settings = (SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=40),
                SamplingParams(temperature=1.3, top_p=0.9), SamplingParams(temperature=1.0, min_p=0.05))
    return [probabilities(logits, params) for params in settings]


def host_tokens(probs, positions, noises) -> list[int]:
    return choose_rows(probs, positions, noises, device_kernel=False).tolist()


def device_tokens(probs, positions, noises, twin=exponentials, **sizes) -> list[int]:
    keys = rows_of([noise.key_bits for noise in noises])
    return noise_kernel.choose_rows(probs.to(DEVICE), keys, rows_of(positions), noise=twin, **sizes).tolist()


@pytest.mark.parametrize("vocab, sizes", [(1000, SMALL), (257, SMALL), (77, SMALL), (3000, {})])
def test_device_choose_is_the_hosts(vocab, sizes):
    """Every row of several distributions, seeds and positions; vocabularies not a multiple of a block or chunk."""
    rows = len(SEEDS) * 2
    noises = [PositionNoise(seed) for seed in SEEDS for _ in range(2)]
    positions = [POSITIONS[i % len(POSITIONS)] + i for i in range(rows)]
    for probs in distributions(rows, vocab, seed=vocab):
        host = host_tokens(probs, positions, noises)
        assert host == [noise.choose(row, position) for row, position, noise in zip(probs, positions, noises)]
        assert device_tokens(probs, positions, noises, **sizes) == host


def test_the_choose_check_catches_noise_one_position_late():
    noises = [PositionNoise(seed) for seed in SEEDS]
    positions = list(POSITIONS[: len(SEEDS)])
    probs = distributions(len(SEEDS), 1000, seed=1)[0]
    host = host_tokens(probs, positions, noises)
    late = device_tokens(probs, positions, noises, twin=one_position_late, **SMALL)
    assert sum(a != b for a, b in zip(host, late)) >= len(SEEDS) - 1


def test_choose_rows_through_the_kernel_takes_a_position_tensor():
    noises = [PositionNoise(seed) for seed in SEEDS]
    probs = distributions(len(SEEDS), 300, seed=2)[1].to(DEVICE)
    positions = list(POSITIONS[: len(SEEDS)])
    tokens = choose_rows(probs, rows_of(positions), noises, device_kernel=True)
    assert tokens.device == probs.device and tokens.dtype == torch.int64
    assert tokens.tolist() == host_tokens(probs.cpu(), positions, noises)


def test_ties_go_to_the_lowest_id_across_lanes_blocks_and_chunks():
    """Infinite probabilities race to inf / E = inf: equal values, whatever the draws. The lowest such id wins,
    wherever the others sit (the same lane of a later block, a lower lane of a later chunk)."""
    vocab = 600
    probs = torch.full((4, vocab), 1e-3)
    for row, ids in enumerate(([300, 140, 5], [70, 6], [129, 130, 1, 599], [599])):
        probs[row, ids] = float("inf")
    noises = [PositionNoise(seed) for seed in SEEDS[:4]]
    expected = [5, 6, 1, 599]
    assert host_tokens(probs, [3] * 4, noises) == expected
    assert device_tokens(probs, [3] * 4, noises, **SMALL) == expected


def test_a_row_without_mass_is_minus_one_and_raises_when_read():
    probs = distributions(3, 500, seed=3)[0]
    probs[1] = 0.0
    probs[2, :] = -1.0
    probs[2, 7] = float("nan")  # not > 0: no mass either
    noises = [PositionNoise(seed) for seed in SEEDS[:3]]
    tokens = device_tokens(probs, [0, 1, 2], noises, **SMALL)
    assert tokens[1:] == [-1, -1] and tokens == host_tokens(probs, [0, 1, 2], noises)
    with pytest.raises(ValueError, match="no mass"):
        read_tokens(torch.tensor(tokens))
    with pytest.raises(ValueError, match="no mass"):
        PositionNoise(0).choose(probs[1].to(DEVICE), 0)


def test_the_choose_check_catches_the_devices_own_log_at_a_near_tie():
    """The device's log is one ulp off numpy-rounded neg_log on a fifth of the draws; random distributions almost
    never meet a race that close, so the row is built: two tokens whose races tie to about an ulp. The kernel
    draws the host's token there; the twin draws the other."""
    noise, position, vocab = PositionNoise(11), 5, 64
    found = near_tie(device_noise(noise, position, vocab), device_noise(noise, position, vocab, twin=device_log))
    assert found is not None
    ids, p = found
    probs = torch.zeros(1, vocab)
    probs[0, torch.from_numpy(ids)] = torch.from_numpy(p)
    host = noise.choose(probs[0], position)
    assert device_tokens(probs, [position], [noise]) == [host]
    assert device_tokens(probs, [position], [noise], twin=device_log) != [host]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="PositionNoise.choose takes the kernel on CUDA tensors")
def test_choose_on_a_cuda_tensor_is_the_hosts():
    probs = distributions(4, 151_936, seed=4)
    for row, noise_seed in zip(range(4), SEEDS):
        for probs_of in probs:
            noise = PositionNoise(noise_seed)
            assert noise.choose(probs_of[row].cuda(), 2**40 + row) == noise.choose(probs_of[row], 2**40 + row)
