"""specdecode: lossless speculative decoding for LLM inference."""
import os

# OpenMP threads that spin long after each parallel region steal the two cores from numpy's BLAS threads
# during prompt prefill (elementwise ops ran 3x slower between GEMMs); threads that sleep at once slow every
# decode step, which runs ~170 short parallel regions. A short spin serves both: against
# OMP_WAIT_POLICY=PASSIVE (4 processes each, medians of 20) the target's 1-token step took 305-313 ms
# instead of 321-345, a 6-token verify block 434-454 instead of 465-488, a draft step 76-78 instead of
# 82-83, and a 300-token prefill was no slower. Set before torch loads libgomp; a user's own
# OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "30000")
# OpenBLAS (numpy's BLAS, used for prefill GEMMs) keeps its threads busy-waiting for about 2^28 cycles after
# each call, so the torch ops between two GEMMs ran on cores that were still spinning: on a 709-token prompt
# they took ~5 s of a ~22 s prefill, and ~1.5 s with the shortest wait OpenBLAS allows (2^4 cycles). It must
# be set before numpy loads OpenBLAS; a user's own setting (or numpy imported earlier) wins.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
