"""GGUF blocks read by the GPU's product kernel itself (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
IQ4_NL, IQ4_XS: every type the CPU's int8 kernel reads), not bfloat16 copies.

A matrix kept as blocks streams about a quarter (Q4_K) to a half (Q8_0) of the bytes of its bfloat16 copy per
pass, and a decode step on a GPU is bound by the bytes it reads. The kernel rebuilds each weight in float32 and
rounds it to bfloat16 before the product, so it multiplies exactly the bfloat16 weight a load-time dequantization
gives: the ggml formulas are exact in float32 here (Q2_K, Q4_K, Q5_K: d*sc and dmin*m are products of a half and
an up-to-6-bit integer, times a 2- to 5-bit value still exact, one rounding in the subtraction; Q4_1, Q5_1: d*q
exact, one rounding in adding m; Q3_K, Q6_K, Q8_0, Q4_0, Q5_0, IQ4_NL, IQ4_XS: products of a half, a scale of up to
6 bits and a value of up to 8, at most 24 significant bits, no rounding at all), whatever order or fused
multiply-add the compiler picks.
A pass over blocks is therefore the bfloat16 pass bit for bit (tests/gpu/test_gguf_blocks.py).

The blocks are regrouped at load into arrays the kernel reads whole: 4-bit quants (and IQ4's table indices) as
bytes holding two consecutive weights (low nibble first), 2-bit ones (Q2_K, Q3_K's low bits, Q6_K's top bits) as
bytes holding four, single top bits (Q3_K, Q5_0, Q5_1, Q5_K) as bytes holding eight, the sub-block scales and mins
as bytes (signed where ggml subtracts an offset from them), the halves as float16 arrays; every array is
[rows, ...] so that a row range or a row subset is a slice.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS = 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23
DENSE = 0  # the product kernel's KIND for a plain [N, K] matrix
# ggml type -> (weights per block, bytes per block)
BLOCKS = {Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22), Q5_1: (32, 24), Q8_0: (32, 34), Q2_K: (256, 84),
          Q3_K: (256, 110), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210), IQ4_NL: (32, 18), IQ4_XS: (256, 136)}
NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1", Q8_0: "Q8_0", Q2_K: "Q2_K", Q3_K: "Q3_K",
         Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K", IQ4_NL: "IQ4_NL", IQ4_XS: "IQ4_XS"}
# Where a block's float16 fields sit (d, then dmin or m)
HALVES = {Q4_0: (0,), Q4_1: (0, 2), Q5_0: (0,), Q5_1: (0, 2), Q8_0: (0,), Q2_K: (80, 82), Q3_K: (108,),
          Q4_K: (0, 2), Q5_K: (0, 2), Q6_K: (208,), IQ4_NL: (0,), IQ4_XS: (0,)}
# The product kernel reads K in whole steps of this many weights (exact_pass.Tiles.block_k): a 32-weight block type
# whose K is an odd multiple of 32 would be read past each row's end, so such a matrix loads as bfloat16 instead.
K_STEP = 64
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # ggml's IQ4 table


@dataclass
class BlockPart:
    """One source tensor of a matrix: its rows [first, first + rows) of the matrix, as the kernel's arrays."""

    kind: int  # a ggml type, or DENSE
    first: int
    rows: int
    # Q4_K: pairs, sc, m, d, dmin; Q5_K: pairs, octets, sc, m, d, dmin; Q6_K: pairs, quads, sc, d;
    # Q2_K: quads, sc, m, d, dmin; Q3_K: quads, octets, sc, d; Q4_0, IQ4_NL: pairs, d; Q4_1: pairs, d, m;
    # Q5_0: pairs, octets, d; Q5_1: pairs, octets, d, m; Q8_0: q, d; IQ4_XS: pairs, sc, d
    arrays: tuple[torch.Tensor, ...]

    def kernel_arrays(self) -> tuple[torch.Tensor, ...]:
        """The kernel's six array arguments (quants, top bits, scales, mins, d, dmin); unused ones repeat the first."""
        return tuple(self.arrays[i] for i in KERNEL_ORDER[self.kind])

    def select(self, ids: torch.Tensor) -> "BlockPart":
        return BlockPart(self.kind, 0, int(ids.numel()), tuple(a.index_select(0, ids).contiguous() for a in self.arrays))


