// Hopper (sm_90a) device primitives: asynchronous warpgroup MMA (wgmma), shared-memory matrix descriptors,
// mbarriers, the async-proxy fence, TMA's 2D tiled copy and setmaxnreg. Thin inline-PTX wrappers; build
// with -gencode arch=compute_90a,code=sm_90a (wgmma and setmaxnreg exist only on the "a" target).
//
// A build that brings its own definitions of the primitives (the host SIMT emulation) defines
// RSWA_HOPPER_PRIMITIVES and leaves the inline PTX below out, as utils.h does with RSWA_DEVICE_PRIMITIVES.
// The pure arithmetic (descriptor encoding, swizzle addressing) is shared by both builds.
//
// PTX ISA sections (docs.nvidia.com/cuda/parallel-thread-execution, ISA 8.x):
//   wgmma.fence / commit_group / wait_group            9.7.15.7 (warpgroup-wide, .sync.aligned)
//   wgmma.mma_async m64nNk16 .f32 .bf16/.f16           9.7.15.5 (descriptor 9.7.15.5.1.2.2, fragments
//                                                      9.7.15.5.1.1: A in registers, accumulator D)
//   mbarrier.init / arrive / arrive.expect_tx /        9.7.13.15 (phases, pending arrivals, tx-count)
//   try_wait.parity
//   fence.proxy.async.shared::cta, fence.mbarrier_init 9.7.13.4 (membar / fence)
//   cp.async.bulk.tensor.2d...mbarrier::complete_tx    9.7.9.25.5.1 (tensor map: cuTensorMapEncodeTiled)
//   setmaxnreg.{inc,dec}.sync.aligned.u32              9.7.19.8 (values 24..256, multiples of 8)
//   bar.sync / bar.red.or.pred with id and count      9.7.13.1 (named barriers)
//
// Fragment layouts (the SIMT emulation implements exactly these; tests/test_simt_hopper.py checks them):
//   warpgroup thread t = 128 w' + 32 w + l (w the warp in its warpgroup), g = l / 4, q = l % 4.
//   D (m64nN, f32, N/2 registers d[i]): row 16 w + g + 8 ((i / 2) % 2), column 8 (i / 4) + 2 q + (i % 2).
//   A in registers (m64k16, 16-bit, 4 registers, two elements each, the lower column in the low half):
//     a[0] = (16 w + g, 2q..2q+1), a[1] = (16 w + g + 8, 2q..), a[2] = (16 w + g, 2q+8..), a[3] = (16 w + g + 8, 2q+8..)
//     (mma.m16n8k16's A fragment, warp w holding rows 16 w..16 w + 15).
//   A and B in shared memory through a descriptor (PTX 9.7.15.5.1.2, its canonical layouts): the element
//     (mn, k) of a 64 x 16 A (mn = m) or N x 16 B (mn = n; B[k][n]) of 16-bit elements lies at byte u, then the
//     16-byte chunk bits [4, 4 + log2(W / 16)) of u are XORed with bits [7, 7 + log2(W / 16)) (swizzle of W =
//     32, 64, 128 bytes; address-based: the pattern repeats every 8 W bytes and starts at a multiple of 8 W,
//     where the descriptor's base offset is 0):
//     K-major (imm-trans 0):  no swizzle u = start + (mn / 8) SBO + (2k / 16) LBO + (mn % 8) 16 + 2k % 16
//                             swizzle W  u = start + (mn / 8) SBO + (mn % 8) W + 2k   (LBO unused)
//     MN-major (imm-trans 1): no swizzle u = start + (mn / 8) SBO + (k / 8) LBO + (k % 8) 16 + 2 (mn % 8)
//                             swizzle W  u = start + (mn / (W / 2)) LBO + (k / 8) SBO + (k % 8) W + 2 (mn % (W / 2))
#pragma once

#include <cuda.h>  // CUtensorMap, cuTensorMapEncodeTiled's enums
#include <cuda_runtime.h>

#include <cstdint>

