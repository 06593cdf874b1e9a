"""Triton kernels of one decoder pass whose rows never depend on the pass (the GPU path, exact_pass.py).

Every kernel gives row r a result computed from row r's inputs and position alone:
- products: one tile shape for every row count (rows padded to BLOCK_M, never another kernel or MMA shape);
  the reduction is split for parallelism at points fixed by the reduction length K alone (split_size), and
  the partial sums are added back in split order by the kernel that consumes them;
- norms, the gated activation and the QKV epilogue: one program per row (or per row and column block), so a
  row's reductions have one shape whatever else is in the pass; the gated activation may instead run in the
  gate|up product's tiles, elementwise on the same sums (linear_partial_kernel's PAIRED);
- attention: row r reduces its keys in chunks of ATTN_CHUNK, grouped into segments of a fixed size at fixed
  logical positions (0, SPLIT, 2 SPLIT, ...), and the segments are merged in ascending order: the same for a
  decode step, a verify block, a token tree, a prompt chunk and a batch.

DOT_F32 multiplies in float32 (float32 weights, and Triton's interpreter, which cannot multiply bfloat16 blocks);
otherwise bfloat16 operands go to the tensor cores with float32 accumulation.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# Arguments that carry a pass's row count or its keys: the row count, the ancestor table's row stride (the row
# count), the segments a pass sizes its scratch by, and the metadata rows, views of one array at offsets of whole
# rows (so their 16-byte alignment follows the row count). Triton specialises an int on being 1 or a multiple of 16
# and a pointer on its alignment; on these it must not, or the row count would pick the binary a row runs.
PASS_INTS = ["M", "anc_stride", "SEGMENTS"]
META_POINTERS = ["slot_ptr", "pos_ptr", "keys_ptr", "prefix_ptr", "anc_ptr", "write_ptr"]


def _interpreter_scalars_index() -> None:
    """Triton 3.6's interpreter holds a scalar as a 1-element array and turns it into a loop bound with int(), which
    NumPy 2.4 refuses for arrays that are not 0-dimensional: the attention merge loops from a row's first segment to
    its last, bounds loaded from its metadata. Take the element instead (the interpreter only: tests, --tiny)."""
    from triton.runtime import interpreter

    patch = interpreter._patch_lang_tensor
    if getattr(patch, "index_by_item", False):
        return

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.index_by_item = True
    interpreter._patch_lang_tensor = patched


if os.environ.get("TRITON_INTERPRET") == "1":
    _interpreter_scalars_index()


@triton.jit
def _after_previous(PDL: tl.constexpr):
    """With programmatic dependent launch (Tiles.pdl; Hopper and later), a kernel's programs may start while the
    kernel before it still runs: each waits here, before it reads or writes anything, until the kernel before has
    finished and its writes are visible (so nothing it reads or overwrites is still in use), and lets the next
    kernel start launching at once. Its launch overlaps this kernel's tail; no
    value changes, since every program still runs after the one before has finished."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


@triton.jit
def _dot(a, b, acc, DOT_F32: tl.constexpr):
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _spread(v, ROWS: tl.constexpr, GROUPS: tl.constexpr, WIDTH: tl.constexpr):
    """[ROWS, GROUPS] -> [ROWS, GROUPS * WIDTH], each value repeated WIDTH times in place."""
    return tl.reshape(tl.broadcast_to(tl.expand_dims(v, 2), (ROWS, GROUPS, WIDTH)), (ROWS, GROUPS * WIDTH))


