"""The GPU path's tests run everywhere: on a machine without CUDA, the same Triton kernels run on CPU tensors in
Triton's interpreter (TRITON_INTERPRET=1, read when the kernels are defined, so it is set here, before any test
imports them). The interpreter's integer-overflow checks (a debugging aid that costs it most of its time) are off."""
import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _fast_interpreter():
    # CI installs the test extra, Triton included: there a missing Triton fails these tests instead of skipping them
    required = any(os.environ.get(name, "").lower() in ("1", "true", "yes") for name in ("CI", "SPECDECODE_REQUIRE_KERNEL"))
    triton = __import__("triton") if required else pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        from triton.runtime import interpreter

        builder = interpreter.interpreter_builder
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
    return triton
