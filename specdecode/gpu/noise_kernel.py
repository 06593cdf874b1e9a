"""PositionNoise's exponential race on the device: the token of row t is argmax_i p_t(i) / E(seed_t, position_t, i)
over a [rows, vocab] probability tensor, with no host read (sampling.py's choose_rows and PositionNoise.choose call it
on CUDA tensors; the tests run it in Triton's interpreter).

Bit for bit the host's race (PositionNoise.race), so a seed gives the same text on either path:
- the hash is splitmix64 in uint64 (wrapping products, logical shifts), keyed as PositionNoise._position_key and
  PositionNoise.exponentials key it, from each row's key (PositionNoise.key_bits) and position;
- -log(u) is sampling.neg_log's sequence of correctly rounded float64 operations, not the device's log, and every
  launch passes enable_fp_fusion=False: a fused multiply-add rounds once where the host rounds twice, and one ulp
  of difference in a draw can flip a race at a near tie;
- p (converted exactly to float64) / E is a correctly rounded division: float64 `/` lowers to div.rn.f64 on
  NVIDIA GPUs (Triton's approximate division is float32's; tl.math.div_rn takes float32 only);
- tokens with p <= 0 (or NaN) never win; ties go to the lowest token id, as numpy's argmax does.

The vocabulary is cut into chunks of BLOCK * BLOCKS tokens, one program each (a row alone fills the device); a
second kernel picks each row's winner among its chunks. An argmax whose ties go to the lowest id does not depend on
the order it visits tokens in, so the split changes nothing in the result.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..sampling import GOLDEN, LN2_BITS, LOG_SERIES_TERMS, SPLITMIX_MULTIPLIERS, SQRT2_BITS

_GOLDEN = tl.constexpr(GOLDEN)
_MIX_A = tl.constexpr(SPLITMIX_MULTIPLIERS[0])
_MIX_B = tl.constexpr(SPLITMIX_MULTIPLIERS[1])
_LN2_BITS = tl.constexpr(LN2_BITS)
_SQRT2_BITS = tl.constexpr(SQRT2_BITS)
_LOG_SERIES_TERMS = tl.constexpr(LOG_SERIES_TERMS)

BLOCK = 1024  # tokens a program races at once
BLOCKS = 8  # blocks a program races in turn: 8192 tokens a program, 19 programs a row for Qwen's 152k vocabulary


@triton.jit
def _float64_of(bits: tl.constexpr):
    # A Python float in a Triton function becomes a float32 constant: float64 constants are built from their bits.
    return tl.full([], bits, tl.int64).to(tl.float64, bitcast=True)


@triton.jit
def _series_coefficient(k: tl.constexpr):
    # sampling.log_series_coefficient: 2 / (2k + 1), one correctly rounded float64 division.
    return tl.full([], 2.0, tl.float64) / tl.full([], 2 * k + 1, tl.float64)


@triton.jit
def neg_log(u):
    """sampling.neg_log, step for step (see it for the scheme): u float64 in [2**-54, 1]."""
    bits = u.to(tl.uint64, bitcast=True)
    exponent = (bits >> 52).to(tl.int64) - 1023
    m = ((bits & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000).to(tl.float64, bitcast=True)  # [1, 2)
    high = m > _float64_of(_SQRT2_BITS)
    m = tl.where(high, m * 0.5, m)  # 0.5, 1.0, 2.0: powers of two, exact in float32 constants too
    exponent = tl.where(high, exponent + 1, exponent)
    f = m - 1.0
    s = f / (f + 2.0)
    z = s * s
    series = _series_coefficient(_LOG_SERIES_TERMS)
    for k in tl.static_range(_LOG_SERIES_TERMS - 1, 0, -1):
        series = series * z + _series_coefficient(k)
    series = z * series
    half_f_squared = 0.5 * f * f
    log_m = f - (half_f_squared - s * (half_f_squared + series))
    return (-exponent).to(tl.float64) * _float64_of(_LN2_BITS) - log_m


@triton.jit
def _mix(z):
    # PositionNoise._mix: splitmix64's finaliser on uint64 (products wrap, shifts are logical)
    z = (z ^ (z >> 30)) * _MIX_A
    z = (z ^ (z >> 27)) * _MIX_B
    return z ^ (z >> 31)


@triton.jit
def _uniform(key, position, ids):
    """PositionNoise.exponentials' uniforms in (0, 1]: key and position uint64 scalars, ids uint64 token ids."""
    counter = _mix(position * _GOLDEN + _GOLDEN)
    position_key = _mix(_mix(key ^ counter) + key)  # PositionNoise._position_key
    bits = _mix(position_key ^ _mix(ids * _GOLDEN + 1))
    return ((bits >> 11).to(tl.float64) + 0.5) * _float64_of(0x3CA0000000000000)  # 2**-53