KERNEL_ORDER = {Q4_K: (0, 0, 1, 2, 3, 4), Q5_K: (0, 1, 2, 3, 4, 5), Q6_K: (0, 1, 2, 0, 3, 0), Q2_K: (0, 0, 1, 2, 3, 4),
                Q3_K: (0, 1, 2, 0, 3, 0), Q4_0: (0, 0, 0, 0, 1, 0), IQ4_NL: (0, 0, 0, 0, 1, 0), Q4_1: (0, 0, 0, 0, 1, 2),
                Q5_0: (0, 1, 0, 0, 2, 0), Q5_1: (0, 1, 0, 0, 2, 3), Q8_0: (0, 0, 0, 0, 1, 0), IQ4_XS: (0, 0, 1, 0, 2, 0),
                DENSE: (0,) * 6}


class BlockWeight:
    """A projection matrix [N, K] as GGUF blocks on the device, for ExactPass.product. Only the GPU pass reads it:
    a model holding one runs every pass there."""

    def __init__(self, parts: list[BlockPart], cols: int, dtype: torch.dtype = torch.bfloat16):
        self.parts = parts
        self.shape = torch.Size((sum(p.rows for p in parts), cols))
        self.dtype = dtype  # what the kernel rounds each weight to before multiplying

    @property
    def device(self) -> torch.device:
        return self.parts[0].arrays[0].device

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() for p in self.parts for a in p.arrays)

    @property
    def kinds(self) -> list[str]:
        return [NAMES[p.kind] for p in self.parts]

    def index_select(self, dim: int, ids: torch.Tensor) -> "BlockWeight":
        """The rows `ids` (a reduced output head); the head is one source tensor."""
        if dim != 0 or len(self.parts) != 1:
            raise ValueError("rows of a one-part block matrix only")
        return BlockWeight([self.parts[0].select(ids.to(self.device))], self.shape[1], self.dtype)

    def contiguous(self) -> "BlockWeight":
        return self


def readable(kinds) -> bool:
    return all(int(kind) in BLOCKS for kind in kinds)


def columns(kind: int, raw) -> int:
    """K of a source tensor of raw blocks [rows, bytes per row]."""
    per_block, size = BLOCKS[int(kind)]
    return raw.shape[1] // size * per_block


def block_weight(parts: list[tuple[int, torch.Tensor | np.ndarray]], device, dtype=torch.bfloat16) -> BlockWeight:
    """A BlockWeight from a matrix's source tensors as (ggml type, raw blocks [rows, bytes per row] uint8).
    Neighbouring tensors of one type become one part (Q and K, gate and up): one launch each."""
    out, first, cols = [], 0, None
    for kind, raws in runs([(kind, raw.numpy() if isinstance(raw, torch.Tensor) else np.asarray(raw))
                            for kind, raw in parts]):
        raw = np.concatenate(raws) if len(raws) > 1 else raws[0]
        per_block, size = BLOCKS[kind]
        k = raw.shape[1] // size * per_block
        if cols is not None and k != cols:
            raise ValueError(f"parts of one matrix with {cols} and {k} columns")
        cols = k
        arrays = tuple(torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in regroup(kind, raw, k))
        out.append(BlockPart(kind, first, raw.shape[0], arrays))
        first += raw.shape[0]
    return BlockWeight(out, cols, dtype)


def runs(parts: list[tuple[int, object]]) -> list[tuple[int, list]]:
    """[(ggml type, item)] as [(ggml type, [items])], neighbouring items of one type together (one part each)."""
    out: list[tuple[int, list]] = []
    for kind, item in parts:
        if out and out[-1][0] == int(kind):
            out[-1][1].append(item)
        else:
            out.append((int(kind), [item]))
    return out


