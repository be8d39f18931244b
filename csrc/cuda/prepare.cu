// Rope tables and the prepared keys / values / summaries of the fused attention (prepare.h).
#include "prepare.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "rotary.h"
#include "utils.h"

namespace rangeswa::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kRowsPerChunk = 32;  // tokens per CTA when no block means are needed

__global__ void rope_table_kernel(float* cos_out, float* sin_out, int64_t count, int half, double theta,
                                  double first, double step, const double* positions) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= count * half) return;
  const int64_t s = idx / half;
  const int k = int(idx % half);
  const double pos = positions != nullptr ? positions[s] : first + double(s) * step;
  rope_cos_sin(pos, k, 2 * half, theta, cos_out + idx, sin_out + idx);
}

// Tokens per CTA of the body rows: whole G-blocks when their means are written.
__host__ __device__ inline int64_t chunk_tokens(const PrepareParams& p) {
  return p.summaries ? p.G * (p.G >= kRowsPerChunk ? 1 : kRowsPerChunk / p.G) : kRowsPerChunk;
}

// One unit = one rotated pair (dims ia, ib) or one pass-through / padding dim (ia = ib).
struct Unit {
  int ia, ib, k;  // k: the pair's frequency, -1 for a single dim
};

__device__ inline Unit unit_of(const PrepareParams& p, int u) {
  const int half = p.rotary_half;
  if (u < half) return p.interleaved ? Unit{2 * u, 2 * u + 1, u} : Unit{u, u + half, u};
  const int d = 2 * half + (u - half);
  return Unit{d, d, -1};
}

