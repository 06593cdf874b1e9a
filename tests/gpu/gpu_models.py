"""Tiny models on the GPU path for the tests: the Triton kernels with small tiles, so that tiny widths still
split every product and tiny contexts still span several attention segments. The kernels are the production
kernels; only their fixed sizes are smaller (production: exact_pass.Tiles())."""
from __future__ import annotations

import torch

from specdecode import gpu
from specdecode.gpu.exact_pass import ExactPass, Tiles
from testlib import TINY_CONFIGS, make_tiny_model, perturbed_copy

# The split sums and the activation in the products' tiles are on here (off in production until a device run shows
# them bitwise): every test runs them, and tests/gpu/test_triton_rows.py compares them with the production kernels.
TEST_TILES = Tiles(block_n=128, block_k=32, max_split=32, attn_split=16, attn_chunk=8, elementwise=64,
                   fused_sums=True, fused_act=True)
# The caches' length: 4 attention segments of 16 keys
CONTEXT = 64


def on_gpu_path(model, pass_type=ExactPass, tiles: Tiles = TEST_TILES):
    """`model` with its passes through the Triton kernels (on CUDA where there is one)."""
    if torch.cuda.is_available():
        model = model.to("cuda")
    reason = gpu.unavailable(model)
    assert reason is None, reason
    model.exact_pass = pass_type(model, tiles=tiles)
    return model


def tiny_gpu_model(name: str = "qwen2-gqa-bias", seed: int = 9, pass_type=ExactPass, tiles: Tiles = TEST_TILES):
    return on_gpu_path(make_tiny_model(seed=seed, max_positions=CONTEXT, **TINY_CONFIGS[name]), pass_type, tiles)


def tiny_target_and_draft(name: str = "qwen2-gqa-bias", seed: int = 9):
    """A tiny target and a strong draft of it (its weights plus a little noise), both on the GPU path."""
    target = make_tiny_model(seed=seed, max_positions=CONTEXT, **TINY_CONFIGS[name])
    draft = perturbed_copy(target, 0.05, seed=3, max_positions=CONTEXT)
    return on_gpu_path(target), on_gpu_path(draft)
