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
# file under its own lock. The kernel build is the set-up's critical path (most of its CPU, and one long file): the
# others run at a lower priority and take what it leaves.
.venv/bin/python -c "from specdecode import kernels; kernels.load_kernel()" &
kernel=$!
nice -n 5 scripts/setup.sh test &
extras=$!
nice -n 5 .venv/bin/specdecode models pull smollm2-135m &
small=$!
# The second test model is the longest chain of the set-up (its download, then converting it takes half a minute of
# one core): it runs at the lowest priority, after everything the tests need, and the tests start without waiting
# for it. A test that needs it first waits for it (the pull and the conversion each hold a lock per file, and the
# test's own load takes the same locks). Its progress goes to a log, shown if it fails.
draft_log=$(mktemp)
nice -n 19 .venv/bin/specdecode models pull qwen2.5-coder-0.5b >"$draft_log" 2>&1 &
draft=$!
# llama.cpp's own converter (its sources, no build) for the tests that convert tiny models of every architecture;
# the tests that need llama-quantize run where scripts/build_llamacpp.sh has built it, and skip saying so elsewhere.
{ nice -n 5 scripts/build_llamacpp.sh --sources || echo "test: llama.cpp's sources could not be fetched; the converter tests will skip" >&2; } &
sources=$!
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "test: installing Debian's chromium for the playground test" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1) || echo "test: chromium install failed; the browser test will skip" >&2
fi
wait "$extras" || { echo "test: installing the test extras failed" >&2; exit 1; }
wait "$small" || { echo "test: pulling smollm2-135m failed" >&2; exit 1; }
wait "$kernel" || true  # a kernel that does not build is reported by the tests (and fails CI: tests/conftest.py)
wait "$sources"
# One worker per core, one thread each: the tests run small models, whose steps are mostly fixed costs a second
# thread cannot share, so two one-thread workers ran the suite ~2.5x faster than one two-thread process. Workers
# take whole files (loadfile): the tests that start a local Ray cluster are one file, so one cluster runs at a
# time. (xdist's loadgroup does not group on pytest 9, which ignores the group suffix it writes into node ids.) The
# files go out in collection order, which tests/conftest.py starts with the longest (LONGEST_FIRST).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
status=0
.venv/bin/python -m pytest tests -q -n auto --dist loadfile --no-loadscope-reorder "$@" || status=$?
# The tests that need the second model fail or skip where it is missing; a pull that failed fails the run either way.
wait "$draft" || { cat "$draft_log" >&2; echo "test: pulling qwen2.5-coder-0.5b failed" >&2; exit 1; }
rm -f "$draft_log"
exit "$status"
