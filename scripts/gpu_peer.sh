#!/usr/bin/env bash
# Issue 64 item 7: llama.cpp's CUDA backend as the peer, in one call on a lent GPU, on the same files as ours.
# Needs peer-cuda/llama.cpp.tar.xz (scripts/llamacpp_cuda_tree.sh; carry it: `carry: ["peer-cuda"]`), nvcc, CMake
# and ninja there. In order:
#   1. builds llama-bench and llama-speculative-simple for this GPU's architecture in the background (16 cores);
#   2. meanwhile, where --check PARTS is given, runs scripts/gpu_check.sh --parts PARTS (exactness parts only: the
#      compiler holds the CPUs, so nothing timed may run beside it), then writes random-weight GGUF files of the
#      0.5B (its file's Q5_0 layout), 1.5B and 7B shapes (Q4_K_M) with Qwen2's tokenizer (scripts/gguf_random.py);
#   3. once the build is done, alone on the machine: llama-bench (-ngl 99 -fa 1, pp512 and tg128, 3 repetitions)
#      on each file, llama-speculative-simple (1.5B with the 0.5B draft, 128 tokens), and specdecode on the same
#      files (scripts/gpu_peer_ours.py: pp512 and tg128 counted as llama-bench counts, then its engine plain and
#      with the default drafter);
#   4. writes $OUT/report.md (ratios in this one run) beside each tool's raw output;
#   5. where --then PARTS is given, runs scripts/gpu_check.sh --parts PARTS (timed parts: seed, swap, long, ...)
#      with what is left of --budget seconds (default 520) counted from the start.
# What failed is reported and the rest goes on; reports are written as each stage ends, so a call cut by its
# timeout keeps what was done. The first call on a lent GPU, with carry ["peer-cuda"] and timeout_s ~580:
#   scripts/gpu_peer.sh --check exact,exact7b,blocks,rounds,sampling,verdicts --then seed,swap,long
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-peer-out}
mkdir -p "$out"
check="" then="" shapes="0.5b,1.5b,7b" budget=520
while [ $# -gt 0 ]; do
  case $1 in
    --check) check=$2; shift 2 ;;
    --then) then=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --shapes) shapes=$2; shift 2 ;;
    *) echo "gpu_peer: unknown argument $1" >&2; exit 2 ;;
  esac
done
log() { echo "[gpu_peer $(date +%T)] $*" | tee -a "$out/steps.log"; }
prompt="Write a Python function that returns the n-th Fibonacci number, with a docstring and a test."
work=/tmp/gpu-peer
mkdir -p "$work/models"
tar -C "$work" -xJf peer-cuda/llama.cpp.tar.xz || { log "no peer-cuda/llama.cpp.tar.xz (scripts/llamacpp_cuda_tree.sh)"; exit 1; }
src=$work/llama.cpp
source scripts/device_python.sh  # gguf, from the wheel carried in peer-cuda/
# no wheel carried: the sources' own gguf-py, enough for gguf_random.py (not for GGUF tokenizers: no metadata)
python3 -c "import gguf" 2>/dev/null || export PYTHONPATH="$src/gguf-py${PYTHONPATH:+:$PYTHONPATH}"
arch=$(python3 -c "import torch; print('%d%d' % torch.cuda.get_device_capability())")

# 1. the build, in the background
# What CMake would not find itself (pip's cuBLAS, the driver's versioned library): scripts/cuda_build_flags.sh
cuda_flags=()
while IFS= read -r flag; do
  case $flag in
    LD_LIBRARY_PATH=*) export LD_LIBRARY_PATH="${flag#LD_LIBRARY_PATH=}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
    ?*) cuda_flags+=("$flag") ;;
  esac
done < <(scripts/cuda_build_flags.sh 2>>"$out/steps.log")
[ ${#cuda_flags[@]} -gt 0 ] && log "CMake told: ${cuda_flags[*]}"
(
  cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_TOOLS=ON "${cuda_flags[@]}" &&
  cmake --build "$work/build" -j "$(nproc)" --target llama-bench llama-speculative-simple
) > "$out/build.log" 2>&1 &
build=$!
log "building llama.cpp (CUDA, sm_$arch) in the background"

# 2. exactness and files while it builds
if [ -n "$check" ]; then
  OUT="$out/check" scripts/gpu_check.sh --parts "$check" > /dev/null 2>&1
  log "gpu_check --parts $check: rc $? ($out/check/report.md)"
fi
for shape in ${shapes//,/ }; do
  layout=q4_k_m; [ "$shape" = 0.5b ] && layout=q5_0
  python3 scripts/gguf_random.py --shape "$shape" --layout "$layout" \
    --vocab "$src/models/ggml-vocab-qwen2.gguf" --out "$work/models/$shape.gguf" >> "$out/steps.log" 2>&1 \
    || log "gguf_random $shape failed"
done
wait "$build"
built=$?
log "build rc $built ($(tail -1 "$out/build.log"))"

# 3. alone on the machine: the peers, then ours
bin=$work/build/bin
for shape in ${shapes//,/ }; do
  file=$work/models/$shape.gguf
  [ -f "$file" ] || continue
  if [ "$built" = 0 ]; then
    "$bin/llama-bench" -m "$file" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o json > "$out/llama-bench-$shape.json" \
      2> "$out/llama-bench-$shape.log" || log "llama-bench $shape failed"
  fi
  draft=""; [ "$shape" != 0.5b ] && [ -f "$work/models/0.5b.gguf" ] && draft="--draft $work/models/0.5b.gguf"
  PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" python3 scripts/gpu_peer_ours.py --model "$file" $draft \
    --prompt "$prompt" --out "$out/ours-$shape.json" > "$out/ours-$shape.log" 2>&1 || log "ours $shape failed"
  PYTHONPATH=. python3 scripts/gpu_peer_ours.py --report "$out" --shapes "$shapes" > /dev/null 2>&1
done
if [ "$built" = 0 ] && [ -f "$work/models/1.5b.gguf" ] && [ -f "$work/models/0.5b.gguf" ]; then
  "$bin/llama-speculative-simple" -m "$work/models/1.5b.gguf" -md "$work/models/0.5b.gguf" -ngl 99 -ngld 99 \
    -fa on -c 2048 -n 128 --temp 0 -p "$prompt" \
    > "$out/speculative-simple.log" 2>&1 || log "llama-speculative-simple failed"
fi

# 4. the report
PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" python3 scripts/gpu_peer_ours.py --report "$out" --shapes "$shapes"
log "peers done: $out/report.md"

# 5. timed parts of the device check with the time left
if [ -n "$then" ]; then
  left=$((budget - SECONDS))
  if [ "$left" -gt 30 ]; then
    OUT="$out/then" scripts/gpu_check.sh --parts "$then" --budget "$left" > /dev/null 2>&1
    log "gpu_check --parts $then --budget $left: rc $? ($out/then/report.md)"
  else
    log "no time left for gpu_check --parts $then"
  fi
fi
