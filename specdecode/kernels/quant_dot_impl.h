// Integer matmul over GGUF blocks: the body shared by the instruction-set paths.
//
// Each path includes this file into a namespace of its own: quant_dot.cpp as plain AVX2,
// quant_dot_vnni.cpp under a target pragma with QD_VNNI set, where the byte and word multiply-adds fuse
// into AVX-512 VNNI instructions and the compiler has 32 vector registers, and quant_dot_amx.cpp, which
// adds the tile units. Both paths compute the same integers and
// run the same float operations in the same order, so they return the same bits.
//
// How one output is computed, and why it does not depend on the block it sits in:
// - Each activation row was quantized on its own (quant_dot.cpp): int8 values with one scale per
//   256 values for the k-quant types, per 32 for the others, plus small integer sums of those values.
// - Per weight block, the products of weight and activation integers are summed exactly in int32
//   vector lanes (integer addition has no rounding, so the order of the lanes' work is free).
// - Each block then adds to the row's float accumulators in block order: one FMA on the 8 lanes with
//   the product of the two scales, and, for types with an offset, one scalar FMA. The final result is
//   a fixed horizontal sum of the lanes plus the scalar. No step looks at another activation row, the
//   number of rows in the call or the thread that runs it.

#ifndef QD_VNNI
#define QD_VNNI 0
#endif
#ifndef QD_AMX
#define QD_AMX 0
#endif

constexpr int64_t Q4_K_UNPACKED = 112;  // not a ggml type: Q4_K repacked by repack_q4k (weights.py: Q4_K_UNPACKED)
constexpr int64_t Q4_K_X16 = 113;       // not ggml types: Q4_K and Q6_K with 16 rows interleaved (interleave_k,
constexpr int64_t Q6_K_X16 = 114;       // Q4KX16 and Q6KX16)
constexpr int64_t Q5_0_X16 = 115;       // not a ggml type: Q5_0 with 16 rows interleaved (Q50X16)
constexpr int64_t Q5_0_X16_SUMS = 116;  // Q50X16's bytes, each block's sum taken whole first (Q50X16S): drafts only
constexpr int MAX_M = 64;  // activation rows per call: a decode step, a verify block, a prefill chunk

using Act = QdAct;  // the quantized activations of one call (quant_dot_paths.h), one type for every path

// Integer multiply-add of 32 weight bytes (unsigned, 0..63 or |w| <= 128) with 32 activation bytes:
// pairs into int16 (no saturation for these ranges), then words times s16 into the 8 int32 lanes.
// FUSED: the VNNI forms, for tiles with several independent accumulators; a lone accumulator would wait
// on their latency at every step, where the separate add takes one cycle. Same integers either way.
template <bool FUSED>
static inline __m256i mad_scaled(__m256i acc, __m256i u, __m256i x, __m256i s16) {
#if QD_VNNI
  if (FUSED) return _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, x), s16);
#endif
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), s16));
}

template <bool FUSED>
static inline __m256i mad(__m256i acc, __m256i u, __m256i x) {
#if QD_VNNI
  if (FUSED) return _mm256_dpbusd_epi32(acc, u, x);
#endif
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
}

// The sum of the 8 int32 lanes, in lane 0 of the result (every lane, in fact), without leaving the vector registers.
static inline __m128i hsum_i32_v(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
}

static inline float f16(const uint8_t* p) { return _cvtsh_ss(*(const uint16_t*)p); }

// What one activation block offers a weight block: its bytes, scale and integer sums.
struct XBlock {
  const int8_t* q;
  float d;
  const int16_t* bsum16;  // k-quant format
  const int16_t* bsum32;
  int32_t sum32;          // 32-block format
};

// ---- block types: load() reads one weight block, weights(j) gives its j-th 32 bytes ready for mad,
// scale(j) the int16 multipliers of those bytes (k-quants), fold() integers added to the exact sum
// (where FOLD), offset() an integer with its own float scale (off_scale). The value of a block's dot
// product is d * dx * (sum + fold) + off_scale * dx * offset.

// Broadcast word w (0..7) of each 128-bit lane of v to that whole lane (a compile-time w in every caller).
static inline __m256i lane_word(__m256i v, int w_lo, int w_hi) {
  const __m256i ctrl = _mm256_setr_epi8(2 * w_lo, 2 * w_lo + 1, 2 * w_lo, 2 * w_lo + 1, 2 * w_lo, 2 * w_lo + 1, 2 * w_lo, 2 * w_lo + 1,
                                        2 * w_lo, 2 * w_lo + 1, 2 * w_lo, 2 * w_lo + 1, 2 * w_lo, 2 * w_lo + 1, 2 * w_lo, 2 * w_lo + 1,
                                        2 * w_hi, 2 * w_hi + 1, 2 * w_hi, 2 * w_hi + 1, 2 * w_hi, 2 * w_hi + 1, 2 * w_hi, 2 * w_hi + 1,
                                        2 * w_hi, 2 * w_hi + 1, 2 * w_hi, 2 * w_hi + 1, 2 * w_hi, 2 * w_hi + 1, 2 * w_hi, 2 * w_hi + 1);
  return _mm256_shuffle_epi8(v, ctrl);
}

#if QD_VNNI
// The word permutation that lays a block's scales out for one quad (four sub-blocks) of the VNNI tile:
// f(q, L, i) is the scale index of word i of 128-bit lane L.
struct QuadIndex {
  alignas(64) int16_t words[2][32];
  template <class F>
  explicit QuadIndex(F f) {
    for (int q = 0; q < 2; ++q)
      for (int p = 0; p < 32; ++p) words[q][p] = (int16_t)f(q, p / 8, p % 8);
  }
  inline __m512i get(int q) const { return _mm512_load_si512(words[q]); }
};
#endif

struct Q4K {  // 8 sub-blocks of 32: 4-bit q, 6-bit scale and min each; w = d*sc*q - dmin*m
  static constexpr int QK = 256, BYTES = 144, SUB = 8;
  // QUAD: a sum of 4 weight-activation products fits int16, as tile()'s VNNI form needs
  static constexpr bool K = true, SIGNED = false, OFFSET = true, QUAD = true;
  const uint8_t* q;
  float d, off_scale;
  __m256i scales;  // both lanes: the 8 scales as int16
  __m128i mins;    // the 8 mins as int16
  // The 12 scale bytes hold eight 6-bit scales and eight 6-bit mins: bytes 0-3 the low 6 bits of scales
  // 0-3, bytes 4-7 those of mins 0-3, bytes 8-11 the low nibbles of scales 4-7 and mins 4-7, and the top
  // two bits of bytes 0-7 the high bits of scales 4-7 and mins 4-7. Unpacked four bytes at a time into
  // out: scales 0-3, scales 4-7, mins 0-3, mins 4-7, one byte each.
  static inline void unpack_scales(const uint8_t* packed, uint32_t out[4]) {
    uint32_t w[3];
    memcpy(w, packed, 12);
    const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
    out[0] = w[0] & low6;
    out[1] = (w[2] & low4) | (((w[0] >> 6) & low2) << 4);
    out[2] = w[1] & low6;
    out[3] = ((w[2] >> 4) & low4) | (((w[1] >> 6) & low2) << 4);
  }
  inline void set_scales(__m128i bytes) {  // 8 scale bytes, then 8 min bytes
    const __m256i both = _mm256_cvtepu8_epi16(bytes);
    scales = _mm256_permute2x128_si256(both, both, 0x00);
    mins = _mm256_extracti128_si256(both, 1);
  }
  inline void load(const uint8_t* b) {
    d = f16(b);
    off_scale = -f16(b + 2);
    uint32_t sm[4];
    unpack_scales(b + 4, sm);
    set_scales(_mm_setr_epi32((int)sm[0], (int)sm[1], (int)sm[2], (int)sm[3]));
    q = b + 16;
  }
  // byte group j/2 holds sub-block j in its low nibbles (j even) or high nibbles (j odd)
  inline __m256i weights(int j) const {
    const __m256i bytes = _mm256_loadu_si256((const __m256i*)(q + 32 * (j >> 1)));
    return _mm256_and_si256(j & 1 ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(15));
  }
  inline __m256i scale(int j) const { return lane_word(scales, j, j); }
#if QD_VNNI
  // Word p of quad q's dpwssd operand scales 128-bit lane p / 8 of packs_epi32(dpbusd(sub-blocks 4q, 4q+1),
  // dpbusd(4q+2, 4q+3)): words 0-3 hold sums of sub-block 4q + L/2, words 4-7 of 4q + 2 + L/2 (L = p / 8).
  inline __m512i packed_scales(int q) const {
    static const QuadIndex idx([](int q, int L, int i) { return 4 * q + (i < 4 ? 0 : 2) + L / 2; });
    return _mm512_permutexvar_epi16(idx.get(q), _mm512_castsi256_si512(scales));
  }
#endif
  static constexpr bool FOLD = false;
  inline __m256i fold(const XBlock&) const { return _mm256_setzero_si256(); }
  inline __m128i offset_parts(const XBlock& x) const {  // min * (sum of the sub-block's 32 activations), in pairs
    return _mm_madd_epi16(mins, _mm_loadu_si128((const __m128i*)x.bsum32));
  }
  template <int T>
  inline __m256i offsets(const XBlock* x) const {  // lane t: the offset of token x[t], T tokens reduced together
    __m128i v[8];
    for (int t = 0; t < 8; ++t) v[t] = t < T ? offset_parts(x[t]) : _mm_setzero_si128();
    return reduce_parts(v);
  }
  static inline __m256i reduce_parts(const __m128i* v) {  // lane i: the sum of the 4 int32 of v[i]
    const __m128i lo = _mm_hadd_epi32(_mm_hadd_epi32(v[0], v[1]), _mm_hadd_epi32(v[2], v[3]));
    const __m128i hi = _mm_hadd_epi32(_mm_hadd_epi32(v[4], v[5]), _mm_hadd_epi32(v[6], v[7]));
    return _mm256_set_m128i(hi, lo);
  }
};

// Q4K with its scales and mins unpacked once, at load (repack_q4k in quant_dot.cpp): d, dmin, 8 scale bytes,
// 8 min bytes, then Q4K's 128 quant bytes; 148 bytes per block instead of 144. The same integers and floats
// as Q4K, so the same bits, with some twenty instructions fewer per block: a decode step is as much
// instruction-bound as memory-bound on two cores.
struct Q4KR : Q4K {
  static constexpr int BYTES = 148;
  inline void load(const uint8_t* b) {
    d = f16(b);
    off_scale = -f16(b + 2);
    set_scales(_mm_loadu_si128((const __m128i*)(b + 4)));
    q = b + 20;
  }
};

