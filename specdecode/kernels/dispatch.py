"""Which kernel computes a product or an attention: the native one where it applies, else torch.

Rows decide: decode steps and verify blocks (up to SKINNY_MAX_ROWS) always take the native kernel,
which computes each row the same way whatever the block size; prompt-sized float32 products take a
BLAS GEMM (plain and speculative decoding share the prefill, and a float32 target prefills in chunks
the exact kernel computes, see FLOAT32_CHUNKED_MAX_ROWS).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from . import native
from . import options
from .weights import SKINNY_MAX_ROWS, GGUFWeight, QuantWeight, quant_isa

# Prompt-sized products up to these row counts also run through the kernel, in SKINNY_MAX_ROWS chunks,
# because below them the GEMM loses on the CPUs measured (docs/cpu.md): bfloat16/int8 weights would first
# be converted to float32 for it, and for a few dozen rows it still streams and packs 4 bytes per weight.
LOW_PRECISION_CHUNKED_MAX_ROWS = 256
FLOAT32_CHUNKED_MAX_ROWS = 128
# Prefill-sized float32 products go through numpy's BLAS (OpenBLAS) unless options.OPTIONS.prefill_gemm says
# torch: faster than torch's GEMM for these shapes where measured (docs/cpu.md). Plain and speculative decoding
# share the prefill, so this changes no comparison between them.


def int8_attn_in(x: torch.Tensor, layer, cos, sin, config) -> torch.Tensor:
    """RMSNorm, QKV product (+ bias), per-head q/k RMSNorm where the layer has one (Qwen3) and rotary embedding of
    an int8 layer (models.transformer.DecoderLayer) in one call: [T, q + 2 kv]."""
    return native._kernel.int8_attn_in(x.contiguous(), layer.attn_norm, config.rms_norm_eps, layer.qkv.parts, layer.qkv.types,
                                       layer.qkv_bias, layer.q_norm, layer.k_norm, cos.contiguous(), sin.contiguous(),
                                       config.n_heads, config.n_kv_heads, config.head_dim, quant_isa())


# The gate activations the int8 layer computes (int8_layer.cpp's Activation), by models.config.Architecture.activation.
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


def int8_attn_out(x: torch.Tensor, attn: torch.Tensor, layer, config) -> torch.Tensor:
    """The rest of an int8 layer after attention in one call: output projection (and its norm, Gemma), residual,
    RMSNorm, gated MLP (and its norm), residual."""
    return native._kernel.int8_attn_out(
        x.contiguous(), attn, layer.out_proj.parts, layer.out_proj.types, layer.mlp_norm, config.rms_norm_eps,
        layer.gate_up.parts, layer.gate_up.types, layer.down.parts, layer.down.types, quant_isa(), layer.post_attn_norm,
        layer.post_mlp_norm, ACTIVATIONS[config.architecture.activation])


# Off: an int8 layer runs as its three calls (int8_attn_in, block_attention, int8_attn_out) with the cache
# written in between by PyTorch: the same bits, for the test that says so.
FUSED_LAYER = True


def int8_layer(x: torch.Tensor, layer, layer_index: int, spans, cos, sin, config) -> torch.Tensor:
    """A whole int8 decoder layer in one call over the rows of one or more sequences (models.transformer.RowSpan:
    each its cache, start and row count, and `visible` for a token tree): int8_attn_in over all rows, each
    span's keys and values written to its cache ([Hkv, max_len, D] per layer), block attention per span
    (row-exact), int8_attn_out over all rows. The same operations as the three calls, without the PyTorch
    dispatch between them."""
    c = config
    none = torch.empty(0, dtype=torch.bool)
    return native._kernel.int8_layer(
        x.contiguous(), layer.attn_norm, c.rms_norm_eps, layer.qkv.parts, layer.qkv.types, layer.qkv_bias, layer.q_norm,
        layer.k_norm, cos.contiguous(), sin.contiguous(), c.n_heads, c.n_kv_heads, c.head_dim,
        [s.cache.keys[layer_index] for s in spans], [s.cache.values[layer_index] for s in spans],
        [s.start for s in spans], [s.rows for s in spans], [none if s.visible is None else s.visible for s in spans],
        layer.out_proj.parts, layer.out_proj.types, layer.mlp_norm, layer.gate_up.parts, layer.gate_up.types,
        layer.down.parts, layer.down.types, quant_isa(), layer.post_attn_norm, layer.post_mlp_norm,
        ACTIVATIONS[c.architecture.activation], c.attention_scale or 0.0, layer.window)


# Off: GGUFWeight products use their float32 copy (identical outputs; for timing the two paths in one process).
READ_GGUF_BLOCKS = True


def _kernel_rows(x: torch.Tensor, weight) -> torch.Tensor:
    if isinstance(weight, GGUFWeight):
        return native._kernel.gguf_linear(x, weight.parts, weight.types)
    return native._kernel.skinny_linear(x, weight)


def block_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
                    visible: torch.Tensor | None = None, scale: float = 0.0, window: int = 0) -> torch.Tensor | None:
    """Attention of a decode step or verify block ([T, H, D] queries in cache rows start..start+T-1) over
    cache views [Hkv, >= start+T, D], through the CPU kernel: each row's result is independent of T.
    Causal, or for a token tree `visible` [T, T] bool (each node sees its ancestors and itself): a tree
    node then gets the bits of the same node in a chain. scale: the factor on q.k (0: 1/sqrt(head_dim)); window:
    a sliding window's size (0: none), a row at position p seeing keys after p - window. None where the kernel does not apply (no kernel,
    not CPU float32, odd head size); the caller falls back.
    """
    if (
        native._kernel is None
        or q.device.type != "cpu"
        or not q.dtype == keys.dtype == values.dtype == torch.float32
        or q.shape[-1] % 8
    ):
        return None
    return native._kernel.block_attention(q, keys, values, start, visible, scale, window)


def linear(x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight.T (+ bias); weight is [out, in] float32, bfloat16, GGUFWeight or QuantWeight; x is float32."""
    if isinstance(weight, QuantWeight):
        y = weight.matmul(x)
        return y + bias if bias is not None else y
    if isinstance(weight, GGUFWeight) and not READ_GGUF_BLOCKS:
        weight = weight.dense
    low_precision = weight.dtype == torch.bfloat16
    if (
        native._kernel is not None
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
        options.OPTIONS.prefill_gemm == "numpy"
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.numel() // x.shape[-1] > SKINNY_MAX_ROWS
        and not x.requires_grad
    ):
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        y = torch.from_numpy(np.matmul(flat.numpy(), weight.numpy().T)).reshape(*x.shape[:-1], weight.shape[0])
        return y + bias if bias is not None else y
    return F.linear(x, weight, bias)
