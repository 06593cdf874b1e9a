// The int8 target: y = x @ w.T with w in GGUF blocks and x quantized to int8, for 1 to 16 rows.
//
// This is how llama.cpp computes a GGUF model on a CPU (integer dot products of weight blocks with
// int8 activations), with one difference that makes speculative decoding exact: every row's result
// is independent of the other rows in the call, of their number and of the thread split (see
// quant_dot_impl.h). A verify block of K+1 rows therefore returns, row for row, the bits that K+1
// single decoding steps return.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels.h"
#include "quant_dot_paths.h"

// The AVX2 path, which every x86-64 CPU this runs on has; the VNNI and AMX paths are compiled in files of their
// own (quant_dot_paths.h says why).
#define QD_VNNI 0
namespace qd_avx2 {
#include "quant_dot_impl.h"
}
#undef QD_VNNI

namespace {

bool cpu_has_vnni() {  // asked once: every decoding matmul passes through here
  static const bool has = [] {
    __builtin_cpu_init();
    return QD_BUILD_VNNI && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
  }();
  return has;
}

// Symmetric int8, one scale per QB values of a row: d = max|x| / 127, q = round-to-nearest-even(x * 127 / max|x|).
// Eight lanes at a time, with the same float products and the same rounding as that scalar definition (cvtps
// rounds to nearest even in the default mode, as nearbyint does), so the same bytes. Returns max|x|.
template <int QB>
inline float quantize_block(const float* v, int8_t* out) {
  static_assert(QB % 32 == 0, "whole 32-value steps");
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 mx = _mm256_setzero_ps();
  for (int i = 0; i < QB; i += 8)  // a NaN lane keeps the running maximum (max_ps returns its second operand)
    mx = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(v + i), abs_mask), mx);
  const float amax = hmax(mx);
  const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the packs' per-lane interleave
  for (int i = 0; i < QB; i += 32) {
    __m256i r[4];
    for (int j = 0; j < 4; ++j)
      r[j] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i + 8 * j), inv)), lo), hi);
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
    _mm256_storeu_si256((__m256i*)(out + i), _mm256_permutevar8x32_epi32(bytes, order));
  }
  return amax;
}

// Every QB-value block of M rows through quantize_block, with the sums of every 16 (k-quant format) or 32
// (32-block format) quantized values, which the weight types with an offset (q - 32, q - 16, + min) need.
// Depends on the row's own values only. The values and their sums are stored row-major ([M][in]) or,
// BLOCK_MAJOR, block by block ([in/QB][M][QB]); d is [M][in/QB]. Rows run in parallel for prompt-sized calls,
// more than a verify block's (each row's values are its own, so the split changes nothing).
template <int QB, bool BLOCK_MAJOR>
void quantize_rows(const float* x, int64_t M, int64_t in, int8_t* q, float* d, int16_t* sums16, int16_t* sums32_16,
                   int32_t* sums32) {
  const int64_t nb = in / QB;
  at::parallel_for(0, M, 32, [&](int64_t m0, int64_t m1) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t at = BLOCK_MAJOR ? b * M + m : m * nb + b;  // the block's index in the stored order
      int8_t* out = q + at * QB;
      d[m * nb + b] = quantize_block<QB>(x + m * in + b * QB, out) / 127.0f;
      if (sums32) {
        int32_t total = 0;
        for (int i = 0; i < QB; ++i) total += out[i];
        sums32[at] = total;
      }
      if (sums32_16)
        for (int g = 0; g < QB / 32; ++g) {
          int32_t s = 0;
          for (int i = 0; i < 32; ++i) s += out[32 * g + i];
          sums32_16[at * (QB / 32) + g] = (int16_t)s;
        }
      if (sums16)
        for (int g = 0; g < QB / 16; ++g) {
          int32_t s = 0;
          for (int i = 0; i < 16; ++i) s += out[16 * g + i];
          sums16[at * (QB / 16) + g] = (int16_t)s;
        }
    }
  });
}

bool is_k_type(int64_t type) {  // activations quantized per 256 values, not per 32
  bool k = false;
  qd_avx2::visit_type(type, [&](auto b) { k = decltype(b)::K; });
  return k;
}