// The scales of the k-quant types with one scale per 16 weights (Q6_K, Q3_K, Q2_K), as int16: sub-block j's
// (weights 32j..32j+31) bytes 0..15 take scale 2j, bytes 16..31 scale 2j+1.
struct Scales16 {
  __m256i first, second;   // both lanes: scales 0-7, scales 8-15
  __m256i all;             // scales 0-15
  inline void set_scales(__m256i sc16) {
    all = sc16;
    first = _mm256_permute2x128_si256(sc16, sc16, 0x00);
    second = _mm256_permute2x128_si256(sc16, sc16, 0x11);
  }
  inline __m256i scale(int j) const { return lane_word(j < 4 ? first : second, (2 * j) & 7, (2 * j + 1) & 7); }
#if QD_VNNI
  // As Q4K::packed_scales, for scales of 16 weights: lane l of a 64-byte dpbusd holds group l / 4 of the 4
  // groups of its two sub-blocks, so word p of quad q takes scale 8q + L (first pair) or 8q + 4 + L.
  inline __m512i packed_scales(int q) const {
    static const QuadIndex idx([](int q, int L, int i) { return 8 * q + (i < 4 ? 0 : 4) + L; });
    return _mm512_permutexvar_epi16(idx.get(q), _mm512_castsi256_si512(all));
  }
#endif
};

struct Q6K : Scales16 {  // 128 bytes low nibbles, 64 bytes 2-bit highs, 16 int8 scales (per 16), fp16 d; w = d*sc*(q-32)
  static constexpr int QK = 256, BYTES = 210, SUB = 8;
  static constexpr bool K = true, SIGNED = false, OFFSET = false, QUAD = true;
  const uint8_t* ql;
  float d, off_scale;
  __m256i minus32sc;       // -32 times each of the 16 scales, as int16
  inline void load(const uint8_t* b) {
    d = f16(b + 208);
    off_scale = 0.0f;
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + 192)));
    set_scales(sc16);
    minus32sc = _mm256_mullo_epi16(sc16, _mm256_set1_epi16(-32));
    ql = b;
  }
  // Sub-block j = (half j/4, t = j%4): weights 128*half + 32t .. +31, unsigned 0..63; low nibbles from
  // ql[64*half + 32*(t&1)] (high nibble when t >= 2), bits 2t..2t+1 of qh[32*half + i] on top.
  inline __m256i weights(int j) const {
    const int half = j >> 2, t = j & 3;
    __m256i l = _mm256_loadu_si256((const __m256i*)(ql + 64 * half + 32 * (t & 1)));
    l = _mm256_and_si256(t >> 1 ? _mm256_srli_epi16(l, 4) : l, _mm256_set1_epi8(15));
    __m256i h = _mm256_loadu_si256((const __m256i*)(ql + 128 + 32 * half));
    h = t == 0 ? _mm256_slli_epi16(h, 4) : t == 1 ? _mm256_slli_epi16(h, 2) : t == 2 ? h : _mm256_srli_epi16(h, 2);
    return _mm256_or_si256(l, _mm256_and_si256(h, _mm256_set1_epi8(0x30)));
  }
  static constexpr bool FOLD = true;
  inline __m256i fold(const XBlock& x) const {  // the -32 of every weight: -32 * scale * 16-value sums
    return _mm256_madd_epi16(minus32sc, _mm256_loadu_si256((const __m256i*)x.bsum16));
  }
  template <int T>
  inline __m256i offsets(const XBlock*) const { return _mm256_setzero_si256(); }
};

// Bit j of every byte of v moved to bit P, the other bits cleared. The shifts are 16-bit, but the bit kept in
// each byte comes from that same byte (j, P < 8).
template <int P>
static inline __m256i byte_bit(__m256i v, int j) {
  const __m256i moved = j <= P ? _mm256_slli_epi16(v, P - j) : _mm256_srli_epi16(v, j - P);
  return _mm256_and_si256(moved, _mm256_set1_epi8(1 << P));
}

// The 2-bit field at bits 2s..2s+1 of every byte of v (Q3_K's and Q2_K's low bits, s = 0..3).
static inline __m256i crumbs(__m256i v, int s) { return _mm256_and_si256(_mm256_srli_epi16(v, 2 * s), _mm256_set1_epi8(3)); }

// Q4K with a fifth bit per weight (unsigned 0..31): d, dmin, Q4K's 12 scale bytes, 32 bytes of fifth bits (bit j of
// byte l for weight l of sub-block j), then Q4K's 128 nibble bytes. Its scales and mins are Q4K's; a sum of
// 4 products, at most 4 * 31 * 127, still fits int16.
struct Q5K : Q4K {
  static constexpr int BYTES = 176;
  const uint8_t* qh;
  inline void load(const uint8_t* b) {
    Q4K::load(b);
    qh = b + 16;
    q = b + 48;
  }
  inline __m256i weights(int j) const {
    return _mm256_or_si256(Q4K::weights(j), byte_bit<4>(_mm256_loadu_si256((const __m256i*)qh), j));
  }
};

// 16 scales of 16 weights, 6 bits each stored plus 32, and 3-bit weights -4..3: bytes 0-31 the third bits (bit j of
// byte l for weight l of sub-block j; a set bit means +0, a clear one -4), 32-95 the two low bits (sub-block j:
// bits 2(j%4) of byte 32(j/4) + l), 96-107 the scales, 108 the fp16 d. w = d*(sc-32)*(u-4) with u = low | third
// << 2, multiplied unsigned (0..7); the -4 is folded as Q6K folds its -32.
struct Q3K : Scales16 {
  static constexpr int QK = 256, BYTES = 110, SUB = 8;
  static constexpr bool K = true, SIGNED = false, OFFSET = false, QUAD = true;
  const uint8_t *hm, *qs;
  float d, off_scale;
  __m256i minus4sc;  // -4 times each of the 16 scales, as int16
  // Scale k has its low nibble in byte k (k < 8) or in the high nibble of byte k - 8, and its two high bits at
  // bits 2(k/4) of byte 8 + k%4. Out: scales 0-3, 4-7, 8-11, 12-15, one byte each, still plus 32.
  static inline void unpack_scales(const uint8_t* packed, uint32_t out[4]) {
    uint32_t w[3];
    memcpy(w, packed, 12);
    const uint32_t low4 = 0x0f0f0f0f, low2 = 0x03030303;
    out[0] = (w[0] & low4) | ((w[2] & low2) << 4);
    out[1] = (w[1] & low4) | (((w[2] >> 2) & low2) << 4);
    out[2] = ((w[0] >> 4) & low4) | (((w[2] >> 4) & low2) << 4);
    out[3] = ((w[1] >> 4) & low4) | (((w[2] >> 6) & low2) << 4);
  }
  inline void load(const uint8_t* b) {
    d = f16(b + 108);
    off_scale = 0.0f;
    uint32_t sc[4];
    unpack_scales(b + 96, sc);
    const __m128i bytes = _mm_setr_epi32((int)sc[0], (int)sc[1], (int)sc[2], (int)sc[3]);
    const __m256i sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(bytes), _mm256_set1_epi16(32));
    set_scales(sc16);
    minus4sc = _mm256_mullo_epi16(sc16, _mm256_set1_epi16(-4));
    hm = b;
    qs = b + 32;
  }
  inline __m256i weights(int j) const {
    const __m256i low = crumbs(_mm256_loadu_si256((const __m256i*)(qs + 32 * (j >> 2))), j & 3);
    return _mm256_or_si256(low, byte_bit<2>(_mm256_loadu_si256((const __m256i*)hm), j));
  }
  static constexpr bool FOLD = true;
  inline __m256i fold(const XBlock& x) const {  // the -4 of every weight: -4 * scale * 16-value sums
    return _mm256_madd_epi16(minus4sc, _mm256_loadu_si256((const __m256i*)x.bsum16));
  }
  template <int T>
  inline __m256i offsets(const XBlock*) const { return _mm256_setzero_si256(); }
};

// 16 sub-blocks of 16 weights, 2 bits each (0..3), with a 4-bit scale (low nibble) and 4-bit min (high nibble) in
// bytes 0-15; bytes 16-79 the weights (sub-block j of 32: bits 2(j%4) of byte 16 + 32(j/4) + l), 80 fp16 d, 82 fp16
// dmin. w = d*sc*q - dmin*m.
struct Q2K : Scales16 {
  static constexpr int QK = 256, BYTES = 84, SUB = 8;
  static constexpr bool K = true, SIGNED = false, OFFSET = true, QUAD = true;
  const uint8_t* qs;
  float d, off_scale;
  __m256i mins;  // the 16 mins as int16
  inline void load(const uint8_t* b) {
    d = f16(b + 80);
    off_scale = -f16(b + 82);
    const __m128i bytes = _mm_loadu_si128((const __m128i*)b), low4 = _mm_set1_epi8(15);
    set_scales(_mm256_cvtepu8_epi16(_mm_and_si128(bytes, low4)));
    mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(bytes, 4), low4));
    qs = b + 16;
  }
  inline __m256i weights(int j) const { return crumbs(_mm256_loadu_si256((const __m256i*)(qs + 32 * (j >> 2))), j & 3); }
  static constexpr bool FOLD = false;
  inline __m256i fold(const XBlock&) const { return _mm256_setzero_si256(); }
  inline __m128i offset_parts(const XBlock& x) const {  // min * (sum of the 16 activations), in fours
    const __m256i p = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i*)x.bsum16));
    return _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
  }
  template <int T>
  inline __m256i offsets(const XBlock* x) const {  // lane t: the offset of token x[t]
    __m128i v[8];
    for (int t = 0; t < 8; ++t) v[t] = t < T ? offset_parts(x[t]) : _mm_setzero_si128();
    return Q4K::reduce_parts(v);
  }
};

// 32-weight blocks: nibbles of 16 bytes, weights 0..15 low, 16..31 high.
static inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128((const __m128i*)qs);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(15));
}

struct Q4_0 {  // w = d*(q - 8)
  static constexpr int QK = 32, BYTES = 18, SUB = 1;
  static constexpr bool K = false, SIGNED = false, OFFSET = false;
  const uint8_t* b;
  float d, off_scale;
  inline void load(const uint8_t* p) { b = p; d = f16(p); off_scale = 0.0f; }
  inline __m256i weights(int) const { return nibbles32(b + 2); }
  inline __m256i scale(int) const { return _mm256_set1_epi16(1); }
  static constexpr bool FOLD = true;
  inline __m256i fold(const XBlock& x) const { return _mm256_setr_epi32(-8 * x.sum32, 0, 0, 0, 0, 0, 0, 0); }
  inline int32_t offset(const XBlock&) const { return 0; }
  template <int T>
  inline __m256i offsets(const XBlock*) const { return _mm256_setzero_si256(); }
};

