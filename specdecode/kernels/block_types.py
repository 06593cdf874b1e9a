"""The block types the int8 kernel reads: ggml's, and the kernel's own faster layouts of them (the ids it is told).
Here, apart from the weight classes (weights.py), so that what measures the layouts (isa_choice.py) and what holds
weights in them both read the ids without importing each other."""
from __future__ import annotations

# ggml block types the int8 kernel (quant_dot.cpp) reads: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
# Q6_K, IQ4_NL, IQ4_XS. A test checks this against the kernel's own list (quant_block_types).
QUANT_KERNEL_TYPES = frozenset({2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23})
Q8_0, Q4_K = 8, 12
# Not a ggml type: Q4_K with its packed 6-bit scales and mins unpacked to bytes at load (148 bytes a
# block instead of 144), which the kernel multiplies with fewer instructions and the same bits.
Q4_K_UNPACKED = 112
# Not ggml types either: Q4_K_UNPACKED and Q6_K with each group of 16 rows interleaved, so one instruction
# multiplies 16 rows at once and a verify block's tokens share every unpacked weight vector (same bits again).
Q4_K_X16, Q6_K_X16 = 113, 114
# And Q5_0 (the 0.5B draft's matrices) in groups of 16 rows, whose one-row tiles could not keep up with memory.
Q5_0_X16 = 115
# Q5_0_X16's bytes under a cheaper float definition than Q5_0's own (each block's integer sum whole, then one FMA,
# where Q5_0 keeps 8 float lanes a row): not llama.cpp's rounding, so for draft models only (DRAFT_LAYOUTS).
Q5_0_X16_SUMS = 116
Q5_0, Q6_K = 6, 14
_INTERNAL_BLOCKS = {Q4_K_UNPACKED: (256, 148), Q4_K_X16: (256, 148), Q6_K_X16: (256, 210), Q5_0_X16: (32, 22),
                    Q5_0_X16_SUMS: (32, 22)}  # per (row) block
# Each type that has an interleaved layout, and that layout's type.
INTERLEAVED = {Q4_K_UNPACKED: Q4_K_X16, Q6_K: Q6_K_X16, Q5_0: Q5_0_X16}
_DEINTERLEAVED = {x16: source for source, x16 in INTERLEAVED.items()} | {Q5_0_X16_SUMS: Q5_0}
# The layouts a draft model's matrices take instead (same bytes, another float definition: a draft's bits decide
# no output, and these take less work a token in prompt reads and multi-row passes).
DRAFT_LAYOUTS = {Q5_0_X16: Q5_0_X16_SUMS}