// Block size (weights) and bytes of a ggml type this kernel reads; {0, 0} for others.
std::pair<int64_t, int64_t> block_shape(int64_t type) {
  std::pair<int64_t, int64_t> shape{0, 0};
  qd_avx2::visit_type(type, [&](auto b) { shape = {decltype(b)::QK, decltype(b)::BYTES}; });
  return shape;
}

}  // namespace

std::vector<int64_t> quant_block_types() {
  std::vector<int64_t> types;
  for (int64_t t = 0; t < 64; ++t)
    if (block_shape(t).first) types.push_back(t);
  return types;
}

// AMX-INT8 on the CPU (CPUID leaf 7: EDX bits 24 tile, 25 int8) and granted by Linux, which hands the tile
// registers' state only to processes that ask for it.
bool cpu_has_amx() {
  static const bool has = [] {
    if (!QD_HAVE_AMX || !cpu_has_vnni()) return false;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 24 & 1) || !(d >> 25 & 1)) return false;
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return has;
}

std::string quant_isa() { return cpu_has_amx() ? "amx" : cpu_has_vnni() ? "avx512-vnni" : "avx2"; }

// Every instruction-set path this CPU can run (they all give the same bits; the tests compare them).
std::vector<std::string> quant_isa_paths() {
  std::vector<std::string> paths{"avx2"};
  if (cpu_has_vnni()) paths.push_back("avx512-vnni");
  if (cpu_has_amx()) paths.push_back("amx");
  return paths;
}

// x: [..., in] float32, at most MAX_M rows. parts: [rows_i, bytes per row] uint8 GGUF blocks of the given
// types, stacked along the output dimension. isa: "auto", "avx2", "avx512-vnni" or "amx". perturb_row >= 0
// breaks that row's summation order on purpose (tests only).
// The product written to y, which has x's rows and the parts' total rows as columns (out_rows_of_parts).
void quant_linear_into(const at::Tensor& x, const std::vector<at::Tensor>& parts, const std::vector<int64_t>& types,
                       std::string isa, int64_t perturb_row, at::Tensor& y) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "quant_linear: x must be float32 on the CPU");
  TORCH_CHECK(parts.size() == types.size() && !parts.empty(), "quant_linear: one type per part");
  auto xc = x.contiguous();
  const int64_t in = xc.size(-1), M = xc.numel() / in;
  TORCH_CHECK(M >= 1 && M <= qd_avx2::MAX_M, "quant_linear: 1 to ", qd_avx2::MAX_M, " rows per call");
  bool need_k = false, need_32 = false;
  int64_t O = 0;
  std::vector<const uint8_t*> ptrs;
  std::vector<int64_t> rows_of;
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto [qk, bytes] = block_shape(types[i]);
    TORCH_CHECK(qk > 0, "quant_linear: unsupported block type ", types[i]);
    const auto& p = parts[i];
    TORCH_CHECK(p.scalar_type() == at::kByte && p.dim() == 2 && p.is_contiguous(), "quant_linear: parts must be contiguous uint8 matrices");
    TORCH_CHECK(in % qk == 0 && p.size(1) == in / qk * bytes, "quant_linear: row size does not match the input size");
    TORCH_CHECK((types[i] != qd_avx2::Q4_K_X16 && types[i] != qd_avx2::Q6_K_X16 && types[i] != qd_avx2::Q5_0_X16 &&
                 types[i] != qd_avx2::Q5_0_X16_SUMS) ||
                    p.size(0) % 16 == 0,
                "quant_linear: interleaved blocks come in groups of 16 rows");
    (is_k_type(types[i]) ? need_k : need_32) = true;
    ptrs.push_back(p.data_ptr<uint8_t>());
    rows_of.push_back(p.size(0));
    O += p.size(0);
  }
  if (isa == "auto") isa = quant_isa();
  TORCH_CHECK(isa == "avx2" || (isa == "avx512-vnni" && cpu_has_vnni()) || (isa == "amx" && cpu_has_amx()),
              "quant_linear: instruction set '", isa, "' is not available");
  // Reused per calling thread: no allocation per decoding step.
  static thread_local std::vector<int8_t> kq, bq;
  static thread_local std::vector<float> kd, kd_by_block, bd;
  static thread_local std::vector<int16_t> kbsum, kbsum32;
  static thread_local std::vector<int32_t> bsum;
  const float* xp = xc.data_ptr<float>();
  if (need_k) {
    kq.resize(M * in), kd.resize(M * in / 256), kbsum.resize(M * in / 16), kbsum32.resize(M * in / 32);
    quantize_rows<256, true>(xp, M, in, kq.data(), kd.data(), kbsum.data(), kbsum32.data(), nullptr);
    const int64_t nsb = in / 256;
    kd_by_block.assign(nsb * (M + 8), 0.0f);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t b = 0; b < nsb; ++b) kd_by_block[b * (M + 8) + m] = kd[m * nsb + b];
  }
  if (need_32) {
    bq.resize(M * in), bd.resize(M * in / 32), bsum.resize(M * in / 32);
    quantize_rows<32, false>(xp, M, in, bq.data(), bd.data(), nullptr, nullptr, bsum.data());
  }
  TORCH_CHECK(y.scalar_type() == at::kFloat && y.is_contiguous() && y.numel() == M * O, "quant_linear: output of the wrong size");
  float* yp = y.data_ptr<float>();
  const QdAct act{in, kq.data(), kd.data(), kbsum.data(), kbsum32.data(), kd_by_block.data(), M, bq.data(), bd.data(), bsum.data()};