struct Q4_1 {  // w = d*q + m
  static constexpr int QK = 32, BYTES = 20, SUB = 1;
  static constexpr bool K = false, SIGNED = false, OFFSET = true;
  const uint8_t* b;
  float d, off_scale;
  inline void load(const uint8_t* p) { b = p; d = f16(p); off_scale = f16(p + 2); }
  inline __m256i weights(int) const { return nibbles32(b + 4); }
  inline __m256i scale(int) const { return _mm256_set1_epi16(1); }
  static constexpr bool FOLD = false;
  inline __m256i fold(const XBlock&) const { return _mm256_setzero_si256(); }
  inline int32_t offset(const XBlock& x) const { return x.sum32; }
};

// Byte i of the result is 0x10 where bit i of m is set, else 0 (Q5_0's fifth bits): byte i takes byte i/8 of m
// and keeps bit i%8.
static inline __m256i bits_to_0x10(uint32_t m) {
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

struct Q5_0 {  // w = d*(q - 16), q = nibble | fifth bit (bit i of qh for weight i) << 4
  static constexpr int QK = 32, BYTES = 22, SUB = 1;
  static constexpr bool K = false, SIGNED = false, OFFSET = false;
  const uint8_t* b;
  float d, off_scale;
  inline void load(const uint8_t* p) { b = p; d = f16(p); off_scale = 0.0f; }
  inline __m256i weights(int) const {
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    return _mm256_or_si256(nibbles32(b + 6), bits_to_0x10(qh));
  }
  inline __m256i scale(int) const { return _mm256_set1_epi16(1); }
  static constexpr bool FOLD = true;
  inline __m256i fold(const XBlock& x) const { return _mm256_setr_epi32(-16 * x.sum32, 0, 0, 0, 0, 0, 0, 0); }
  inline int32_t offset(const XBlock&) const { return 0; }
  template <int T>
  inline __m256i offsets(const XBlock*) const { return _mm256_setzero_si256(); }
};

struct Q8_0 {  // w = d*q, q signed: multiplied as |q| times x with q's sign
  static constexpr int QK = 32, BYTES = 34, SUB = 1;
  static constexpr bool K = false, SIGNED = true, OFFSET = false;
  const uint8_t* b;
  float d, off_scale;
  inline void load(const uint8_t* p) { b = p; d = f16(p); off_scale = 0.0f; }
  inline __m256i weights(int) const { return _mm256_loadu_si256((const __m256i*)(b + 2)); }
  inline __m256i scale(int) const { return _mm256_set1_epi16(1); }
  static constexpr bool FOLD = false;
  inline __m256i fold(const XBlock&) const { return _mm256_setzero_si256(); }
  inline int32_t offset(const XBlock&) const { return 0; }
  template <int T>
  inline __m256i offsets(const XBlock*) const { return _mm256_setzero_si256(); }
};

struct Q5_1 {  // w = d*q + m, q = nibble | fifth bit (bit i of qh for weight i) << 4: d, m, 4 bytes qh, 16 of nibbles
  static constexpr int QK = 32, BYTES = 24, SUB = 1;
  static constexpr bool K = false, SIGNED = false, OFFSET = true;
  const uint8_t* b;
  float d, off_scale;
  inline void load(const uint8_t* p) { b = p; d = f16(p); off_scale = f16(p + 2); }
  inline __m256i weights(int) const {
    uint32_t qh;
    memcpy(&qh, b + 4, 4);
    return _mm256_or_si256(nibbles32(b + 8), bits_to_0x10(qh));
  }
  inline __m256i scale(int) const { return _mm256_set1_epi16(1); }
  static constexpr bool FOLD = false;
  inline __m256i fold(const XBlock&) const { return _mm256_setzero_si256(); }
  inline int32_t offset(const XBlock& x) const { return x.sum32; }
};

// The IQ4 types store 4-bit indices into one fixed table of 16 signed weight values (non-uniform, denser near
// zero); a byte shuffle looks them up, the table in both 128-bit lanes.
static inline __m256i iq4_values(__m256i nibbles) {
  const __m128i table = _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
  return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), nibbles);
}

struct IQ4NL {  // w = d*value[index]: fp16 d, 16 bytes of indices laid out as Q4_0's nibbles; signed as Q8_0's
  static constexpr int QK = 32, BYTES = 18, SUB = 1;
  static constexpr bool K = false, SIGNED = true, OFFSET = false;
  const uint8_t* b;
  float d, off_scale;
  inline void load(const uint8_t* p) { b = p; d = f16(p); off_scale = 0.0f; }
  inline __m256i weights(int) const { return iq4_values(nibbles32(b + 2)); }
  inline __m256i scale(int) const { return _mm256_set1_epi16(1); }
  static constexpr bool FOLD = false;
  inline __m256i fold(const XBlock&) const { return _mm256_setzero_si256(); }
  inline int32_t offset(const XBlock&) const { return 0; }
};

// 8 sub-blocks of 32 IQ4 indices, each with a 6-bit scale stored plus 32: fp16 d, a 16-bit word of the scales' high
// bit pairs (bits 2j, 2j+1 for sub-block j), 4 bytes of their low nibbles (sub-block j: nibble j%2 of byte j/2),
// then 16 bytes of indices per sub-block, laid out as IQ4_NL's. w = d*(sc-32)*value[index]. The weights are signed
// (|w| <= 127): multiplied as |w| times x with w's sign, and 4 such products can exceed int16, so tile() takes
// the unpacked form on the VNNI path too (QUAD false).
struct IQ4XS {
  static constexpr int QK = 256, BYTES = 136, SUB = 8;
  static constexpr bool K = true, SIGNED = true, OFFSET = false, QUAD = false;
  const uint8_t* qs;
  float d, off_scale;
  __m256i scales;  // both lanes: the 8 scales as int16
  inline void load(const uint8_t* b) {
    d = f16(b);
    off_scale = 0.0f;
    uint16_t high;
    uint32_t low;
    memcpy(&high, b + 2, 2);
    memcpy(&low, b + 4, 4);
    // word j: byte j/2 of the low nibbles, times 16 where j is even so that >> 4 leaves nibble j%2 on top
    const __m128i pairs = _mm_cvtepu8_epi16(_mm_shuffle_epi8(_mm_cvtsi32_si128((int)low), _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1, -1, -1, -1, -1)));
    const __m128i lo = _mm_and_si128(_mm_srli_epi16(_mm_mullo_epi16(pairs, _mm_setr_epi16(16, 1, 16, 1, 16, 1, 16, 1)), 4), _mm_set1_epi16(15));
    // word j: bits 2j, 2j+1 of the high word moved to the top (times 2^(14 - 2j)), then down to bits 4-5
    const __m128i up = _mm_mullo_epi16(_mm_set1_epi16((short)high), _mm_setr_epi16(1 << 14, 1 << 12, 1 << 10, 1 << 8, 1 << 6, 1 << 4, 1 << 2, 1));
    const __m128i hi = _mm_slli_epi16(_mm_srli_epi16(up, 14), 4);
    scales = _mm256_broadcastsi128_si256(_mm_sub_epi16(_mm_or_si128(lo, hi), _mm_set1_epi16(32)));
    qs = b + 8;
  }
  inline __m256i weights(int j) const { return iq4_values(nibbles32(qs + 16 * j)); }
  inline __m256i scale(int j) const { return lane_word(scales, j, j); }
  static constexpr bool FOLD = false;
  inline __m256i fold(const XBlock&) const { return _mm256_setzero_si256(); }
  template <int T>
  inline __m256i offsets(const XBlock*) const { return _mm256_setzero_si256(); }
};

// The rows of a chunk lie end to end in memory, and a thread walks them in order. The hardware
// prefetcher alone left a decode step well below the memory's bandwidth (rows of a 1536-wide matrix are
// under 1 KB); asking for the lines PREFETCH_BYTES ahead, across into the next row, closes most of the gap.
constexpr int PREFETCH_BYTES = 4608;
template <class B>
static inline void prefetch_ahead(const uint8_t* block) {
  const char* ahead = (const char*)block + (PREFETCH_BYTES + B::BYTES - 1) / B::BYTES * B::BYTES;
  for (int c = 0; c < B::BYTES; c += 64) _mm_prefetch(ahead + c, _MM_HINT_T0);
}

// Lane t of the result: the sum of the 8 int32 lanes of s[t] (exact), for t < T; 0 above.
template <int T>
inline __m256i lane_sums(const __m256i* s) {
  __m256i v[8];
  for (int t = 0; t < 8; ++t) v[t] = t < T ? s[t] : _mm256_setzero_si256();
  const __m256i q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20), _mm256_permute2x128_si256(q0, q1, 0x31));
}

// x with the signs of a signed type's weights w (maddubs multiplies unsigned by signed bytes, so a signed type
// multiplies |w| by x carrying w's sign; a zero weight zeroes its product either way); x itself for the others.
template <class B>
static inline __m256i signed_like(__m256i x, __m256i w) { return B::SIGNED ? _mm256_sign_epi8(x, w) : x; }

// acc + the scaled products of a k-quant block's sub-block j with the activations at xq + 32 j.
template <class B>
static inline __m256i mad_weights(__m256i acc, const B& b, int j, const int8_t* xq) {
  const __m256i wv = b.weights(j), x = _mm256_loadu_si256((const __m256i*)(xq + 32 * j));
  return mad_scaled<true>(acc, B::SIGNED ? _mm256_sign_epi8(wv, wv) : wv, signed_like<B>(x, wv), b.scale(j));
}

