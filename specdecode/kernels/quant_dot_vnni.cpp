// The AVX-512 VNNI path of the int8 product (quant_dot.cpp dispatches to it): quant_dot_impl.h compiled with the
// byte and word multiply-adds fused into VNNI instructions and 32 vector registers. Same integers, same float
// operations in the same order as the AVX2 path, so the same bits (tests/models/test_quant_dot.py).
#include "quant_dot_paths.h"

#if QD_BUILD_VNNI
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
namespace qd_vnni {
#define QD_VNNI 1
#include "quant_dot_impl.h"
#undef QD_VNNI
}  // namespace qd_vnni
#pragma GCC pop_options
#endif
