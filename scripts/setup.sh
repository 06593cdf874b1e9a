#!/usr/bin/env bash
# Creates .venv (once) and installs specdecode with its test and cluster extras; re-runs only when pyproject changes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.specdecode-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing specdecode and its dependencies (a few minutes the first time)" >&2
  # torch is pinned to 2.13.0 in pyproject.toml: the CPU build; an unpinned torch would pull a CUDA build.
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,cluster]" 2>&1 | grep -v -E "^(WARNING: Location|$)" >&2 || true
  .venv/bin/python -c "import specdecode, torch, gguf, transformers, fastapi, ray.serve" || { echo "setup: install failed" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
