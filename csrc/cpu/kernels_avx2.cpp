// The kernels of cpu/kernels_body.h for CPUs with AVX2 and FMA (RANGESWA_CPU_CAPABILITY=avx2).
#include "cpu/dispatch.h"

#if RANGESWA_X86_KERNELS
#define RANGESWA_VEC_AVX2
#include "cpu/kernels_body.h"
#endif
