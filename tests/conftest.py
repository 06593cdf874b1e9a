"""Shared fixtures. Helpers (tiny models, fake tokenizer, references) live in testlib.py."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdecode import kernels
from testlib import SMOLLM2


# --------------------------------------------------------------------------- order
# The files that take longest, longest first. scripts/test.sh hands xdist's workers whole files in collection order
# (--no-loadscope-reorder; xdist's own order starts the files with the most tests first, which left the Ray cluster
# file, ten tests and two minutes, to run last and alone). The second real model's files come after the first few:
# on a fresh machine it is still being pulled when the tests start.
LONGEST_FIRST = (
    "server/test_cluster.py", "lossless/test_greedy_identity.py", "gpu/test_triton_rows.py",
    "gpu/test_triton_identity.py", "lossless/test_controls_identity.py",
    "lossless/test_sampling_distribution.py", "lossless/test_batch_draft.py", "models/test_hf_match.py",
    "models/test_float_gguf.py", "server/test_tool_calls.py", "server/test_shutdown.py", "models/test_loader.py",
    "test_bench.py", "server/test_structured.py", "models/test_phi3.py", "models/test_rope.py",
    "lossless/test_batch_invariance.py", "gpu/test_batch_ahead.py",
)


def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).parent
    missing = [name for name in LONGEST_FIRST if not (tests / name).is_file()]
    assert not missing, f"tests/conftest.py LONGEST_FIRST names files that do not exist: {missing}"
    rank = {str(tests / name): i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))  # stable: the rest keep their order


# --------------------------------------------------------------------------- kernel
def kernel_required() -> bool:
    """In CI (CI=true, or SPECDECODE_REQUIRE_KERNEL=1 as .ci/run sets) a kernel that does not build fails the run:
    otherwise the ~30 lossless tests that need it skip and the run passes having checked none of them."""
    return any(os.environ.get(name, "").lower() in ("1", "true", "yes") for name in ("CI", "SPECDECODE_REQUIRE_KERNEL"))


@pytest.fixture(scope="session", autouse=True)
def _load_cpu_kernel():
    """Load the skinny CPU kernel once, up front, so every test (tiny or real model) runs the same
    matmul path whatever order the tests run in (loading is process-global and one-way)."""
    if kernels.load_kernel() is None and kernel_required():
        pytest.exit(f"the CPU kernel is unavailable ({kernels.kernel_status()}) and this run requires it"
                    " (CI or SPECDECODE_REQUIRE_KERNEL): its tests would all skip", returncode=3)
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


# --------------------------------------------------------------------------- the command line
@pytest.fixture
def cli(capsys, monkeypatch):
    """main(argv) as `python -m specdecode.cli` runs it, in this process (no Python start, no imports: ~2 s less
    than a subprocess): its exit status, stdout and stderr."""
    from specdecode.cli import main

    def run(*args: str, env: dict | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's refusals
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["specdecode", *args], code, out, err)

    return run