// One weight row of a k-quant type against tokens t0..t0+T-1, over the whole row. Per block and token: an exact
// integer sum s, then acc = fma(float(s), d * dx, acc) (and the same for an offset term), block after
// block; the result is acc + offset. T >= 2 runs it in one vector lane per token, tile_one() for a lone
// token in lane 0 of a 128-bit register: the same IEEE operations either way. perturb_token >= 0 splits
// that token's sum into even and odd blocks, added at the end: a deliberately broken variant for the
// tests that must catch it.
template <class B, int T>
void tile(const Act& a, int64_t t0, const uint8_t* w, float* y, int64_t ldy, int64_t perturb_token) {
  static_assert(B::K, "tile() takes the k-quant types; tile_lanes() the 32-weight ones");
  static_assert(T >= 2 && T <= 16, "one token runs in tile_one(); at most 16 tokens, two vectors of float lanes");
  constexpr int G = (T + 7) / 8;  // float vectors: tokens 8g .. 8g+7 in vector g
  const int64_t nblk = a.in / B::QK;
  __m256 acc[G], off[G], odd[G], perturb_lane[G];
  __m256i token_lanes[G];
  for (int g = 0; g < G; ++g) {
    acc[g] = off[g] = odd[g] = _mm256_setzero_ps();
    const __m256i lane = _mm256_setr_epi32(8 * g, 8 * g + 1, 8 * g + 2, 8 * g + 3, 8 * g + 4, 8 * g + 5, 8 * g + 6, 8 * g + 7);
    perturb_lane[g] = _mm256_castsi256_ps(_mm256_cmpeq_epi32(lane, _mm256_set1_epi32((int)(perturb_token - t0))));
    token_lanes[g] = _mm256_cmpgt_epi32(_mm256_set1_epi32(T), lane);
  }
  for (int64_t blk = 0; blk < nblk; ++blk) {
    B b;
    b.load(w + blk * B::BYTES);
    prefetch_ahead<B>(w + blk * B::BYTES);
    const int64_t first = blk * a.M + t0;  // this block of token t0, block-major
    XBlock xb[T];
    __m256i s[T];
    for (int t = 0; t < T; ++t)
      xb[t] = {a.kq + (first + t) * 256, 0.0f, a.kbsum + (first + t) * 16, a.kbsum32 + (first + t) * 8, 0};
#if QD_VNNI
    if constexpr (B::QUAD) {  // Four sub-blocks per step: two 512-bit dpbusd, whose int32 lanes (sums of 4 products, |sum| <= 4 * 63 * 127)
       // fit int16, packed into one dpwssd with the scales: three multiplies per 128 weights and token instead
       // of four (maddubs and dpwssd per 64), the same integers.
      __m512i wide[T];
      for (int t = 0; t < T; ++t) wide[t] = _mm512_setzero_si512();
#pragma GCC unroll 2
      for (int q = 0; q < B::SUB / 4; ++q) {
        const __m512i wa = _mm512_inserti64x4(_mm512_castsi256_si512(b.weights(4 * q)), b.weights(4 * q + 1), 1);
        const __m512i wb = _mm512_inserti64x4(_mm512_castsi256_si512(b.weights(4 * q + 2)), b.weights(4 * q + 3), 1);
        const __m512i sc = b.packed_scales(q);
        for (int t = 0; t < T; ++t) {
          const __m512i pa = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wa, _mm512_loadu_si512(xb[t].q + 128 * q));
          const __m512i pb = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wb, _mm512_loadu_si512(xb[t].q + 128 * q + 64));
          wide[t] = _mm512_dpwssd_epi32(wide[t], _mm512_packs_epi32(pa, pb), sc);
        }
      }
      for (int t = 0; t < T; ++t)
        s[t] = _mm256_add_epi32(B::FOLD ? b.fold(xb[t]) : _mm256_setzero_si256(),
                                _mm256_add_epi32(_mm512_castsi512_si256(wide[t]), _mm512_extracti64x4_epi64(wide[t], 1)));
    } else
#endif
    {
      for (int t = 0; t < T; ++t) s[t] = B::FOLD ? b.fold(xb[t]) : _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int j = 0; j < B::SUB; ++j) {
        const __m256i wv = b.weights(j);
        const __m256i wa = B::SIGNED ? _mm256_sign_epi8(wv, wv) : wv;  // signed weights: |w| times x with w's sign
        const __m256i sc = b.scale(j);
        for (int t = 0; t < T; ++t)
          s[t] = mad_scaled<(T >= 4)>(s[t], wa, signed_like<B>(_mm256_loadu_si256((const __m256i*)(xb[t].q + 32 * j)), wv), sc);
      }
    }
    __m256i sums[G], offs[G];  // lane t of vector g: the block's exact sum (and offset) of token 8g + t
    sums[0] = lane_sums<(T < 8 ? T : 8)>(s);
    offs[0] = b.template offsets<(T < 8 ? T : 8)>(xb);
    if constexpr (G == 2) {
      sums[G - 1] = lane_sums<T - 8>(s + 8);
      offs[G - 1] = b.template offsets<T - 8>(xb + 8);
    }
    const bool to_odd = perturb_token >= t0 && perturb_token < t0 + T && (blk & 1);
    for (int g = 0; g < G; ++g) {
      const __m256 dxv = _mm256_maskload_ps(a.kd_by_block + blk * (a.M + 8) + t0 + 8 * g, token_lanes[g]);
      const __m256 sum = _mm256_cvtepi32_ps(sums[g]);
      const __m256 prod = _mm256_mul_ps(_mm256_set1_ps(b.d), dxv);
      if (to_odd) {
        odd[g] = _mm256_blendv_ps(odd[g], _mm256_fmadd_ps(sum, prod, odd[g]), perturb_lane[g]);
        acc[g] = _mm256_blendv_ps(_mm256_fmadd_ps(sum, prod, acc[g]), acc[g], perturb_lane[g]);
      } else {
        acc[g] = _mm256_fmadd_ps(sum, prod, acc[g]);
      }
      if (B::OFFSET)
        off[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(offs[g]), _mm256_mul_ps(_mm256_set1_ps(b.off_scale), dxv), off[g]);
    }
  }
  alignas(32) float lanes[8 * G], odds[8 * G], offsets[8 * G];
  for (int g = 0; g < G; ++g) {
    _mm256_store_ps(lanes + 8 * g, acc[g]);
    _mm256_store_ps(odds + 8 * g, odd[g]);
    _mm256_store_ps(offsets + 8 * g, off[g]);
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = (t0 + t == perturb_token ? lanes[t] + odds[t] : lanes[t]) + offsets[t];
}

// One weight row against one token (a decode step): tile()'s operations, with the block's integer sum
// split over two accumulators (exact either way) and reduced without leaving the vector registers, so
// consecutive blocks overlap instead of waiting on one long chain of latencies.
template <class B>
void tile_one(const Act& a, int64_t t0, const uint8_t* w, float* y, int64_t perturb_token) {
  static_assert(B::K && B::SUB % 2 == 0, "tile_one() takes the k-quant types");
  const int64_t nblk = a.in / B::QK;
  const bool perturb = perturb_token == t0;
  const float* xd = a.kd + t0 * nblk;
  __m128 acc = _mm_setzero_ps(), odd = _mm_setzero_ps(), off = _mm_setzero_ps();  // lane 0
  for (int64_t blk = 0; blk < nblk; ++blk) {
    B b;
    b.load(w + blk * B::BYTES);
    prefetch_ahead<B>(w + blk * B::BYTES);
    const int64_t at = blk * a.M + t0;  // block-major
    const XBlock xb{a.kq + at * 256, xd[blk], a.kbsum + at * 16, a.kbsum32 + at * 8, 0};
    __m256i s0 = B::FOLD ? b.fold(xb) : _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < B::SUB; j += 2) {
      s0 = mad_weights<B>(s0, b, j, xb.q);
      s1 = mad_weights<B>(s1, b, j + 1, xb.q);
    }
    const __m128 sum = _mm_cvtepi32_ps(hsum_i32_v(_mm256_add_epi32(s0, s1)));
    if (perturb && (blk & 1)) odd = _mm_fmadd_ss(sum, _mm_set_ss(b.d * xb.d), odd);
    else acc = _mm_fmadd_ss(sum, _mm_set_ss(b.d * xb.d), acc);
    if (B::OFFSET)
      off = _mm_fmadd_ss(_mm_cvtepi32_ps(_mm256_castsi256_si128(b.template offsets<1>(&xb))), _mm_set_ss(b.off_scale * xb.d), off);
  }
  y[0] = (perturb ? _mm_cvtss_f32(acc) + _mm_cvtss_f32(odd) : _mm_cvtss_f32(acc)) + _mm_cvtss_f32(off);
}

// The 32-weight block types: one weight block is only 32 products per token, too few to pay for a
// reduction to one integer, so each token keeps 8 float lanes, as llama.cpp does: per block
// acc = fma(float(s), d * dx, acc) lane by lane (and a scalar fma for an offset), and at the end a fixed
// horizontal sum of the lanes plus the offset. Each token's lanes see the same operations whatever T is.
template <class B, int T>
void tile_lanes(const Act& a, int64_t t0, const uint8_t* w, float* y, int64_t ldy, int64_t perturb_token) {
  const int64_t nblk = a.in / B::QK;
  __m256 acc[T], odd[T];
  float off[T];
  for (int t = 0; t < T; ++t) acc[t] = odd[t] = _mm256_setzero_ps(), off[t] = 0.0f;
  const int8_t* xq[T];
  const float* xd[T];
  const int32_t* xs[T];
  for (int t = 0; t < T; ++t) {
    xq[t] = a.bq + (t0 + t) * a.in;
    xd[t] = a.bd + (t0 + t) * nblk;
    xs[t] = a.bsum + (t0 + t) * nblk;
  }
  for (int64_t blk = 0; blk < nblk; ++blk) {
    B b;
    b.load(w + blk * B::BYTES);
    prefetch_ahead<B>(w + blk * B::BYTES);
    const __m256i wv = b.weights(0);
    const __m256i wa = B::SIGNED ? _mm256_sign_epi8(wv, wv) : wv;
    for (int t = 0; t < T; ++t) {
      const XBlock xb{xq[t] + 32 * blk, xd[t][blk], nullptr, nullptr, xs[t][blk]};
      const __m256i x = _mm256_loadu_si256((const __m256i*)xb.q);
      __m256i s = B::FOLD ? b.fold(xb) : _mm256_setzero_si256();
      // each block's sum starts afresh, so the fused form's latency holds nothing up across blocks
      s = B::SIGNED ? mad<true>(s, wa, _mm256_sign_epi8(x, wv)) : mad<true>(s, wv, x);
      __m256& sink = (t0 + t == perturb_token && (blk & 1)) ? odd[t] : acc[t];
      sink = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(b.d * xb.d), sink);
      if (B::OFFSET) off[t] = std::fma((float)b.offset(xb), b.off_scale * xb.d, off[t]);
    }
  }
  for (int t = 0; t < T; ++t)
    y[t * ldy] = (t0 + t == perturb_token ? hsum(acc[t]) + hsum(odd[t]) : hsum(acc[t])) + off[t];
}

// Tokens per tile: one float lane each for the k-quants (16 with AVX-512's 32 registers: a verify block of
// up to 16 rows unpacks each weight block once), 8 float lanes each for the others.
constexpr int K_TOKENS = QD_VNNI ? 16 : 8, LANE_TOKENS = 8;

// One weight row against every token: groups of as many tokens as a tile takes, then the remainder.
template <class B, int T = (B::K ? K_TOKENS : LANE_TOKENS)>
void row_tokens(const Act& a, int64_t t, int64_t M, const uint8_t* w, float* y, int64_t ldy, int64_t perturb) {
  if constexpr (T == 0) {
    return;
  } else {
    for (; t + T <= M; t += T) {
      if constexpr (B::K && T == 1) tile_one<B>(a, t, w, y + t * ldy, perturb);
      else if constexpr (B::K) tile<B, T>(a, t, w, y + t * ldy, ldy, perturb);
      else tile_lanes<B, T>(a, t, w, y + t * ldy, ldy, perturb);
    }
    row_tokens<B, T - 1>(a, t, M, w, y, ldy, perturb);
  }
}

