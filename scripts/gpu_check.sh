#!/usr/bin/env bash
# The GPU device check: exactness and speed of the Triton path on random-weight models in the shapes of Qwen2.5
# 0.5B, 1.5B and 7B, with transformers' generate modes on the same models in the same run (scripts/gpu_check.py).
# Needs a CUDA device with torch, triton and transformers installed; installs nothing and downloads nothing.
# Writes report.md, results.json and log.txt to $OUT (default gpu-check-out/). Extra arguments go to the script
# (--parts exact,speed,cost,7b picks parts; --budget S: no part starts after S seconds; --tiny tries the script
# itself on tiny shapes without a GPU).
# Exactness runs first whatever the parts: rows and batches of the 1.5B shape (with the fused split sums, the fused
# activation and a twin whose splits arrive in reverse, none yet measured on a device), every GGUF block type's
# products, transformers, the loader, the drafters, then the 7B shape's rows; then issue 64's parts, none yet run on
# a device: rounds (draft chains as device rounds), sampling (the race's bits, PTX; sampled vs greedy speed),
# verdicts (accept.py's kernel, 16 batched requests with device verdicts on and off), each part's exactness before
# their speed; then the long speed parts. The first call on a lent GPU, estimated 5-7 minutes on an H100 once the
# machine is up (~30 s imports and models, exact with the blocks' products ~2.5 min, the 7B shape's build and rows
# ~1.5 min, the three issue-64 parts ~2 min; the blocks' speed table, last, starts only if the budget allows, ~1.5
# min more); give it timeout_s ~540 (what a part has written stays in $OUT if it is cut):
#   scripts/gpu_check.sh --parts exact,exact7b,blocks,rounds,sampling,verdicts,pdl --budget 360
# or, to build llama.cpp's CUDA peer during those exactness parts (issue 64 item 7; carry ["peer-cuda"], made by
# scripts/llamacpp_cuda_tree.sh; timeout_s ~580), then the timed parts swap, long and seed with the time left:
#   scripts/gpu_peer.sh --check exact,exact7b,blocks,rounds,sampling,verdicts --then seed,swap,long
# Parts added for issue 64 (each tried here with --tiny): swap (16-row transposed tiles, sublayers ended in their
# products: rows exact under each, then timed against the defaults), long (first token of 1k-16k prompts against
# transformers' cuBLAS + SDPA forward, decoding at 32k positions), seed (7B, 32B, 72B targets as Q4_K_M blocks
# built on the device, the 0.5B draft's proposals, and projected speedups of draft chains from the CPU's acceptance
# by depth, docs/bench/draft-chains-*).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
source scripts/device_python.sh  # gguf, from the wheel carried in peer-cuda/
PYTHONPATH=".:tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 python3 scripts/gpu_check.py --out "$out" "$@" \
  2>&1 | tee "$out/log.txt"