template <typename Element>
__global__ void __launch_bounds__(kThreads) prepare_kernel(const PrepareParams p) {
  const int64_t bh = blockIdx.y;
  const int64_t Dp = p.Dp, D = p.D;
  const Element* k = static_cast<const Element*>(p.k) + bh * p.N * D;
  const Element* v = static_cast<const Element*>(p.v) + bh * p.N * D;
  Element* kn = static_cast<Element*>(p.keys_nat) + bh * p.nat_rows * Dp;
  Element* vo = static_cast<Element*>(p.values) + bh * p.nat_rows * Dp;
  Element* kg = p.keys_grp ? static_cast<Element*>(p.keys_grp) + bh * p.grp_rows * Dp : nullptr;
  Element* kc = p.keys_cond ? static_cast<Element*>(p.keys_cond) + bh * p.L * Dp : nullptr;
  const int half = p.rotary_half;
  const int units = int(half + (Dp - 2 * half));
  auto load = [&](const Element* row, int d) { return d < D ? to_float(row[d]) : 0.f; };
  auto store = [&](Element* row, int d, float x) { row[d] = from_float<Element>(x); };

  const int64_t body_chunks = (p.L + chunk_tokens(p) - 1) / chunk_tokens(p);
  if (int64_t(blockIdx.x) >= body_chunks) {  // control rows, copied unrotated
    const int64_t c0 = (blockIdx.x - body_chunks) * kRowsPerChunk;
    for (int64_t c = c0; c < p.C && c < c0 + kRowsPerChunk; ++c)
      for (int d = threadIdx.x; d < Dp; d += blockDim.x) {
        store(kn + c * Dp, d, load(k + c * D, d));
        store(vo + c * Dp, d, load(v + c * D, d));
      }
    return;
  }

  const int64_t j0 = blockIdx.x * chunk_tokens(p), j1 = j0 + chunk_tokens(p) < p.L ? j0 + chunk_tokens(p) : p.L;
  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    const Unit un = unit_of(p, u);
    // Block sums of the rotated keys (native, grouped) and of the values, dims a and b, in double.
    double sum[3][2] = {{0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}};
    for (int64_t j = j0; j < j1; ++j) {
      const Element* krow = k + (p.C + j) * D;
      const Element* vrow = v + (p.C + j) * D;
      const float ka = load(krow, un.ia), kb = load(krow, un.ib);
      const float va = load(vrow, un.ia), vb = load(vrow, un.ib);
      // R x at table row s: (a cos - b sin, a sin + b cos), or x itself for a single dim.
      auto rotate = [&](const float* cos_t, const float* sin_t, int64_t s, float* ra, float* rb) {
        if (un.k < 0) {
          *ra = *rb = ka;
          return;
        }
        const float c = cos_t[s * half + un.k], sn = sin_t[s * half + un.k];
        *ra = ka * c - kb * sn;
        *rb = ka * sn + kb * c;
      };
      float ra, rb;
      rotate(p.cos_nat, p.sin_nat, j, &ra, &rb);
      store(kn + (p.C + j) * Dp, un.ia, ra);
      store(kn + (p.C + j) * Dp, un.ib, rb);
      sum[0][0] += ra;
      sum[0][1] += rb;
      if (kg != nullptr) {
        rotate(p.cos_grp, p.sin_grp, j / p.g + p.group_offset, &ra, &rb);
        store(kg + j * Dp, un.ia, ra);
        store(kg + j * Dp, un.ib, rb);
        sum[1][0] += ra;
        sum[1][1] += rb;
      }
      if (kc != nullptr) {
        rotate(p.cos_cond, p.sin_cond, j, &ra, &rb);
        store(kc + j * Dp, un.ia, ra);
        store(kc + j * Dp, un.ib, rb);
      }
      store(vo + (p.C + j) * Dp, un.ia, va);
      store(vo + (p.C + j) * Dp, un.ib, vb);
      sum[2][0] += va;
      sum[2][1] += vb;
      // Rule 4: the mean of a G-block once its last token is in (chunks hold whole blocks).
      if (p.summaries && ((j + 1) % p.G == 0 || j + 1 == p.L)) {
        const int64_t blk = j / p.G, n = j + 1 - blk * p.G;
        const int64_t srow = p.L + blk;  // summary rows follow the body rows
        store(kn + (p.C + srow) * Dp, un.ia, float(sum[0][0] / double(n)));
        store(kn + (p.C + srow) * Dp, un.ib, float(sum[0][1] / double(n)));
        if (kg != nullptr) {
          store(kg + srow * Dp, un.ia, float(sum[1][0] / double(n)));
          store(kg + srow * Dp, un.ib, float(sum[1][1] / double(n)));
        }
        store(vo + (p.C + srow) * Dp, un.ia, float(sum[2][0] / double(n)));
        store(vo + (p.C + srow) * Dp, un.ib, float(sum[2][1] / double(n)));
        for (auto& s : sum) s[0] = s[1] = 0.0;
      }
    }
  }
}

}  // namespace

cudaError_t launch_rope_table(float* cos_out, float* sin_out, int64_t count, int rotary_half, double theta,
                              double first, double step, const double* positions, cudaStream_t stream) {
  const int64_t n = count * rotary_half;
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  rope_table_kernel<<<unsigned((n + threads - 1) / threads), threads, 0, stream>>>(cos_out, sin_out, count, rotary_half,
                                                                                   theta, first, step, positions);
  return cudaGetLastError();
}

template <typename Element>
cudaError_t launch_prepare(const PrepareParams& p, cudaStream_t stream) {
  const int64_t body_chunks = (p.L + chunk_tokens(p) - 1) / chunk_tokens(p);
  const int64_t control_chunks = (p.C + kRowsPerChunk - 1) / kRowsPerChunk;
  const int64_t chunks = body_chunks + control_chunks;
  if (chunks == 0 || p.BH == 0) return cudaSuccess;
  if (chunks > int64_t(0x7fffffff) || p.BH > 65535) return cudaErrorInvalidConfiguration;
  prepare_kernel<Element><<<dim3(unsigned(chunks), unsigned(p.BH)), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template cudaError_t launch_prepare<float>(const PrepareParams&, cudaStream_t);
template cudaError_t launch_prepare<__nv_bfloat16>(const PrepareParams&, cudaStream_t);
template cudaError_t launch_prepare<__half>(const PrepareParams&, cudaStream_t);

}  // namespace rangeswa::cuda
