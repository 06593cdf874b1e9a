"""Small-batch CPU matmul for decoding and verification.

On this class of CPU PyTorch's default BLAS is slow for the shapes that decoding uses (1 to ~16
rows against a large weight matrix): a 4-row product costs 3-4x a 1-row one although both only
stream the weights once. The kernel in skinny_linear.cpp streams each weight row once for all
activation rows, so a verify block of K+1 tokens costs little more than one token, and it sums
every dot product in the same order whatever the row count, so the verify pass reproduces the
plain decoding pass bit for bit (no floating-point near-tie can split them).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import sys
import threading
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

_lock = threading.Lock()
_kernel = None
_kernel_failed: str | None = None
# Rows one kernel call takes: a decode step or a verify block (prompt lookup's largest is 16 tokens).
SKINNY_MAX_ROWS = 16
# Prompt-sized products up to these row counts also run through the kernel, in SKINNY_MAX_ROWS chunks,
# because the GEMM loses below them on this class of CPU. bfloat16/int8 weights would first be converted
# to float32 for the GEMM (~0.8 s per pass over the 0.5B draft): 40 rows took 0.56 s instead of 1.26 s.
# Float32 and GGUF-block weights: for a few dozen rows the GEMM still streams (and packs) 4 bytes per
# weight. Whole prefill of the 1.5B target, GGUF blocks, chunks against GEMM: 24 tokens 1.03 s against
# 2.59 s, 48 1.74 against 3.75, 96 3.44 against 4.00, 160 5.69 against 5.52, 256 9.75 against 7.88;
# float32 weights: 24 1.26 against 2.76, 96 3.89 against 4.23, 160 6.51 against 4.97.
LOW_PRECISION_CHUNKED_MAX_ROWS = 256
FLOAT32_CHUNKED_MAX_ROWS = 128
# Prefill-sized float32 products go through numpy's BLAS (OpenBLAS): on this 2-core AMD EPYC it reached
# 128-136 GFLOP/s for 256-709 rows against a 1536x8960 weight where torch's MKL GEMM reached 81-97.
# Plain and speculative decoding share the prefill, so this changes no comparison between them.
PREFILL_GEMM = os.environ.get("SPECDECODE_PREFILL_GEMM", "numpy")


def _cpu_has_avx2_fma() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx2" in flags and " fma" in flags and " f16c" in flags


_HERE = Path(__file__).parent
KERNEL_SOURCES = [_HERE / name for name in ("skinny_linear.cpp", "block_attention.cpp", "gguf_linear.cpp", "quant_dot.cpp", "int8_layer.cpp")]
KERNEL_HEADERS = [_HERE / name for name in ("avx2_math.h", "quant_dot_impl.h")]
KERNEL_CFLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"]


def kernel_build_dir() -> Path:
    """One build folder per checkout and content of the sources, header, flags and torch version.

    PyTorch rebuilds when a source, its path or a flag changes (not a header): two checkouts sharing one
    folder would rebuild over each other's library, possibly while the other process loads it.
    """
    from ..registry import cache_dir

    digest = hashlib.sha256(" ".join(KERNEL_CFLAGS + [torch.__version__, str(_HERE)]).encode())
    for path in [*KERNEL_SOURCES, *KERNEL_HEADERS]:
        digest.update(path.read_bytes())
    return cache_dir() / "kernels" / digest.hexdigest()[:16]


def load_kernel():
    """Compile (once, cached on disk by PyTorch) and return the extension, or None with a reason kept."""
    global _kernel, _kernel_failed
    if _kernel is not None or _kernel_failed is not None:
        return _kernel
    with _lock:
        if _kernel is not None or _kernel_failed is not None:
            return _kernel
        if os.environ.get("SPECDECODE_NO_KERNEL"):
            _kernel_failed = "disabled by SPECDECODE_NO_KERNEL"
            return None
        if not _cpu_has_avx2_fma():
            _kernel_failed = "CPU lacks AVX2/FMA"
            return None
        try:
            from torch.utils.cpp_extension import load

            build_dir = kernel_build_dir()
            build_dir.mkdir(parents=True, exist_ok=True)
            if not list(build_dir.glob("specdecode_skinny_linear*.so")):
                print("specdecode: compiling the CPU matmul and attention kernels (first use only, a few minutes) ...", file=sys.stderr)
            # PyTorch's own build lock is a plain file: a build killed mid-way (SIGTERM, SIGKILL) leaves it
            # behind and every later load waits on it forever. An flock dies with its process, so whoever holds
            # it knows no other build of ours is running and removes a leftover file first.
            with open(build_dir / "build.flock", "w") as guard:
                fcntl.flock(guard, fcntl.LOCK_EX)
                (build_dir / "lock").unlink(missing_ok=True)
                _kernel = load(
                    name="specdecode_skinny_linear",
                    sources=[str(path) for path in KERNEL_SOURCES],
                    extra_cflags=KERNEL_CFLAGS,
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(build_dir),
                    verbose=False,
                )
        except Exception as exc:  # a missing compiler must not stop inference, only slow it
            _kernel_failed = f"{type(exc).__name__}: {exc}"
            print(f"specdecode: CPU kernel unavailable, using torch matmul ({_kernel_failed})", file=sys.stderr)
            _kernel = None
        return _kernel


def kernel_status() -> str:
    if _kernel is not None:
        return "skinny-avx2"
    return f"torch ({_kernel_failed})" if _kernel_failed else "not loaded"


# ggml block types the gguf kernel reads (gguf.GGMLQuantizationType values): Q4_1, Q8_0, Q4_K, Q6_K.
# Kept here, not asked of the kernel, because converting a GGUF file saves its blocks without compiling
# anything; a test checks it against the kernel's own list (gguf_block_types).
GGUF_KERNEL_TYPES = frozenset({3, 8, 12, 14})


# ggml block types the int8 kernel (quant_dot.cpp) reads: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K. A test checks
# this against the kernel's own list (quant_block_types).
QUANT_KERNEL_TYPES = frozenset({2, 3, 6, 8, 12, 14})
Q8_0 = 8
# The int8 kernel's instruction set: "auto" picks AVX-512 VNNI where the CPU has it, else AVX2. Both give
# the same bits; SPECDECODE_ISA=avx2 forces the AVX2 path (for A/B timing).
QUANT_ISA = os.environ.get("SPECDECODE_ISA", "auto")


class QuantWeight:
    """A weight matrix kept as GGUF blocks, multiplied with int8-quantized activations (the int8 target).

    One part per source tensor, stacked along the output dimension. Every product runs through
    quant_dot.cpp in blocks of at most SKINNY_MAX_ROWS rows, prompts included, so each row's result is
    the one that row gets alone: prefill, decode steps and verify blocks compute a token the same way.
    """

    dtype = torch.int8

    def __init__(self, parts: list[tuple[int, torch.Tensor]]):
        import gguf

        self.types = [int(t) for t, _ in parts]
        self.parts = [blocks.contiguous() for _, blocks in parts]
        weights_per_block, bytes_per_block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(self.types[0])]
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
        return QuantWeight([(self.types[0], self.parts[0].index_select(0, index))])

    def contiguous(self) -> "QuantWeight":
        return self

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] float32 -> [..., out]; any number of rows, SKINNY_MAX_ROWS per kernel call."""
        flat = x.reshape(-1, x.shape[-1])
        calls = [
            _kernel.quant_linear(flat[i : i + SKINNY_MAX_ROWS], self.parts, self.types, QUANT_ISA, -1)
            for i in range(0, flat.shape[0], SKINNY_MAX_ROWS)
        ]
        y = calls[0] if len(calls) == 1 else torch.cat(calls)
        return y.reshape(*x.shape[:-1], self.shape[0])


