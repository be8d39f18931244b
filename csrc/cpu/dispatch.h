// Run-time choice of the instruction set of the CPU kernels, the idea of ATen's DispatchStub: the hot
// loops (cpu/kernels_body.h) are compiled once per capability, each build under its own target pragma
// so that the build flags stay those of the baseline CPU (kernels_default.cpp, kernels_avx2.cpp,
// kernels_avx512.cpp), and the first call picks one table of function pointers for the process.
// Which one: RANGESWA_CPU_CAPABILITY=avx512|avx2|default when set (an error if this CPU cannot run
// it), else ATen's own choice (torch.backends.cpu.get_cpu_capability(), which follows
// ATEN_CPU_CAPABILITY), capped at what this CPU runs. Torch-free but for kernels() (dispatch.cpp).
#pragma once

#include <cstdint>

// The AVX2 and AVX-512 builds need x86-64 and a compiler with target pragmas (GCC, clang).
#if defined(__x86_64__) && defined(__GNUC__)
#define RANGESWA_X86_KERNELS 1
#else
#define RANGESWA_X86_KERNELS 0
#endif

namespace rangeswa::cpu {

enum class Capability { kDefault = 0, kAvx2 = 1, kAvx512 = 2 };

// The dispatched kernels; cpu/kernels.h states what each computes.
struct KernelTable {
  Capability capability;
  void (*gemm_nt)(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb,
                  float* C, int64_t ldc);
  void (*gemm_nn)(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb,
                  float* C, int64_t ldc, float beta);
  float (*row_max)(const float* x, int64_t n);
  float (*exp_shifted)(float* x, int64_t n, float shift);
  void (*rotate_row)(const float* x, float* out, const float* cos, const float* sin, int64_t D, int64_t rotary_dim,
                     bool interleaved, float mul);
  void (*block_means)(const float* x, int64_t ldx, int64_t L, int64_t G, int64_t D, float* out);
};

// One table per build of cpu/kernels_body.h.
namespace generic {
extern const KernelTable kTable;
}
#if RANGESWA_X86_KERNELS
namespace avx2 {
extern const KernelTable kTable;
}
namespace avx512 {
extern const KernelTable kTable;
}
#endif

// "default", "avx2", "avx512": the values of RANGESWA_CPU_CAPABILITY (and of ATEN_CPU_CAPABILITY).
inline const char* capability_name(Capability c) {
  return c == Capability::kAvx512 ? "avx512" : c == Capability::kAvx2 ? "avx2" : "default";
}

// Whether this build has c's table and this CPU (and its OS) can run it: AVX2 with FMA; AVX-512 F, BW,
// DQ and VL with FMA, the set ATen's AVX512 capability asks for.
inline bool cpu_supports(Capability c) {
#if RANGESWA_X86_KERNELS
  if (c == Capability::kAvx512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
  if (c == Capability::kAvx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return c == Capability::kDefault;
}

// The table of capability c; c must be supported.
inline const KernelTable& kernel_table(Capability c) {
#if RANGESWA_X86_KERNELS
  if (c == Capability::kAvx512) return avx512::kTable;
  if (c == Capability::kAvx2) return avx2::kTable;
#endif
  return generic::kTable;
}

// The table every CPU kernel calls through, chosen on the first call (the rule above); raises, on
// every call, when RANGESWA_CPU_CAPABILITY asks for what this CPU lacks or is not a capability name.
const KernelTable& kernels();

}  // namespace rangeswa::cpu
