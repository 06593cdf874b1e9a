#!/usr/bin/env bash
# Builds llama.cpp's own tools (llama-bench, llama-speculative-simple, llama-completion, llama-server,
# llama-quantize) from the llama.cpp vendored in the llama-cpp-python sdist, for `specdecode bench --peers`,
# for serving benchmarks against llama-server (several slots, -np) and for test files of every quantization.
#
# Usage: scripts/build_llamacpp.sh [--sources] [BIN_DIR]
#   --sources        only fetch and unpack the sources (convert_hf_to_gguf.py, gguf-py): what the tests that convert
#                    tiny models need; seconds instead of a build
#   BIN_DIR          where the binaries go (default: $LLAMACPP_BIN, else ${SPECDECODE_CACHE:-~/.cache/specdecode}/llama.cpp/bin)
#   LLAMACPP_CMAKE_FLAGS  extra cmake flags appended to the configure line (e.g. "-DGGML_AVX512=ON")
#   LLAMACPP_JOBS    parallel compile jobs (default 2)
#   LLAMACPP_PY_VERSION   llama-cpp-python sdist to take llama.cpp from (default 0.3.36)
#
# GGML_NATIVE=OFF with explicit flags: GGML_NATIVE=ON (-march=native) crashed on batched work on an AMX
# machine. The flags are the best this CPU has: AVX2/FMA/F16C everywhere, plus AVX-512 (F, BW, DQ, VL,
# VNNI, VBMI) where the CPU has all of them, which makes llama.cpp's decoding faster there: a peer is
# measured at its best. Idempotent: does nothing when all binaries are in BIN_DIR, built with the same
# flags (BIN_DIR/.flags). Sources and the build tree live next to BIN_DIR (never in the repository).
# llama-server is built without its web UI (LLAMA_BUILD_UI=OFF: no npm build; LLAMA_USE_PREBUILT_UI=OFF:
# no download from Hugging Face at build time): the HTTP API works, `/` has no page. It needs neither curl
# nor OpenSSL (OpenSSL, if found, only adds HTTPS support).
set -euo pipefail

SOURCES_ONLY=0
if [ "${1:-}" = "--sources" ]; then SOURCES_ONLY=1; shift; fi
VERSION=${LLAMACPP_PY_VERSION:-0.3.36}
BIN=${1:-${LLAMACPP_BIN:-${SPECDECODE_CACHE:-$HOME/.cache/specdecode}/llama.cpp/bin}}
JOBS=${LLAMACPP_JOBS:-2}
TARGETS=(llama-bench llama-speculative-simple llama-completion llama-server llama-quantize)

ISA_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has_all=1
for f in avx512f avx512bw avx512dq avx512vl avx512_vnni avx512vbmi; do
  case " $cpu_flags " in *" $f "*) ;; *) has_all=0 ;; esac
done
if [ "$has_all" = 1 ]; then
  ISA_FLAGS="$ISA_FLAGS -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON"
else  # explicit OFF: the CMake cache of an earlier build on another CPU must not keep them on
  ISA_FLAGS="$ISA_FLAGS -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_VBMI=OFF"
fi
FLAGS="$ISA_FLAGS ${LLAMACPP_CMAKE_FLAGS:-}"

missing=0
for t in "${TARGETS[@]}"; do [ -x "$BIN/$t" ] || missing=1; done
if [ "$SOURCES_ONLY" = 0 ] && [ "$missing" = 0 ] && [ "$(cat "$BIN/.flags" 2>/dev/null)" = "$FLAGS" ]; then
  echo "build_llamacpp: binaries already in $BIN" >&2
  exit 0
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi

WORK=$(dirname "$BIN")/src-$VERSION
mkdir -p "$WORK" "$BIN"
cd "$WORK"

sdist=$(ls llama_cpp_python-"$VERSION".tar.gz 2>/dev/null || true)
if [ -z "$sdist" ]; then
  echo "build_llamacpp: downloading the llama-cpp-python==$VERSION sdist" >&2
  # --no-binary for this package only: with :all: pip also built its build dependencies (cmake among them) from
  # source just to read the sdist's metadata, minutes on a machine without a pip cache instead of ~10 s.
  "$PY" -m pip download -q --disable-pip-version-check --no-binary llama-cpp-python --no-deps \
    "llama-cpp-python==$VERSION" -d "$WORK"
  sdist=$(ls llama_cpp_python-"$VERSION".tar.gz)
fi
SRC=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  tar xzf "$sdist"
fi
[ -f "$SRC/CMakeLists.txt" ] || { echo "build_llamacpp: no vendor/llama.cpp in the sdist" >&2; exit 1; }
if [ "$SOURCES_ONLY" = 1 ]; then
  echo "build_llamacpp: sources in $SRC" >&2
  exit 0
fi

CMAKE=cmake
if ! command -v cmake >/dev/null 2>&1; then
  if [ -x "$ROOT/.venv/bin/cmake" ]; then
    CMAKE="$ROOT/.venv/bin/cmake"
  else
    echo "build_llamacpp: cmake not found, installing it into the venv with pip" >&2
    "$ROOT/.venv/bin/python" -m pip install -q --disable-pip-version-check cmake
    CMAKE="$ROOT/.venv/bin/cmake"
  fi
fi
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)

BUILD=$WORK/build
start=$(date +%s)
# shellcheck disable=SC2086  # FLAGS is a list of flags on purpose
nice -n 19 "$CMAKE" -S "$SRC" -B "$BUILD" ${GEN[@]+"${GEN[@]}"} \
  -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  $FLAGS
nice -n 19 "$CMAKE" --build "$BUILD" --config Release -j "$JOBS" --target "${TARGETS[@]}"
for t in "${TARGETS[@]}"; do
  cp "$BUILD/bin/$t" "$BIN/$t"
done
echo "$FLAGS" > "$BIN/.flags"
echo "build_llamacpp: built ${TARGETS[*]} into $BIN in $(( $(date +%s) - start ))s" >&2
