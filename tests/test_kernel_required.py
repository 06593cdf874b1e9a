"""CI must not pass with the kernel's tests skipped: a run that requires the kernel fails when it does not build."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICK_TEST = "tests/test_text.py::test_incremental_detokenizer_keeps_multibyte_characters_whole"


def run_pytest(**env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "SPECDECODE_REQUIRE_KERNEL")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", QUICK_TEST],
                          cwd=ROOT, env={**clean, "SPECDECODE_NO_KERNEL": "1", **env}, capture_output=True, text=True,
                          timeout=300)


def test_a_ci_run_fails_when_the_kernel_is_unavailable():
    """CI passed with ~30 lossless tests skipped when the kernel did not build."""
    for env in ({"CI": "true"}, {"SPECDECODE_REQUIRE_KERNEL": "1"}):
        result = run_pytest(**env)
        assert result.returncode != 0, (env, result.stdout[-2000:])
        assert "the CPU kernel is unavailable (torch (disabled by SPECDECODE_NO_KERNEL))" in result.stdout, result.stdout[-2000:]


def test_outside_ci_a_missing_kernel_only_skips_its_tests():
    result = run_pytest()
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def test_the_ci_script_requires_the_kernel():
    assert "export SPECDECODE_REQUIRE_KERNEL=1" in (ROOT / ".ci" / "run").read_text()
