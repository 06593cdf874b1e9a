"""Every option of the native kernels, in one table, read once from the environment at import.

None of them changes what a model outputs on a given path (every instruction-set path and every weight layout
gives the same bits); they choose what is compiled, which path runs and which layout weights are kept in, for
builds aimed at other machines and for A/B timing. Code reads `options.OPTIONS.<field>` when it runs, so a test
replaces the record (`monkeypatch.setattr(options, "OPTIONS", replace(options.OPTIONS, isa="avx2"))`) instead of
patching copies of a global in several modules.

| environment variable | field | values | what it does |
|---|---|---|---|
| SPECDECODE_NO_KERNEL | disabled | any non-empty | no native kernel: every product runs through torch (slower; speculative output is then not guaranteed equal to plain decoding on CPU, so engines refuse it unless told --allow-inexact) |
| SPECDECODE_KERNEL_ISAS | build_every_isa | all | compile every instruction-set path, not only those this CPU runs (a build for other machines) |
| SPECDECODE_ISA | isa | auto, avx2, avx512-vnni, amx | the int8 kernel's path; auto: AMX or VNNI, whichever measured faster on this machine (once per kernel build, isa_choice.py), else the best this CPU runs |
| SPECDECODE_DENSE_WEIGHTS | dense_weights | any non-empty | float32 models from GGUF stream float32 weights instead of keeping the GGUF blocks |
| SPECDECODE_PREFILL_GEMM | prefill_gemm | numpy, torch | which GEMM multiplies prompt-sized float32 blocks |
| (tests only) | unpack_q4_k, interleave_k | True, False | the int8 kernel's faster weight layouts; off keeps GGUF's own |
"""
from __future__ import annotations

import os
from dataclasses import dataclass

QUANT_ISAS = ("auto", "avx2", "avx512-vnni", "amx")
PREFILL_GEMMS = ("numpy", "torch")


@dataclass(frozen=True)
class KernelOptions:
    disabled: bool = False
    build_every_isa: bool = False
    isa: str = "auto"  # checked against QUANT_ISAS and this CPU when a model loads (weights.check_quant_isa)
    dense_weights: bool = False
    prefill_gemm: str = "numpy"
    unpack_q4_k: bool = True
    interleave_k: bool = True


def from_environment(env=os.environ) -> KernelOptions:
    return KernelOptions(
        disabled=bool(env.get("SPECDECODE_NO_KERNEL")),
        build_every_isa=env.get("SPECDECODE_KERNEL_ISAS") == "all",
        isa=env.get("SPECDECODE_ISA", "auto"),
        dense_weights=bool(env.get("SPECDECODE_DENSE_WEIGHTS")),
        prefill_gemm=env.get("SPECDECODE_PREFILL_GEMM", "numpy"),
    )


OPTIONS = from_environment()
