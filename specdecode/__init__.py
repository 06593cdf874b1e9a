"""specdecode: lossless speculative decoding for LLM inference."""
import os

# OpenMP threads that spin long after each parallel region steal the cores from numpy's BLAS threads during
# prompt prefill, and from the one thread that still works when another process holds a core: a waiting
# thread then spins on a core its partner needs, and plain decoding ran 3-4x slower with one core busy.
# Threads that sleep at once slow every decode step, which runs ~100-200 short parallel regions. A short
# spin serves all three (docs/cpu.md, "Threads"). Set before torch loads libgomp; a user's own
# OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "3000")
# OpenBLAS (numpy's BLAS, used for prefill GEMMs) keeps its threads busy-waiting for about 2^28 cycles after
# each call, so the torch ops between two GEMMs ran on cores that were still spinning: on a 709-token prompt
# they took ~5 s of a ~22 s prefill, and ~1.5 s with the shortest wait OpenBLAS allows (2^4 cycles). It must
# be set before numpy loads OpenBLAS; a user's own setting (or numpy imported earlier) wins.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
