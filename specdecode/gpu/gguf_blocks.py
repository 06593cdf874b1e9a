"""GGUF blocks read by the GPU's product kernel itself (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K), not bfloat16
copies.

A matrix kept as blocks streams about a quarter (Q4_K) to a half (Q8_0) of the bytes of its bfloat16 copy per
pass, and a decode step on a GPU is bound by the bytes it reads. The kernel rebuilds each weight in float32 and
rounds it to bfloat16 before the product, so it multiplies exactly the bfloat16 weight a load-time dequantization
gives: the ggml formulas are exact in float32 here (Q4_K, Q5_K: d*sc and dmin*m are products of a half and a 6-bit
integer, times a 4- or 5-bit value still exact, one rounding in the subtraction; Q4_1: d*q exact, one rounding in
adding m; Q6_K, Q8_0, Q4_0, Q5_0: products of a half, an 8-bit scale and an up-to-8-bit value, no rounding at all),
whatever order or fused multiply-add the compiler picks.
A pass over blocks is therefore the bfloat16 pass bit for bit (tests/gpu/test_gguf_blocks.py).

The blocks are regrouped at load into arrays the kernel reads whole: the quants as bytes holding two consecutive
weights (low nibble first), Q6_K's top two bits as bytes holding four, Q5_0's and Q5_K's top bits as bytes holding
eight, the 6-bit scales and mins of Q4_K as bytes,
the halves as float16 arrays; every array is [rows, ...] so that a row range or a row subset is a slice.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K = 2, 3, 6, 8, 12, 13, 14
DENSE = 0  # the product kernel's KIND for a plain [N, K] matrix
# ggml type -> (weights per block, bytes per block)
BLOCKS = {Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22), Q8_0: (32, 34), Q4_K: (256, 144), Q5_K: (256, 176),
          Q6_K: (256, 210)}
NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q8_0: "Q8_0", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K"}
# Where a block's float16 fields sit (d, then dmin or m)
HALVES = {Q4_0: (0,), Q4_1: (0, 2), Q5_0: (0,), Q8_0: (0,), Q4_K: (0, 2), Q5_K: (0, 2), Q6_K: (208,)}


@dataclass
class BlockPart:
    """One source tensor of a matrix: its rows [first, first + rows) of the matrix, as the kernel's arrays."""

    kind: int  # a ggml type, or DENSE
    first: int
    rows: int
    # Q4_K: pairs, sc, m, d, dmin; Q5_K: pairs, octets, sc, m, d, dmin; Q6_K: pairs, quads, sc, d;
    # Q4_0: pairs, d; Q4_1: pairs, d, m; Q5_0: pairs, octets, d; Q8_0: q, d
    arrays: tuple[torch.Tensor, ...]

    def kernel_arrays(self) -> tuple[torch.Tensor, ...]:
        """The kernel's six array arguments (quants, top bits, scales, mins, d, dmin); unused ones repeat the first."""
        a = self.arrays
        order = {Q4_K: (0, 0, 1, 2, 3, 4), Q5_K: (0, 1, 2, 3, 4, 5), Q6_K: (0, 1, 2, 0, 3, 0), Q4_0: (0, 0, 0, 0, 1, 0),
                 Q4_1: (0, 0, 0, 0, 1, 2), Q5_0: (0, 1, 0, 0, 2, 0), Q8_0: (0, 0, 0, 0, 1, 0), DENSE: (0,) * 6}
        return tuple(a[i] for i in order[self.kind])

    def select(self, ids: torch.Tensor) -> "BlockPart":
        return BlockPart(self.kind, 0, int(ids.numel()), tuple(a.index_select(0, ids).contiguous() for a in self.arrays))


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
    if kind in (Q4_0, Q4_1, Q5_0):  # per 32 weights: 16 bytes of low nibbles (weight j, then j + 16) at the end
        low = ((b[..., -16:, None] >> np.array([0, 4], dtype=np.uint8)) & 0x0F).swapaxes(-1, -2).reshape(rows, k)
        if kind != Q5_0:
            return pairs(low), *halves
        bits = np.ascontiguousarray(b[..., 2:6]).view(np.uint32)  # 32 top bits, bit j: weight j
        high = ((bits >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8).reshape(rows, k)
        return pairs(low), np.packbits(high, axis=1, bitorder="little"), *halves
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
        low = (ql & 0x0F).reshape(rows, k)
        high = (qh & 0x03).reshape(rows, k)
        quads = high[:, 0::4] | high[:, 1::4] << 2 | high[:, 2::4] << 4 | high[:, 3::4] << 6
        sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).reshape(rows, -1)
        return pairs(low), quads, sc, *halves
    raise ValueError(f"no GPU kernel reads ggml type {kind}")


