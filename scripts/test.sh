#!/usr/bin/env bash
# The test suite on a fresh machine: set up, fetch the real test models and a headless browser, run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Python compiles each module once, when a test first imports it (setup.sh installs without compiling every module of
# every package), and keeps it: where PYTHONDONTWRITEBYTECODE is set, every worker and server process would compile
# it again.
unset PYTHONDONTWRITEBYTECODE
scripts/setup.sh  # the core library first: the kernel build and the model pulls need nothing more
# Five jobs at once: the CPU kernel compiles (CPU-bound, about a minute), the extras install, and each test model
# and llama.cpp's sources download (network-bound, then the models' conversion). None of them touches what another
# installs: the pulls and the kernel run on the core library the extras leave as it is, and each model is its own
# file under its own lock. One after another, the two models' pulls and conversions were the longest chain of the
# set-up (about 2 of its 3 minutes).
.venv/bin/python -c "from specdecode import kernels; kernels.load_kernel()" &
kernel=$!
scripts/setup.sh test &
extras=$!
.venv/bin/specdecode models pull smollm2-135m &
small=$!
.venv/bin/specdecode models pull qwen2.5-coder-0.5b &
draft=$!
# llama.cpp's own converter (its sources, no build) for the tests that convert tiny models of every architecture;
# the tests that need llama-quantize run where scripts/build_llamacpp.sh has built it, and skip saying so elsewhere.
{ scripts/build_llamacpp.sh --sources || echo "test: llama.cpp's sources could not be fetched; the converter tests will skip" >&2; } &
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "test: installing Debian's chromium for the playground test" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1) || echo "test: chromium install failed; the browser test will skip" >&2
fi
wait "$extras" || { echo "test: installing the test extras failed" >&2; exit 1; }
wait "$small" && wait "$draft" || { echo "test: pulling the test models failed" >&2; exit 1; }
wait "$kernel" || true  # a kernel that does not build is reported by the tests (and fails CI: tests/conftest.py)
wait  # llama.cpp's sources (after the waits by pid: a bare wait forgets the statuses of the jobs it reaps)
# One worker per core, one thread each: the tests run small models, whose steps are mostly fixed costs a second
# thread cannot share, so two one-thread workers ran the suite ~2.5x faster than one two-thread process. Workers
# take whole files (loadfile): the tests that start a local Ray cluster are one file, so one cluster runs at a
# time. (xdist's loadgroup does not group on pytest 9, which ignores the group suffix it writes into node ids.)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest tests -q -n auto --dist loadfile "$@"
