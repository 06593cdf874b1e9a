#!/usr/bin/env bash
# Creates .venv (once) and installs specdecode with the extras named (comma-separated; none: the core library).
#   scripts/setup.sh serve      # what the demo needs: the core and the server
#   scripts/setup.sh test       # the test suite: everything (serve, bench, cluster, test tools)
# Re-runs pip only when pyproject.toml changes or new extras are asked for.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
extras=${1:-}
start=$(date +%s)
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
stamp=".venv/.specdecode-installed${extras:+-${extras//,/-}}"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing specdecode${extras:+ with extras $extras} (about 2 minutes the first time)" >&2
  # torch is pinned to 2.13.0 in pyproject.toml: the CPU build; an unpinned torch would pull a CUDA build.
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extras:+[$extras]}" 2>&1 \
    | grep -v -E "^(WARNING: Location|$)" >&2 || true
  .venv/bin/python -c "import specdecode, torch, gguf, transformers" || { echo "setup: install failed" >&2; exit 1; }
  echo "$want" > "$stamp"
  echo "setup: installed in $(( $(date +%s) - start )) s" >&2
fi
