#!/usr/bin/env python3
"""The int8 path's top-1 agreement with the float32 model of the same GGUF file, for each llama.cpp quantization.

The registry's smollm2-135m (Q4_1) is dequantized to an F32 GGUF by llama.cpp's own llama-quantize, which then
quantizes that file to each type as users would (its usual per-tensor mixture; rows that are not a multiple of 256
take llama.cpp's fallback type). scripts/precision_quality.py then reads the same documents with the int8 model and
the float32 model of each file (teacher-forced, nothing generated) and counts the positions whose argmax agrees.
The table also lists the block types of each file's matrices, all of which the int8 kernel reads as they are.

    [LLAMACPP_BIN=folder] .venv/bin/python scripts/quant_agreement.py [--positions 1000] [--types Q5_K_M Q3_K_M ...] [--out table.md]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
from pathlib import Path

from specdecode import registry

HERE = Path(__file__).resolve().parent
TYPES = ["Q5_K_M", "Q3_K_M", "Q2_K", "IQ4_NL", "IQ4_XS"]


def quantize(binary: Path, source: Path, out: Path, ftype: str, pure: bool = False) -> Path:
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        flags = ["--allow-requantize"] + (["--pure"] if pure else [])
        subprocess.run([str(binary), *flags, str(source), str(tmp), ftype], check=True, capture_output=True)
        tmp.replace(out)
    return out


def matrix_types(path: Path) -> str:
    """How many 2-D tensors of the file have each block type, e.g. 'Q5_1 x120, Q6_K x31'."""
    import gguf

    counts = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors if len(t.shape) == 2)
    return ", ".join(f"{name} x{n}" for name, n in sorted(counts.items()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--positions", type=int, default=1000)
    p.add_argument("--types", nargs="+", default=TYPES, help="llama-quantize type names")
    p.add_argument("--pure", action="store_true", help="llama-quantize --pure: every matrix the type itself, except"
                   " rows that are not a multiple of its block (smollm2's 576-wide inputs), which take llama.cpp's fallback")
    p.add_argument("--out", default=None, help="also write the Markdown table here")
    args = p.parse_args()
    binary = Path(os.environ.get("LLAMACPP_BIN") or registry.cache_dir() / "llama.cpp" / "bin") / "llama-quantize"
    if not binary.exists():
        sys.exit(f"{binary} is missing: run scripts/build_llamacpp.sh")
    folder = registry.cache_dir() / "quant-agreement"
    folder.mkdir(parents=True, exist_ok=True)
    source = Path(registry.resolve("smollm2-135m"))
    f32 = quantize(binary, source, folder / "smollm2-135m-F32.gguf", "F32")
    rows = ["| file (llama-quantize) | matrices | positions | top-1 agreement int8 vs float32 |", "|---|---|---|---|"]
    for ftype in args.types:
        label = f"{ftype}{' --pure' if args.pure else ''}"
        path = quantize(binary, f32, folder / f"smollm2-135m-{ftype}{'-pure' if args.pure else ''}.gguf", ftype, args.pure)
        result = folder / f"{label.replace(' ', '')}.json"
        subprocess.run([sys.executable, str(HERE / "precision_quality.py"), "--model", str(path), "--positions",
                        str(args.positions), "--out", str(result)], check=True)
        figures = json.loads(result.read_text())
        rows.append(f"| smollm2-135m {label} | {matrix_types(path)} | {figures['positions']} | {figures['top1_agreement']:.2%} |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main()
