"""The GPU path: the native decoder's passes through row-exact Triton kernels (exact_pass.py, triton_kernels.py),
caches of many sequences in one device pool (kv_pool.py), passes of up to 64 rows captured as CUDA graphs.

`attach(model)` gives a native Transformer on a CUDA device its ExactPass; on a CPU only where Triton's
interpreter is on (TRITON_INTERPRET=1: the tests run the same kernels that way).
"""
from __future__ import annotations

import os


def unavailable(model) -> str | None:
    """Why the Triton path cannot run this model where it is; None where it can."""
    if model.int8:
        return "int8 (GGUF blocks) matrices run on the CPU kernels"
    return unavailable_for(model.config, model.device)


def unavailable_for(config, device) -> str | None:
    """Why the Triton path cannot run a model of this configuration on this device; None where it can."""
    index = getattr(device, "index", None)
    device = getattr(device, "type", str(device).partition(":")[0])
    if device != "cuda" and not (device == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"):
        return f"the Triton path runs on CUDA devices (this model is on {device})"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed (pip install triton)"
    if device == "cuda":
        import torch

        # Triton's kernels need bfloat16 MMA (sm_80): on a T4 or V100 the first pass would fail to compile
        major, minor = torch.cuda.get_device_capability(torch.device(device, index) if index is not None else None)
        if (major, minor) < (8, 0):
            return (f"the Triton kernels need a GPU of compute capability 8.0 or newer (bfloat16 MMA); this one is "
                    f"{major}.{minor}")
    if config.head_dim & (config.head_dim - 1) or config.head_dim < 16:
        return f"the Triton attention takes head sizes that are powers of two, not {config.head_dim}"
    return None


def attach(model, **options) -> str | None:
    """Run every pass of `model` through the Triton kernels (ExactPass(model, **options)); returns why not, or None.
    Caches made before this are not in its pools: attach before making any."""
    reason = unavailable(model)
    if reason is None:
        from .exact_pass import ExactPass

        model.exact_pass = ExactPass(model, **options)
    return reason
