// What quant_dot.cpp (the dispatcher and the AVX2 path) shares with the files that compile the faster paths,
// quant_dot_vnni.cpp and quant_dot_amx.cpp. Each path is one copy of quant_dot_impl.h in a namespace of its own,
// compiled for its instruction set; they were three copies in one file, whose compile was most of a first build
// and ran on one core. As three files they compile side by side, on a two-core machine about a third sooner.
#pragma once
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "avx2_math.h"

// Which faster paths to compile: native.py passes those this CPU can run (a first build compiles only them);
// compiled without the flags, every path is.
#ifndef QD_BUILD_VNNI
#define QD_BUILD_VNNI 1
#endif
#ifndef QD_BUILD_AMX
#define QD_BUILD_AMX 1
#endif
#if QD_BUILD_VNNI && QD_BUILD_AMX && defined(__GNUC__) && __GNUC__ >= 11 && defined(__x86_64__)
#define QD_HAVE_AMX 1
#else
#define QD_HAVE_AMX 0
#endif

// The quantized activations of one call (see quantize_* in quant_dot.cpp), one type for every path.
struct QdAct {
  int64_t in;
  // k-quant types, block-major so that a tile reaches each of its tokens at a constant offset:
  const int8_t* kq;       // [in/256][M][256] int8, one scale per 256
  const float* kd;        // [M][in/256]
  const int16_t* kbsum;   // [in/256][M][16] sums of 16 consecutive values
  const int16_t* kbsum32; // [in/256][M][8] sums of 32 consecutive values
  const float* kd_by_block;  // [in/256][M + 8]: kd transposed (padded), the scales of all tokens per block
  int64_t M;
  const int8_t* bq;       // [M][in] int8, one scale per 32 (32-weight block types)
  const float* bd;        // [M][in/32]
  const int32_t* bsum;    // [M][in/32] sums of the 32 values
};

// The entry point of each path (quant_dot_impl.h: run_all), defined in its own file.
#define QD_RUN_ALL_SIGNATURE                                                                                   \
  void run_all(const QdAct& a, int64_t M, const std::vector<const uint8_t*>& parts,                            \
               const std::vector<int64_t>& rows_of, const std::vector<int64_t>& types, float* y, int64_t O,     \
               int64_t perturb)
#if QD_BUILD_VNNI
namespace qd_vnni {
QD_RUN_ALL_SIGNATURE;
}
#endif
#if QD_HAVE_AMX
namespace qd_amx {
QD_RUN_ALL_SIGNATURE;
}
#endif
