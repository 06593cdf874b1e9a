// Attention for decode steps, verify blocks (chains and token trees) and int8 prompts, against the KV cache.
//
// Row i of a block sits at position start+i and attends keys 0..start+i (a sliding window of W keeps those after
// start+i-W: the same keys a single step at that position attends). Every row is computed on its
// own, in one fixed order (dot products over the head dimension, softmax sums over the keys), so a row's
// output is the same bits whether it runs alone (plain decoding) or inside a verify block; that is what
// lets speculative decoding reproduce plain decoding exactly. PyTorch's fused attention rounds a batched
// causal call differently from single-row calls, so the model used to make one call per row instead;
// this kernel replaces those calls (28 layers x 16 rows = 448 calls for a 16-token block).
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <vector>

#include "avx2_math.h"
#include "kernels.h"

namespace {

// Scores of one query against keys rows[0..n) (row r at k + r * kstride): four keys at a time for
// instruction-level parallelism; each dot product still runs over the head dimension in the same order.
void scores(const float* q, const float* k, int64_t kstride, const int64_t* rows, int64_t n, int64_t D, float scale, float* out) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float* k0 = k + rows[j] * kstride;
    const float* k1 = k + rows[j + 1] * kstride;
    const float* k2 = k + rows[j + 2] * kstride;
    const float* k3 = k + rows[j + 3] * kstride;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
      __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
      a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
      a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
      a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
    }
    out[j] = hsum(a0) * scale;
    out[j + 1] = hsum(a1) * scale;
    out[j + 2] = hsum(a2) * scale;
    out[j + 3] = hsum(a3) * scale;
  }
  for (; j < n; ++j) {
    const float* kj = k + rows[j] * kstride;
    __m256 a = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(kj + d), a);
    out[j] = hsum(a) * scale;
  }
}

// ---- The fast path: the same operations per (row, head, key) as above, more of them in flight.
//
// scores() keeps four dot products in flight and reduces each with hsum(): a chain of 16 dependent FMAs per key
// (D = 128) and seven shuffles and adds per key. Here two query heads of the group meet four keys per step:
// eight independent chains share each key load, and their eight horizontal sums run together as one transpose
// (two lane swaps, then three pairwise adds across registers). Each key's eight lane sums are still built by the
// same FMAs in the same order over the head dimension, and added in hsum's pairing ((0+4) + (1+5)) + ((2+6) +
// (3+7)), so every score has the bits scores() gives it (tests/lossless/test_row_exact_blocks.py compares them).

// The eight horizontal sums of a[0..8), each in hsum's order, returned as [a0, a2, a4, a6, a1, a3, a5, a7].
static inline __m256 hsum8_interleaved(const __m256* a) {
  __m256 s[4];
  for (int i = 0; i < 4; ++i)  // lane l + lane l+4 of a[2i] (low half) and a[2i+1] (high half)
    s[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x20), _mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x31));
  // (s0 + s1) and (s2 + s3) of each, then their sum
  return _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
}

// Scores of NH (1 or 2) query heads (q, D apart) against four keys per step, 8 / NH ... keys rows[0..n):
// out[h * ld + j]. Keys past the last whole step take scores() one at a time: the same bits.
template <int NH>
void scores_fast(const float* q, const float* k, int64_t kstride, const int64_t* rows, int64_t n, int64_t D, float scale,
                 float* out, int64_t ld) {
  constexpr int NK = 8 / NH;  // keys per step: eight chains in all
  const __m256 sc = _mm256_set1_ps(scale);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // [a0, a2, .., a1, a3, ..] back to a0..a7
  int64_t j = 0;
  for (; j + NK <= n; j += NK) {
    const float* kj[NK];
    for (int i = 0; i < NK; ++i) kj[i] = k + rows[j + i] * kstride;
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
      __m256 kv[NK];
      for (int i = 0; i < NK; ++i) kv[i] = _mm256_loadu_ps(kj[i] + d);
      for (int h = 0; h < NH; ++h) {
        const __m256 qv = _mm256_loadu_ps(q + h * D + d);
        for (int i = 0; i < NK; ++i) acc[h * NK + i] = _mm256_fmadd_ps(qv, kv[i], acc[h * NK + i]);
      }
    }
    const __m256 sums = _mm256_mul_ps(_mm256_permutevar8x32_ps(hsum8_interleaved(acc), order), sc);
    if constexpr (NH == 2) {
      _mm_storeu_ps(out + j, _mm256_castps256_ps128(sums));
      _mm_storeu_ps(out + ld + j, _mm256_extractf128_ps(sums, 1));
    } else {
      _mm256_storeu_ps(out + j, sums);
    }
  }
  for (int h = 0; h < NH; ++h) scores(q + h * D, k, kstride, rows + j, n - j, D, scale, out + h * ld + j);
}

