"""Weight matrices the native kernels read: GGUF blocks for the int8 target, float32 with its blocks kept."""
from __future__ import annotations

import torch

from ..errors import ModelError
from . import native, options
from .options import QUANT_ISAS
from .native import load_kernel
from .block_types import (  # noqa: F401  (the block types, read from here by the package and the tests)
    _DEINTERLEAVED,
    _INTERNAL_BLOCKS,
    DRAFT_LAYOUTS,
    INTERLEAVED,
    Q4_K,
    Q4_K_UNPACKED,
    Q4_K_X16,
    Q5_0,
    Q5_0_X16,
    Q5_0_X16_SUMS,
    Q6_K,
    Q6_K_X16,
    Q8_0,
    QUANT_KERNEL_TYPES,
)
from .isa_choice import auto_isa

# Rows one kernel call takes: a decode step or a verify block (prompt lookup's largest is 16 tokens).
SKINNY_MAX_ROWS = 16
# ggml block types the gguf kernel reads (gguf.GGMLQuantizationType values): Q4_1, Q8_0, Q4_K, Q6_K.
# Kept here, not asked of the kernel, because converting a GGUF file saves its blocks without compiling
# anything; a test checks it against the kernel's own list (gguf_block_types).
GGUF_KERNEL_TYPES = frozenset({3, 8, 12, 14})

# The int8 kernel's instruction set (options.OPTIONS.isa): "auto" takes AMX (Q4_K tiles of 16 and 32 tokens on the
# tile units, the rest as VNNI) or AVX-512 VNNI, whichever measured faster on this machine (isa_choice.py), where
# the CPU and Linux allow AMX, else AVX-512 VNNI where present, else AVX2. All give the same bits;
# SPECDECODE_ISA=amx, avx512-vnni or avx2 forces that path (for A/B timing).


def quant_isa() -> str:
    """The path products run: SPECDECODE_ISA, or for auto the one measured fastest here (isa_choice)."""
    isa = options.OPTIONS.isa
    return isa if isa != "auto" else auto_isa()


def quant_isa_paths() -> list[str]:
    """The instruction-set paths the int8 kernel runs on this CPU, as the kernel reports them (none without it)."""
    kernel = load_kernel()
    return list(kernel.quant_isa_paths()) if kernel is not None else []


def check_quant_isa() -> None:
    """Refuse at load a SPECDECODE_ISA the int8 kernel cannot run here: the model would load, then fail every
    product (every request a 500). A ModelError, so the command line prints it as one line."""
    isa = options.OPTIONS.isa
    if isa not in QUANT_ISAS:
        raise ModelError(f"SPECDECODE_ISA={isa} names no instruction-set path of the int8 kernel;"
                         f" choose one of {', '.join(QUANT_ISAS)}")
    if isa == "auto":
        return
    paths = quant_isa_paths()
    if isa not in paths:
        raise ModelError(f"SPECDECODE_ISA={isa}: this CPU lacks that instruction set (the int8 kernel runs"
                         f" {', '.join(paths) or 'nothing'} here); unset SPECDECODE_ISA or choose one of those")


def _kernel_layout(block_type: int, blocks: torch.Tensor) -> tuple[int, torch.Tensor]:
    """GGUF blocks in the kernel's faster layouts (same results): Q4_K with its scales unpacked, then Q4_K and Q6_K
    interleaved where the rows come in groups of 16; other types unchanged."""
    if block_type == Q4_K and options.OPTIONS.unpack_q4_k:
        block_type, blocks = Q4_K_UNPACKED, load_kernel().repack_q4k(blocks)
    if block_type in INTERLEAVED and options.OPTIONS.interleave_k and blocks.shape[0] % 16 == 0:
        return INTERLEAVED[block_type], load_kernel().interleave_k(blocks, block_type, True)
    return block_type, blocks