def int8_attn_in(x: torch.Tensor, norm: torch.Tensor, eps: float, qkv: QuantWeight, bias, cos, sin, config) -> torch.Tensor:
    """RMSNorm, QKV product (+ bias) and rotary embedding of an int8 layer in one call: [T, q + 2 kv]."""
    return _kernel.int8_attn_in(x.contiguous(), norm, eps, qkv.parts, qkv.types, bias, cos.contiguous(), sin.contiguous(),
                                config.n_heads, config.n_kv_heads, config.head_dim, QUANT_ISA)


def int8_attn_out(x: torch.Tensor, attn: torch.Tensor, out_proj: QuantWeight, norm: torch.Tensor, eps: float,
                  gate_up: QuantWeight, down: QuantWeight) -> torch.Tensor:
    """The rest of an int8 layer after attention in one call: output projection, residual, RMSNorm, SwiGLU MLP, residual."""
    return _kernel.int8_attn_out(x.contiguous(), attn, out_proj.parts, out_proj.types, norm, eps, gate_up.parts, gate_up.types,
                                 down.parts, down.types, QUANT_ISA)


# Off: GGUFWeight products use their float32 copy (identical outputs; for timing the two paths in one process).
READ_GGUF_BLOCKS = True


def gguf_blocks_enabled(device) -> bool:
    """Whether a float32 model loaded from GGUF on this device should keep its blocks for the gguf kernel.
    SPECDECODE_DENSE_WEIGHTS=1 turns it off (same outputs, float32 weights streamed: for A/B timing)."""
    return torch.device(device).type == "cpu" and load_kernel() is not None and not os.environ.get("SPECDECODE_DENSE_WEIGHTS")


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


