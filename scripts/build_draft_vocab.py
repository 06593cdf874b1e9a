"""Build the frequency-ranked draft vocabulary (FR-Spec) for the Qwen2.5 tokenizer, offline.

The draft model's output layer over all 151936 tokens is a large share of its cost; scoring only
the most frequent tokens makes each draft step cheaper and rarely changes its top choice. The
ranking comes from a local corpus that has nothing to do with the benchmark prompts: the Python
standard library's source (code and docstrings) and the English package descriptions installed
beside it. The output is an int32 array of token ids, most frequent first.

    python scripts/build_draft_vocab.py --model qwen2.5-coder-0.5b
"""
from __future__ import annotations

import argparse
import json
import sysconfig
from collections import Counter
from pathlib import Path

import numpy as np

from specdecode.models.loader import load_model

OUT = Path(__file__).resolve().parents[1] / "specdecode" / "data"


def corpus_files(limit_bytes: int) -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    purelib = Path(sysconfig.get_paths()["purelib"])
    code = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    prose = sorted(purelib.glob("*.dist-info/METADATA")) + sorted(purelib.rglob("*.md"))
    files, total = [], 0
    for group in (code, prose):
        budget = limit_bytes // 2
        for path in group:
            size = path.stat().st_size
            if budget - size < 0:
                break
            files.append(path)
            budget -= size
            total += size
    return files


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--keep", type=int, default=65536)
    parser.add_argument("--limit-bytes", type=int, default=24_000_000)
    args = parser.parse_args()
    tokenizer = load_model(args.model).tokenizer
    counts: Counter = Counter()
    files = corpus_files(args.limit_bytes)
    for path in files:
        text = path.read_text(errors="ignore")
        counts.update(tokenizer.encode(text))
    ranked = [tid for tid, _ in counts.most_common(args.keep)]
    OUT.mkdir(parents=True, exist_ok=True)
    np.save(OUT / "qwen2_draft_vocab.npy", np.array(ranked, dtype=np.int32))
    meta = {"tokenizer_fingerprint": tokenizer.fingerprint(), "files": len(files), "tokens_counted": sum(counts.values()),
            "distinct": len(counts), "kept": len(ranked)}
    (OUT / "qwen2_draft_vocab.json").write_text(json.dumps(meta, indent=1))
    print(meta)


if __name__ == "__main__":
    main()
