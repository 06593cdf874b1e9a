#!/usr/bin/env bash
# The test suite on a fresh machine: set up, fetch the real test models and a headless browser, run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh  # the core library first: it is all the kernel build needs
# The CPU kernel compiles (CPU-bound, about a minute) while the extras install and the models, llama.cpp's sources
# and chromium download (network-bound).
.venv/bin/python -c "from specdecode import kernels; kernels.load_kernel()" &
kernel=$!
scripts/setup.sh test
.venv/bin/specdecode models pull smollm2-135m qwen2.5-coder-0.5b
# llama.cpp's own converter (its sources, no build) for the tests that convert tiny models of every architecture;
# the tests that need llama-quantize run where scripts/build_llamacpp.sh has built it, and skip saying so elsewhere.
scripts/build_llamacpp.sh --sources || echo "test: llama.cpp's sources could not be fetched; the converter tests will skip" >&2
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "test: installing Debian's chromium for the playground test" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || echo "test: chromium install failed; the browser test will skip" >&2
fi
wait "$kernel" || true  # a kernel that does not build is reported by the tests (and fails CI: tests/conftest.py)
# One worker per core, one thread each: the tests run small models, whose steps are mostly fixed costs a second
# thread cannot share, so two one-thread workers ran the suite ~2.5x faster than one two-thread process. Workers
# take whole files (loadfile): the tests that start a local Ray cluster are one file, so one cluster runs at a
# time. (xdist's loadgroup does not group on pytest 9, which ignores the group suffix it writes into node ids.)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest tests -q -n auto --dist loadfile "$@"
