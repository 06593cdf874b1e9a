"""Logit processing shared by target and draft (temperature, min-p, top-k, top-p, then softmax), and the seeded
noise that samples from the result (PositionNoise; its race also runs on the device: gpu/noise_kernel.py)."""
from __future__ import annotations

import functools
import math
import secrets
import sys
from dataclasses import dataclass, replace

import numpy as np
import torch

from .errors import InputError


MAX_SEED = 2**63 - 1  # seeds are 0..2**63 - 1, as the server's API takes them


def finite_number(value) -> bool:
    """An int or float that a float holds finitely. Not a bool; not an integer past float's range (JSON's 10**400
    parses as one, and math.isfinite raises OverflowError on it rather than answering)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) <= sys.float_info.max if isinstance(value, int) else math.isfinite(value)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None
    min_p: float = 0.0  # 0 = off; else drop tokens below min_p times the top token's probability

    def __post_init__(self):
        if not finite_number(self.temperature) or self.temperature < 0:
            raise InputError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise InputError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not finite_number(self.top_p) or not 0 < self.top_p <= 1:
            raise InputError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not finite_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise InputError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not 0 <= self.seed <= MAX_SEED):
            raise InputError(f"seed must be an integer in 0..{MAX_SEED}, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def noise(self) -> "PositionNoise":
        """The randomness of one generation: from the seed, or a fresh random one."""
        return PositionNoise(secrets.randbits(63) if self.seed is None else self.seed)

    def for_choice(self, index: int) -> "SamplingParams":
        """The settings of choice `index` of a request asking for several answers (`n`): seed + index (wrapping
        past MAX_SEED), so choice 0 is the answer to the request with n = 1 and choice i the answer to the same
        request with seed + i. Without a seed every choice draws its own randomness."""
        return self if index == 0 else replace(self, seed=choice_seed(self.seed, index))


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice `index` of a request with `seed` (see SamplingParams.for_choice)."""
    return None if seed is None else (seed + index) % (MAX_SEED + 1)


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [T, V] -> processed probabilities [T, V] (float32). Not for greedy decoding."""
    logits = logits.float()
    # Subtracting the maximum before dividing keeps a tiny temperature finite (the top token at 0, the
    # rest at -inf at worst) where logits / 1e-40 overflowed to inf - inf = NaN. A temperature below float32's
    # smallest normal number became 0 in the division (the top token 0 / 0 = NaN: no mass to sample, a failed pass
    # for every request in it): the smallest normal divides as any smaller one would, up to subnormal differences.
    temperature = max(params.temperature, torch.finfo(torch.float32).tiny)
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature  # amax: max with indices costs 15x more
    if params.min_p > 0:  # the top token sits at 0: p(i) / p(top) = exp(logit_i)
        logits = logits.masked_fill(logits < math.log(params.min_p), float("-inf"))
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < nucleus_floor(probs, params.top_p), float("-inf"))
    return logits.softmax(-1)


# Ranks a CPU row's nucleus is first looked for in: a partial ranking of 64 tokens costs ~0.4 ms where sorting
# Qwen's 151,936 cost 13 ms a row (a third of a decoding step; K+1 of them in a sampled verify).
NUCLEUS_HEADS = (64, 1024)


def nucleus_floor(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs [T, V] -> [T, 1]: the smallest probability top-p keeps in each row. Ranked by probability, the nucleus is
    the head whose mass first reaches top_p, the token that crosses it included; every token at least as likely as
    its last is kept, so equal probabilities are kept or dropped together, whatever order a sort gives them.

    On the host the head is looked for in the first 64, then 1024 ranks, then all: a CPU cumsum adds in sequence
    (in float64), so a prefix's mass has the same bits in a short head as in the whole ranking, and each row's floor
    is the one the full sort gives. On a device the whole row is sorted: a partial ranking would need a host read to
    know whether it sufficed (one sort there costs microseconds)."""
    vocab = probs.shape[-1]
    heads = [head for head in NUCLEUS_HEADS if head < vocab] if probs.device.type == "cpu" else []
    for head in heads + [vocab]:
        ranked = torch.topk(probs, head, dim=-1).values if head < vocab else torch.sort(probs, -1, True).values
        reached = ranked.cumsum(-1) >= top_p
        if head == vocab or bool(reached[:, -1].all()):
            # The first rank reaching top_p (none: rounding left the mass short of it, and every token stays).
            first = torch.where(reached.any(-1), reached.int().argmax(-1), head - 1)
            return ranked.gather(-1, first[:, None])


