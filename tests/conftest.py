"""Shared fixtures. Helpers (tiny models, fake tokenizer, references) live in testlib.py."""
from __future__ import annotations

import pytest

from specdecode import kernels
from testlib import SMOLLM2


# --------------------------------------------------------------------------- kernel
@pytest.fixture(scope="session", autouse=True)
def _load_cpu_kernel():
    """Load the skinny CPU kernel once, up front, so every test (tiny or real model) runs the same
    matmul path whatever order the tests run in (loading is process-global and one-way)."""
    kernels.load_kernel()
    yield


@pytest.fixture(params=["kernel", "torch"])
def matmul_path(request, monkeypatch):
    """Run a test through the skinny kernel and through plain torch matmuls."""
    if request.param == "kernel":
        if kernels.load_kernel() is None:
            pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    else:
        monkeypatch.setattr(kernels.native, "_kernel", None)
    return request.param


# --------------------------------------------------------------------------- real models
@pytest.fixture(scope="session")
def smollm2():
    """The tiny real model (llama arch, vocab 49152); pulled on first use, ~1 s to load once converted."""
    from specdecode.models.loader import load_model

    return load_model(SMOLLM2, device="cpu", max_context=1024)