def regroup(kind: int, raw: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    """The kernel's arrays of one tensor's raw blocks [rows, bytes] (see the module's docstring)."""
    rows = raw.shape[0]
    per_block, size = BLOCKS[kind]
    b = raw.reshape(rows, k // per_block, size)
    halves = [np.ascontiguousarray(b[..., at:at + 2]).view(np.float16)[..., 0] for at in HALVES[kind]]
    if kind == Q8_0:
        return np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(rows, k), *halves
    if per_block == 32:  # Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL: the 16 bytes of nibbles end the block
        low = split_nibbles(b[..., -16:], rows, k)
        if kind not in (Q5_0, Q5_1):
            return pairs(low), *halves
        at = 2 if kind == Q5_0 else 4
        bits = np.ascontiguousarray(b[..., at:at + 4]).view(np.uint32)  # 32 top bits, bit j: weight j
        high = ((bits >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8).reshape(rows, k)
        return pairs(low), np.packbits(high, axis=1, bitorder="little"), *halves
    if kind == IQ4_XS:  # per 32 weights: a 6-bit scale (low 4 bits in scales_l, top 2 in scales_h), ggml's minus 32
        low = split_nibbles(b[..., 8:].reshape(rows, -1, 16), rows, k)
        scales_l = (b[..., 4:8, None] >> np.array([0, 4], dtype=np.uint8)) & 0x0F
        scales_h = (np.ascontiguousarray(b[..., 2:4]).view(np.uint16) >> (2 * np.arange(8, dtype=np.uint16))) & 3
        sc = scales_l.reshape(rows, -1) | (scales_h.astype(np.uint8).reshape(rows, -1) << 4)
        return pairs(low), sc.astype(np.int8) - np.int8(32), *halves
    if kind in (Q2_K, Q3_K):  # per 128 weights: 32 bytes, weight 32 j + i in bits 2j of byte i
        at = 16 if kind == Q2_K else 32
        two = b[..., at:at + 64].reshape(rows, -1, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
        low = (two & 3).reshape(rows, k)
        if kind == Q2_K:  # per 16 weights: a 4-bit scale and a 4-bit min in one byte
            scales = b[..., :16].reshape(rows, -1)
            return quads(low), scales & 0x0F, scales >> 4, *halves
        hmask = b[..., :32].reshape(rows, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
        high = (hmask & 1).reshape(rows, k)  # bit j of byte i: the third bit of weight 32 j + i
        return quads(low), np.packbits(high, axis=1, bitorder="little"), q3_k_scales(b[..., 96:108], rows), *halves
    if kind in (Q4_K, Q5_K):
        from gguf.quants import Q4_K as ggml_q4_k

        sc, m = ggml_q4_k.get_scale_min(np.ascontiguousarray(b[..., 4:16]).reshape(-1, 12))
        qs = b[..., -128:].reshape(rows, -1, 4, 1, 32)  # per 64 weights: 32 bytes, low nibbles first, then high
        low = pairs(((qs >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)) & 0x0F).reshape(rows, k))
        scales = (sc.reshape(rows, -1), m.reshape(rows, -1), *halves)
        if kind == Q4_K:
            return (low, *scales)
        qh = b[..., 16:48].reshape(rows, -1, 1, 32)  # bit j of byte i: the fifth bit of weight 32 j + i
        high = ((qh >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1).reshape(rows, k)
        return (low, np.packbits(high, axis=1, bitorder="little"), *scales)
    if kind == Q6_K:
        ql = b[..., :128].reshape(rows, -1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)
        qh = b[..., 128:192].reshape(rows, -1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)
        sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).reshape(rows, -1)
        return pairs((ql & 0x0F).reshape(rows, k)), quads((qh & 0x03).reshape(rows, k)), sc, *halves
    raise ValueError(f"no GPU kernel reads ggml type {kind}")


def split_nibbles(runs: np.ndarray, rows: int, k: int) -> np.ndarray:
    """Runs of 16 bytes [rows, runs, 16] holding 32 weights each (weight j low, weight j + 16 high) -> [rows, k]."""
    return ((runs[..., None] >> np.array([0, 4], dtype=np.uint8)) & 0x0F).swapaxes(-1, -2).reshape(rows, k)


def q3_k_scales(packed: np.ndarray, rows: int) -> np.ndarray:
    """Q3_K's 12 bytes of sixteen 6-bit scales per block -> int8 [rows, k / 16], ggml's minus 32 applied: scale i
    has its low 4 bits in byte i % 8 (low nibble for i < 8), its top 2 in byte 8 + i % 4 at bit 2 (i // 4)."""
    low = (packed[..., :8].reshape(rows, -1, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    high = (packed[..., 8:].reshape(rows, -1, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    return (low.reshape(rows, -1) | high.reshape(rows, -1) << 4).astype(np.int8) - np.int8(32)


def pairs(values: np.ndarray) -> np.ndarray:
    """4-bit values [rows, k] as bytes holding two consecutive ones, the first in the low nibble."""
    return (values[:, 0::2] | values[:, 1::2] << 4).astype(np.uint8)


def quads(values: np.ndarray) -> np.ndarray:
    """2-bit values [rows, k] as bytes holding four consecutive ones, the first in the lowest bits."""
    return (values[:, 0::4] | values[:, 1::4] << 2 | values[:, 2::4] << 4 | values[:, 3::4] << 6).astype(np.uint8)


def dequantized(kind: int, arrays: tuple[np.ndarray, ...]) -> np.ndarray:
    """float32 weights from the regrouped arrays, by the kernel's formulas (a check of regroup against ggml's)."""
    def spread(v, width):
        return np.repeat(v.astype(np.float32), width, axis=1)

    def nibbles(p):
        return np.stack([p & 0x0F, p >> 4], axis=-1).reshape(p.shape[0], -1)

    def twos(q):
        return np.stack([(q >> s) & 3 for s in (0, 2, 4, 6)], axis=-1).reshape(q.shape[0], -1)

    def bits(octets):
        return np.unpackbits(octets, axis=1, bitorder="little")

    table = np.array(IQ4_VALUES, dtype=np.float32)
    if kind == Q8_0:
        q, d = arrays
        return q.astype(np.float32) * spread(d, 32)
    if kind in (Q4_0, IQ4_NL):
        p, d = arrays
        return (table[nibbles(p)] if kind == IQ4_NL else nibbles(p).astype(np.float32) - 8.0) * spread(d, 32)
    if kind == Q4_1:
        p, d, m = arrays
        return nibbles(p).astype(np.float32) * spread(d, 32) + spread(m, 32)
    if kind in (Q5_0, Q5_1):
        p, octets, d, *m = arrays
        q = (nibbles(p) | bits(octets) << 4).astype(np.float32)
        return q * spread(d, 32) + spread(m[0], 32) if m else (q - 16.0) * spread(d, 32)
    if kind == IQ4_XS:
        p, sc, d = arrays
        return table[nibbles(p)] * spread(spread(d, 8) * sc, 32)
    if kind == Q2_K:
        q, sc, m, d, dmin = arrays
        return twos(q).astype(np.float32) * spread(spread(d, 16) * sc, 16) - spread(spread(dmin, 16) * m, 16)
    if kind == Q3_K:
        q, octets, sc, d = arrays
        return ((twos(q) | bits(octets) << 2).astype(np.float32) - 4.0) * spread(spread(d, 16) * sc, 16)
    if kind in (Q4_K, Q5_K):
        p, *octets, sc, m, d, dmin = arrays
        q = nibbles(p) | (bits(octets[0]) << 4 if octets else 0)
        scale = spread(d, 8) * sc.astype(np.float32)
        low = spread(dmin, 8) * m.astype(np.float32)
        return q.astype(np.float32) * spread(scale, 32) - spread(low, 32)
    p, q, sc, d = arrays
    q = (nibbles(p) | twos(q) << 4).astype(np.float32) - 32.0
    return q * spread(spread(d, 16) * sc.astype(np.float32), 16)


def gpu_readable(blocks: dict[str, list[tuple[int, torch.Tensor]]]) -> dict[str, list[tuple[int, torch.Tensor]]]:
    """The matrices (of loader's {key: [(ggml type, raw blocks)]}) whose every source tensor the kernel reads, in
    whole K steps; the others load as bfloat16."""
    return {key: parts for key, parts in blocks.items()
            if readable(kind for kind, _ in parts) and all(columns(kind, raw) % K_STEP == 0 for kind, raw in parts)}


def attach(model, blocks: dict[str, list[tuple[int, torch.Tensor]]]) -> int:
    """Replace each matrix of `model` named in `blocks` ("layers.3.qkv", "lm_head": the head, tied or not) by its
    BlockWeight on the model's device; returns how many. The model must run every pass through ExactPass."""
    for key, parts in blocks.items():
        owner_path, _, attr = key.rpartition(".")
        owner = model.get_submodule(owner_path) if owner_path else model
        owner._parameters.pop(attr, None)
        setattr(owner, attr, block_weight(parts, model.device))
    return len(blocks)