#if QD_HAVE_AMX
  if (isa == "amx") return qd_amx::run_all(act, M, ptrs, rows_of, types, yp, O, perturb_row);
#endif
#if QD_BUILD_VNNI
  if (isa == "avx512-vnni") return qd_vnni::run_all(act, M, ptrs, rows_of, types, yp, O, perturb_row);
#endif
  qd_avx2::run_all(act, M, ptrs, rows_of, types, yp, O, perturb_row);
}

int64_t out_rows_of_parts(const std::vector<at::Tensor>& parts) {
  int64_t O = 0;
  for (const auto& p : parts) O += p.size(0);
  return O;
}

at::Tensor quant_linear_cpu(at::Tensor x, std::vector<at::Tensor> parts, std::vector<int64_t> types,
                               std::string isa, int64_t perturb_row) {
  auto out_sizes = x.sizes().vec();
  TORCH_CHECK(!out_sizes.empty() && !parts.empty(), "quant_linear: x [..., in] and at least one part expected");
  out_sizes.back() = out_rows_of_parts(parts);
  auto y = at::empty(out_sizes, x.options().dtype(at::kFloat));
  quant_linear_into(x, parts, types, isa, perturb_row, y);
  return y;
}

// Q4_K blocks [rows, n * 144] to Q4KR blocks [rows, n * 148]: the 12 packed scale bytes become 8 scale bytes
// and 8 min bytes, everything else is copied. Multiplies give the bits Q4_K gives (tests check it).
at::Tensor repack_q4k_cpu(at::Tensor blocks) {
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.size(1) % 144 == 0,
              "repack_q4k: uint8 [rows, 144k] Q4_K blocks expected");
  auto src = blocks.contiguous();
  const int64_t n = src.numel() / 144;
  auto out = at::empty({src.size(0), src.size(1) / 144 * 148}, at::kByte);
  const uint8_t* in = src.data_ptr<uint8_t>();
  uint8_t* op = out.data_ptr<uint8_t>();
  at::parallel_for(0, n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint8_t* blk = in + i * 144;
      uint8_t* dst = op + i * 148;
      uint32_t sm[4];
      qd_avx2::Q4K::unpack_scales(blk + 4, sm);
      memcpy(dst, blk, 4);
      memcpy(dst + 4, sm, 16);
      memcpy(dst + 20, blk + 16, 128);
    }
  });
  return out;
}

