"""Add llama.cpp (its own binaries: plain, draft model, n-gram) to an existing bench results.json.

`specdecode bench --peers` runs llama.cpp itself when its binaries are built (scripts/build_llamacpp.sh);
this script is for a bench that ran before they were (a long compile on a 2-core machine).
Usage: python scripts/add_llamacpp_peer.py bench-out/humaneval
"""
from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path

from specdecode.bench.peers import _llamacpp_runs, summarise_peers
from specdecode.bench.prompts import find_bench_dir, load_suite
from specdecode.bench.report import write_report
from specdecode.models.loader import load_model


def main(out_dir: str) -> int:
    out = Path(out_dir)
    results = json.loads((out / "results.json").read_text())
    c = results["config"]
    prompts = load_suite(c["suite"], find_bench_dir(None), c["limit"], c["categories"])
    tokenizer = load_model(c["target"]).tokenizer
    runs = _llamacpp_runs(Namespace(model=c["target"], ctx=4096, max_new_tokens=c["max_new_tokens"]), prompts, tokenizer)
    if not runs:
        print("llama.cpp binaries not found: build them with scripts/build_llamacpp.sh", file=sys.stderr)
        return 1
    peers = results.get("peers") or {}
    peers["runs"] = {**peers.get("runs", {}), **runs}
    peers["summary"] = summarise_peers(peers["runs"], results["rows"], earlier=peers.get("summary"))
    results["peers"] = peers
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(write_report(results, out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