// ---- Interleaved k-quants: Q4_K and Q6_K with each group of 16 weight rows stored together (Q4_K_X16 and
// Q6_K_X16, built at load by interleave_k in quant_dot.cpp). A group is stored block after block, and in a
// group block the quants come in chunks of 64 bytes: chunk c, bytes 4r..4r+3 hold columns 8c..8c+3 of row r
// (low nibbles) and 8c+4..8c+7 (high nibbles). One byte-dot instruction then multiplies four columns of 16
// rows by four activation bytes broadcast, so each row's sum builds up in its own vector lane: no horizontal
// reductions, and every token of a verify block reuses each unpacked weight vector. The integers and the
// float operations per block are those of tile() and tile_one(), so every row keeps the bits its GGUF
// layout gives it.

#if QD_VNNI
using XI = __m512i;
using XF = __m512;
constexpr int XL = 16;  // rows per vector
static inline XI x_load(const uint8_t* p) { return _mm512_loadu_si512(p); }
static inline XI x_and(XI v, int8_t mask) { return _mm512_and_si512(v, _mm512_set1_epi8(mask)); }
static inline XI x_or(XI a, XI b) { return _mm512_or_si512(a, b); }
template <int N> static inline XI x_shl16(XI v) {  // N < 0: logical right shift
  if constexpr (N > 0) return _mm512_slli_epi16(v, N); else return _mm512_srli_epi16(v, -N);
}
template <int N> static inline XI x_shl32(XI v) {  // N < 0: arithmetic right shift
  if constexpr (N > 0) return _mm512_slli_epi32(v, N); else return _mm512_srai_epi32(v, -N);
}
static inline XI x_zero() { return _mm512_setzero_si512(); }
static inline XI x_bcast4(const void* p) { int32_t v; memcpy(&v, p, 4); return _mm512_set1_epi32(v); }
// acc + the byte dot of w with 4 bytes at p in every lane, the broadcast folded into the instruction
// (GCC emits a separate broadcast for _mm512_set1_epi32 of a load).
static inline XI x_dot_bcast(XI acc, XI w, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t*)p));
  return acc;
}
static inline XI x_add(XI a, XI b) { return _mm512_add_epi32(a, b); }
static inline XI x_sub(XI a, XI b) { return _mm512_sub_epi32(a, b); }
static inline XI x_neg16(XI v) { return _mm512_sub_epi16(x_zero(), v); }
static inline XI x_pairs(XI acc, XI w16, const int16_t* x) { return _mm512_dpwssd_epi32(acc, w16, x_bcast4(x)); }
static inline XI x_u8_to_32(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)); }
static inline XI x_u8_to_16(const uint8_t* p) { return _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p)); }
static inline XI x_i8_to_16(const uint8_t* p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)p)); }
static inline XF x_halfs(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
static inline XF x_cvt(XI v) { return _mm512_cvtepi32_ps(v); }
static inline XF x_set1(float v) { return _mm512_set1_ps(v); }
static inline XI x_set1_i32(int32_t v) { return _mm512_set1_epi32(v); }
static inline XF x_mul(XF a, XF b) { return _mm512_mul_ps(a, b); }
static inline XF x_fma(XF a, XF b, XF c) { return _mm512_fmadd_ps(a, b, c); }
static inline XF x_loadf(const float* p) { return _mm512_load_ps(p); }
static inline void x_storef(float* p, XF v) { _mm512_store_ps(p, v); }
static inline XF x_addf(XF a, XF b) { return _mm512_add_ps(a, b); }
// A scale per lane, in the form x_dot_scaled multiplies by.
static inline XI x_scale_form(XI s32) { return s32; }
// The exact sums of N chunks (8N columns) of one token for 16 rows, times the rows' scales.
// CHAINS: independent accumulators; one is enough where many tokens' chains run side by side.
template <int N, int CHAINS>
static inline XI x_dot_scaled(const XI* lo, const XI* hi, const int8_t* x, XI scales) {
  XI p[2] = {x_zero(), x_zero()};
  for (int c = 0; c < N; ++c) {
    p[0] = x_dot_bcast(p[0], lo[c], x + 8 * c);
    p[CHAINS - 1] = x_dot_bcast(p[CHAINS - 1], hi[c], x + 8 * c + 4);
  }
  return _mm512_mullo_epi32(CHAINS == 1 ? p[0] : x_add(p[0], p[1]), scales);  // |sum| <= 16 * 63 * 127: int32
}
// Tokens per tile: each token's block sums (s[t]) and the sub-block sum being built (one more per token, since the
// compiler interleaves the tokens' chains) must fit the 32 registers beside 8 weight vectors and the scales. With
// 16 tokens the sums lived on the stack (reloaded and stored again at every sub-block); 8 keeps them in registers.
constexpr int X16_TOKENS = 8;
// acc + the byte dots of w with the 4 bytes at p in every lane.
static inline XI x_dot4(XI acc, XI w, const int8_t* p) { return x_dot_bcast(acc, w, p); }
// Fifth bits of 16 rows x 4 columns: bit b of the 64 at p becomes 0x10 in byte b.
static inline XI x_fifth_bits(const uint8_t* p, int) {
  uint64_t m;
  memcpy(&m, p, 8);
  return _mm512_maskz_mov_epi8((__mmask64)m, _mm512_set1_epi8(0x10));
}
#else
using XI = __m256i;
using XF = __m256;
constexpr int XL = 8;
static inline XI x_load(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
static inline XI x_and(XI v, int8_t mask) { return _mm256_and_si256(v, _mm256_set1_epi8(mask)); }
static inline XI x_or(XI a, XI b) { return _mm256_or_si256(a, b); }
template <int N> static inline XI x_shl16(XI v) {  // N < 0: logical right shift
  if constexpr (N > 0) return _mm256_slli_epi16(v, N); else return _mm256_srli_epi16(v, -N);
}
template <int N> static inline XI x_shl32(XI v) {  // N < 0: arithmetic right shift
  if constexpr (N > 0) return _mm256_slli_epi32(v, N); else return _mm256_srai_epi32(v, -N);
}
static inline XI x_zero() { return _mm256_setzero_si256(); }
static inline XI x_bcast4(const void* p) { int32_t v; memcpy(&v, p, 4); return _mm256_set1_epi32(v); }
static inline XI x_add(XI a, XI b) { return _mm256_add_epi32(a, b); }
static inline XI x_sub(XI a, XI b) { return _mm256_sub_epi32(a, b); }
static inline XI x_neg16(XI v) { return _mm256_sub_epi16(x_zero(), v); }
static inline XI x_pairs(XI acc, XI w16, const int16_t* x) { return x_add(acc, _mm256_madd_epi16(w16, x_bcast4(x))); }
static inline XI x_u8_to_32(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)); }
static inline XI x_u8_to_16(const uint8_t* p) { return _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)p)); }
static inline XI x_i8_to_16(const uint8_t* p) { return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p)); }
static inline XF x_halfs(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
static inline XF x_cvt(XI v) { return _mm256_cvtepi32_ps(v); }
static inline XF x_set1(float v) { return _mm256_set1_ps(v); }
static inline XI x_set1_i32(int32_t v) { return _mm256_set1_epi32(v); }
static inline XF x_mul(XF a, XF b) { return _mm256_mul_ps(a, b); }
static inline XF x_fma(XF a, XF b, XF c) { return _mm256_fmadd_ps(a, b, c); }
static inline XF x_loadf(const float* p) { return _mm256_load_ps(p); }
static inline void x_storef(float* p, XF v) { _mm256_store_ps(p, v); }
static inline XF x_addf(XF a, XF b) { return _mm256_add_ps(a, b); }
static inline XI x_scale_form(XI s32) {  // the scale in both 16-bit halves of its lane, for madd
  return _mm256_or_si256(_mm256_and_si256(s32, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(s32, 16));
}
// v, opaque to the optimizer: an accumulator stays one chain of adds. Integer adds reassociate freely, and GCC
// otherwise turns a token's chain into a tree over all its products, which then outlive the 16 registers.
static inline XI x_chain(XI v) {
  __asm__("" : "+x"(v));
  return v;
}
constexpr int X16_TOKENS = 4;  // 16 registers: 8 int16 accumulators (4 tokens, both halves), the weights, a broadcast
static inline XI x_dot4(XI acc, XI w, const int8_t* p) {
  return x_add(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x_bcast4(p)), _mm256_set1_epi16(1)));
}
// Fifth bits of rows 8h..8h+7 x 4 columns: bit b of the 32 at p + 4h becomes 0x10 in byte b.
static inline XI x_fifth_bits(const uint8_t* p, int h) {
  uint32_t m;
  memcpy(&m, p + 4 * h, 4);
  return bits_to_0x10(m);
}
#endif

constexpr int X16_HALVES = 16 / XL;  // vectors per group of 16 rows: 1 with AVX-512, 2 with AVX2
template <int T>
constexpr int CHAINS = T >= 8 ? 1 : 2;
// Tokens per tile of the interleaved 32-weight types (their accumulators live in memory: 8 lane vectors a token).
constexpr int X16_LANE_TOKENS = 4;

