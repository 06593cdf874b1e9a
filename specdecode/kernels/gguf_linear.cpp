// Small-batch matmul y = x @ w.T straight from GGUF quantized blocks (Q4_K, Q6_K, Q4_1, Q8_0).
//
// Exact by construction: each block is rebuilt into the very float32 values the gguf package's
// dequantizer produces (same operations, same order; the products of a scale and a small integer
// are exact in float32, so no contraction or reordering can change them), and every (row, token)
// dot product then runs the same single-accumulator FMA chain in the same k order as the float32
// kernel in skinny_linear.cpp. The result is bit-identical to dequantizing the file and running the
// float32 kernel, while a decoding step streams ~0.56-0.82 bytes per weight instead of 4.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "avx2_math.h"
#include "kernels.h"

namespace {

// ggml's type ids, as gguf.GGMLQuantizationType numbers them.
enum GType { Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q6_K = 14 };

inline float half_to_float(const uint8_t* p) { return _cvtsh_ss(*(const uint16_t*)p); }

// Each block type: QK weights in BYTES bytes. load() reads a block's scales; quarter(j) then rebuilds its
// weights 32j..32j+31 as four vectors of 8 float32 values, exactly as the gguf package computes them.
// j is a compile-time constant in every caller (fully unrolled loops), so offsets and shifts fold away.
struct BlockQ8_0 {
  static constexpr int QK = 32, BYTES = 34;
  const uint8_t* q;
  __m256 d;
  inline void load(const uint8_t* b) { d = _mm256_set1_ps(half_to_float(b)); q = b + 2; }
  inline __m256 w(int g) const {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(q + 8 * g)))), d);
  }
  inline void quarter(int, __m256 out[4]) const { for (int g = 0; g < 4; ++g) out[g] = w(g); }
};

struct BlockQ4_1 {  // weights 0-15 in the low nibbles of qs[0..15], 16-31 in the high nibbles: d*q + m
  static constexpr int QK = 32, BYTES = 20;
  const uint8_t* q;
  __m256 d, m;
  inline void load(const uint8_t* b) { d = _mm256_set1_ps(half_to_float(b)); m = _mm256_set1_ps(half_to_float(b + 2)); q = b + 4; }
  inline __m256 w(int g) const {
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(q + 8 * (g & 1))));
    v = g < 2 ? _mm256_and_si256(v, _mm256_set1_epi32(15)) : _mm256_srli_epi32(v, 4);
    return _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(v)), m);
  }
  inline void quarter(int, __m256 out[4]) const { for (int g = 0; g < 4; ++g) out[g] = w(g); }
};

// Q4_K: d, dmin (fp16), 12 bytes of packed 6-bit scales and mins for 8 sub-blocks of 32, 128 bytes of
// nibbles: byte group j (32 bytes) holds sub-block 2j in its low nibbles and 2j+1 in its high ones.
// Weight = (d*scale)*q - dmin*min; both products of a float16 and a 6-bit integer are exact.
struct BlockQ4_K {
  static constexpr int QK = 256, BYTES = 144;
  const uint8_t* q;
  float ds[8], dm[8];
  inline void load(const uint8_t* b) {
    const float d = half_to_float(b), dmin = half_to_float(b + 2);
    const uint8_t* s = b + 4;
    for (int sub = 0; sub < 4; ++sub) {
      ds[sub] = d * (float)(s[sub] & 63);
      dm[sub] = dmin * (float)(s[sub + 4] & 63);
      ds[sub + 4] = d * (float)((s[sub + 8] & 15) | ((s[sub] >> 6) << 4));
      dm[sub + 4] = dmin * (float)((s[sub + 8] >> 4) | ((s[sub + 4] >> 6) << 4));
    }
    q = b + 16;
  }
  // Sub-block j (weights 32j..32j+31): split 32 bytes into nibbles once, widen 8 at a time.
  inline void quarter(int j, __m256 out[4]) const {
    const __m256i bytes = _mm256_loadu_si256((const __m256i*)(q + 32 * (j >> 1)));
    const __m256i nib = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(15));
    const __m128i lo = _mm256_castsi256_si128(nib), hi = _mm256_extracti128_si256(nib, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    const __m256 scale = _mm256_set1_ps(ds[j]), offset = _mm256_set1_ps(dm[j]);
    for (int g = 0; g < 4; ++g)
      out[g] = _mm256_sub_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[g]))), offset);
  }
};

// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16 int8 scales (one per 16 weights),
// fp16 d. Each half of 128 weights uses 64 ql bytes and 32 qh bytes: quarter t takes ql[32(t&1)+i]
// (low nibble for t<2, high for t>=2) and bits 2t..2t+1 of qh[i]; the weight is (d*scale)*(that - 32).
struct BlockQ6_K {
  static constexpr int QK = 256, BYTES = 210;
  const uint8_t* ql;
  float ds[16];
  inline void load(const uint8_t* b) {
    const float d = half_to_float(b + 208);
    const int8_t* sc = (const int8_t*)(b + 192);
    for (int i = 0; i < 16; ++i) ds[i] = d * (float)sc[i];
    ql = b;
  }
  // Quarter j = (half j/4, t = j%4): weights 128*half + 32t .. +31, as signed bytes, then widened 8 at a time.
  inline void quarter(int j, __m256 out[4]) const {
    const int half = j >> 2, t = j & 3;
    __m256i l = _mm256_loadu_si256((const __m256i*)(ql + 64 * half + 32 * (t & 1)));
    l = _mm256_and_si256(t >> 1 ? _mm256_srli_epi16(l, 4) : l, _mm256_set1_epi8(15));
    __m256i h = _mm256_loadu_si256((const __m256i*)(ql + 128 + 32 * half));
    // bits 2t..2t+1 of each byte moved to bits 4..5; bits crossing into the neighbour byte are masked off
    h = t == 0 ? _mm256_slli_epi16(h, 4) : t == 1 ? _mm256_slli_epi16(h, 2) : t == 2 ? h : _mm256_srli_epi16(h, 2);
    h = _mm256_and_si256(h, _mm256_set1_epi8(0x30));
    const __m256i v = _mm256_sub_epi8(_mm256_or_si256(l, h), _mm256_set1_epi8(32));
    const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int g = 0; g < 4; ++g)
      out[g] = _mm256_mul_ps(_mm256_set1_ps(ds[8 * half + 2 * t + (g >> 1)]), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[g])));
  }
};

constexpr int R = 3;         // weight rows per tile
constexpr int MB = 4;        // tokens per register tile
constexpr int MAX_M = 16;    // tokens per call (a verify block); the accumulators live in a small buffer
constexpr int CHUNK = 256;   // weights dequantized per row at a time (fits L1 for R rows)

// Each row asks for its blocks a few blocks ahead (R rows stream at once). Measured within this machine's
// noise of no prefetch at all; kept as a hint. Prefetching past the end is harmless.
constexpr int PREFETCH_BLOCKS = 4;
template <class B>
inline void prefetch_block(const uint8_t* p) {
  for (int off = 0; off < B::BYTES; off += 64) _mm_prefetch((const char*)p + off, _MM_HINT_T0);
}

template <class B>
inline void dequant(const uint8_t* block, float* out) {
  B b;
  b.load(block);
#pragma GCC unroll 8
  for (int j = 0; j < B::QK / 32; ++j) {
    __m256 w[4];
    b.quarter(j, w);
    for (int g = 0; g < 4; ++g) _mm256_storeu_ps(out + 32 * j + 8 * g, w[g]);
  }
}

