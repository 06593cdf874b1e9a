# Sourced by the device scripts (gpu_check.sh, gpu_peer.sh) from the repository's root: the Python packages the
# device's image lacks (gguf: GGUF files and block types; its other needs, numpy, pyyaml, requests and tqdm, are
# there) installed from the wheels carried in peer-cuda/ (scripts/llamacpp_cuda_tree.sh puts them there), where
# they are missing. Installed with their metadata: transformers reads gguf's version before it reads a GGUF
# tokenizer.
if ! python3 -c "import gguf" 2>/dev/null; then
  if ls peer-cuda/*.whl >/dev/null 2>&1 &&
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        peer-cuda/*.whl; then
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "device_python: no gguf package and no wheel of it in peer-cuda/ (scripts/llamacpp_cuda_tree.sh):" \
      "what reads GGUF files will fail" >&2
  fi
fi
