"""specdecode: lossless speculative decoding for LLM inference."""
import os

# OpenMP threads that spin after each parallel region steal the two cores from numpy's BLAS threads during
# prompt prefill (elementwise ops ran 3x slower between GEMMs); sleeping threads measured no slower for
# decoding. This must be set before torch loads libgomp, so it lives here; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