// p[j] = exp(s[j] - max) in place over [0, n) (s padded with -inf up to a multiple of 8); returns sum p.
float softmax_numerators(float* s, int64_t n) {
  const int64_t padded = (n + 7) / 8 * 8;
  __m256 m = _mm256_set1_ps(-INFINITY);
  for (int64_t j = 0; j < padded; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + j));
  const __m256 mx = _mm256_set1_ps(hmax(m));
  __m256 total = _mm256_setzero_ps();
  for (int64_t j = 0; j < padded; j += 8) {
    __m256 p = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + j), mx));  // -inf padding gives 0
    _mm256_storeu_ps(s + j, p);
    total = _mm256_add_ps(total, p);
  }
  return hsum(total);
}

// acc[0, 8*C) += p[j] * v[rows[j]][0, 8*C) for j in [0, n), in order: one chunk of the head dimension.
// acc lives in memory between calls, so a key range split into tiles gets the FMAs of one long loop.
template <int C>
void weighted_values(const float* p, const float* v, int64_t vstride, const int64_t* rows, int64_t n, float* acc_mem) {
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_loadu_ps(acc_mem + 8 * c);
  for (int64_t j = 0; j < n; ++j) {
    __m256 pj = _mm256_set1_ps(p[j]);
    const float* vj = v + rows[j] * vstride;
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * c), acc[c]);
  }
  for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc_mem + 8 * c, acc[c]);
}

void values_acc(const float* p, const float* v, int64_t vstride, const int64_t* rows, int64_t n, int64_t D, float* acc) {
  int64_t d = 0;
  for (; d + 64 <= D; d += 64) weighted_values<8>(p, v + d, vstride, rows, n, acc + d);
  switch ((D - d) / 8) {
    case 7: weighted_values<7>(p, v + d, vstride, rows, n, acc + d); break;
    case 6: weighted_values<6>(p, v + d, vstride, rows, n, acc + d); break;
    case 5: weighted_values<5>(p, v + d, vstride, rows, n, acc + d); break;
    case 4: weighted_values<4>(p, v + d, vstride, rows, n, acc + d); break;
    case 3: weighted_values<3>(p, v + d, vstride, rows, n, acc + d); break;
    case 2: weighted_values<2>(p, v + d, vstride, rows, n, acc + d); break;
    case 1: weighted_values<1>(p, v + d, vstride, rows, n, acc + d); break;
    default: break;
  }
}

// Keys per tile: the query heads that share a key/value head take their turns on one tile (16 KB of keys
// or values) while it is in the first-level cache, so the cache is read from memory once per group, not
// once per query head.
constexpr int64_t KEY_TILE = 32;

// Row i of the block, query heads [h0, h1) of one key/value group: scores, softmax, weighted values.
// Per (row, head) the operations and their order do not depend on the tiling or on h0, h1.
// definition: the scores one (head, key) at a time (scores()), the order the fast path must reproduce bit for bit.
void attend_group(const float* q, const float* kh, int64_t kstride, const float* vh, int64_t vstride,
                  const std::vector<int64_t>& rows, int64_t h0, int64_t h1, int64_t D, float scale, float* out,
                  bool definition) {
  const int64_t n = rows.size(), padded = (n + 7) / 8 * 8, heads = h1 - h0;
  static thread_local std::vector<float> s, acc, total;  // reused: no allocation per layer and token
  s.assign(heads * padded, -INFINITY), acc.assign(heads * D, 0.0f), total.resize(heads);
  for (int64_t j0 = 0; j0 < n; j0 += KEY_TILE) {
    const int64_t m = std::min(KEY_TILE, n - j0);
    int64_t h = 0;
    if (!definition)
      for (; h + 2 <= heads; h += 2)
        scores_fast<2>(q + (h0 + h) * D, kh, kstride, rows.data() + j0, m, D, scale, s.data() + h * padded + j0, padded);
    for (; h < heads; ++h) {
      float* sh = s.data() + h * padded + j0;
      if (definition) scores(q + (h0 + h) * D, kh, kstride, rows.data() + j0, m, D, scale, sh);
      else scores_fast<1>(q + (h0 + h) * D, kh, kstride, rows.data() + j0, m, D, scale, sh, padded);
    }
  }
  for (int64_t h = 0; h < heads; ++h) total[h] = softmax_numerators(s.data() + h * padded, n);
  for (int64_t j0 = 0; j0 < n; j0 += KEY_TILE)
    for (int64_t h = 0; h < heads; ++h)
      values_acc(s.data() + h * padded + j0, vh, vstride, rows.data() + j0, std::min(KEY_TILE, n - j0), D, acc.data() + h * D);
  for (int64_t h = 0; h < heads; ++h) {
    const __m256 inv = _mm256_set1_ps(1.0f / total[h]);
    for (int64_t d = 0; d < D; d += 8)
      _mm256_storeu_ps(out + (h0 + h) * D + d, _mm256_mul_ps(_mm256_loadu_ps(acc.data() + h * D + d), inv));
  }
}

}  // namespace