# The noise's constants, read by the host (PositionNoise) and by the device's kernel (gpu/noise_kernel.py) alike.
GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: splitmix64's counter step
SEED_SALT = 0x6A09E667F3BCC909  # sqrt(2)'s fraction: keys seed 0 away from the all-zero word
SPLITMIX_MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
LN2_BITS = 0x3FE62E42FEFA39EF  # log(2) rounded to float64
SQRT2_BITS = 0x3FF6A09E667F3BCD  # sqrt(2) rounded to float64
LOG_SERIES_TERMS = 11  # log's series in s**2 (<= 0.0295) to the power 11: truncation below 1e-18 relative


def _float64_of(bits: int) -> np.float64:
    return np.array([bits], dtype=np.uint64).view(np.float64)[0]


def log_series_coefficient(k: int) -> np.float64:
    """2 / (2k + 1) in float64, one correctly rounded division: the device divides the same way."""
    return np.float64(2.0) / np.float64(2 * k + 1)


def neg_log(u: np.ndarray) -> np.ndarray:
    """-log(u) for float64 u in [2**-54, 1] (normal numbers), within one ulp of np.log's.

    Written with correctly rounded float64 operations only (+, -, *, /, bit manipulation) in one fixed order, so the
    device's kernel (gpu/noise_kernel.py's neg_log, the same steps) gives the same bits: np.log and the device's log
    (libdevice) are not guaranteed to round alike, and one ulp of difference in a draw can flip an exponential race
    at a near tie, which would give a seed different text on the GPU. fdlibm's scheme: u = m * 2**e with m in
    [sqrt(1/2), sqrt(2)), f = m - 1 (exact), s = f / (2 + f), log(1 + f) = 2s + s * R, R = sum_k 2 z**k / (2k+1)
    with z = s*s, rearranged as f - (f*f/2 - s * (f*f/2 + R)) so the large terms enter last and exactly.
    """
    bits = np.ascontiguousarray(u, dtype=np.float64).view(np.uint64)
    exponent = (bits >> np.uint64(52)).astype(np.int64) - 1023
    m = ((bits & np.uint64(0x000FFFFFFFFFFFFF)) | np.uint64(0x3FF0000000000000)).view(np.float64)  # [1, 2)
    high = m > _float64_of(SQRT2_BITS)
    m = np.where(high, m * 0.5, m)
    exponent = np.where(high, exponent + 1, exponent)
    f = m - 1.0
    s = f / (f + 2.0)
    z = s * s
    series = np.full_like(z, log_series_coefficient(LOG_SERIES_TERMS))
    for k in range(LOG_SERIES_TERMS - 1, 0, -1):  # Horner, highest power first
        series = series * z + log_series_coefficient(k)
    series = z * series
    half_f_squared = 0.5 * f * f
    log_m = f - (half_f_squared - s * (half_f_squared + series))
    return (-exponent).astype(np.float64) * _float64_of(LN2_BITS) - log_m


