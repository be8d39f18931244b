// The kernels of cpu/kernels_body.h for CPUs with AVX-512 F, BW, DQ and VL, and FMA (RANGESWA_CPU_CAPABILITY=avx512).
#include "cpu/dispatch.h"

#if RANGESWA_X86_KERNELS
#define RANGESWA_VEC_AVX512
#include "cpu/kernels_body.h"
#endif
