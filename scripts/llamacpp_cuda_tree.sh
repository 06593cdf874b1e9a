#!/usr/bin/env bash
# Packs the llama.cpp sources that a CUDA build of llama-bench and llama-speculative-simple needs, for a GPU machine
# that can download nothing (issue 64: llama.cpp's CUDA backend as the peer in the device check's run):
# peer-cuda/llama.cpp.tar.xz (ignored by git; the device tool's `carry` takes it), with gguf-py and Qwen2's
# vocabulary-only GGUF for scripts/gguf_random.py, and beside it the gguf package's wheel (the device's image has
# none). The sources are the sdist's that scripts/build_llamacpp.sh fetches; other backends' folders, docs, tests
# and model files are left out, and the tools' and examples' lists name only the two programs (so configuring
# needs nothing else). scripts/gpu_peer.sh unpacks and builds it.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${LLAMACPP_PY_VERSION:-0.3.36}
scripts/build_llamacpp.sh --sources
SRC=${SPECDECODE_CACHE:-$HOME/.cache/specdecode}/llama.cpp/src-$VERSION/llama_cpp_python-$VERSION/vendor/llama.cpp
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
DEST=$STAGE/llama.cpp
mkdir -p "$DEST/models" "$DEST/tools" "$DEST/examples" "$DEST/ggml/src"
for part in CMakeLists.txt LICENSE cmake common include src vendor pocs gguf-py; do
  cp -r "$SRC/$part" "$DEST/"
done
cp "$SRC/models/ggml-vocab-qwen2.gguf" "$DEST/models/"
cp -r "$SRC/tools/llama-bench" "$DEST/tools/"
cp -r "$SRC/examples/speculative-simple" "$DEST/examples/"
# ggml: the CPU and CUDA backends only (a backend's folder is read only where its option is on)
for part in "$SRC"/ggml/*; do
  [ "$(basename "$part")" = src ] || cp -r "$part" "$DEST/ggml/"
done
for part in "$SRC"/ggml/src/*; do
  case $(basename "$part") in
    ggml-vulkan|ggml-sycl|ggml-cann|ggml-metal|ggml-opencl|ggml-hexagon|ggml-et|ggml-webgpu|ggml-openvino| \
    ggml-virtgpu|ggml-musa|ggml-zdnn|ggml-rpc|ggml-blas|ggml-hip|ggml-zendnn) ;;
    *) cp -r "$part" "$DEST/ggml/src/" ;;
  esac
done
printf 'llama_add_compile_flags()\nadd_subdirectory(llama-bench)\n' > "$DEST/tools/CMakeLists.txt"
printf 'llama_add_compile_flags()\nadd_subdirectory(speculative-simple)\n' > "$DEST/examples/CMakeLists.txt"
mkdir -p peer-cuda
tar -C "$STAGE" -cJf peer-cuda/llama.cpp.tar.xz llama.cpp
# The gguf package (pure Python) for what reads GGUF files there: the device's image has none
# (scripts/device_python.sh installs it); the version this checkout's tests run with.
rm -f peer-cuda/*.whl
gguf_version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('gguf'))" 2>/dev/null || echo 0.19.0)
python3 -m pip download -q --no-deps --only-binary=:all: -d peer-cuda "gguf==$gguf_version"
echo "llamacpp_cuda_tree: peer-cuda/llama.cpp.tar.xz, $(du -h peer-cuda/llama.cpp.tar.xz | cut -f1) (llama.cpp from llama-cpp-python $VERSION)" >&2