// Where each bit field of one row's block lies in the interleaved group block of its 16 rows: f(row offset,
// shift, group-block offset, shift, bits) for every field of row r.
template <class F>
void q4k_fields(int r, F&& f) {  // from Q4KR: d, dmin, 8 scale bytes, 8 min bytes, 128 bytes of nibbles
  using X = qd_avx2::Q4KX16;
  for (int i = 0; i < 2; ++i) f(i, 0, X::D + 2 * r + i, 0, 8), f(2 + i, 0, X::DMIN + 2 * r + i, 0, 8);
  for (int j = 0; j < 8; ++j) f(4 + j, 0, X::SCALES + 16 * j + r, 0, 8), f(12 + j, 0, X::MINS + 32 * (j / 2) + 2 * r + j % 2, 0, 8);
  for (int w = 0; w < 256; ++w)  // column w: byte 32 * (w / 64) + w % 32, high nibble where w / 32 is odd
    f(20 + 32 * (w / 64) + w % 32, (w / 32) % 2 * 4, X::QS + 64 * (w / 8) + 4 * r + w % 4, w % 8 / 4 * 4, 4);
}

template <class F>
void q6k_fields(int r, F&& f) {  // from Q6_K: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, d
  using X = qd_avx2::Q6KX16;
  for (int i = 0; i < 2; ++i) f(208 + i, 0, X::D + 2 * r + i, 0, 8);
  for (int j = 0; j < 16; ++j) f(192 + j, 0, X::PAIRS + X::PAIR_BYTES * (j / 2) + X::SCALES + 2 * r + j % 2, 0, 8);
  for (int w = 0; w < 256; ++w) {  // half n, quarter t of that half, column l of the quarter; chunk c of pair p
    const int n = w / 128, t = w % 128 / 32, l = w % 32, p = w / 32, c = w / 8 % 4;
    const int pair = X::PAIRS + X::PAIR_BYTES * p + 4 * r + w % 4;
    f(64 * n + 32 * (t & 1) + l, t / 2 * 4, pair + X::QL + 64 * c, w % 8 / 4 * 4, 4);
    f(128 + 32 * n + l, 2 * t, pair + X::QH + 64 * (c / 2), c % 2 * 4 + w % 8 / 4 * 2, 2);
  }
}

template <class F>
void q5_0_fields(int r, F&& f) {  // from Q5_0: d, 4 bytes of fifth bits (bit w for column w), 16 bytes of nibbles
  using X = qd_avx2::Q50X16;
  for (int i = 0; i < 2; ++i) f(i, 0, X::D + 2 * r + i, 0, 8);
  for (int w = 0; w < 32; ++w) {  // column w: low nibble of byte w for w < 16, high nibble of byte w - 16 above
    const int bit = 4 * r + w % 4;  // in fifth-bit word w / 4
    f(6 + w % 16, w / 16 * 4, X::QS + 64 * (w / 8) + 4 * r + w % 4, w % 8 / 4 * 4, 4);
    f(2 + w / 8, w % 8, X::QH + 8 * (w / 4) + bit / 8, bit % 8, 1);
  }
}

// The same moves as q4k_fields and q6k_fields (q5_0_fields below) for one group of 16 rows (in: the group's first row at this
// column block, rows row_stride bytes apart), written destination byte by destination byte: each row's 4-bit
// (and Q6_K's 2-bit) columns unpacked once, then every byte of the group block assembled from its columns. The
// field walk above moves one field at a time into a zeroed block; at every model load it took seconds (the 1.5B
// target: 5.8 s on two cores), this a fraction. tests/models/test_quant_dot.py checks both against each other.
static void q4k_group_to_x16(const uint8_t* in, int64_t row_stride, uint8_t* out) {
  using X = qd_avx2::Q4KX16;
  for (int r = 0; r < 16; ++r) {
    const uint8_t* s = in + r * row_stride;
    for (int i = 0; i < 2; ++i) out[X::D + 2 * r + i] = s[i], out[X::DMIN + 2 * r + i] = s[2 + i];
    for (int j = 0; j < 8; ++j) out[X::SCALES + 16 * j + r] = s[4 + j], out[X::MINS + 32 * (j / 2) + 2 * r + j % 2] = s[12 + j];
    uint8_t col[256];  // column w's 4-bit value
    for (int h = 0; h < 4; ++h)
      for (int l = 0; l < 32; ++l) col[64 * h + l] = s[20 + 32 * h + l] & 15, col[64 * h + 32 + l] = s[20 + 32 * h + l] >> 4;
    for (int g = 0; g < 32; ++g)
      for (int c = 0; c < 4; ++c) out[X::QS + 64 * g + 4 * r + c] = (uint8_t)(col[8 * g + c] | col[8 * g + c + 4] << 4);
  }
}

