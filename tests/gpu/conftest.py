"""The GPU path's tests run everywhere: on a machine without CUDA, the same Triton kernels run on CPU tensors in
Triton's interpreter (TRITON_INTERPRET=1, read when the kernels are defined, so it is set here, before any test
imports them), made faster where that changes nothing a kernel computes (testlib.fast_triton_interpreter)."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from testlib import fast_triton_interpreter  # noqa: E402  (after the variable: nothing it imports defines kernels)


@pytest.fixture(autouse=True)
def _fast_interpreter():
    # CI installs the test extra, Triton included: there a missing Triton fails these tests instead of skipping them
    required = any(os.environ.get(name, "").lower() in ("1", "true", "yes") for name in ("CI", "SPECDECODE_REQUIRE_KERNEL"))
    triton = __import__("triton") if required else pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        fast_triton_interpreter()
    return triton