#if QD_AMX
// ---- AMX-INT8 (the tile units of recent Xeons) for Q4KX16 tiles of 16 or 32 tokens: a prompt's chunks and full
// verify blocks. One tile product multiplies 16 tokens' 64 activation bytes by 64 columns of the 16 rows, far
// more work per instruction than the VNNI lanes, but its int32 sums run over all 64 columns, across two
// sub-blocks with different scales. So the weights are scaled before the product: each 6-bit scale splits as
// sc = 8 hi + lo (hi, lo < 8), q * hi and q * lo (at most 105) are bytes, and two products over the block's 256
// columns give sums H and L with 8 H + L = sum over sub-blocks of sc * (q . x): exactly the integer the VNNI
// lanes build, so the float part that follows, and every bit of the result, stay those of the other paths.
struct alignas(64) TileConfig {  // palette 1: tile i has rows[i] rows of colsb[i] bytes
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
// Every tile 16 x 64 bytes. Loaded by each thread at the start of every run_all call that may use the tiles, not
// cached per thread: other code on the thread (a library's own AMX kernels) may change it between calls.
static inline void amx_configure() {
  TileConfig c;
  for (int i = 0; i < 8; ++i) c.rows[i] = 16, c.colsb[i] = 64;
  _tile_loadconfig(&c);
}
// The tile instructions read and write memory the compiler cannot see: stores before them must happen first,
// loads after them must not be hoisted.
static inline void amx_fence() { asm volatile("" ::: "memory"); }
#endif

// Each interleaved type gives, for half h of a group block (all 16 rows with AVX-512, 8 with AVX2), every
// token's exact block sum s[t] (and offset o[t]), and the rows' float scales d and off_scale.
struct Q4KX16 {  // d, dmin (float16 x 16), scales [8 sub-blocks][16 rows], mins [4 pairs][16 rows][2], 32 chunks
  static constexpr int QK = 256, BYTES = 148, ROWS = 16, GROUP_BYTES = 16 * 148;
  static constexpr int D = 0, DMIN = 32, SCALES = 64, MINS = 192, QS = 320;  // offsets in a group block
  static constexpr bool K = true, SIGNED = false, OFFSET = true;
  // s[h][t], o[h][t]: the sums of half h (one half with AVX-512).
  template <int T>
  static inline void sums(const uint8_t* g, const Act& a, int64_t first, XI (*s)[T], XI (*o)[T]) {
#if QD_VNNI
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {  // sub-block j: 32 columns, chunks 4j..4j+3
      const XI scales = x_scale_form(x_u8_to_32(g + SCALES + 16 * j));
      XI lo[4], hi[4];
      for (int c = 0; c < 4; ++c) {
        const XI v = x_load(g + QS + 64 * (4 * j + c));
        lo[c] = x_and(v, 15);
        hi[c] = x_and(x_shl16<-4>(v), 15);
      }
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t)
        s[0][t] = x_add(s[0][t], x_dot_scaled<4, CHAINS<T>>(lo, hi, a.kq + (first + t) * 256 + 32 * j, scales));
    }
#else
    // A decode step (one token) walks the group block once per half, which streams from memory faster here; more
    // tokens take both halves per chunk, so that each activation broadcast feeds two multiplies.
    if constexpr (T == 1) {
      for (int h = 0; h < 2; ++h)
#pragma GCC unroll 1
        for (int j = 0; j < 8; ++j) avx2_sub_block<T, 1>(g, j, h, a.kq + first * 256 + 32 * j, s);
    } else {
#pragma GCC unroll 1
      for (int j = 0; j < 8; ++j) avx2_sub_block<T, 2>(g, j, 0, a.kq + first * 256 + 32 * j, s);
    }
#endif
    for (int h = 0; h < X16_HALVES; ++h) offsets<T>(g, h, a, first, o[h]);
  }
#if !QD_VNNI
  // Sub-block j (32 columns, chunks 4j..4j+3) of the rows of halves h0..h0+NH-1 against T tokens (token t's bytes
  // at x + 256 t) into s[h][t]: per row, 8 pair sums of 15 * 127 fit int16, then one word multiply-add by the scales.
  template <int T, int NH>
  static inline void avx2_sub_block(const uint8_t* g, int j, int h0, const int8_t* x, XI (*s)[T]) {
    XI w[NH][T];
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) w[h][t] = x_zero();
#pragma GCC unroll 8
    for (int cn = 0; cn < 8; ++cn) {  // chunk c = cn / 2: its low nibbles (columns 8c..8c+3), then the high
      XI u[NH];
      for (int h = 0; h < NH; ++h) {
        const XI v = x_load(g + QS + 64 * (4 * j + cn / 2) + 4 * XL * (h0 + h));
        u[h] = x_and(cn % 2 ? x_shl16<-4>(v) : v, 15);
      }
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const XI b = x_bcast4(x + 256 * t + 4 * cn);
        for (int h = 0; h < NH; ++h) w[h][t] = x_chain(_mm256_add_epi16(w[h][t], _mm256_maddubs_epi16(u[h], b)));
      }
    }
    for (int h = 0; h < NH; ++h) {
      const XI scales = x_scale_form(x_u8_to_32(g + SCALES + 16 * j + XL * (h0 + h)));
      for (int t = 0; t < T; ++t) s[h0 + h][t] = x_add(s[h0 + h][t], _mm256_madd_epi16(w[h][t], scales));
    }
  }
#endif
  // o[t] += the offset's integer part (also the AMX tiles' offset: the mins stay in the vector lanes)
  template <int T>
  static inline void offsets(const uint8_t* g, int h, const Act& a, int64_t first, XI* o) {
    for (int p = 0; p < 4; ++p) {  // mins times sums of 32 activations, two sub-blocks per step
      const XI mins = x_u8_to_16(g + MINS + 32 * p + 2 * XL * h);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) o[t] = x_pairs(o[t], mins, a.kbsum32 + (first + t) * 8 + 2 * p);
    }
  }
  static inline XF d(const uint8_t* g, int h) { return x_halfs(g + D + 2 * XL * h); }
  static inline XF off_scale(const uint8_t* g, int h) { return x_mul(x_halfs(g + DMIN + 2 * XL * h), x_set1(-1.0f)); }
#if QD_AMX
  // The B tiles of one group block, per 64 columns (k = 0..3): row 2c of chunk c's low nibbles, row 2c + 1 its
  // high nibbles, each row 4 columns of all 16 weight rows, times the rows' hi or lo scale of that sub-block.
  static inline void amx_scaled_weights(const uint8_t* g, uint8_t (*bhi)[16][64], uint8_t (*blo)[16][64]) {
    const XI low4 = _mm512_set1_epi8(15), low3 = _mm512_set1_epi32(7);
    for (int j = 0; j < 8; ++j) {
      const XI sc = x_u8_to_32(g + SCALES + 16 * j);
      const XI lo32 = _mm512_and_si512(sc, low3), hi32 = _mm512_srli_epi32(sc, 3);
      // each scale in both 16-bit halves of its row's lane: a word multiply scales the word's two nibble bytes
      // at once (q * scale < 256 cannot carry into the next byte)
      const XI lo16 = _mm512_or_si512(lo32, _mm512_slli_epi32(lo32, 16)), hi16 = _mm512_or_si512(hi32, _mm512_slli_epi32(hi32, 16));
      for (int c = 0; c < 4; ++c) {
        const XI v = x_load(g + QS + 64 * (4 * j + c));
        const XI qlo = _mm512_and_si512(v, low4), qhi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        const int k = j / 2, r = 8 * (j % 2) + 2 * c;
        _mm512_store_si512(bhi[k][r], _mm512_mullo_epi16(qlo, hi16));
        _mm512_store_si512(bhi[k][r + 1], _mm512_mullo_epi16(qhi, hi16));
        _mm512_store_si512(blo[k][r], _mm512_mullo_epi16(qlo, lo16));
        _mm512_store_si512(blo[k][r + 1], _mm512_mullo_epi16(qhi, lo16));
      }
    }
  }
#endif
};

// d (float16 x 16), then per pair p of sub-blocks (2p, 2p+1: 32 columns, chunks 4p..4p+3), in the order the
// kernel reads them: their scales [16 rows][2] (int8), the 4 chunks of low nibbles, and 2 chunks of high bits:
// byte 4r+i of high chunk m holds the two high bits of the columns of chunk 2m (bits 0-1 for its low-nibble
// column, 2-3 for its high-nibble column) and of chunk 2m+1 (bits 4-5, 6-7). One sequential run per block:
// with the high bits apart from the nibbles, streaming from memory measured much slower.
struct Q6KX16 {
  static constexpr int QK = 256, BYTES = 210, ROWS = 16, GROUP_BYTES = 16 * 210;
  static constexpr int D = 0, PAIRS = 32, PAIR_BYTES = 416, SCALES = 0, QL = 32, QH = 288;  // QL, QH: in a pair
  static constexpr bool K = true, SIGNED = false, OFFSET = false;
  // The 6-bit weights of chunk c (0..3) of a pair, rows of half h: low-nibble columns in lo, high in hi.
  static inline void unpack(const uint8_t* pp, int c, int h, XI& lo, XI& hi) {
    const XI v = x_load(pp + QL + 64 * c + 4 * XL * h);
    const XI bits = x_load(pp + QH + 64 * (c / 2) + 4 * XL * h);
    lo = x_or(x_and(v, 15), x_and(c % 2 ? bits : x_shl16<4>(bits), 0x30));
    hi = x_or(x_and(x_shl16<-4>(v), 15), x_and(c % 2 ? x_shl16<-2>(bits) : x_shl16<2>(bits), 0x30));
  }
  // Lane r of half h: the two scales of the pair as int16 (pair), in the form x_dot_scaled multiplies by (even,
  // odd), and -32 * scale (fits int16), which times the sums of 16 activations gives every weight's -32 in the
  // same int32 as the rest.
  struct PairScales {
    XI even, odd, minus32;
    PairScales(const uint8_t* pp, int h) {
      const XI pair = x_i8_to_16(pp + SCALES + 2 * XL * h);
      even = x_scale_form(x_shl32<-16>(x_shl32<16>(pair)));
      odd = x_scale_form(x_shl32<-16>(pair));
      minus32 = x_neg16(x_shl16<5>(pair));
    }
  };
  // s[h][t]: the sums of half h (one half with AVX-512).
  template <int T>
  static inline void sums(const uint8_t* g, const Act& a, int64_t first, XI (*s)[T], XI (*)[T]) {
#pragma GCC unroll 1
    for (int p = 0; p < 8; ++p) {  // sub-blocks 2p and 2p+1: 32 columns, chunks 4p..4p+3
      const uint8_t* pp = g + PAIRS + PAIR_BYTES * p;
#if QD_VNNI
      const PairScales sc(pp, 0);
      XI lo[4], hi[4];
      for (int c = 0; c < 4; ++c) unpack(pp, c, 0, lo[c], hi[c]);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const int8_t* x = a.kq + (first + t) * 256 + 32 * p;
        s[0][t] = x_add(s[0][t], x_add(x_dot_scaled<2, CHAINS<T>>(lo, hi, x, sc.even), x_dot_scaled<2, CHAINS<T>>(lo + 2, hi + 2, x + 16, sc.odd)));
        s[0][t] = x_pairs(s[0][t], sc.minus32, a.kbsum + (first + t) * 16 + 2 * p);
      }
#else
      // Both halves per chunk, each activation broadcast feeding two multiplies (see Q4KX16); per chunk and row,
      // 2 pair sums of 63 * 127 fit int16, 4 do not.
      const PairScales sc[2] = {PairScales(pp, 0), PairScales(pp, 1)};
      const int8_t* x = a.kq + first * 256 + 32 * p;
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        XI lo[2], hi[2];
        for (int h = 0; h < 2; ++h) unpack(pp, c, h, lo[h], hi[h]);
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
          const XI bl = x_bcast4(x + 256 * t + 8 * c), bh = x_bcast4(x + 256 * t + 8 * c + 4);
          for (int h = 0; h < 2; ++h) {
            const XI w = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], bl), _mm256_maddubs_epi16(hi[h], bh));
            s[h][t] = x_chain(x_add(s[h][t], _mm256_madd_epi16(w, c < 2 ? sc[h].even : sc[h].odd)));
          }
        }
      }
      for (int h = 0; h < 2; ++h)
        for (int t = 0; t < T; ++t) s[h][t] = x_pairs(s[h][t], sc[h].minus32, a.kbsum + (first + t) * 16 + 2 * p);