def _kernel_rows(x: torch.Tensor, weight) -> torch.Tensor:
    if isinstance(weight, GGUFWeight):
        return _kernel.gguf_linear(x, weight.parts, weight.types)
    return _kernel.skinny_linear(x, weight)


def block_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
                    visible: torch.Tensor | None = None) -> torch.Tensor | None:
    """Attention of a decode step or verify block ([T, H, D] queries in cache rows start..start+T-1) over
    cache views [Hkv, >= start+T, D], through the CPU kernel: each row's result is independent of T.
    Causal, or for a token tree `visible` [T, T] bool (each node sees its ancestors and itself): a tree
    node then gets the bits of the same node in a chain. None where the kernel does not apply (no kernel,
    not CPU float32, odd head size); the caller falls back.
    """
    if (
        _kernel is None
        or q.device.type != "cpu"
        or not q.dtype == keys.dtype == values.dtype == torch.float32
        or q.shape[-1] % 8
    ):
        return None
    return _kernel.block_attention(q, keys, values, start, visible)


def linear(x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight.T (+ bias); weight is [out, in] float32, bfloat16, GGUFWeight or QuantWeight; x is float32."""
    if isinstance(weight, QuantWeight):
        y = weight.matmul(x)
        return y + bias if bias is not None else y
    if isinstance(weight, GGUFWeight) and not READ_GGUF_BLOCKS:
        weight = weight.dense
    low_precision = weight.dtype == torch.bfloat16
    if (
        _kernel is not None
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.shape[1] % 8 == 0
    ):
        rows = x.numel() // x.shape[-1]
        if rows <= SKINNY_MAX_ROWS:
            y = _kernel_rows(x, weight)
            return y + bias if bias is not None else y
        if rows <= (LOW_PRECISION_CHUNKED_MAX_ROWS if low_precision else FLOAT32_CHUNKED_MAX_ROWS):
            flat = x.reshape(rows, x.shape[-1])
            y = torch.cat([_kernel_rows(flat[i : i + SKINNY_MAX_ROWS], weight) for i in range(0, rows, SKINNY_MAX_ROWS)])
            y = y.reshape(*x.shape[:-1], weight.shape[0])
            return y + bias if bias is not None else y
    if isinstance(weight, GGUFWeight):
        weight = weight.dequantize(x.dtype)
    if weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    if (
        PREFILL_GEMM == "numpy"
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.numel() // x.shape[-1] > SKINNY_MAX_ROWS
        and not x.requires_grad
    ):
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        y = torch.from_numpy(np.matmul(flat.numpy(), weight.numpy().T)).reshape(*x.shape[:-1], weight.shape[0])
        return y + bias if bias is not None else y
    return F.linear(x, weight, bias)