namespace rangeswa::cuda::hopper {

// Descriptor bits 62-63 (PTX 9.7.15.5.1.2.2): 0 no swizzle, 1 128-byte, 2 64-byte, 3 32-byte.
enum class Swizzle : uint32_t { kNone = 0, k128B = 1, k64B = 2, k32B = 3 };

// The swizzle span in bytes (16 for none: one core-matrix row).
__host__ __device__ constexpr uint32_t swizzle_bytes(Swizzle s) {
  return s == Swizzle::k128B ? 128u : s == Swizzle::k64B ? 64u : s == Swizzle::k32B ? 32u : 16u;
}

// matrix-descriptor-encode(x) = (x & 0x3FFFF) >> 4
__host__ __device__ constexpr uint64_t descriptor_encode(uint32_t x) { return uint64_t((x & 0x3FFFFu) >> 4); }

// The 64-bit shared-memory matrix descriptor: start address (bits 0-13), leading dimension byte offset
// (16-29), stride dimension byte offset (32-45), matrix base offset (49-51), swizzle mode (62-63). All three
// byte quantities must be 16-byte aligned. base_offset: 0 when the start lies in a swizzle pattern that starts
// at a multiple of 8 W bytes (the only case the emulation runs; see simt/simt_wgmma.cpp).
__host__ __device__ constexpr uint64_t make_smem_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                                      Swizzle swizzle, uint32_t base_offset = 0) {
  return descriptor_encode(smem_addr) | descriptor_encode(lbo_bytes) << 16 | descriptor_encode(sbo_bytes) << 32 |
         uint64_t(base_offset & 7u) << 49 | uint64_t(swizzle) << 62;
}

// The shared-memory byte address where TMA (and wgmma) put the byte of unswizzled address `addr` under a
// swizzle of W bytes (16: none): the 16-byte chunk index within a W-byte row XOR the row index within the
// 8-row pattern, both read from the address bits. For kernel code that reads a TMA-written tile with plain
// loads (e.g. to build wgmma's register A fragment).
__host__ __device__ constexpr uint32_t swizzle_address(uint32_t addr, uint32_t W) {
  return W <= 16 ? addr : addr ^ (((addr >> 7) & (W / 16 - 1)) << 4);
}