@triton.jit
def _nibbles(packed, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """Bytes [ROWS, WIDTH / 2] holding two 4-bit values each (low nibble first) -> [ROWS, WIDTH] uint8."""
    return tl.reshape(tl.join(packed & 0x0F, packed >> 4), (ROWS, WIDTH))


@triton.jit
def _top_bits(octets, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """Bytes [ROWS, WIDTH / 8] holding eight 1-bit values each (bit j: value j) -> [ROWS, WIDTH] uint8."""
    b0, b1, b2, b3 = octets & 1, (octets >> 1) & 1, (octets >> 2) & 1, (octets >> 3) & 1
    b4, b5, b6, b7 = (octets >> 4) & 1, (octets >> 5) & 1, (octets >> 6) & 1, octets >> 7
    # nested joins flatten in place: join(join(v0, v2), join(v1, v3)) is v0 v1 v2 v3, and one level deeper so
    return tl.reshape(tl.join(tl.join(tl.join(b0, b4), tl.join(b2, b6)), tl.join(tl.join(b1, b5), tl.join(b3, b7))),
                      (ROWS, WIDTH))


@triton.jit
def _per_group(ptr, row, k0, K, valid, GROUP: tl.constexpr, BLOCK_K: tl.constexpr):
    """The float32 values [rows, BLOCK_K / GROUP] of an array holding one value per GROUP weights of a row."""
    groups = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)[None, :]
    return tl.load(ptr + row * (K // GROUP) + groups, mask=valid, other=0).to(tl.float32)


@triton.jit
def _twos(quads, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """Bytes [ROWS, WIDTH / 4] holding four 2-bit values each (lowest bits first) -> [ROWS, WIDTH] uint8."""
    # join(join(v0, v2), join(v1, v3)) flattens to v0 v1 v2 v3
    pairs = tl.join(tl.join(quads & 3, (quads >> 4) & 3), tl.join((quads >> 2) & 3, quads >> 6))
    return tl.reshape(pairs, (ROWS, WIDTH))


@triton.jit
def _iq4_values(q):
    """IQ4 table indices (0..15) -> ggml's IQ4 values (gguf_blocks.IQ4_VALUES) as int32, from the table's 16 bytes
    held in four 32-bit constants: arithmetic, no table load."""
    i = q.to(tl.int32)
    word = tl.where(i < 8, tl.where(i < 4, -1079142271, -152379953), tl.where(i < 12, 639175937, 1901675829))
    byte = (word >> ((i & 3) * 8)) & 0xFF
    return byte - ((byte >> 7) << 8)  # the byte as a signed value


@triton.jit
def _block_weights(q_ptr, hi_ptr, sc_ptr, mn_ptr, d_ptr, dmin_ptr, cols, k0, N, K, KIND: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Weights [BLOCK_N, BLOCK_K] of rows `cols`, columns k0.. of a GGUF-block matrix (gguf_blocks.py's arrays),
    in float32 by ggml's formulas (exact here: see gguf_blocks.py). Rows past N and columns past K give 0."""
    row = cols[:, None]
    valid = ((cols < N) & (k0 < K))[:, None]
    if KIND == 8:  # Q8_0: d * q, d per 32
        q = tl.load(q_ptr + row * K + k0 + tl.arange(0, BLOCK_K)[None, :], mask=valid, other=0).to(tl.float32)
        w = q * _spread(_per_group(d_ptr, row, k0, K, valid, 32, BLOCK_K), BLOCK_N, BLOCK_K // 32, 32)
    elif KIND == 10 or KIND == 11:
        w = _two_bit_weights(q_ptr, hi_ptr, sc_ptr, mn_ptr, d_ptr, dmin_ptr, row, k0, K, valid, KIND, BLOCK_N,
                             BLOCK_K)
    else:
        q = _four_bit_quants(q_ptr, hi_ptr, row, k0, K, valid, KIND, BLOCK_N, BLOCK_K)
        if KIND == 2 or KIND == 3 or KIND == 6 or KIND == 7 or KIND == 20:
            w = _per_32_weights(q, d_ptr, dmin_ptr, row, k0, K, valid, KIND, BLOCK_N, BLOCK_K)
        else:
            w = _per_256_weights(q, sc_ptr, mn_ptr, d_ptr, dmin_ptr, row, k0, K, valid, KIND, BLOCK_N, BLOCK_K)
    return tl.where(valid, w, 0.0)


@triton.jit
def _two_bit_weights(q_ptr, hi_ptr, sc_ptr, mn_ptr, d_ptr, dmin_ptr, row, k0, K, valid, KIND: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Q2_K: (d sc) q - (dmin m); Q3_K: (d sc) (q - 4), a third bit from hi; sc, m per 16, d per 256."""
    quads = tl.load(q_ptr + row * (K // 4) + k0 // 4 + tl.arange(0, BLOCK_K // 4)[None, :], mask=valid, other=0)
    q = _twos(quads, BLOCK_N, BLOCK_K)
    subs = k0 // 16 + tl.arange(0, BLOCK_K // 16)[None, :]
    sc = tl.load(sc_ptr + row * (K // 16) + subs, mask=valid, other=0).to(tl.float32)
    d = tl.load(d_ptr + row * (K // 256) + subs // 16, mask=valid, other=0).to(tl.float32)
    if KIND == 10:
        mn = tl.load(mn_ptr + row * (K // 16) + subs, mask=valid, other=0).to(tl.float32)
        dmin = tl.load(dmin_ptr + row * (K // 256) + subs // 16, mask=valid, other=0).to(tl.float32)
        w = q.to(tl.float32) * _spread(d * sc, BLOCK_N, BLOCK_K // 16, 16) - _spread(dmin * mn, BLOCK_N,
                                                                                   BLOCK_K // 16, 16)
    else:
        octets = tl.load(hi_ptr + row * (K // 8) + k0 // 8 + tl.arange(0, BLOCK_K // 8)[None, :], mask=valid,
                         other=0)
        q = q | (_top_bits(octets, BLOCK_N, BLOCK_K) << 2)
        w = (q.to(tl.int32) - 4).to(tl.float32) * _spread(d * sc, BLOCK_N, BLOCK_K // 16, 16)
    return w


@triton.jit
def _four_bit_quants(q_ptr, hi_ptr, row, k0, K, valid, KIND: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """The quants of the types stored as nibbles (IQ4's table indices included), with the fifth bit of Q5_0, Q5_1
    and Q5_K and the two top bits of Q6_K: uint8 [BLOCK_N, BLOCK_K]."""
    packed = tl.load(q_ptr + row * (K // 2) + k0 // 2 + tl.arange(0, BLOCK_K // 2)[None, :], mask=valid, other=0)
    q = _nibbles(packed, BLOCK_N, BLOCK_K)
    if KIND == 6 or KIND == 7 or KIND == 13:  # Q5_0, Q5_1, Q5_K: a fifth bit
        octets = tl.load(hi_ptr + row * (K // 8) + k0 // 8 + tl.arange(0, BLOCK_K // 8)[None, :], mask=valid,
                         other=0)
        q = q | (_top_bits(octets, BLOCK_N, BLOCK_K) << 4)
    if KIND == 14:  # Q6_K: two more bits
        quads = tl.load(hi_ptr + row * (K // 4) + k0 // 4 + tl.arange(0, BLOCK_K // 4)[None, :], mask=valid,
                        other=0)
        q = q | (_twos(quads, BLOCK_N, BLOCK_K) << 4)
    return q


@triton.jit
def _per_32_weights(q, d_ptr, dmin_ptr, row, k0, K, valid, KIND: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    """The types with a scale per 32: Q4_0: d (q - 8); Q4_1, Q5_1: d q + m; Q5_0: d (q - 16); IQ4_NL: d table[q]."""
    d = _spread(_per_group(d_ptr, row, k0, K, valid, 32, BLOCK_K), BLOCK_N, BLOCK_K // 32, 32)
    if KIND == 2:
        w = (q.to(tl.int32) - 8).to(tl.float32) * d
    elif KIND == 3 or KIND == 7:
        w = q.to(tl.float32) * d + _spread(_per_group(dmin_ptr, row, k0, K, valid, 32, BLOCK_K), BLOCK_N,
                                           BLOCK_K // 32, 32)
    elif KIND == 6:
        w = (q.to(tl.int32) - 16).to(tl.float32) * d
    else:
        w = _iq4_values(q).to(tl.float32) * d
    return w


@triton.jit
def _per_256_weights(q, sc_ptr, mn_ptr, d_ptr, dmin_ptr, row, k0, K, valid, KIND: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The k-quants with nibbles and a scale per 256: IQ4_XS: (d sc) table[q], sc per 32; Q6_K: (d sc) (q - 32),
    sc per 16; Q4_K, Q5_K: (d sc) q - (dmin m), sc and m per 32."""
    if KIND == 23:
        subs = k0 // 32 + tl.arange(0, BLOCK_K // 32)[None, :]
        sc = tl.load(sc_ptr + row * (K // 32) + subs, mask=valid, other=0).to(tl.float32)
        d = tl.load(d_ptr + row * (K // 256) + subs // 8, mask=valid, other=0).to(tl.float32)
        w = _iq4_values(q).to(tl.float32) * _spread(d * sc, BLOCK_N, BLOCK_K // 32, 32)
    elif KIND == 14:
        subs = k0 // 16 + tl.arange(0, BLOCK_K // 16)[None, :]
        sc = tl.load(sc_ptr + row * (K // 16) + subs, mask=valid, other=0).to(tl.float32)
        d = tl.load(d_ptr + row * (K // 256) + subs // 16, mask=valid, other=0).to(tl.float32)
        w = (q.to(tl.int32) - 32).to(tl.float32) * _spread(d * sc, BLOCK_N, BLOCK_K // 16, 16)
    else:
        subs = k0 // 32 + tl.arange(0, BLOCK_K // 32)[None, :]
        sc = tl.load(sc_ptr + row * (K // 32) + subs, mask=valid, other=0).to(tl.float32)
        mn = tl.load(mn_ptr + row * (K // 32) + subs, mask=valid, other=0).to(tl.float32)
        d = tl.load(d_ptr + row * (K // 256) + subs // 8, mask=valid, other=0).to(tl.float32)
        dmin = tl.load(dmin_ptr + row * (K // 256) + subs // 8, mask=valid, other=0).to(tl.float32)
        scale = _spread(d * sc, BLOCK_N, BLOCK_K // 32, 32)
        w = q.to(tl.float32) * scale - _spread(dmin * mn, BLOCK_N, BLOCK_K // 32, 32)
    return w


@triton.jit
def _to_bfloat16(w, BY_BITS: tl.constexpr):
    """float32 -> bfloat16, rounded to nearest even as torch rounds a load-time copy. The GPU's conversion does
    that; Triton's interpreter truncates, so there (BY_BITS) the rounding is done on the bits."""
    if BY_BITS:
        bits = w.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return w.to(tl.bfloat16)


@triton.jit(do_not_specialize=PASS_INTS, do_not_specialize_on_alignment=["pos_ptr", "slot_ptr", "write_ptr"])
def linear_partial_kernel(x_ptr, w_ptr, hi_ptr, sc_ptr, mn_ptr, d_ptr, dmin_ptr, part_ptr, sum_ptr, count_ptr,
                          M, N, K, COL0, NT, res_x_ptr, post_w_ptr, norm_w_ptr, h_ptr, row_count_ptr, TILES, eps,
                          bias_ptr, q_norm_ptr, k_norm_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, write_ptr, q_ptr,
                          k_pool_ptr, v_pool_ptr, slot_stride, head_stride,
                          SPLITS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, KIND: tl.constexpr, DOT_F32: tl.constexpr,
                          ROUND_BY_BITS: tl.constexpr, FUSE_SUM: tl.constexpr, PAIRED: tl.constexpr = False,
                          GELU: tl.constexpr = False, REVERSED: tl.constexpr = False, PDL: tl.constexpr = False,
                          SWAP_AB: tl.constexpr = False, RESIDUAL: tl.constexpr = False,
                          HAS_POST: tl.constexpr = False, NORM_N: tl.constexpr = 1, NORM_BLOCK: tl.constexpr = 16,
                          QKV: tl.constexpr = False, H: tl.constexpr = 1, HKV: tl.constexpr = 1, D: tl.constexpr = 16,
                          HAS_BIAS: tl.constexpr = False, QK_NORM: tl.constexpr = False):
    """part[s, m, COL0 + n] = sum over k in split s of x[m, k] * w[n, k]: x [M, K], part float32 [SPLITS, M, NT].
    KIND 0: w [N, K] row-major (bfloat16 or float32; the other array arguments unused); a ggml type (gguf_blocks):
    w is a matrix of GGUF blocks in gguf_blocks.py's arrays, whose bfloat16 weights are rebuilt per tile, so the
    same tiles, steps and dot multiply the same weights as over its bfloat16 copy.

    FUSE_SUM: the last split of a tile to finish (an arrival count per tile in count_ptr, zero before and after
    the launch) also adds the tile's splits, in ascending order as every consumer would, into sum [M, NT]. Which
    program does it depends on timing; the sum's order does not, so its bits are the consumer's own.

    PAIRED (with FUSE_SUM; w is [gate | up], N = 2 INTER): a tile's lanes 2i and 2i+1 are gate column
    pid_n BLOCK_N / 2 + i and its up column, and the tile's sum is act(gate) * up, stored to sum [M, INTER] in its
    dtype: the gated activation's own formula on the same sums, with no kernel of its own.

    REVERSED (a check's twin): the programs take the splits last to first, so another split arrives last.

    SWAP_AB: the tile is computed transposed, weights [BLOCK_N, BLOCK_K] times rows [BLOCK_K, BLOCK_M], so the
    weights take the MMA's M side and the rows its N side, where an MMA can be as narrow as 8 or 16: a decode step
    padded to a 16-row tile multiplies 16 rows, not 64. The same products summed over the same K steps; used for
    every pass of a model alike (Tiles.swap_ab), never chosen by the rows.

    RESIDUAL (with FUSE_SUM; the product of a sublayer's end, NORM_N = NT its width): the end of the sublayer runs in the
    product's last tile of each row block (a second arrival count per row block in row_count_ptr, TILES tiles a
    row block over every launch of the product: one per run of GGUF block types). That tile applies
    residual_norm_kernel's formula (_residual_norm_row) to each of the block's rows over the summed product, so the
    sublayer needs no kernel of its own.

    QKV (with FUSE_SUM; the QKV product): the same last tile of each row block finishes each of the block's rows
    head by head by qkv_finish_kernel's formula (_qkv_head: bias, q/k norms, rotary embedding, q out, k and v into
    the row's cache slot), so the QKV epilogue needs no kernel of its own either."""
    _after_previous(PDL)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    if REVERSED:
        split = SPLITS - 1 - split
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    lanes = tl.arange(0, BLOCK_N)
    if PAIRED:
        pairs = pid_n * (BLOCK_N // 2) + lanes // 2
        cols = pairs + (lanes % 2) * (N // 2)
        live = pairs < N // 2
    else:
        cols = pid_n * BLOCK_N + lanes
        live = cols < N
    if SWAP_AB:
        acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, SPLIT, BLOCK_K):
        k0 = split * SPLIT + step
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        if KIND == 0:
            w = tl.load(w_ptr + cols[:, None] * K + ks[None, :], mask=live[:, None] & (ks[None, :] < K), other=0.0)
        else:
            w = _to_bfloat16(_block_weights(w_ptr, hi_ptr, sc_ptr, mn_ptr, d_ptr, dmin_ptr, cols, k0, N, K, KIND,
                                            BLOCK_N, BLOCK_K), ROUND_BY_BITS)
        if SWAP_AB:
            acc_t = _dot(w, tl.trans(x.to(w.dtype)), acc_t, DOT_F32)
        else:
            acc = _dot(x.to(w.dtype), tl.trans(w), acc, DOT_F32)
    if SWAP_AB:
        acc = tl.trans(acc_t)
    inside = (rows[:, None] < M) & live[None, :]
    # in 64 bits: splits x rows x columns passes 2^31 near 2,000 rows of a full head
    at = rows.to(tl.int64)[:, None] * NT + COL0 + cols[None, :]
    tl.store(part_ptr + (split * M).to(tl.int64) * NT + at, acc, mask=inside)
    if FUSE_SUM:
        tile = count_ptr + pid_m * tl.num_programs(1) + pid_n
        tl.debug_barrier()  # every thread's partial sums stored before the arrival is counted (released)
        if tl.atomic_add(tile, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(0, SPLITS):  # ".cg": read from L2, where the other programs' stores are
                total += tl.load(part_ptr + (s * M).to(tl.int64) * NT + at, mask=inside, other=0.0,
                                 cache_modifier=".cg")
            if PAIRED:
                gate, up = tl.split(tl.reshape(total, (BLOCK_M, BLOCK_N // 2, 2)))
                pair = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
                tl.store(sum_ptr + rows.to(tl.int64)[:, None] * (N // 2) + pair[None, :],
                         _gated(gate, up, GELU).to(sum_ptr.dtype.element_ty),
                         mask=(rows[:, None] < M) & (pair < N // 2)[None, :])
            else:
                tl.store(sum_ptr + at, total, mask=inside)
            tl.atomic_xchg(tile, 0)  # zero again for the next launch (and the next replay of a graph)
            if RESIDUAL or QKV:
                # The last of the row block's TILES tiles to arrive (every other tile's sums then stored, read from
                # L2) ends the block's rows, one after another, by the consumer kernel's own formula.
                block_count = row_count_ptr + pid_m
                tl.debug_barrier()  # every thread's sums stored before the tile is counted (released)
                if tl.atomic_add(block_count, 1, sem="acq_rel", scope="gpu") == TILES - 1:
                    for r in range(0, BLOCK_M):
                        row = pid_m * BLOCK_M + r
                        if row < M:
                            if RESIDUAL:
                                _residual_norm_row(sum_ptr, row, res_x_ptr, post_w_ptr, norm_w_ptr, h_ptr, M, NORM_N,
                                                   1, eps, HAS_POST, NORM_BLOCK, ".cg")
                            else:
                                for head in range(0, H + 2 * HKV):
                                    _qkv_head(sum_ptr, bias_ptr, q_norm_ptr, k_norm_ptr, cos_ptr, sin_ptr, pos_ptr,
                                              slot_ptr, write_ptr, q_ptr, k_pool_ptr, v_pool_ptr, slot_stride,
                                              head_stride, M, eps, row, head, H, HKV, D, 1, HAS_BIAS, QK_NORM, ".cg")
                    tl.atomic_xchg(block_count, 0)  # zero again for the next launch


@triton.jit
def _sum_splits(part_ptr, row, cols, mask, M, N, SPLITS: tl.constexpr, BLOCK: tl.constexpr, CACHE: tl.constexpr):
    """A row's columns summed over the splits in ascending order (the fixed order every row gets). CACHE: the loads'
    cache modifier, always passed: Triton's compiler (not its interpreter) fails on a jit helper's str default."""
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in range(SPLITS):
        total += tl.load(part_ptr + (split * M + row).to(tl.int64) * N + cols, mask=mask, other=0.0,
                         cache_modifier=CACHE)
    return total


@triton.jit(do_not_specialize=PASS_INTS)
def reduce_kernel(part_ptr, bias_ptr, out_ptr, M, N, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
                  BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """out[m, n] = sum of the splits (+ bias): the output head's logits."""
    _after_previous(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    y = _sum_splits(part_ptr, row, cols, mask, M, N, SPLITS, BLOCK, "")
    if HAS_BIAS:
        y += tl.load(bias_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row.to(tl.int64) * N + cols, y, mask=mask)


@triton.jit
def _rms(x, mask, N: tl.constexpr, eps):
    """1 / sqrt(mean(x^2) + eps) over the N valid entries (masked entries are zero)."""
    squares = tl.where(mask, x * x, 0.0)
    return 1.0 / tl.sqrt(tl.sum(squares, axis=0) / N + eps)


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, h_ptr, N: tl.constexpr, eps, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """h[m] = x[m] * rms(x[m]) * w, one program per row (x float32, h in the weights' dtype)."""
    _after_previous(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(h_ptr + row * N + cols, (x * _rms(x, mask, N, eps) * w).to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=PASS_INTS)
def residual_norm_kernel(part_ptr, x_ptr, post_w_ptr, norm_w_ptr, h_ptr, M, N: tl.constexpr, SPLITS: tl.constexpr,
                         eps, HAS_POST: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """The end of a sublayer, one program per row (_residual_norm_row)."""
    _after_previous(PDL)
    _residual_norm_row(part_ptr, tl.program_id(0), x_ptr, post_w_ptr, norm_w_ptr, h_ptr, M, N, SPLITS, eps, HAS_POST,
                       BLOCK, "")


@triton.jit
def _residual_norm_row(part_ptr, row, x_ptr, post_w_ptr, norm_w_ptr, h_ptr, M, N: tl.constexpr, SPLITS: tl.constexpr,
                       eps, HAS_POST: tl.constexpr, BLOCK: tl.constexpr, CACHE: tl.constexpr):
    """y = the product's splits summed (then RMS-normed by post_w where the architecture has sandwich norms), x += y
    in place, h = RMSNorm(x) * norm_w for the next product."""
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    y = _sum_splits(part_ptr, row, cols, mask, M, N, SPLITS, BLOCK, CACHE)
    if HAS_POST:
        y = y * _rms(y, mask, N, eps) * tl.load(post_w_ptr + cols, mask=mask, other=0.0)
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0) + y
    tl.store(x_ptr + row * N + cols, x, mask=mask)
    w = tl.load(norm_w_ptr + cols, mask=mask, other=0.0)
    tl.store(h_ptr + row * N + cols, (x * _rms(x, mask, N, eps) * w).to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=PASS_INTS)
def gated_act_kernel(part_ptr, out_ptr, M, INTER: tl.constexpr, SPLITS: tl.constexpr, GELU: tl.constexpr,
                     BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """out[m, i] = act(gate[m, i]) * up[m, i], from the gate|up product's splits ([.., M, 2 INTER])."""
    _after_previous(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTER
    gate = _sum_splits(part_ptr, row, cols, mask, M, 2 * INTER, SPLITS, BLOCK, "")
    up = _sum_splits(part_ptr, row, cols + INTER, mask, M, 2 * INTER, SPLITS, BLOCK, "")
    tl.store(out_ptr + row * INTER + cols, _gated(gate, up, GELU).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated(gate, up, GELU: tl.constexpr):
    """act(gate) * up in float32: SiLU, or GELU's tanh approximation (tanh(z) = 1 - 2 / (exp(2z) + 1))."""
    if GELU:
        z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = 0.5 * gate * (2.0 - 2.0 / (tl.exp(2.0 * z) + 1.0))
    else:
        act = gate / (1.0 + tl.exp(-gate))
    return act * up


@triton.jit(do_not_specialize=PASS_INTS, do_not_specialize_on_alignment=META_POINTERS)
def qkv_finish_kernel(part_ptr, bias_ptr, q_norm_ptr, k_norm_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, write_ptr,
                      q_ptr, k_pool_ptr, v_pool_ptr, slot_stride, head_stride, M, eps,
                      H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
                      HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr, PDL: tl.constexpr = False):
    """One head of one row after the QKV product (_qkv_head), a program per row and head."""
    _after_previous(PDL)
    _qkv_head(part_ptr, bias_ptr, q_norm_ptr, k_norm_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, write_ptr, q_ptr,
              k_pool_ptr, v_pool_ptr, slot_stride, head_stride, M, eps, tl.program_id(0), tl.program_id(1), H, HKV, D,
              SPLITS, HAS_BIAS, QK_NORM, "")


@triton.jit
def _qkv_head(part_ptr, bias_ptr, q_norm_ptr, k_norm_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, write_ptr, q_ptr,
              k_pool_ptr, v_pool_ptr, slot_stride, head_stride, M, eps, row, head, H: tl.constexpr,
              HKV: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
              QK_NORM: tl.constexpr, CACHE: tl.constexpr):
    """One head of one row after the QKV product: its splits summed (+ bias), per-head RMSNorm of q and k where
    the architecture has it, the rotary embedding at the row's position (half-rotation layout), then q to q_ptr
    [M, H, D] and k, v into the row's cache slot at its write position (pools [slots, HKV, max_len, D]). Heads are
    q heads, then k heads, then v heads: the product's column order."""
    HALF: tl.constexpr = D // 2
    N: tl.constexpr = (H + 2 * HKV) * D
    lo = tl.arange(0, HALF)
    all_true = lo < HALF
    first = head * D
    x1 = _sum_splits(part_ptr, row, first + lo, all_true, M, N, SPLITS, HALF, CACHE)
    x2 = _sum_splits(part_ptr, row, first + HALF + lo, all_true, M, N, SPLITS, HALF, CACHE)
    if HAS_BIAS:
        x1 += tl.load(bias_ptr + first + lo)
        x2 += tl.load(bias_ptr + first + HALF + lo)
    pos = tl.load(pos_ptr + row)
    slot = tl.load(slot_ptr + row)
    at = tl.load(write_ptr + row)
    if head < H + HKV:
        if QK_NORM:
            if head < H:
                w1 = tl.load(q_norm_ptr + lo)
                w2 = tl.load(q_norm_ptr + HALF + lo)
            else:
                w1 = tl.load(k_norm_ptr + lo)
                w2 = tl.load(k_norm_ptr + HALF + lo)
            scale = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / D + eps)
            x1 = x1 * scale * w1
            x2 = x2 * scale * w2
        cos = tl.load(cos_ptr + pos * HALF + lo)
        sin = tl.load(sin_ptr + pos * HALF + lo)
        y1 = x1 * cos - x2 * sin
        y2 = x2 * cos + x1 * sin
        if head < H:
            out = q_ptr + (row * H + head) * D
            tl.store(out + lo, y1.to(q_ptr.dtype.element_ty))
            tl.store(out + HALF + lo, y2.to(q_ptr.dtype.element_ty))
        else:
            out = k_pool_ptr + slot.to(tl.int64) * slot_stride + (head - H) * head_stride + at * D
            tl.store(out + lo, y1.to(k_pool_ptr.dtype.element_ty))
            tl.store(out + HALF + lo, y2.to(k_pool_ptr.dtype.element_ty))
    else:
        out = v_pool_ptr + slot.to(tl.int64) * slot_stride + (head - H - HKV) * head_stride + at * D
        tl.store(out + lo, x1.to(v_pool_ptr.dtype.element_ty))
        tl.store(out + HALF + lo, x2.to(v_pool_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=PASS_INTS, do_not_specialize_on_alignment=META_POINTERS)
def attention_partial_kernel(q_ptr, k_pool_ptr, v_pool_ptr, slot_ptr, pos_ptr, keys_ptr, prefix_ptr, anc_ptr,
                             anc_stride, m_ptr, l_ptr, acc_ptr, out_ptr, count_ptr, slot_stride, head_stride, M, scale,
                             WINDOW, SEGMENTS, H: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr,
                             GROUP_PAD: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr, CHUNK: tl.constexpr,
                             DOT_F32: tl.constexpr, FUSE_MERGE: tl.constexpr, REVERSED: tl.constexpr = False, PDL: tl.constexpr = False):
    """One segment of one row's attention for the GROUP query heads of one kv head: keys at logical positions
    [s SPLIT, (s+1) SPLIT) that the row sees, in chunks of CHUNK with an online softmax; writes the segment's
    running max m, sum l and weighted values acc (float32, [M, HKV, SEGMENTS, GROUP_PAD(, D)]; SEGMENTS covers the
    pass's longest row, not the pool).

    Row r sees logical positions 0..keys[r]-1 (and, with a window, none before pos - WINDOW + 1); position p sits
    in cache entry p below prefix[r], else in entry anc[r, p - prefix[r]] (a token tree's ancestors; a chain has
    prefix = keys). Segments the row does not reach write nothing; the merge does not visit them.

    FUSE_MERGE: the last of a row's and kv head's segment programs to finish (an arrival count each in count_ptr,
    zero before and after the launch) merges the segments into out, in ascending order whichever program it is.
    REVERSED (a check's twin): the programs take the segments last to first, so another segment arrives last."""
    _after_previous(PDL)
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)
    if REVERSED:
        segment = SEGMENTS - 1 - segment
    n_keys = tl.load(keys_ptr + row)
    pos = tl.load(pos_ptr + row)
    lowest = tl.where(WINDOW > 0, pos - WINDOW + 1, 0)
    start = segment * SPLIT
    if (start < n_keys) & (start + SPLIT > lowest):
        prefix = tl.load(prefix_ptr + row)
        slot = tl.load(slot_ptr + row)
        group = tl.arange(0, GROUP_PAD)
        dims = tl.arange(0, D)
        q = tl.load(q_ptr + (row * H + kv_head * GROUP + group)[:, None] * D + dims[None, :],
                    mask=(group < GROUP)[:, None], other=0.0)
        base = slot.to(tl.int64) * slot_stride + kv_head * head_stride  # slots x positions x width may pass 2^31
        m_i = tl.full((GROUP_PAD,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((GROUP_PAD,), dtype=tl.float32)
        acc = tl.zeros((GROUP_PAD, D), dtype=tl.float32)
        for step in range(0, SPLIT, CHUNK):
            p = start + step + tl.arange(0, CHUNK)
            valid = (p < n_keys) & (p >= lowest)
            in_tree = valid & (p >= prefix)
            entry = tl.where(in_tree, tl.load(anc_ptr + row + (p - prefix) * anc_stride, mask=in_tree, other=0), p)
            k = tl.load(k_pool_ptr + base + entry[:, None] * D + dims[None, :], mask=valid[:, None], other=0.0)
            scores = _dot(q, tl.trans(k.to(q.dtype)), tl.zeros((GROUP_PAD, CHUNK), dtype=tl.float32), DOT_F32) * scale
            scores = tl.where(valid[None, :], scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a chunk with no key changes nothing
            alpha = tl.exp(m_i - m_safe)
            weights = tl.exp(scores - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(weights, axis=1)
            v = tl.load(v_pool_ptr + base + entry[:, None] * D + dims[None, :], mask=valid[:, None], other=0.0)
            acc = _dot(weights.to(v.dtype), v, acc * alpha[:, None], DOT_F32)
            m_i = m_new
        at = (row.to(tl.int64) * HKV + kv_head) * SEGMENTS + segment  # rows x segments x width may pass 2^31
        tl.store(m_ptr + at * GROUP_PAD + group, m_i)
        tl.store(l_ptr + at * GROUP_PAD + group, l_i)
        tl.store(acc_ptr + (at * GROUP_PAD + group)[:, None] * D + dims[None, :], acc)
    if FUSE_MERGE:
        arrivals = count_ptr + row * HKV + kv_head
        tl.debug_barrier()  # every thread's stores before the arrival is counted (released)
        if tl.atomic_add(arrivals, 1, sem="acq_rel", scope="gpu") == SEGMENTS - 1:
            _merge_segments(m_ptr, l_ptr, acc_ptr, pos_ptr, keys_ptr, out_ptr, row, kv_head, WINDOW, SEGMENTS, H, HKV,
                            GROUP, GROUP_PAD, D, SPLIT)
            tl.atomic_xchg(arrivals, 0)  # zero again for the next launch (and the next replay of a graph)


@triton.jit
def _merge_segments(m_ptr, l_ptr, acc_ptr, pos_ptr, keys_ptr, out_ptr, row, kv_head, WINDOW, SEGMENTS,
                    H: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr,
                    SPLIT: tl.constexpr):
    """A row's segments merged in ascending order (first their maximum, then the rescaled sums) into out [M, H * D].
    Only the segments the row reaches are visited (from its window's lowest key to its last key): a row's bits,
    and its time, do not depend on how many segments the pass or the cache could hold.
    Loads through L2 (".cg"): where the merge is fused into the partial kernel, other programs wrote them."""
    n_keys = tl.load(keys_ptr + row)
    pos = tl.load(pos_ptr + row)
    lowest = tl.where(WINDOW > 0, pos - WINDOW + 1, 0)
    first_used = tl.maximum(lowest, 0) // SPLIT
    last_used = (n_keys - 1) // SPLIT
    group = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, D)
    first = (row.to(tl.int64) * HKV + kv_head) * SEGMENTS
    top = tl.full((GROUP_PAD,), float("-inf"), dtype=tl.float32)
    for segment in range(first_used, last_used + 1):
        top = tl.maximum(top, tl.load(m_ptr + (first + segment) * GROUP_PAD + group, cache_modifier=".cg"))
    total = tl.zeros((GROUP_PAD,), dtype=tl.float32)
    acc = tl.zeros((GROUP_PAD, D), dtype=tl.float32)
    for segment in range(first_used, last_used + 1):
        at = (first + segment) * GROUP_PAD + group
        m_s = tl.load(m_ptr + at, cache_modifier=".cg")
        weight = tl.where(m_s == float("-inf"), 0.0, tl.exp(m_s - top))
        total = total + weight * tl.load(l_ptr + at, cache_modifier=".cg")
        acc = acc + weight[:, None] * tl.load(acc_ptr + at[:, None] * D + dims[None, :], cache_modifier=".cg")
    out = acc / total[:, None]
    heads = kv_head * GROUP + group
    tl.store(out_ptr + (row * H + heads)[:, None] * D + dims[None, :], out.to(out_ptr.dtype.element_ty),
             mask=(group < GROUP)[:, None])


@triton.jit(do_not_specialize=PASS_INTS, do_not_specialize_on_alignment=META_POINTERS)
def attention_merge_kernel(m_ptr, l_ptr, acc_ptr, pos_ptr, keys_ptr, out_ptr, M, WINDOW, SEGMENTS,
                           H: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                           D: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr = False):
    """_merge_segments of one row and kv head (where the partial kernel does not merge them itself)."""
    _after_previous(PDL)
    _merge_segments(m_ptr, l_ptr, acc_ptr, pos_ptr, keys_ptr, out_ptr, tl.program_id(0), tl.program_id(1), WINDOW,
                    SEGMENTS, H, HKV, GROUP, GROUP_PAD, D, SPLIT)