// One token (a plain decoding step): each weight is rebuilt in a register and used at once. The rows
// take turns quarter by quarter: each (row, token) sum is one dependent FMA chain (that is what keeps it
// exact), so only several rows in flight hide the FMA latency.
template <class B, int NR>
void single_token_tile(const float* x, int64_t in, const uint8_t* w, int64_t wstride, float* y) {
  __m256 a[NR];
  for (int r = 0; r < NR; ++r) a[r] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < in / B::QK; ++blk) {
    const float* xb = x + blk * B::QK;
    B b[NR];
    for (int r = 0; r < NR; ++r) {
      const uint8_t* block = w + r * wstride + blk * B::BYTES;
      prefetch_block<B>(block + PREFETCH_BLOCKS * B::BYTES);
      b[r].load(block);
    }
#pragma GCC unroll 8
    for (int j = 0; j < B::QK / 32; ++j) {
      for (int r = 0; r < NR; ++r) {
        __m256 wv[4];
        b[r].quarter(j, wv);
        for (int g = 0; g < 4; ++g) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 32 * j + 8 * g), wv[g], a[r]);
      }
    }
  }
  for (int r = 0; r < NR; ++r) y[r] = hsum(a[r]);
}

// MBT tokens (m..m+MBT-1) against NR dequantized rows of one chunk; the accumulators stay in registers.
template <int NR, int MBT>
inline void fma_tile(const float* x, int64_t in, int64_t k0, int64_t chunk, const float (*wbuf)[CHUNK], float (*acc)[MAX_M][8], int64_t m) {
  __m256 a[NR][MBT];
  for (int r = 0; r < NR; ++r) for (int j = 0; j < MBT; ++j) a[r][j] = _mm256_load_ps(acc[r][m + j]);
#pragma GCC unroll 4
  for (int64_t k = 0; k < chunk; k += 8) {
    __m256 wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = _mm256_load_ps(wbuf[r] + k);
    for (int j = 0; j < MBT; ++j) {
      __m256 xv = _mm256_loadu_ps(x + (m + j) * in + k0 + k);
      for (int r = 0; r < NR; ++r) a[r][j] = _mm256_fmadd_ps(xv, wv[r], a[r][j]);
    }
  }
  for (int r = 0; r < NR; ++r) for (int j = 0; j < MBT; ++j) _mm256_store_ps(acc[r][m + j], a[r][j]);
}

// Rows o..o+NR-1 of the weight: dequantize a chunk of each row once, then run every token over it.
// The accumulator of each (row, token) pair is parked in acc between chunks, which keeps its FMA
// chain, and so its rounding, exactly that of the float32 kernel.
template <class B, int NR>
void rows_tile(const float* x, int64_t M, int64_t in, const uint8_t* w, int64_t wstride, float* y, int64_t ldy) {
  alignas(32) float wbuf[NR][CHUNK];
  alignas(32) float acc[NR][MAX_M][8];
  for (int r = 0; r < NR; ++r) for (int j = 0; j < M; ++j) _mm256_store_ps(acc[r][j], _mm256_setzero_ps());
  const int64_t chunk = in % CHUNK == 0 ? CHUNK : B::QK;
  for (int64_t k0 = 0; k0 < in; k0 += chunk) {
    for (int r = 0; r < NR; ++r)
      for (int64_t k = 0; k < chunk; k += B::QK) {
        const uint8_t* block = w + r * wstride + (k0 + k) / B::QK * B::BYTES;
        prefetch_block<B>(block + PREFETCH_BLOCKS * B::BYTES);
        dequant<B>(block, wbuf[r] + k);
      }
    int64_t m = 0;
    for (; m + MB <= M; m += MB) fma_tile<NR, MB>(x, in, k0, chunk, wbuf, acc, m);
    switch (M - m) {
      case 3: fma_tile<NR, 3>(x, in, k0, chunk, wbuf, acc, m); break;
      case 2: fma_tile<NR, 2>(x, in, k0, chunk, wbuf, acc, m); break;
      case 1: fma_tile<NR, 1>(x, in, k0, chunk, wbuf, acc, m); break;
      default: break;
    }
  }
  for (int r = 0; r < NR; ++r) for (int j = 0; j < M; ++j) y[j * ldy + r] = hsum(_mm256_load_ps(acc[r][j]));
}

