#!/usr/bin/env bash
# The device check rehearsed here, as far as a machine without a GPU can: scripts/gpu_check.sh --tiny (Triton's
# interpreter) run by a python3 that cannot import what the device's image lacks (/work/.library/device/KINDS.md's
# package list: gguf, llguidance and the server's packages), so that a part needing one of them fails here, not in
# the device's few minutes; scripts/device_python.sh installs gguf from peer-cuda/'s wheel, as it does there.
# Usage: scripts/device_rehearsal.sh [gpu_check.py arguments, e.g. --parts blocks,seed]  (OUT: the report's folder)
set -euo pipefail
cd "$(dirname "$0")/.."
sim=$(mktemp -d)
trap 'rm -rf "$sim" /tmp/site' EXIT
cat > "$sim/sitecustomize.py" <<'PY'
"""Packages the device's image lacks cannot be imported from site-packages (a copy installed elsewhere can)."""
import importlib.abc
import importlib.machinery
import sys

LACKING = {"gguf", "llguidance", "fastapi", "uvicorn", "starlette", "pydantic", "openai", "ray", "xgrammar"}


class Lacking(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in LACKING:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        where = spec and (spec.origin or str(list(spec.submodule_search_locations or [])))
        if spec is not None and "site-packages" not in where:
            return spec
        raise ModuleNotFoundError(f"No module named {name!r} (not in the device's image)")


sys.meta_path.insert(0, Lacking())
PY
python=$PWD/.venv/bin/python  # as it is: the venv is found through the path it is called by
printf '#!/bin/sh\nPYTHONPATH="%s${PYTHONPATH:+:$PYTHONPATH}" exec %s "$@"\n' "$sim" "$python" > "$sim/python3"
chmod +x "$sim/python3"
[ -f peer-cuda/llama.cpp.tar.xz ] || echo "device_rehearsal: no peer-cuda/ (scripts/llamacpp_cuda_tree.sh): gguf will be missing, as on a device it is not carried to" >&2
PATH="$sim:$PATH" OUT="${OUT:-gpu-rehearsal-out}" scripts/gpu_check.sh --tiny "$@"