@triton.jit
def exponentials(key, position, ids):
    """E(position, i) of the seed whose key is `key` for token ids `ids`: PositionNoise.exponentials, same bits."""
    return neg_log(_uniform(key, position, ids))


@triton.jit
def _race_kernel(probs_ptr, row_stride, column_stride, keys_ptr, positions_ptr, best_ptr, winner_ptr, vocab, chunks,
                 BLOCK: tl.constexpr, BLOCKS: tl.constexpr, NOISE: tl.constexpr):
    """Program (row, chunk): the best p / E of the chunk's tokens and its lowest token id; -1.0 and -1 where no
    token of the chunk has mass. NOISE(key, position, ids) -> E: `exponentials` (a test passes a broken twin)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    key = tl.load(keys_ptr + row).to(tl.uint64, bitcast=True)
    position = tl.load(positions_ptr + row).to(tl.uint64, bitcast=True)
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], -1.0, tl.float64)  # every p / E with p > 0 is > 0
    winner = tl.full([BLOCK], -1, tl.int32)
    for block in range(BLOCKS):
        ids = (chunk * BLOCKS + block) * BLOCK + lanes
        inside = ids < vocab
        p = tl.load(probs_ptr + row.to(tl.int64) * row_stride + ids.to(tl.int64) * column_stride, mask=inside,
                    other=0.0).to(tl.float64)
        race = tl.where(p > 0, p / NOISE(key, position, ids.to(tl.uint64)), -1.0)
        better = race > best  # strict: a lane's later (higher) id never displaces an equal earlier one
        best = tl.where(better, race, best)
        winner = tl.where(better, ids, winner)
    top = tl.max(best, 0)
    tl.store(best_ptr + row * chunks + chunk, top)
    tl.store(winner_ptr + row * chunks + chunk, tl.min(tl.where(best == top, winner, vocab), 0))


@triton.jit
def _pick_kernel(best_ptr, winner_ptr, tokens_ptr, chunks, CHUNKS: tl.constexpr):
    """Program row: the lowest id among the chunks' winners of the best p / E; -1 where no chunk has mass."""
    row = tl.program_id(0)
    lanes = tl.arange(0, CHUNKS)
    inside = lanes < chunks
    best = tl.load(best_ptr + row * chunks + lanes, mask=inside, other=-1.0)
    winner = tl.load(winner_ptr + row * chunks + lanes, mask=inside, other=-1)
    top = tl.max(best, 0)
    # top == -1.0: every chunk is empty and every winner -1
    tl.store(tokens_ptr + row, tl.min(tl.where(best == top, winner, 2**31 - 1), 0).to(tl.int64))


def choose_rows(probs: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor, noise=exponentials,
                block: int = BLOCK, blocks: int = BLOCKS) -> torch.Tensor:
    """probs [T, V] (float32, or any float dtype: read exactly as float64), keys [T] int64 (PositionNoise.key_bits),
    positions [T] int64 (>= 0), all on one device -> tokens [T] int64 there, -1 for a row with no mass. Two launches,
    no host read. noise and the block sizes are for tests (a broken twin; many chunks on a small vocabulary)."""
    rows, vocab = probs.shape
    tokens = torch.empty(rows, dtype=torch.int64, device=probs.device)
    if rows == 0:
        return tokens
    chunks = triton.cdiv(vocab, block * blocks)
    best = torch.empty(rows, chunks, dtype=torch.float64, device=probs.device)
    winner = torch.empty(rows, chunks, dtype=torch.int32, device=probs.device)
    # enable_fp_fusion=False: no a * b + c of neg_log or the race may become one fused multiply-add (module doc)
    _race_kernel[(rows, chunks)](probs, probs.stride(0), probs.stride(1), keys, positions, best, winner, vocab, chunks,
                                 BLOCK=block, BLOCKS=blocks, NOISE=noise, enable_fp_fusion=False)
    _pick_kernel[(rows,)](best, winner, tokens, chunks, CHUNKS=triton.next_power_of_2(chunks), enable_fp_fusion=False)
    return tokens