static void q6k_group_to_x16(const uint8_t* in, int64_t row_stride, uint8_t* out) {
  using X = qd_avx2::Q6KX16;
  for (int r = 0; r < 16; ++r) {
    const uint8_t* s = in + r * row_stride;
    for (int i = 0; i < 2; ++i) out[X::D + 2 * r + i] = s[208 + i];
    for (int j = 0; j < 16; ++j) out[X::PAIRS + X::PAIR_BYTES * (j / 2) + X::SCALES + 2 * r + j % 2] = s[192 + j];
    uint8_t lo[256], hi[256];  // column w's low 4 bits and high 2 bits
    for (int n = 0; n < 2; ++n)  // column w = 128 n + 32 t + l
      for (int t = 0; t < 4; ++t)
        for (int l = 0; l < 32; ++l) {
          lo[128 * n + 32 * t + l] = s[64 * n + 32 * (t & 1) + l] >> (t / 2 * 4) & 15;
          hi[128 * n + 32 * t + l] = s[128 + 32 * n + l] >> (2 * t) & 3;
        }
    for (int p = 0; p < 8; ++p)
      for (int q = 0; q < 4; ++q) {
        uint8_t* pair = out + X::PAIRS + X::PAIR_BYTES * p + 4 * r + q;
        for (int c = 0; c < 4; ++c) {
          const int w = 32 * p + 8 * c + q;
          pair[X::QL + 64 * c] = (uint8_t)(lo[w] | lo[w + 4] << 4);
        }
        for (int cc = 0; cc < 2; ++cc) {
          const int w = 32 * p + 16 * cc + q;
          pair[X::QH + 64 * cc] = (uint8_t)(hi[w] | hi[w + 4] << 2 | hi[w + 8] << 4 | hi[w + 12] << 6);
        }
      }
  }
}

// q5_0_fields' moves for one group: the fifth bits of two rows share a byte of the group block, so they are
// assembled after the rows, from each row's 32 bits (bit w: column w, as the field walk reads byte 2 + w / 8).
static void q50_group_to_x16(const uint8_t* in, int64_t row_stride, uint8_t* out) {
  using X = qd_avx2::Q50X16;
  uint32_t fifth[16];
  for (int r = 0; r < 16; ++r) {
    const uint8_t* s = in + r * row_stride;
    for (int i = 0; i < 2; ++i) out[X::D + 2 * r + i] = s[i];
    memcpy(&fifth[r], s + 2, 4);  // little-endian: byte 2 + w / 8, bit w % 8
    uint8_t col[32];
    for (int l = 0; l < 16; ++l) col[l] = s[6 + l] & 15, col[16 + l] = s[6 + l] >> 4;
    for (int g = 0; g < 4; ++g)
      for (int c = 0; c < 4; ++c) out[X::QS + 64 * g + 4 * r + c] = (uint8_t)(col[8 * g + c] | col[8 * g + c + 4] << 4);
  }
  for (int j = 0; j < 8; ++j)  // columns 4j..4j+3: rows 2p and 2p + 1 in byte p
    for (int p = 0; p < 8; ++p)
      out[X::QH + 8 * j + p] = (uint8_t)((fifth[2 * p] >> (4 * j) & 15) | (fifth[2 * p + 1] >> (4 * j) & 15) << 4);
}

// Bytes per one-row block of the types that have a 16-row interleaved layout (the interleaved layouts keep
// each row's bytes); 0 for any other type.
static int64_t interleavable_block_bytes(int64_t type) {
  switch (type) {
    case qd_avx2::Q4_K_UNPACKED: return qd_avx2::Q4KX16::BYTES;
    case 14: return qd_avx2::Q6KX16::BYTES;  // Q6_K
    case 6: return qd_avx2::Q50X16::BYTES;   // Q5_0
    default: return 0;
  }
}

