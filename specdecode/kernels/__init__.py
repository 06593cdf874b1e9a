"""Native CPU kernels for decoding and verification, and the dispatch that picks them.

Decoding multiplies 1 to ~16 rows by large weight matrices. The kernels stream each weight block
once for all rows of a block, and sum every row in the same order whatever the row count, so a
verify block reproduces the plain decoding pass bit for bit (no floating-point near-tie can split
them). native.py compiles and loads the extension, weights.py holds the weight classes it reads
(GGUF blocks for the int8 target, float32 with blocks kept), dispatch.py routes each product and
attention to it or to torch.
"""
from .dispatch import (
    FLOAT32_CHUNKED_MAX_ROWS,
    LOW_PRECISION_CHUNKED_MAX_ROWS,
    READ_GGUF_BLOCKS,
    block_attention,
    int8_attn_in,
    int8_attn_out,
    int8_layer,
    linear,
)
from .options import KernelOptions
from .native import KERNEL_CFLAGS, KERNEL_HEADERS, KERNEL_SOURCES, kernel_build_dir, kernel_status, load_kernel
from .weights import (
    GGUF_KERNEL_TYPES,
    Q4_K_UNPACKED,
    Q4_K_X16,
    Q5_0_X16,
    Q5_0_X16_SUMS,
    Q6_K_X16,
    Q8_0,
    QUANT_ISAS,
    QUANT_KERNEL_TYPES,
    SKINNY_MAX_ROWS,
    GGUFWeight,
    QuantWeight,
    check_quant_isa,
    gguf_blocks_enabled,
    quant_isa,
    quant_isa_paths,
)