class PositionNoise:
    """Sampling whose randomness is a function of (seed, position, token id) and of nothing else.

    The token at sequence position n is argmax_i p_n(i) / E(n, i), where the E are independent Exp(1)
    variables (the exponential race, the Gumbel-max trick in another form): token i wins with
    probability exactly p_n(i), and a token of probability 0 never wins. E(n, i) comes from a hash of
    (seed, n, i), not from a stream of draws, so:
    - plain decoding, speculation with any K or drafter, and any earlier requests give the same text
      for the same seed: verification is the greedy check against these noisy argmaxes, and the
      output is, token for token, the seeded plain output;
    - a draft model that samples its proposals with the same noise agrees with the target whenever
      their distributions are close (a coupling of the two draws), which keeps acceptance high.
    """

    _GOLDEN = np.uint64(GOLDEN)
    _SEED_SALT = np.uint64(SEED_SALT)

    def __init__(self, seed: int):
        self.seed = seed
        with np.errstate(over="ignore"):
            self._key = self._mix(np.uint64(seed % 2**64) ^ self._SEED_SALT)

    @staticmethod
    def _mix(z: np.ndarray) -> np.ndarray:
        """splitmix64's finaliser: a bijection of 64-bit words whose output bits look independent. In place on one
        copy of z: a vocabulary's words are 1.2 MB, and a fresh array per operation took most of a row's race."""
        z = np.array(z, dtype=np.uint64)
        shifted = np.empty_like(z)
        for shift, multiplier in zip((30, 27), SPLITMIX_MULTIPLIERS):
            z ^= np.right_shift(z, np.uint64(shift), out=shifted)
            z *= np.uint64(multiplier)
        z ^= np.right_shift(z, np.uint64(31), out=shifted)
        return z

    def _position_key(self, position: int) -> np.ndarray:  # a 0-d uint64 array (_mix works on arrays)
        """The key of one position's draws: a keyed hash of (seed, position), key = seed, counter = position.

        The key enters before and after the mixing (a Davies-Meyer feed-forward), so no arithmetic relation
        between seeds (a difference, a multiple of a constant) moves one seed's draws onto another's at
        other positions, as a key linear in seed and position (seed + c * position) did.
        """
        with np.errstate(over="ignore"):  # 64-bit words: products and sums wrap around
            counter = self._mix(np.uint64(position) * self._GOLDEN + self._GOLDEN)
            return self._mix(self._mix(self._key ^ counter) + self._key)

    def exponentials(self, position: int, token_ids: np.ndarray) -> np.ndarray:
        """E(position, i) for each token id: independent Exp(1) draws, the same on every call."""
        return neg_log(self._uniforms(position, token_ids))  # not np.log: the device draws the same bits (neg_log)

    def _uniforms(self, position: int, token_ids: np.ndarray, words: np.ndarray | None = None) -> np.ndarray:
        """The uniforms in (0, 1] whose -log are the draws of `exponentials`. words: the tokens' half of the hash
        (`token_words(vocab)[token_ids]`), where the caller has it."""
        with np.errstate(over="ignore"):
            if words is None:
                words = self._mix(token_ids.astype(np.uint64) * self._GOLDEN + np.uint64(1))
            bits = self._mix(words ^ self._position_key(position))
            bits >>= np.uint64(11)
        uniforms = bits.astype(np.float64)
        uniforms += 0.5
        uniforms *= 2.0**-53
        return uniforms

    @property
    def key_bits(self) -> int:
        """The seed's key as a signed 64-bit integer: how an int64 tensor carries it to the device's kernel."""
        key = int(self._key)
        return key - 2**64 if key >= 2**63 else key

    def choose(self, probs: torch.Tensor, position: int) -> int:
        """The token sampled from probs [V] at this sequence position. On a CUDA device the race runs there and only
        the chosen token is read back; elsewhere on the host. Both draw the same token."""
        if probs.is_cuda:
            return read_tokens(choose_rows(probs[None], [position], [self]))[0]
        token = self.race(probs.detach().float().cpu().numpy(), position)
        if token < 0:
            raise ValueError("sampling from a distribution with no mass")
        return token

    def race(self, p: np.ndarray, position: int) -> int:
        """The host's race over probabilities p [V] (float32): the winning token id, -1 where p has no mass."""
        support = np.flatnonzero(p > 0)  # tokens outside top-k / top-p cannot win
        if support.size == 0:
            return -1
        words = token_words(p.size)
        # The race with NumPy's log first: neg_log, the draws' definition, costs ~50x more over a whole vocabulary
        # (9 ms a row), and the two differ by an ulp at most, so only tokens within a relative 1e-12 of the leader
        # can win the exact race (far above the ~4e-16 an ulp of E moves a ratio); those are raced exactly.
        whole = support.size == p.size
        uniform = self._uniforms(position, support, words if whole else words[support])
        fast = np.log(uniform)
        np.subtract(0.0, fast, out=fast)  # (0.0 - : u = 1 draws +0.0, as neg_log does); in place: a row is 1.2 MB
        np.divide(p if whole else p[support], fast, out=fast)
        near = np.flatnonzero(fast >= fast.max() * (1 - 1e-12))
        exact = p[support[near]] / neg_log(uniform[near])
        return int(support[near[int(np.argmax(exact))]])  # ties: the lowest id (the device keeps the same rule)


