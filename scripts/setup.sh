#!/usr/bin/env bash
# Creates .venv (once) and installs specdecode with the extras named (comma-separated; none: the core library).
#   scripts/setup.sh serve      # what the demo needs: the core and the server
#   scripts/setup.sh test       # the test suite: everything (serve, bench, cluster, test tools)
# Re-runs pip only when pyproject.toml changes or new extras are asked for.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
extras=${1:-}
start=$(date +%s)
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
# What a run of each part imports (and so wants compiled): the core, then each extra's own modules.
warm_imports() {
  local code="import torch, numpy, gguf, tokenizers, jinja2, llguidance, tqdm, transformers
from transformers import AutoTokenizer, PreTrainedTokenizerFast
import specdecode.cli, specdecode.build, specdecode.batch, specdecode.models.loader, specdecode.kernels.native
import torch.utils.cpp_extension"
  case ",$1," in *,serve,*|*,cluster,*|*,test,*) code="$code
import fastapi, uvicorn, prometheus_client, specdecode.server.app, specdecode.server.serve_command" ;; esac
  case ",$1," in *,bench,*|*,test,*) code="$code
import matplotlib.pyplot" ;; esac
  case ",$1," in *,cluster,*|*,test,*) code="$code
import ray, ray.serve, specdecode.server.cluster" ;; esac
  case ",$1," in *,test,*) code="$code
import pytest, xdist, hypothesis, openai, httpx, playwright.sync_api, accelerate" ;; esac
  echo "$code"
}
# torch first, through pip: pyproject.toml pins 2.13.0, the CPU build pip finds on this kind of machine (its
# find-links); an unpinned torch, or an installer that does not read pip's configuration, would pull a CUDA build of
# several GB. The rest through uv where it installs: it resolves, downloads and unpacks in parallel (the test extras
# in ~10 s where pip took ~2 min on two cores), keeps the torch already there, and compiles no bytecode (the import
# below compiles what a run imports). pip does all of it where uv cannot be had.
install_packages() {
  local target=".${1:+[$1]}" pip=(.venv/bin/python -m pip install -q --no-compile --disable-pip-version-check)
  local torch_pin  # pyproject.toml's own pin, so the two cannot disagree
  torch_pin=$(grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"')
  .venv/bin/python -c "import torch" 2>/dev/null || "${pip[@]}" "$torch_pin" 2>&1 | quiet_pip >&2 || true
  [ -x .venv/bin/uv ] || "${pip[@]}" uv 2>&1 | quiet_pip >&2 || true
  if [ -x .venv/bin/uv ]; then
    .venv/bin/uv pip install -q --python .venv/bin/python -e "$target" >&2 && return
    echo "setup: uv could not install; trying pip" >&2
  fi
  "${pip[@]}" -e "$target" 2>&1 | quiet_pip >&2 || true
}
quiet_pip() { grep -v -E "^(WARNING: Location|$)" || true; }
stamp=".venv/.specdecode-installed${extras:+-${extras//,/-}}"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing specdecode${extras:+ with extras $extras}" >&2
  install_packages "$extras"
  # Written to __pycache__ even where PYTHONDONTWRITEBYTECODE is set: later runs read it (the variable only stops
  # writing), so no process compiles these modules again.
  env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -c "$(warm_imports "$extras")" \
    || { echo "setup: install failed" >&2; exit 1; }
  echo "$want" > "$stamp"
  echo "setup: installed in $(( $(date +%s) - start )) s" >&2
fi