// Q4_K_UNPACKED, Q6_K or Q5_0 blocks [rows, n * bytes] (rows a multiple of 16) to their interleaved layout
// (Q4KX16, Q6KX16, Q50X16 in quant_dot_impl.h), the same size; to_x16 false converts back (for selecting
// rows). Bits move, none changes. field_walk: the field-by-field moves even where a faster assembly exists (tests).
at::Tensor interleave_k_cpu(at::Tensor blocks, int64_t type, bool to_x16, bool field_walk) {
  const int64_t bytes = interleavable_block_bytes(type);
  TORCH_CHECK(bytes > 0, "interleave_k: Q4_K_UNPACKED, Q6_K or Q5_0 blocks only");
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.size(1) % bytes == 0 && blocks.size(0) % 16 == 0,
              "interleave_k: uint8 [16k rows, n blocks] expected");
  auto src = blocks.contiguous();
  // The assembled types write every byte of the output once; the field walk ORs fields into a zeroed block.
  const bool assembled = to_x16 && !field_walk;
  auto out = assembled ? at::empty_like(src) : at::zeros_like(src);
  const int64_t n = src.size(1) / bytes, groups = src.size(0) / 16;
  const uint8_t* in = src.data_ptr<uint8_t>();
  uint8_t* op = out.data_ptr<uint8_t>();
  at::parallel_for(0, groups * n, 256, [&](int64_t b, int64_t e) {
    for (int64_t gb = b; gb < e; ++gb) {
      const int64_t g = gb / n, blk = gb % n;
      const int64_t x_at = gb * 16 * bytes;
      if (assembled) {
        const uint8_t* first = in + (g * 16 * n + blk) * bytes;
        if (type == 14) q6k_group_to_x16(first, n * bytes, op + x_at);
        else if (type == 6) q50_group_to_x16(first, n * bytes, op + x_at);
        else q4k_group_to_x16(first, n * bytes, op + x_at);
        continue;
      }
      for (int r = 0; r < 16; ++r) {
        const int64_t row_at = ((g * 16 + r) * n + blk) * bytes;
        auto move = [&](int ro, int rs, int xo, int xs, int nbits) {
          const int mask = (1 << nbits) - 1;
          if (to_x16) op[x_at + xo] |= (uint8_t)(((in[row_at + ro] >> rs) & mask) << xs);
          else op[row_at + ro] |= (uint8_t)(((in[x_at + xo] >> xs) & mask) << rs);
        };
        if (type == 14) q6k_fields(r, move);
        else if (type == 6) q5_0_fields(r, move);
        else q4k_fields(r, move);
      }
    }
  });
  return out;
}

// Float32 weights to Q8_0 blocks (one fp16 scale per 32 weights), for matrices whose GGUF type the
// kernel cannot read (or that came from a Hugging Face folder): the int8 model then still runs every
// matmul through quant_linear.
at::Tensor quantize_q8_0_cpu(at::Tensor w) {
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.dim() == 2 && w.size(1) % 32 == 0, "quantize_q8_0: float32 [rows, 32k] expected");
  auto wc = w.contiguous();
  const int64_t rows = wc.size(0), in = wc.size(1), nb = in / 32;
  auto out = at::empty({rows, nb * 34}, at::kByte);
  const float* wp = wc.data_ptr<float>();
  uint8_t* op = out.data_ptr<uint8_t>();
  at::parallel_for(0, rows, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      for (int64_t k = 0; k < nb; ++k) {
        const float* v = wp + r * in + 32 * k;
        uint8_t* blk = op + (r * nb + k) * 34;
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
        const uint16_t dh = _cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT);
        const float d = _cvtsh_ss(dh);
        const float inv = d > 0.0f ? 1.0f / d : 0.0f;
        memcpy(blk, &dh, 2);
        for (int i = 0; i < 32; ++i) blk[2 + i] = (uint8_t)(int8_t)std::max(-127, std::min(127, (int)std::nearbyint(v[i] * inv)));
      }
  });
  return out;
}