def pairs(values: np.ndarray) -> np.ndarray:
    """4-bit values [rows, k] as bytes holding two consecutive ones, the first in the low nibble."""
    return (values[:, 0::2] | values[:, 1::2] << 4).astype(np.uint8)


def dequantized(kind: int, arrays: tuple[np.ndarray, ...]) -> np.ndarray:
    """float32 weights from the regrouped arrays, by the kernel's formulas (a check of regroup against ggml's)."""
    def spread(v, width):
        return np.repeat(v.astype(np.float32), width, axis=1)

    def nibbles(p):
        return np.stack([p & 0x0F, p >> 4], axis=-1).reshape(p.shape[0], -1)

    def bits(octets):
        return np.unpackbits(octets, axis=1, bitorder="little")

    if kind == Q8_0:
        q, d = arrays
        return q.astype(np.float32) * spread(d, 32)
    if kind == Q4_0:
        p, d = arrays
        return (nibbles(p).astype(np.float32) - 8.0) * spread(d, 32)
    if kind == Q4_1:
        p, d, m = arrays
        return nibbles(p).astype(np.float32) * spread(d, 32) + spread(m, 32)
    if kind == Q5_0:
        p, octets, d = arrays
        return ((nibbles(p) | bits(octets) << 4).astype(np.float32) - 16.0) * spread(d, 32)
    if kind in (Q4_K, Q5_K):
        p, *octets, sc, m, d, dmin = arrays
        q = nibbles(p) | (bits(octets[0]) << 4 if octets else 0)
        scale = spread(d, 8) * sc.astype(np.float32)
        low = spread(dmin, 8) * m.astype(np.float32)
        return q.astype(np.float32) * spread(scale, 32) - spread(low, 32)
    p, quads, sc, d = arrays
    high = np.stack([(quads >> s) & 3 for s in (0, 2, 4, 6)], axis=-1).reshape(quads.shape[0], -1)
    q = (nibbles(p) | high << 4).astype(np.float32) - 32.0
    return q * spread(spread(d, 16) * sc.astype(np.float32), 16)


def gpu_readable(blocks: dict[str, list[tuple[int, torch.Tensor]]]) -> dict[str, list[tuple[int, torch.Tensor]]]:
    """The matrices (of loader's {key: [(ggml type, raw blocks)]}) whose every source tensor the kernel reads."""
    return {key: parts for key, parts in blocks.items() if readable(kind for kind, _ in parts)}


def attach(model, blocks: dict[str, list[tuple[int, torch.Tensor]]]) -> int:
    """Replace each matrix of `model` named in `blocks` ("layers.3.qkv", "lm_head": the head, tied or not) by its
    BlockWeight on the model's device; returns how many. The model must run every pass through ExactPass."""
    for key, parts in blocks.items():
        owner_path, _, attr = key.rpartition(".")
        owner = model.get_submodule(owner_path) if owner_path else model
        owner._parameters.pop(attr, None)
        setattr(owner, attr, block_weight(parts, model.device))
    return len(blocks)