template <class B, int NR>
void tile(const float* x, int64_t M, int64_t in, const uint8_t* w, int64_t wstride, float* y, int64_t ldy) {
  if (M == 1) single_token_tile<B, NR>(x, in, w, wstride, y);
  else rows_tile<B, NR>(x, M, in, w, wstride, y, ldy);
}

template <class B>
void run(const float* x, int64_t M, int64_t in, const uint8_t* w, int64_t O, float* y, int64_t ldy) {
  const int64_t wstride = in / B::QK * B::BYTES;
  const int64_t tiles = (O + R - 1) / R;
  at::parallel_for(0, tiles, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t * R;
      if (o + R <= O) tile<B, R>(x, M, in, w + o * wstride, wstride, y + o, ldy);
      else for (int64_t r = o; r < O; ++r) tile<B, 1>(x, M, in, w + r * wstride, wstride, y + r, ldy);
    }
  });
}

// Calls f with a value of the block type for a ggml type id; false for a type the kernel cannot read.
template <class F>
bool visit_block_type(int64_t type, F&& f) {
  switch (type) {
    case Q8_0: f(BlockQ8_0{}); return true;
    case Q4_1: f(BlockQ4_1{}); return true;
    case Q4_K: f(BlockQ4_K{}); return true;
    case Q6_K: f(BlockQ6_K{}); return true;
    default: return false;
  }
}

}  // namespace

// The ggml type ids visit_block_type reads, so Python's list of them (GGUF_KERNEL_TYPES) can be checked.
std::vector<int64_t> gguf_block_types() {
  std::vector<int64_t> types;
  for (int64_t t = 0; t < 64; ++t)
    if (visit_block_type(t, [](auto) {})) types.push_back(t);
  return types;
}

// x: [..., in] float32 with at most 16 rows; parts: [rows_i, bytes per row] uint8 blocks of the given
// ggml types, stacked along the output dimension (e.g. the Q, K and V projections of one layer).
at::Tensor gguf_linear_cpu(at::Tensor x, std::vector<at::Tensor> parts, std::vector<int64_t> types) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "gguf_linear: x must be float32 on the CPU");
  TORCH_CHECK(parts.size() == types.size() && !parts.empty(), "gguf_linear: one type per part");
  auto xc = x.contiguous();
  const int64_t in = xc.size(-1), M = xc.numel() / in;
  TORCH_CHECK(M >= 1 && M <= MAX_M, "gguf_linear: 1 to 16 rows per call");
  int64_t O = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto& p = parts[i];
    int64_t qk = 0, bytes = 0;
    TORCH_CHECK(visit_block_type(types[i], [&](auto b) { qk = decltype(b)::QK; bytes = decltype(b)::BYTES; }),
                "gguf_linear: unsupported block type ", types[i]);
    TORCH_CHECK(p.scalar_type() == at::kByte && p.dim() == 2 && p.is_contiguous(), "gguf_linear: parts must be contiguous uint8 matrices");
    TORCH_CHECK(in % qk == 0 && p.size(1) == in / qk * bytes, "gguf_linear: row size does not match the input size");
    O += p.size(0);
  }
  auto out_sizes = xc.sizes().vec();
  out_sizes.back() = O;
  auto y = at::empty(out_sizes, xc.options());
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  int64_t col = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const uint8_t* w = parts[i].data_ptr<uint8_t>();
    const int64_t rows = parts[i].size(0);
    visit_block_type(types[i], [&](auto b) { run<decltype(b)>(xp, M, in, w, rows, yp + col, O); });
    col += rows;
  }
  return y;
}