class QuantWeight:
    """A weight matrix kept as GGUF blocks, multiplied with int8-quantized activations (the int8 target).

    One part per source tensor, stacked along the output dimension. Every product runs through
    quant_dot.cpp in blocks of at most SKINNY_MAX_ROWS rows, prompts included, so each row's result is
    the one that row gets alone: prefill, decode steps and verify blocks compute a token the same way.
    """

    dtype = torch.int8

    def __init__(self, parts: list[tuple[int, torch.Tensor]]):
        import gguf

        parts = [_kernel_layout(int(t), blocks) for t, blocks in parts]
        self.types = [t for t, _ in parts]
        self.parts = [blocks.contiguous() for _, blocks in parts]
        weights_per_block, bytes_per_block = _INTERNAL_BLOCKS.get(self.types[0]) or gguf.GGML_QUANT_SIZES[
            gguf.GGMLQuantizationType(self.types[0])]
        self.shape = torch.Size([sum(p.shape[0] for p in self.parts), self.parts[0].shape[1] // bytes_per_block * weights_per_block])
        self.device = torch.device("cpu")

    @classmethod
    def from_dense(cls, weight: torch.Tensor) -> "QuantWeight":
        """Float weights as Q8_0 blocks (one float16 scale per 32 weights)."""
        return cls([(Q8_0, load_kernel().quantize_q8_0(weight.detach().to(torch.float32).contiguous()))])

    def index_select(self, dim: int, index: torch.Tensor) -> "QuantWeight":
        """Whole rows (the draft's frequent-vocabulary head): from one part only."""
        if dim != 0 or len(self.parts) != 1:
            raise ValueError("QuantWeight selects whole rows of a one-part matrix only")
        block_type, blocks = self.types[0], self.parts[0]
        if block_type in _DEINTERLEAVED:  # rows back out of their groups of 16
            block_type = _DEINTERLEAVED[block_type]
            blocks = load_kernel().interleave_k(blocks, block_type, False)
        return QuantWeight([(block_type, blocks.index_select(0, index))])

    def contiguous(self) -> "QuantWeight":
        return self

    def as_draft(self) -> "QuantWeight":
        """The same blocks under the draft models' cheaper float definitions (block_types.DRAFT_LAYOUTS): the same
        bytes and integers, other roundings, each row still computed on its own."""
        self.types = [DRAFT_LAYOUTS.get(t, t) for t in self.types]
        return self

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] float32 -> [..., out]; any number of rows, SKINNY_MAX_ROWS per kernel call."""
        flat = x.reshape(-1, x.shape[-1])
        calls = [
            native._kernel.quant_linear(flat[i : i + SKINNY_MAX_ROWS], self.parts, self.types, quant_isa(), -1)
            for i in range(0, flat.shape[0], SKINNY_MAX_ROWS)
        ]
        y = calls[0] if len(calls) == 1 else torch.cat(calls)
        return y.reshape(*x.shape[:-1], self.shape[0])


def gguf_blocks_enabled(device) -> bool:
    """Whether a float32 model loaded from GGUF on this device should keep its blocks for the gguf kernel.
    SPECDECODE_DENSE_WEIGHTS=1 turns it off (same outputs, float32 weights streamed: for A/B timing)."""
    return torch.device(device).type == "cpu" and load_kernel() is not None and not options.OPTIONS.dense_weights


class GGUFWeight:
    """A float32 weight that keeps the GGUF blocks it was dequantized from, one part per source tensor.

    Decode steps and verify blocks (up to SKINNY_MAX_ROWS rows) read the blocks through gguf_linear.cpp,
    which returns the float32 kernel's result bit for bit while streaming 0.56-0.82 bytes per weight
    instead of 4; prompt-sized products keep the float32 copy for the BLAS GEMM. Outputs are therefore
    those of the float32 model whichever path runs: this is a faster float32 target, not a 4-bit one.
    """

    dtype = torch.float32

    def __init__(self, dense: torch.Tensor, parts: list[tuple[int, torch.Tensor]]):
        self.dense = dense
        self.types = [int(t) for t, _ in parts]
        self.parts = [blocks.contiguous() for _, blocks in parts]
        self.shape = dense.shape
        self.device = dense.device

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        return self.dense.index_select(dim, index)

    def contiguous(self) -> "GGUFWeight":
        return self

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.dense.to(dtype)
