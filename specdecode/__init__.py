"""specdecode: lossless speculative decoding for LLM inference."""
import os

# OpenMP threads that spin after each parallel region steal the two cores from numpy's BLAS threads during
# prompt prefill (elementwise ops ran 3x slower between GEMMs); sleeping threads measured no slower for
# decoding. This must be set before torch loads libgomp, so it lives here; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# OpenBLAS (numpy's BLAS, used for prefill GEMMs) keeps its threads busy-waiting for about 2^28 cycles after
# each call, so the torch ops between two GEMMs ran on cores that were still spinning: on a 709-token prompt
# they took ~5 s of a ~22 s prefill, and ~1.5 s with the shortest wait OpenBLAS allows (2^4 cycles). It must
# be set before numpy loads OpenBLAS; a user's own setting (or numpy imported earlier) wins.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
