// The AMX-INT8 path of the int8 product (quant_dot.cpp dispatches to it): the VNNI path, whose interleaved Q4_K
// tiles of 16 and 32 tokens multiply on the tile units (tile_q4k_amx in quant_dot_impl.h). Same integers, same
// float operations, same bits.
#include "quant_dot_paths.h"

#if QD_HAVE_AMX
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")
namespace qd_amx {
#define QD_VNNI 1
#define QD_AMX 1
#include "quant_dot_impl.h"
#undef QD_AMX
#undef QD_VNNI
}  // namespace qd_amx
#pragma GCC pop_options
#endif