#endif
    }
  }
  static inline XF d(const uint8_t* g, int h) { return x_halfs(g + D + 2 * XL * h); }
  static inline XF off_scale(const uint8_t*, int) { return x_set1(0.0f); }
};

// Q5_0 with 16 rows interleaved, per 32-column group block: the rows' float16 scales, 4 chunks of nibbles laid
// out as the k-quant groups' (chunk c, bytes 4r..4r+3: columns 8c..8c+3 of row r in the low nibbles, 8c+4..8c+7
// in the high), then the fifth bits: 8 words of 64, bit 4r+i of word j for column 4j+i of row r. Lane vector j
// (columns 4j..4j+3 of every row) is what lane j of Q5_0's one-row tile sums, so tile_x16_lanes below can give
// every row the one-row bits.
struct Q50X16 {
  static constexpr int QK = 32, BYTES = 22, ROWS = 16, GROUP_BYTES = 16 * 22;
  static constexpr int D = 0, QS = 32, QH = 288;  // offsets in a group block
  static constexpr bool K = false, SIGNED = false, OFFSET = false;
  static inline XI weights(const uint8_t* g, int h, int j) {  // q = nibble | fifth bit << 4, unsigned 0..31
    const XI v = x_load(g + QS + 64 * (j / 2) + 4 * XL * h);
    return x_or(x_and(j % 2 ? x_shl16<-4>(v) : v, 15), x_fifth_bits(g + QH + 8 * j, h));
  }
  static inline int32_t fold(int32_t sum32) { return -16 * sum32; }  // the -16 of every weight, in lane 0
  static inline XF d(const uint8_t* g, int h) { return x_halfs(g + D + 2 * XL * h); }
};

// Q50X16's layout and integers under another float definition (tile_x16_sums): a block's 32 products are summed
// whole in int32 before its one FMA, where Q5_0's own definition keeps 8 float lanes a row. Not llama.cpp's
// rounding, so never a target's: a draft model's matrices take it (its bits decide no output, only what is
// proposed), for a third of the float work per token and accumulators that fit in registers.
struct Q50X16S : Q50X16 {};

// One group of 16 rows of Q50X16S against tokens t0..t0+T-1. Per block and token, each row's exact integer sum
// (the fold, then the 8 byte-dots of its 4-column lanes, chained), then acc = fma(float(sum), d * dx, acc), block
// after block; the result acc + 0.0f. Every row and token on its own, as in the other tiles.
template <class B, int T>
void tile_x16_sums(const Act& a, int64_t t0, const uint8_t* w, float* y, int64_t ldy, int64_t perturb_token) {
  constexpr int H = X16_HALVES;
  const int64_t nblk = a.in / B::QK;
  const bool perturb = perturb_token >= t0 && perturb_token < t0 + T;
  XF acc[T][H], odd[H];  // odd: only the tests' broken variant (a token's odd blocks summed apart)
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) acc[t][h] = x_set1(0.0f);
  for (int h = 0; h < H; ++h) odd[h] = x_set1(0.0f);
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const uint8_t* g = w + blk * B::GROUP_BYTES;
    for (int h = 0; h < H; ++h) {
      XI wv[8];
      for (int j = 0; j < 8; ++j) wv[j] = B::weights(g, h, j);
      const XF d = B::d(g, h);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const int64_t tok = t0 + t;
        const int8_t* x = a.bq + tok * a.in + 32 * blk;
        XI s = x_set1_i32(B::fold(a.bsum[tok * nblk + blk]));
        for (int j = 0; j < 8; ++j) s = x_dot4(s, wv[j], x + 4 * j);
        const XF scale = x_mul(d, x_set1(a.bd[tok * nblk + blk]));
        if (perturb && tok == perturb_token && (blk & 1)) odd[h] = x_fma(x_cvt(s), scale, odd[h]);
        else acc[t][h] = x_fma(x_cvt(s), scale, acc[t][h]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      XF r = acc[t][h];
      if (t0 + t == perturb_token) r = x_addf(r, odd[h]);
      alignas(64) float out[XL];
      x_storef(out, x_addf(r, x_set1(0.0f)));
      memcpy(y + t * ldy + XL * h, out, sizeof out);
    }
}

// One group of 16 rows of a 32-weight type against tokens t0..t0+T-1: tile_lanes()'s integers and float
// operations for every row at once. Per block and token, lane vector j holds each row's exact sum over columns
// 4j..4j+3 (plus the fold in lane 0), then acc[j] = fma(float(sum), d * dx, acc[j]); at the end the 8 lanes
// are added in hsum()'s order ((0+4) + (1+5)) + ((2+6) + (3+7)), plus the offset 0.0f, as tile_lanes() does.
template <class B, int T>
void tile_x16_lanes(const Act& a, int64_t t0, const uint8_t* w, float* y, int64_t ldy, int64_t perturb_token) {
  constexpr int H = X16_HALVES;
  const int64_t nblk = a.in / B::QK;
  const bool perturb = perturb_token >= t0 && perturb_token < t0 + T;
  alignas(64) float acc[T][H][8][XL] = {};
  alignas(64) float odd[H][8][XL];  // only the tests' broken variant uses it: zeroed only then
  if (perturb) memset(odd, 0, sizeof odd);
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const uint8_t* g = w + blk * B::GROUP_BYTES;
    for (int h = 0; h < H; ++h) {
      XI wv[8];
      for (int j = 0; j < 8; ++j) wv[j] = B::weights(g, h, j);
      const XF d = B::d(g, h);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const int64_t tok = t0 + t;
        const int8_t* x = a.bq + tok * a.in + 32 * blk;
        const XF scale = x_mul(d, x_set1(a.bd[tok * nblk + blk]));
        float (*sink)[XL] = (perturb && tok == perturb_token && (blk & 1)) ? odd[h] : acc[t][h];
        for (int j = 0; j < 8; ++j) {
          const XI start = j == 0 ? x_set1_i32(B::fold(a.bsum[tok * nblk + blk])) : x_zero();
          x_storef(sink[j], x_fma(x_cvt(x_dot4(start, wv[j], x + 4 * j)), scale, x_loadf(sink[j])));
        }
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      auto lanes_sum = [](float (*v)[XL]) {
        XF l[8];
        for (int j = 0; j < 8; ++j) l[j] = x_loadf(v[j]);
        return x_addf(x_addf(x_addf(l[0], l[4]), x_addf(l[1], l[5])), x_addf(x_addf(l[2], l[6]), x_addf(l[3], l[7])));
      };
      XF r = lanes_sum(acc[t][h]);
      if (t0 + t == perturb_token) r = x_addf(r, lanes_sum(odd[h]));
      r = x_addf(r, x_set1(0.0f));
      alignas(64) float out[XL];
      x_storef(out, r);
      memcpy(y + t * ldy + XL * h, out, sizeof out);
    }
}

// One block's float step of one token for XL rows: acc = fma(float(s), d * dx, acc), and with an offset
// off = fma(float(o), off_scale * dx, off).
template <bool OFFSET>
static inline void x16_accumulate(float* acc, float* off, XI s, XI o, XF d, XF off_scale, XF dx) {
  x_storef(acc, x_fma(x_cvt(s), x_mul(d, dx), x_loadf(acc)));
  if (OFFSET) x_storef(off, x_fma(x_cvt(o), x_mul(off_scale, dx), x_loadf(off)));
}

// The tile's results: acc (+ the broken variant's odd blocks) + off, row r of token t to y[t * ldy + r].
template <int T, int ROWS>
static inline void x16_store(const float (*acc)[ROWS], const float (*off)[ROWS], const float (*odd)[ROWS], int64_t t0,
                             int64_t perturb_token, float* y, int64_t ldy) {
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < ROWS / XL; ++h) {
      XF v = x_loadf(acc[t] + XL * h);
      if (t0 + t == perturb_token) v = x_addf(v, x_loadf(odd[t] + XL * h));
      const XF r = x_addf(v, x_loadf(off[t] + XL * h));  // + 0.0f without an offset, as tile() does
      alignas(64) float lanes[XL];
      x_storef(lanes, r);
      memcpy(y + t * ldy + XL * h, lanes, sizeof lanes);
    }
}

// One group of 16 weight rows against tokens t0..t0+T-1 (T <= X16_TOKENS); y[t * ldy + r] for row r.
// perturb_token: as in tile(), that token's odd blocks summed apart (the tests' broken variant).
template <class B, int T>
void tile_x16(const Act& a, int64_t t0, const uint8_t* w, float* y, int64_t ldy, int64_t perturb_token) {
  constexpr int H = X16_HALVES;
  const int64_t nblk = a.in / B::QK;
  alignas(64) float acc[T][B::ROWS] = {}, off[T][B::ROWS] = {}, odd[T][B::ROWS];
  const bool perturb = perturb_token >= t0 && perturb_token < t0 + T;
  if (perturb) memset(odd, 0, sizeof odd);  // only the tests' broken variant uses it
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const uint8_t* g = w + blk * B::GROUP_BYTES;
    // No software prefetch: a group is one long run of blocks read in order, which the hardware prefetchers
    // follow (asking for lines ahead, as the one-row types do, measured slower here).
    const int64_t first = blk * a.M + t0;  // this block of token t0, block-major
    XI s[H][T], o[H][T];
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) s[h][t] = o[h][t] = x_zero();
    B::template sums<T>(g, a, first, s, o);
    for (int h = 0; h < H; ++h) {
      const XF d = B::d(g, h), off_scale = B::off_scale(g, h);
      for (int t = 0; t < T; ++t) {
        float* sink = (perturb && t0 + t == perturb_token && (blk & 1)) ? odd[t] : acc[t];
        x16_accumulate<B::OFFSET>(sink + XL * h, off[t] + XL * h, s[h][t], o[h][t], d, off_scale,
                                  x_set1(a.kd_by_block[blk * (a.M + 8) + t0 + t]));
      }
    }
  }
  x16_store<T, B::ROWS>(acc, off, odd, t0, perturb_token, y, ldy);
}

