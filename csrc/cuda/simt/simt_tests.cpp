// Small kernels that test the SIMT emulation (tests/test_simt.py through simt_ops.cpp): the project's WarpGemm
// (common/warp_gemm.h) on tiles in shared memory, the PTX semantics of ldmatrix and mma on marked data, barriers and
// shuffles, and kernels that misuse a primitive (each must raise, not hang). Torch-free.
#include "cuda/simt/simt_tests.h"

#include "cuda/simt/simt.h"
// The kernel sources under test, unmodified.
#include "cuda/kernel_traits.h"
#include "cuda/utils.h"
#include "cuda/common/warp_gemm.h"

namespace rangeswa::cuda::simt_tests {
namespace {

struct GemmArgs {
  const void *q, *k, *v;  // [128, D], [kCols, D], [kCols, D] in the element type
  const float* p;         // [128, kCols]
  float *s, *o;           // [128, kCols], [128, D]
};

// Each of the 4 warps: S = Q K^T for its 32 rows, then O = P V with P given (rounded to the element type by pv).
// The accumulators are written out in the layout common/warp_gemm.h documents.
template <typename Traits, int kCols>
__global__ void warp_gemm_kernel(const GemmArgs a) {
  using E = typename Traits::Element;
  constexpr int S = Traits::kStride, D = Traits::kHeadDim, M = Traits::kBlockM, MB = Traits::kMBlocks;
  constexpr int kChunk = 16 / int(sizeof(E)), kPer = D / kChunk;
  RSWA_DYNAMIC_SHARED(smem);
  E* sQ = reinterpret_cast<E*>(smem);
  E* sK = sQ + M * S;
  E* sV = sK + kCols * S;
  for (int c = threadIdx.x; c < (M + 2 * kCols) * kPer; c += Traits::kThreads) {
    const int r = c / kPer, col = (c % kPer) * kChunk;
    const E* src = r < M ? static_cast<const E*>(a.q) + r * D
                 : r < M + kCols ? static_cast<const E*>(a.k) + (r - M) * D
                                 : static_cast<const E*>(a.v) + (r - M - kCols) * D;
    E* dst = r < M ? sQ + r * S : r < M + kCols ? sK + (r - M) * S : sV + (r - M - kCols) * S;
    cp_async_16(dst + col, src + col, true);
  }
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  float s[MB][kCols / 8][4];
  WarpGemm<Traits>::template qk<kCols>(s, sQ + warp * Traits::kWarpRows * S, sK, lane);
  float p[MB][kCols / 8][4], o[MB][D / 8][4];
  for (int mb = 0; mb < MB; ++mb)
    for (int e = 0; e < 4; ++e) {
      const int row = warp * Traits::kWarpRows + mb * 16 + g + 8 * (e / 2);
      for (int n = 0; n < kCols / 8; ++n) {
        const int col = n * 8 + 2 * t + e % 2;
        a.s[row * kCols + col] = s[mb][n][e];
        p[mb][n][e] = a.p[row * kCols + col];
      }
      for (int dt = 0; dt < D / 8; ++dt) o[mb][dt][e] = 0.f;
    }
  WarpGemm<Traits>::template pv<kCols>(o, p, sV, lane);
  for (int mb = 0; mb < MB; ++mb)
    for (int e = 0; e < 4; ++e) {
      const int row = warp * Traits::kWarpRows + mb * 16 + g + 8 * (e / 2);
      for (int dt = 0; dt < D / 8; ++dt) a.o[row * D + dt * 8 + 2 * t + e % 2] = o[mb][dt][e];
    }
}

template <typename E, int D, int kCols>
void gemm(const GemmArgs& a) {
  using Traits = AttnTraits<E, D>;
  const size_t smem = size_t(Traits::kBlockM + 2 * kCols) * Traits::kStride * sizeof(E);
  ::simt::launch(dim3(1), dim3(Traits::kThreads), smem, warp_gemm_kernel<Traits, kCols>, a);
}

template <typename E, int D>
void gemm_cols(int cols, const GemmArgs& a) {
  if (cols == 16) gemm<E, D, 16>(a);
  else if (cols == 32) gemm<E, D, 32>(a);
  else if (cols == 64) gemm<E, D, 64>(a);
  else throw ::simt::Error("warp_gemm: kCols must be 16, 32 or 64");
}

template <typename E>
void gemm_dims(int D, int cols, const GemmArgs& a) {
  if (D == 64) gemm_cols<E, 64>(cols, a);
  else if (D == 80) gemm_cols<E, 80>(cols, a);
  else if (D == 128) gemm_cols<E, 128>(cols, a);
  else throw ::simt::Error("warp_gemm: D must be 64, 80 or 128");
}

// ---- probes ---------------------------------------------------------------------------------------------------

struct ProbeArgs {
  float* out;
  const float* in;
  int which;
};

// Barriers, a static shared variable and the CTA reductions (128 threads); out[128 * x + tid].
__global__ void barrier_kernel(const ProbeArgs a) {
  RSWA_DYNAMIC_SHARED(smem);
  RSWA_STATIC_SHARED(int, shared_int);
  int* s = reinterpret_cast<int*>(smem);
  const int tid = threadIdx.x, n = blockDim.x;
  float* out = a.out + blockIdx.x * 8 * n;
  s[tid] = 3 * tid;
  if (tid == 0) shared_int = 42 + int(blockIdx.x);
  __syncthreads();
  out[tid] = float(s[(tid + 1) % n]);
  out[n + tid] = float(shared_int);
  out[2 * n + tid] = float(__syncthreads_or(tid == 77));
  out[3 * n + tid] = float(__syncthreads_or(0));
  out[4 * n + tid] = float(__syncthreads_and(tid != 5));
  out[5 * n + tid] = float(__syncthreads_and(1));
  out[6 * n + tid] = float(__syncthreads_count(tid % 3 == 0));
  __syncthreads();
  s[tid] = -tid;  // every thread read its neighbour's value before this (the barrier above)
  __syncthreads();
  out[7 * n + tid] = float(s[(tid + 5) % n]);
}

// Shuffles (128 threads); out[128 * x + tid].
__global__ void shuffle_kernel(const ProbeArgs a) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, n = blockDim.x;
  float* out = a.out + blockIdx.x * 8 * n;
  float v = float(lane);
  for (int x = 1; x < 32; x *= 2) v += __shfl_xor_sync(0xffffffffu, v, x);
  out[tid] = v;                                                                  // 496
  out[n + tid] = float(__shfl_sync(0xffffffffu, lane * 10 + warp, 7));           // 70 + warp
  out[2 * n + tid] = float(__shfl_sync(0xffffffffu, lane * 10, (lane + 1) % 32));  // rotation
  out[3 * n + tid] = float(__shfl_xor_sync(0xffffffffu, lane, 2, 4));            // within quads
  out[4 * n + tid] = float(__shfl_up_sync(0xffffffffu, lane, 3));                // lane - 3, or lane
  out[5 * n + tid] = float(__shfl_down_sync(0xffffffffu, lane, 3, 16));          // lane + 3 within 16
  out[6 * n + tid] = float(__shfl_sync(0xffffffffu, lane, 33, 8));               // (33 % 8) within 8
  __syncwarp();
  const unsigned u = __shfl_xor_sync(0xffffffffu, 0x80000000u | unsigned(lane), 16);
  out[7 * n + tid] = float(u & 0xffu);
}

// ldmatrix x4 and x4.trans on four 8 x 8 matrices whose element (m, r, c) holds m * 64 + r * 8 + c; lane l
// addresses row l % 8 of matrix l / 8 (rows of matrix m at row m * 8 of a [32, 8 + pad] array).
// out[l * 8 + x] (x < 4: plain r[x]; x >= 4: trans r[x - 4]) as the two 16-bit halves lo + 65536 * hi.
__global__ void ldmatrix_kernel(const ProbeArgs a) {
  RSWA_DYNAMIC_SHARED(smem);
  uint16_t* s = reinterpret_cast<uint16_t*>(smem);
  constexpr int kRow = 24;  // elements per row: 48 bytes, 16-byte aligned rows
  const int lane = threadIdx.x;
  for (int r = 0; r < 8; ++r) s[lane * kRow + r] = uint16_t((lane / 8) * 64 + (lane % 8) * 8 + r);
  __syncthreads();
  uint32_t plain[4], trans[4];
  ldmatrix_x4(plain, s + lane * kRow);
  ldmatrix_x4_trans(trans, s + lane * kRow);
  for (int x = 0; x < 4; ++x) {
    a.out[lane * 8 + x] = float(plain[x] & 0xffffu) + 65536.f * float(plain[x] >> 16);
    a.out[lane * 8 + 4 + x] = float(trans[x] & 0xffffu) + 65536.f * float(trans[x] >> 16);
  }
}

// One mma.m16n8k16 (bf16 when which == 0, else f16): A [16, 16], B [16, 8], C [16, 8] from in (A, then B,
// then C, row-major floats representable in the type), fragments built as PTX 9.7.14.5.8 lays them out;
// D written to out [16, 8] row-major.
template <typename E>
__global__ void mma_kernel(const ProbeArgs a) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  const float* A = a.in;
  const float* B = a.in + 256;
  const float* C = a.in + 384;
  uint32_t fa[4];
  fa[0] = pack2<E>(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]);
  fa[1] = pack2<E>(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]);
  fa[2] = pack2<E>(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]);
  fa[3] = pack2<E>(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9]);
  const uint32_t b0 = pack2<E>(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]);
  const uint32_t b1 = pack2<E>(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g]);
  float d[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
  mma_16816<E>(d, fa, b0, b1);
  a.out[g * 8 + 2 * t] = d[0];
  a.out[g * 8 + 2 * t + 1] = d[1];
  a.out[(g + 8) * 8 + 2 * t] = d[2];
  a.out[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// ---- misuse: each must raise simt::Error ----

__global__ void divergent_exit_kernel(const ProbeArgs) {
  if (threadIdx.x >= 64) return;  // half the CTA leaves, the other half waits at the barrier
  __syncthreads();
}

__global__ void divergent_sites_kernel(const ProbeArgs a) {
  if (threadIdx.x < 64) {
    __syncthreads();
    a.out[threadIdx.x] = 1.f;
  } else {
    __syncthreads();
    a.out[threadIdx.x] = 2.f;
  }
}

__global__ void partial_shuffle_kernel(const ProbeArgs a) {
  const int lane = threadIdx.x % 32;
  float v = float(lane);
  if (lane < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);  // full mask, half the warp
  a.out[threadIdx.x] = v;
}

__global__ void mixed_collectives_kernel(const ProbeArgs a) {
  const int lane = threadIdx.x % 32;
  float v = float(lane);
  if (lane < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  else __syncwarp();
  a.out[threadIdx.x] = v;
}

__global__ void barrier_vs_shuffle_kernel(const ProbeArgs a) {
  float v = float(threadIdx.x);
  if (threadIdx.x >= 16 && threadIdx.x < 32) v = __shfl_xor_sync(0xffffffffu, v, 1);  // lanes 16-31 of warp 0 ...
  else __syncthreads();  // ... wait for lanes 0-15, which wait at the barrier for them: nobody can go on
  a.out[threadIdx.x] = v;
}

__global__ void misaligned_cp_async_kernel(const ProbeArgs a) {
  RSWA_DYNAMIC_SHARED(smem);
  cp_async_16(smem + 8 + 16 * threadIdx.x, a.in, true);
  cp_async_commit();
  cp_async_wait_all();
}

__global__ void ldmatrix_out_of_bounds_kernel(const ProbeArgs) {
  RSWA_DYNAMIC_SHARED(smem);
  uint32_t r[4];
  ldmatrix_x4(r, smem + 16 * threadIdx.x + 768);  // 1 KB of shared memory: rows 16..31 lie past it
}

__global__ void ldmatrix_before_wait_kernel(const ProbeArgs a) {
  RSWA_DYNAMIC_SHARED(smem);
  const int tid = threadIdx.x;
  cp_async_16(smem + 16 * tid, a.in + 4 * tid, true);
  cp_async_commit();
  __syncthreads();  // no cp.async.wait_group before it: the copies may not have landed
  uint32_t r[4];
  ldmatrix_x4(r, smem + 16 * (tid % 32));
}

__global__ void ldmatrix_without_barrier_kernel(const ProbeArgs a) {
  RSWA_DYNAMIC_SHARED(smem);
  const int tid = threadIdx.x;
  cp_async_16(smem + 16 * tid, a.in + 4 * tid, true);
  cp_async_commit();
  cp_async_wait_all();  // each thread's own copies landed, but warp 1 reads warp 0's rows with no barrier
  uint32_t r[4];
  ldmatrix_x4(r, smem + 16 * ((tid + 32) % 64));
}

__global__ void write_after_read_kernel(const ProbeArgs a) {
  RSWA_DYNAMIC_SHARED(smem);
  const int tid = threadIdx.x;
  cp_async_16(smem + 16 * tid, a.in + 4 * tid, true);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();
  uint32_t r[4];
  ldmatrix_x4(r, smem + 16 * (tid % 32));  // both warps read rows 0-31 ...
  if (tid >= 32) cp_async_16(smem + 16 * (tid - 32), a.in, true);  // ... warp 1 overwrites them, no barrier
  cp_async_commit();
  cp_async_wait_all();
}

__global__ void throwing_kernel(const ProbeArgs) {
  if (threadIdx.x == 37) throw std::runtime_error("kernel-side failure");
  __syncthreads();
}

}  // namespace

void warp_gemm(int dtype, int D, int cols, const void* q, const void* k, const void* v, const float* p, float* s,
               float* o) {
  const GemmArgs a{q, k, v, p, s, o};
  if (dtype == 1) gemm_dims<__nv_bfloat16>(D, cols, a);
  else if (dtype == 2) gemm_dims<__half>(D, cols, a);
  else gemm_dims<float>(D, cols, a);
}

// redux.sync min / max over a warp of values (lane * 7) % 32 - 9 (one warp), and bmsk.clamp on the
// (a, b) pairs of the input (16 pairs), each mask as its two 16-bit halves; then vote.sync all / any of
// the predicates value < 22 (all but one lane), value > -10 (every lane), value > 21 (one lane) and
// value > 21 && lane == 32 (no lane) as the bits of one word, after the masks (out[96 + lane]).
__global__ void bits_kernel(const ProbeArgs a) {
  const int lane = threadIdx.x;
  const int value = (lane * 7) % 32 - 9;
  a.out[lane] = float(__reduce_min_sync(0xffffffffu, value));
  a.out[32 + lane] = float(__reduce_max_sync(0xffffffffu, value));
  const bool preds[4] = {value < 22, value > -10, value > 21, value > 21 && lane == 32};
  int votes = 0;
  for (int x = 0; x < 4; ++x)
    votes |= (__all_sync(0xffffffffu, preds[x]) << x) | (__any_sync(0xffffffffu, preds[x]) << (4 + x));
  a.out[96 + lane] = float(votes);
  if (lane < 16) {
    const uint32_t mask = bit_range(uint32_t(a.in[2 * lane]), uint32_t(a.in[2 * lane + 1]));
    a.out[64 + 2 * lane] = float(mask & 0xffffu);
    a.out[64 + 2 * lane + 1] = float(mask >> 16);
  }
}

std::vector<float> probe(const std::string& name, const std::vector<float>& in) {
  std::vector<float> out(8192, 0.f), input(in);
  input.resize(std::max<size_t>(input.size(), 4096), 0.f);
  const ProbeArgs a{out.data(), input.data(), 0};
  if (name == "barrier") ::simt::launch(dim3(3), dim3(128), 128 * 4, barrier_kernel, a);
  else if (name == "shuffle") ::simt::launch(dim3(2), dim3(128), 0, shuffle_kernel, a);
  else if (name == "bits") ::simt::launch(dim3(1), dim3(32), 0, bits_kernel, a);
  else if (name == "ldmatrix") ::simt::launch(dim3(1), dim3(32), 32 * 48, ldmatrix_kernel, a);
  else if (name == "mma_bf16") ::simt::launch(dim3(1), dim3(32), 0, mma_kernel<__nv_bfloat16>, a);
  else if (name == "mma_f16") ::simt::launch(dim3(1), dim3(32), 0, mma_kernel<__half>, a);
  else if (name == "divergent_exit") ::simt::launch(dim3(1), dim3(128), 0, divergent_exit_kernel, a);
  else if (name == "divergent_sites") ::simt::launch(dim3(1), dim3(128), 0, divergent_sites_kernel, a);
  else if (name == "partial_shuffle") ::simt::launch(dim3(1), dim3(64), 0, partial_shuffle_kernel, a);
  else if (name == "mixed_collectives") ::simt::launch(dim3(1), dim3(32), 0, mixed_collectives_kernel, a);
  else if (name == "barrier_vs_shuffle") ::simt::launch(dim3(1), dim3(64), 0, barrier_vs_shuffle_kernel, a);
  else if (name == "misaligned_cp_async") ::simt::launch(dim3(1), dim3(32), 1024, misaligned_cp_async_kernel, a);
  else if (name == "ldmatrix_out_of_bounds") ::simt::launch(dim3(1), dim3(32), 1024, ldmatrix_out_of_bounds_kernel, a);
  else if (name == "ldmatrix_before_wait") ::simt::launch(dim3(1), dim3(64), 1024, ldmatrix_before_wait_kernel, a);
  else if (name == "ldmatrix_without_barrier") ::simt::launch(dim3(1), dim3(64), 1024, ldmatrix_without_barrier_kernel, a);
  else if (name == "write_after_read") ::simt::launch(dim3(1), dim3(64), 1024, write_after_read_kernel, a);
  else if (name == "throwing") ::simt::launch(dim3(2), dim3(64), 0, throwing_kernel, a);
  else throw ::simt::Error("no probe named " + name);
  return out;
}

}  // namespace rangeswa::cuda::simt_tests