#if !defined(RSWA_HOPPER_PRIMITIVES)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// utils.h cp_async_16 (cp.async.cg, 16 bytes; zeroed when not `valid`) to a shared-window address (smem_u32 of
// a tile plus a byte offset): a run of copies into one tile converts its address once and adds constants.
__device__ __forceinline__ void cp_async_16_shared(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

// ---- wgmma -------------------------------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  static_assert(kPending >= 0 && kPending <= 7, "wgmma.wait_group N: 0..7");
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accesses of the accumulator registers across the wgmma instructions (the asm
// statements below name them, but a use between issue and wait must stay where the source puts it).
template <int K>
__device__ __forceinline__ void fence_operand(float (&r)[K]) {
#pragma unroll
  for (int i = 0; i < K; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int K>
__device__ __forceinline__ void fence_operand(uint32_t (&r)[K]) {
#pragma unroll
  for (int i = 0; i < K; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

namespace detail {
template <typename E>
struct WgmmaType;
template <>
struct WgmmaType<__nv_bfloat16> {
  static constexpr bool kBF16 = true;
};
template <>
struct WgmmaType<__half> {
  static constexpr bool kBF16 = false;
};

template <int N>
struct WgmmaAsm;

// One specialization per N: the accumulator list {%0..%(N/2 - 1)}, then (ss) descriptor A, descriptor B,
// scale-d, imm-trans-a, imm-trans-b; (rs) a0..a3, descriptor B, scale-d, imm-trans-b. imm-scale-a/b are 1.
#define RSWA_WGMMA_ASM(NN, DLIST, SS_TAIL, RS_TAIL, ...)                                                    \
  template <>                                                                                                \
  struct WgmmaAsm<NN> {                                                                                      \
    template <int kTransA, int kTransB>                                                                      \
    static __device__ __forceinline__ void ss_bf16(float* d, uint64_t da, uint64_t db, int scale_d) {        \
      asm volatile("{\n.reg .pred p;\n" SS_TAIL(".bf16", DLIST) "}\n"                                        \
                   : __VA_ARGS__                                                                             \
                   : "l"(da), "l"(db), "r"(scale_d), "n"(kTransA), "n"(kTransB));                            \
    }                                                                                                        \
    template <int kTransA, int kTransB>                                                                      \
    static __device__ __forceinline__ void ss_f16(float* d, uint64_t da, uint64_t db, int scale_d) {         \
      asm volatile("{\n.reg .pred p;\n" SS_TAIL(".f16", DLIST) "}\n"                                         \
                   : __VA_ARGS__                                                                             \
                   : "l"(da), "l"(db), "r"(scale_d), "n"(kTransA), "n"(kTransB));                            \
    }                                                                                                        \
    template <int kTransB>                                                                                   \
    static __device__ __forceinline__ void rs_bf16(float* d, const uint32_t* a, uint64_t db, int scale_d) {  \
      asm volatile("{\n.reg .pred p;\n" RS_TAIL(".bf16", DLIST) "}\n"                                        \
                   : __VA_ARGS__                                                                             \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(kTransB));       \
    }                                                                                                        \
    template <int kTransB>                                                                                   \
    static __device__ __forceinline__ void rs_f16(float* d, const uint32_t* a, uint64_t db, int scale_d) {   \
      asm volatile("{\n.reg .pred p;\n" RS_TAIL(".f16", DLIST) "}\n"                                         \
                   : __VA_ARGS__                                                                             \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(kTransB));       \
    }                                                                                                        \
  };

#define RSWA_F8(x) "+f"(d[x]), "+f"(d[x + 1]), "+f"(d[x + 2]), "+f"(d[x + 3]), "+f"(d[x + 4]), "+f"(d[x + 5]), \
                   "+f"(d[x + 6]), "+f"(d[x + 7])

#define RSWA_F4(x) "+f"(d[x]), "+f"(d[x + 1]), "+f"(d[x + 2]), "+f"(d[x + 3])

// N = 16: 8 accumulators.
#define RSWA_SS16(TY, DL) "setp.ne.b32 p, %10, 0;\nwgmma.mma_async.sync.aligned.m64n16k16.f32" TY TY " " DL \
                          ", %8, %9, p, 1, 1, %11, %12;\n"
#define RSWA_RS16(TY, DL) "setp.ne.b32 p, %13, 0;\nwgmma.mma_async.sync.aligned.m64n16k16.f32" TY TY " " DL \
                          ", {%8, %9, %10, %11}, %12, p, 1, 1, %14;\n"
RSWA_WGMMA_ASM(16, "{%0, %1, %2, %3, %4, %5, %6, %7}", RSWA_SS16, RSWA_RS16, RSWA_F8(0))

// N = 32: 16 accumulators.
#define RSWA_SS32(TY, DL) "setp.ne.b32 p, %18, 0;\nwgmma.mma_async.sync.aligned.m64n32k16.f32" TY TY " " DL \
                          ", %16, %17, p, 1, 1, %19, %20;\n"
#define RSWA_RS32(TY, DL) "setp.ne.b32 p, %21, 0;\nwgmma.mma_async.sync.aligned.m64n32k16.f32" TY TY " " DL \
                          ", {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n"
RSWA_WGMMA_ASM(32, "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}", RSWA_SS32, RSWA_RS32,
               RSWA_F8(0), RSWA_F8(8))

// N = 64: 32 accumulators.
#define RSWA_SS64(TY, DL) "setp.ne.b32 p, %34, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32" TY TY " " DL \
                          ", %32, %33, p, 1, 1, %35, %36;\n"
#define RSWA_RS64(TY, DL) "setp.ne.b32 p, %37, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32" TY TY " " DL \
                          ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n"
RSWA_WGMMA_ASM(64,
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
               "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}",
               RSWA_SS64, RSWA_RS64, RSWA_F8(0), RSWA_F8(8), RSWA_F8(16), RSWA_F8(24))

// N = 72: 36 accumulators (P V of head dim 64 with the body kernel's column of ones: sm90/body_layout.h kValueCols).
#define RSWA_SS72(TY, DL) "setp.ne.b32 p, %38, 0;\nwgmma.mma_async.sync.aligned.m64n72k16.f32" TY TY " " DL \
                          ", %36, %37, p, 1, 1, %39, %40;\n"
#define RSWA_RS72(TY, DL) "setp.ne.b32 p, %41, 0;\nwgmma.mma_async.sync.aligned.m64n72k16.f32" TY TY " " DL \
                          ", {%36, %37, %38, %39}, %40, p, 1, 1, %42;\n"
RSWA_WGMMA_ASM(72,
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
               "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}",
               RSWA_SS72, RSWA_RS72, RSWA_F8(0), RSWA_F8(8), RSWA_F8(16), RSWA_F8(24), RSWA_F4(32))

// N = 80: 40 accumulators (the P V of head dim 80).
#define RSWA_SS80(TY, DL) "setp.ne.b32 p, %42, 0;\nwgmma.mma_async.sync.aligned.m64n80k16.f32" TY TY " " DL \
                          ", %40, %41, p, 1, 1, %43, %44;\n"
#define RSWA_RS80(TY, DL) "setp.ne.b32 p, %45, 0;\nwgmma.mma_async.sync.aligned.m64n80k16.f32" TY TY " " DL \
                          ", {%40, %41, %42, %43}, %44, p, 1, 1, %46;\n"
RSWA_WGMMA_ASM(80,
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
               "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}",
               RSWA_SS80, RSWA_RS80, RSWA_F8(0), RSWA_F8(8), RSWA_F8(16), RSWA_F8(24), RSWA_F8(32))

// N = 88: 44 accumulators (P V of head dim 80 with the column of ones).
#define RSWA_SS88(TY, DL) "setp.ne.b32 p, %46, 0;\nwgmma.mma_async.sync.aligned.m64n88k16.f32" TY TY " " DL \
                          ", %44, %45, p, 1, 1, %47, %48;\n"
#define RSWA_RS88(TY, DL) "setp.ne.b32 p, %49, 0;\nwgmma.mma_async.sync.aligned.m64n88k16.f32" TY TY " " DL \
                          ", {%44, %45, %46, %47}, %48, p, 1, 1, %50;\n"
RSWA_WGMMA_ASM(88,
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
               "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
               "%42, %43}",
               RSWA_SS88, RSWA_RS88, RSWA_F8(0), RSWA_F8(8), RSWA_F8(16), RSWA_F8(24), RSWA_F8(32), RSWA_F4(40))

// N = 128: 64 accumulators.
#define RSWA_SS128(TY, DL) "setp.ne.b32 p, %66, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32" TY TY " " DL \
                           ", %64, %65, p, 1, 1, %67, %68;\n"
#define RSWA_RS128(TY, DL) "setp.ne.b32 p, %69, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32" TY TY " " DL \
                           ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n"
RSWA_WGMMA_ASM(128,
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
               "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, "
               "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
               "%61, %62, %63}",
               RSWA_SS128, RSWA_RS128, RSWA_F8(0), RSWA_F8(8), RSWA_F8(16), RSWA_F8(24), RSWA_F8(32), RSWA_F8(40),
               RSWA_F8(48), RSWA_F8(56))

// N = 136: 68 accumulators (P V of head dim 128 with the column of ones).
#define RSWA_SS136(TY, DL) "setp.ne.b32 p, %70, 0;\nwgmma.mma_async.sync.aligned.m64n136k16.f32" TY TY " " DL \
                          ", %68, %69, p, 1, 1, %71, %72;\n"
#define RSWA_RS136(TY, DL) "setp.ne.b32 p, %73, 0;\nwgmma.mma_async.sync.aligned.m64n136k16.f32" TY TY " " DL \
                          ", {%68, %69, %70, %71}, %72, p, 1, 1, %74;\n"
RSWA_WGMMA_ASM(136,
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
               "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
               "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
               "%63, %64, %65, %66, %67}",
               RSWA_SS136, RSWA_RS136, RSWA_F8(0), RSWA_F8(8), RSWA_F8(16), RSWA_F8(24), RSWA_F8(32), RSWA_F8(40), RSWA_F8(48), RSWA_F8(56), RSWA_F4(64))

#undef RSWA_WGMMA_ASM
#undef RSWA_F8
#undef RSWA_F4
#undef RSWA_SS16
#undef RSWA_RS16
#undef RSWA_SS32
#undef RSWA_RS32
#undef RSWA_SS64
#undef RSWA_RS64
#undef RSWA_SS80
#undef RSWA_RS80
#undef RSWA_SS128
#undef RSWA_RS128
#undef RSWA_SS72
#undef RSWA_RS72
#undef RSWA_SS88
#undef RSWA_RS88
#undef RSWA_SS136
#undef RSWA_RS136
}  // namespace detail

// wgmma.mma_async.sync.aligned.m64nNk16.f32.E.E with A and B in shared memory (descriptors):
// d = A B + (scale_d ? d : 0). kTransA = 1: A is M-major (imm-trans-a); kTransB = 1: B is N-major (imm-trans-b).
template <int N, typename E, int kTransA = 0, int kTransB = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  if constexpr (detail::WgmmaType<E>::kBF16)
    detail::WgmmaAsm<N>::template ss_bf16<kTransA, kTransB>(d, desc_a, desc_b, scale_d);
  else
    detail::WgmmaAsm<N>::template ss_f16<kTransA, kTransB>(d, desc_a, desc_b, scale_d);
}

// The same with A in registers (the fragment layout above).
template <int N, typename E, int kTransB = 0>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  if constexpr (detail::WgmmaType<E>::kBF16) detail::WgmmaAsm<N>::template rs_bf16<kTransB>(d, a, desc_b, scale_d);
  else detail::WgmmaAsm<N>::template rs_f16<kTransB>(d, a, desc_b, scale_d);
}

// ---- mbarrier (8 bytes of shared memory, 8-byte aligned) --------------------------------------------------------
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA's complete_tx) and other threads; a
// __syncthreads() follows it before another thread uses them.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// tx-count += bytes, then one arrival.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// Whether the phase of parity `parity` has completed (the barrier's current phase has the other parity);
// may wait a while before answering false.
__device__ __forceinline__ bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// ---- fences, TMA, registers -------------------------------------------------------------------------------------
// Orders this thread's generic-proxy accesses of shared memory before later async-proxy ones (wgmma operands
// written with st.shared, a TMA store of them) and vice versa.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// cp.async.bulk.tensor.2d: the box of `map` at element coordinates (c0 inner, c1 outer) into shared memory at
// dst (128-byte aligned; swizzled as the map says), completing its bytes on `bar`'s tx-count.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}

// Named CTA barriers (bar.sync / bar.red with a barrier id and a thread count, PTX 9.7.13.1): the `count`
// threads (a multiple of 32, whole warps) that use barrier `id` (1..15; 0 is __syncthreads') wait for each
// other; the warp-specialized kernel's consumer warpgroups synchronise without the producer this way.
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// The same, returning whether `pred` was true in any of the `count` threads (bar.red.or.pred).
__device__ __forceinline__ bool named_barrier_or(int id, int count, bool pred) {
  uint32_t out;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 q, %2, 0;\nbar.red.or.pred p, %1, %3, q;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(out)
      : "r"(id), "r"(uint32_t(pred)), "r"(count)
      : "memory");
  return out != 0;
}

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg: 24..256, a multiple of 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg: 24..256, a multiple of 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Waits for the phase of parity `parity` of `bar` (try_wait in a loop).
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}

// ---- host: tensor maps ------------------------------------------------------------------------------------------
// A tensor map of a 2D row-major array [dim1][dim0] with rows stride1_bytes apart, boxes of box0 x box1
// elements: the driver's cuTensorMapEncodeTiled, found through the runtime's entry-point query (no link against
// libcuda); CUDA_ERROR_NOT_FOUND where the driver has none. The map must outlive nothing: a kernel takes it by
// value (a __grid_constant__ parameter).
inline CUresult encode_tensor_map_2d(CUtensorMap* map, CUtensorMapDataType type, void* global, uint64_t dim0,
                                     uint64_t dim1, uint64_t stride1_bytes, uint32_t box0, uint32_t box1,
                                     CUtensorMapSwizzle swizzle,
                                     CUtensorMapFloatOOBfill oob_fill = CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) {
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return Encode(nullptr);
    return reinterpret_cast<Encode>(fn);
  }();
  if (encode == nullptr) return CUDA_ERROR_NOT_FOUND;
  const cuuint64_t dims[2] = {dim0, dim1}, strides[1] = {stride1_bytes};
  const cuuint32_t box[2] = {box0, box1}, element_strides[2] = {1, 1};
  return encode(map, type, 2, global, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                CU_TENSOR_MAP_L2_PROMOTION_L2_128B, oob_fill);
}

#endif  // RSWA_HOPPER_PRIMITIVES

}  // namespace rangeswa::cuda::hopper