#if QD_AMX
// Tile products of one Q4KX16 group block for T = 16 or 32 tokens (activation bytes from x, 256 apart): the hi
// and lo sums of each 16 tokens, stored to sums[half][hi, lo][token][row]. 16 tokens: tiles 0 and 1 collect, 2-4
// and 5-7 hold alternate steps' activations and weights. 32: tiles 0-3 collect both halves' sums (four
// independent chains), 4 and 5 hold the halves' activations, 6 and 7 the weights, each serving both halves.
template <int T>
static inline void amx_products(const int8_t* x, const uint8_t (*bhi)[16][64], const uint8_t (*blo)[16][64],
                                int32_t (*sums)[2][16][16]) {
  if constexpr (T == 16) {
    _tile_zero(0);
    _tile_zero(1);
    for (int k = 0; k < 4; k += 2) {
      _tile_loadd(2, x + 64 * k, 256);
      _tile_loadd(3, bhi[k], 64);
      _tile_loadd(4, blo[k], 64);
      _tile_dpbsud(0, 2, 3);
      _tile_dpbsud(1, 2, 4);
      _tile_loadd(5, x + 64 * (k + 1), 256);
      _tile_loadd(6, bhi[k + 1], 64);
      _tile_loadd(7, blo[k + 1], 64);
      _tile_dpbsud(0, 5, 6);
      _tile_dpbsud(1, 5, 7);
    }
    _tile_stored(0, sums[0][0], 64);
    _tile_stored(1, sums[0][1], 64);
  } else {
    static_assert(T == 32, "16 or 32 tokens");
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int k = 0; k < 4; ++k) {
      _tile_loadd(4, x + 64 * k, 256);
      _tile_loadd(5, x + 16 * 256 + 64 * k, 256);
      _tile_loadd(6, bhi[k], 64);
      _tile_loadd(7, blo[k], 64);
      _tile_dpbsud(0, 4, 6);
      _tile_dpbsud(1, 4, 7);
      _tile_dpbsud(2, 5, 6);
      _tile_dpbsud(3, 5, 7);
    }
    _tile_stored(0, sums[0][0], 64);
    _tile_stored(1, sums[0][1], 64);
    _tile_stored(2, sums[1][0], 64);
    _tile_stored(3, sums[1][1], 64);
  }
}

// tile_x16<Q4KX16, T> with the integer sums on the tiles, T = 16 or 32: the same integers (8 hi + lo) and the
// same float steps, so the same bits. Software-pipelined: the vector units scale the next block's weights while
// the tiles multiply this block's, since a tile load waits for the stores that filled its buffer to complete.
template <int T>
void tile_q4k_amx(const Act& a, int64_t t0, const uint8_t* w, float* y, int64_t ldy, int64_t perturb_token) {
  using B = Q4KX16;
  const int64_t nblk = a.in / B::QK;
  alignas(64) float acc[T][16] = {}, off[T][16] = {}, odd[T][16];
  const bool perturb = perturb_token >= t0 && perturb_token < t0 + T;
  if (perturb) memset(odd, 0, sizeof odd);  // only the tests' broken variant uses it
  alignas(64) uint8_t weights[2][2][4][16][64];  // [block parity][hi, lo][k]: two blocks' B tiles
  alignas(64) int32_t sums[T / 16][2][16][16];
  B::amx_scaled_weights(w, weights[0][0], weights[0][1]);
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const uint8_t* g = w + blk * B::GROUP_BYTES;
    const int64_t first = blk * a.M + t0;
    amx_fence();
    amx_products<T>(a.kq + first * 256, weights[blk & 1][0], weights[blk & 1][1], sums);
    // The next block's activations into L1 meanwhile: a tile load waits for all of its 16 rows, and each k
    // step's loads wait for the previous step's products (there are no spare tiles to load ahead into).
    if (blk + 1 < nblk) {
      for (int i = 0; i < T * 4; ++i) _mm_prefetch((const char*)(a.kq + (first + a.M) * 256) + 64 * i, _MM_HINT_T0);
      B::amx_scaled_weights(g + B::GROUP_BYTES, weights[(blk + 1) & 1][0], weights[(blk + 1) & 1][1]);
    }
    XI o[T];
    for (int t = 0; t < T; ++t) o[t] = x_zero();
    B::offsets<T>(g, 0, a, first, o);
    amx_fence();
    const XF d = B::d(g, 0), off_scale = B::off_scale(g, 0);
    for (int t = 0; t < T; ++t) {
      const XI s = x_add(x_shl32<3>(_mm512_load_si512(sums[t / 16][0][t % 16])), _mm512_load_si512(sums[t / 16][1][t % 16]));
      float* sink = (perturb && t0 + t == perturb_token && (blk & 1)) ? odd[t] : acc[t];
      x16_accumulate<true>(sink, off[t], s, o[t], d, off_scale, x_set1(a.kd_by_block[blk * (a.M + 8) + t0 + t]));
    }
  }
  x16_store<T, 16>(acc, off, odd, t0, perturb_token, y, ldy);
}
#endif

// One group of 16 rows against every token: tiles of X16_TOKENS, then the remainder. On the AMX path Q4_K
// takes tiles of 32 tokens first (each scaled weight tile then serves both halves).
template <class B>
constexpr bool block_sums = std::is_same_v<B, Q50X16S>;

template <class B, int T = (B::K || block_sums<B> ? X16_TOKENS : X16_LANE_TOKENS)>
void group_tokens(const Act& a, int64_t t, int64_t M, const uint8_t* w, float* y, int64_t ldy, int64_t perturb) {
#if QD_AMX
  if constexpr (std::is_same_v<B, Q4KX16> && T == X16_TOKENS) {
    for (; t + 32 <= M; t += 32) tile_q4k_amx<32>(a, t, w, y + t * ldy, ldy, perturb);
    for (; t + 16 <= M; t += 16) tile_q4k_amx<16>(a, t, w, y + t * ldy, ldy, perturb);
  }
#endif
  if constexpr (T > 0) {
    for (; t + T <= M; t += T) {
      if constexpr (B::K) tile_x16<B, T>(a, t, w, y + t * ldy, ldy, perturb);
      else if constexpr (block_sums<B>) tile_x16_sums<B, T>(a, t, w, y + t * ldy, ldy, perturb);
      else tile_x16_lanes<B, T>(a, t, w, y + t * ldy, ldy, perturb);
    }
    group_tokens<B, T - 1>(a, t, M, w, y, ldy, perturb);
  }
}

template <class B>
constexpr bool interleaved = std::is_same_v<B, Q4KX16> || std::is_same_v<B, Q6KX16> || std::is_same_v<B, Q50X16> ||
                             std::is_same_v<B, Q50X16S>;

// Output rows [begin, end) of one part (row o of the part at w + o * row bytes, its outputs at y[o]).
template <class B>
void run_rows(const Act& a, int64_t M, const uint8_t* w, int64_t begin, int64_t end, float* y, int64_t ldy, int64_t perturb) {
  const int64_t wstride = a.in / B::QK * B::BYTES;
  if constexpr (interleaved<B>) {  // whole groups: chunks start and end on multiples of 16 rows
    for (int64_t o = begin; o < end; o += B::ROWS) group_tokens<B>(a, 0, M, w + o * wstride, y + o, ldy, perturb);
  } else {
    for (int64_t o = begin; o < end; ++o) row_tokens<B>(a, 0, M, w + o * wstride, y + o, ldy, perturb);
  }
}

// Calls f with a value of the block type for a ggml type id; false for a type the kernel cannot read.
template <class F>
bool visit_type(int64_t type, F&& f) {
  switch (type) {
    case 2: f(Q4_0{}); return true;
    case 3: f(Q4_1{}); return true;
    case 6: f(Q5_0{}); return true;
    case 7: f(Q5_1{}); return true;
    case 8: f(Q8_0{}); return true;
    case 10: f(Q2K{}); return true;
    case 11: f(Q3K{}); return true;
    case 12: f(Q4K{}); return true;
    case 13: f(Q5K{}); return true;
    case 20: f(IQ4NL{}); return true;
    case 23: f(IQ4XS{}); return true;
    case Q4_K_UNPACKED: f(Q4KR{}); return true;
    case Q4_K_X16: f(Q4KX16{}); return true;
    case Q6_K_X16: f(Q6KX16{}); return true;
    case Q5_0_X16: f(Q50X16{}); return true;
    case Q5_0_X16_SUMS: f(Q50X16S{}); return true;
    case 14: f(Q6K{}); return true;
    default: return false;
  }
}

// Every part in one parallel region (one wake-up of the threads per call, not one per part), split
// into chunks of about CHUNK_BYTES of weights that threads take as they come free: a thread slowed by
// another process on its core takes fewer chunks instead of holding the others at the barrier, and
// each chunk is one long run of memory for the prefetchers. Which thread computes a row changes
// nothing in it.
constexpr int64_t CHUNK_BYTES = 256 * 1024, CHUNKS_PER_THREAD = 4;

void run_all(const Act& a, int64_t M, const std::vector<const uint8_t*>& parts, const std::vector<int64_t>& rows_of,
             const std::vector<int64_t>& types, float* y, int64_t O, int64_t perturb) {
  const int64_t threads = at::get_num_threads();
  std::vector<int64_t> first_chunk{0}, first_col{0}, chunk_rows;  // per part (and one past the last)
  for (size_t i = 0; i < parts.size(); ++i) {
    int64_t row_bytes = 0;
    visit_type(types[i], [&](auto b) { row_bytes = a.in / decltype(b)::QK * decltype(b)::BYTES; });
    // Small matrices (a layer's Q, K, V or output projection) in at least CHUNKS_PER_THREAD chunks per
    // thread, so that no thread waits long at the end of the call for another's last chunk.
    const int64_t balanced = (rows_of[i] + threads * CHUNKS_PER_THREAD - 1) / (threads * CHUNKS_PER_THREAD);
    int64_t rows = std::max<int64_t>(8, std::min(CHUNK_BYTES / row_bytes, balanced));
    if (types[i] == Q4_K_X16 || types[i] == Q6_K_X16 || types[i] == Q5_0_X16 || types[i] == Q5_0_X16_SUMS) rows = (rows + 15) / 16 * 16;
    chunk_rows.push_back(rows);
    first_chunk.push_back(first_chunk.back() + (rows_of[i] + chunk_rows[i] - 1) / chunk_rows[i]);
    first_col.push_back(first_col.back() + rows_of[i]);
  }
  const int64_t chunks = first_chunk.back();
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(threads, chunks);
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
#if QD_AMX
    if (M >= 16) amx_configure();
#endif
    for (int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
      size_t i = 0;
      while (c >= first_chunk[i + 1]) ++i;
      const int64_t begin = (c - first_chunk[i]) * chunk_rows[i], end = std::min(rows_of[i], begin + chunk_rows[i]);
      visit_type(types[i], [&](auto b) { run_rows<decltype(b)>(a, M, parts[i], begin, end, y + first_col[i], O, perturb); });
    }
  });
}
