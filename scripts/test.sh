#!/usr/bin/env bash
# The test suite on a fresh machine: set up, fetch the real test models and a headless browser, run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
.venv/bin/specdecode models pull smollm2-135m qwen2.5-coder-0.5b
# llama.cpp's own converter (its sources, no build) for the tests that convert tiny models of every architecture;
# the tests that need llama-quantize run where scripts/build_llamacpp.sh has built it, and skip saying so elsewhere.
scripts/build_llamacpp.sh --sources || echo "test: llama.cpp's sources could not be fetched; the converter tests will skip" >&2
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "test: installing Debian's chromium for the playground test" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || echo "test: chromium install failed; the browser test will skip" >&2
fi
exec .venv/bin/python -m pytest tests -q "$@"