// q: [T, H, D] float32; k, v: [Hkv, N, D] float32 views of the cache (N >= start + T, rows contiguous).
// visible: undefined for a causal block, or [T, T] bool for a token tree (row i sees block rows j with
// visible[i][j]: its ancestors and itself, parents before children). A tree row attends the prefix and then
// its ancestors in root-to-leaf order, which is exactly the key sequence of the chain it lies on, so it
// gets the bits that chain's row gets. scale: the factor on q.k (<= 0: 1/sqrt(D)). window: > 0 for a sliding
// window, a row at position p seeing keys at positions after p - window (a tree node's position is start plus
// its depth, so it still sees the keys of its chain's row).
// definition: the plain loops the fast path must match bit for bit (for the tests).
at::Tensor block_attention_cpu(at::Tensor q, at::Tensor k, at::Tensor v, int64_t start, c10::optional<at::Tensor> visible,
                                  double scale_arg, int64_t window, bool definition) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "block_attention: float32 only");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "block_attention: q [T,H,D], k/v [Hkv,N,D]");
  auto qc = q.contiguous();
  const int64_t T = qc.size(0), H = qc.size(1), D = qc.size(2), Hkv = k.size(0);
  TORCH_CHECK(D % 8 == 0 && k.size(2) == D && v.size(2) == D, "block_attention: head size must match and be a multiple of 8");
  TORCH_CHECK(H % Hkv == 0 && v.size(0) == Hkv, "block_attention: query heads must be a multiple of key/value heads");
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1, "block_attention: cache rows must be contiguous");
  TORCH_CHECK(start >= 0 && k.size(1) >= start + T && v.size(1) >= start + T, "block_attention: the cache lacks the block's keys");
  // The key rows each query row attends, in order.
  std::vector<std::vector<int64_t>> rows(T);
  const bool tree = visible && visible->defined();
  if (tree) TORCH_CHECK(visible->scalar_type() == at::kBool && visible->dim() == 2 && visible->size(0) == T && visible->size(1) == T,
                        "block_attention: visible must be a [T, T] bool matrix");
  auto vis = tree ? visible->contiguous() : at::Tensor();
  const bool* seen = tree ? vis.data_ptr<bool>() : nullptr;
  std::vector<int64_t> position(T);  // of each block row: its index in a chain, its depth in a tree
  for (int64_t i = 0; i < T; ++i) position[i] = start + (tree ? std::count(seen + i * T, seen + (i + 1) * T, true) - 1 : i);
  for (int64_t i = 0; i < T; ++i) {
    const int64_t oldest = window > 0 ? position[i] - window + 1 : 0;  // the first position inside the window
    for (int64_t j = std::max<int64_t>(oldest, 0); j < start; ++j) rows[i].push_back(j);
    for (int64_t j = 0; j < T; ++j)
      if ((tree ? seen[i * T + j] : j <= i) && position[j] >= oldest) rows[i].push_back(start + j);
  }
  auto out = at::empty_like(qc);
  const float* qp = qc.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t group = H / Hkv;
  const float scale = scale_arg > 0 ? (float)scale_arg : 1.0f / std::sqrt((float)D);
  // One work item per (key/value group, row, slice of the group's query heads): slices only where rows
  // times groups leave a thread without work (a decode step of a model with few key/value heads). Group-major,
  // so that a thread's consecutive rows read the same group's keys and values while they are in its caches.
  const int64_t threads = at::get_num_threads();
  const int64_t slices = std::min(group, std::max<int64_t>(1, (threads + T * Hkv - 1) / (T * Hkv)));
  const int64_t per_slice = (group + slices - 1) / slices;
  at::parallel_for(0, T * Hkv * slices, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t g = item / (T * slices), i = item / slices % T, slice = item % slices;
      const int64_t h0 = g * group + slice * per_slice, h1 = std::min(g * group + group, h0 + per_slice);
      if (h0 >= h1) continue;
      attend_group(qp + i * H * D, kp + g * k.stride(0), k.stride(1), vp + g * v.stride(0), v.stride(1), rows[i], h0, h1, D,
                   scale, op + i * H * D, definition);
    }
  });
  return out;
}