@functools.lru_cache(maxsize=4)
def token_words(vocab: int) -> np.ndarray:
    """The tokens' half of every draw's hash, mix(id * GOLDEN + 1) for the ids below `vocab`: the same for every seed
    and position, so it is hashed once per vocabulary size instead of on every sampled row (read-only)."""
    with np.errstate(over="ignore"):
        words = PositionNoise._mix(np.arange(vocab, dtype=np.uint64) * np.uint64(GOLDEN) + np.uint64(1))
    words.flags.writeable = False
    return words


def choose_rows(probs: torch.Tensor, positions, noises: list[PositionNoise],
                device_kernel: bool | None = None) -> torch.Tensor:
    """Row t of probs [T, V] sampled by noises[t] at sequence position positions[t] (a list of ints, or an int64
    tensor on probs' device) -> tokens [T] int64 on probs' device, -1 for a row with no mass (read_tokens raises on
    it). The same tokens as PositionNoise.choose row by row.

    device_kernel: race in the Triton kernel (gpu/noise_kernel.py), one launch pair for all rows and no host read;
    None picks it for CUDA tensors. True on CPU tensors runs the kernel in Triton's interpreter (TRITON_INTERPRET=1,
    the tests). False: PositionNoise.race row by row on the host.
    """
    if len(noises) != probs.shape[0] or len(positions) != probs.shape[0]:
        raise ValueError(f"{probs.shape[0]} rows need as many positions and noises, got {len(positions)} and "
                         f"{len(noises)}")
    if device_kernel is None:
        device_kernel = probs.is_cuda
    if device_kernel:
        from .gpu import noise_kernel  # Triton loads only here: CPU-only installs sample on the host

        keys = int64_to_device([noise.key_bits for noise in noises], probs.device)
        if not torch.is_tensor(positions):
            positions = int64_to_device([int(position) for position in positions], probs.device)
        return noise_kernel.choose_rows(probs, keys, positions)
    p = probs.detach().float().cpu().numpy()
    positions = positions.tolist() if torch.is_tensor(positions) else positions
    tokens = [noise.race(row, int(position)) for row, position, noise in zip(p, positions, noises)]
    return torch.tensor(tokens, dtype=torch.int64, device=probs.device)


def int64_to_device(values: list[int], device) -> torch.Tensor:
    """values as an int64 tensor on device; to a GPU from pinned memory, asynchronously (no wait for its queue: a
    pass may still be running there)."""
    rows = torch.tensor(values, dtype=torch.int64)
    if torch.device(device).type == "cuda":
        return rows.pin_memory().to(device, non_blocking=True)
    return rows.to(device)


def read_tokens(tokens: torch.Tensor) -> list[int]:
    """choose_rows' tokens read to the host (the one read of the device path); a row with no mass raises, as
    PositionNoise.choose does."""
    values = tokens.tolist()
    if any(token < 0 for token in values):
        raise ValueError("sampling from a distribution with no mass")
    return values
