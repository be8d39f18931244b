// Rule 3's retrieval on the device (topk_blocks.h), with the arithmetic of the CPU kernel
// (csrc/cpu/topk_blocks.cpp) operation for operation, so both give the same blocks bit for bit:
//   1. block means in double: q over the rows of a query block that q holds and the query heads of
//      the KV group (heads outer, rows inner), k over the tokens of a key block, each divided once by
//      its count; a query block with none of its rows in q (SPEC section 7) retrieves nothing;
//   2. per (query block, KV head) every candidate's score as a sequential double dot product (the key
//      means stored dims-major, so the threads of a CTA, one candidate each, read consecutive blocks)
//      (separate multiply and add, no FMA, like the CPU's plain loop), and the top K kept in shared
//      memory: the candidates come in chunks of 256, each ranked against the chunk and merged into
//      the sorted list by rank (order: higher score, then lower block; no score table in global
//      memory beyond the per-head block means).
#include "topk_blocks.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "utils.h"

namespace rangeswa::cuda {
namespace {

constexpr int kMeanThreads = 128;
constexpr int kSelectThreads = 256;  // candidates per chunk
constexpr int kQueryGroup = 4;       // query blocks per CTA (each key mean read once for all of them)

// Sum of the keys of key block kb of (b, hkv), dim d, in order (the CPU's loop), divided once.
template <typename Element>
__device__ __forceinline__ double key_block_mean(const TopkParams& p, int64_t b, int64_t hkv, int64_t kb, int64_t d) {
  const Rules& R = p.rules;
  const Element* rows = static_cast<const Element*>(p.k) + p.k_strides.at(b, hkv, p.C);
  const int64_t s = kb * R.Rb, e = min64(R.L, s + R.Rb);
  double acc = 0.0;
  for (int64_t j = s; j < e; ++j) acc += double(to_float(rows[j * p.k_strides.row + d]));
  return acc / double(e - s);
}

template <typename Element>
__global__ void key_means_kernel(const TopkParams p, int64_t first_block, double* out) {
  const int64_t nKb = p.rules.num_key_blocks(), kb = first_block + blockIdx.x;
  for (int64_t bkv = blockIdx.y; bkv < p.B * p.Hkv; bkv += gridDim.y)  // utils.h grid_rows
    for (int64_t d = threadIdx.x; d < p.D; d += blockDim.x)
      out[(bkv * (nKb - first_block) + kb - first_block) * p.D + d] =
          key_block_mean<Element>(p, bkv / p.Hkv, bkv % p.Hkv, kb, d);
}

// Block x of the launch (query blocks, then key blocks) of KV head bkv.
template <typename Element>
__device__ void block_means_of_head(const TopkParams& p, int64_t bkv, int64_t x) {
  const Rules& R = p.rules;
  const int64_t nQb = R.num_query_blocks(), nKb = R.num_key_blocks(), D = p.D;
  const int64_t b = bkv / p.Hkv, hkv = bkv % p.Hkv, group = p.Hq / p.Hkv;
  const Element* q = static_cast<const Element*>(p.q);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    double acc = 0.0;
    if (x < nQb) {
      const int64_t r0 = max64(x * R.Qb, p.first), r1 = min64(R.L, x * R.Qb + R.Qb);
      for (int64_t h = hkv * group; h < (hkv + 1) * group; ++h)
        for (int64_t i = r0; i < r1; ++i) acc += double(to_float(q[p.q_strides.at(b, h, p.C + i - p.first) + d]));
      p.q_means[(bkv * nQb + x) * D + d] = r1 > r0 ? acc / double((r1 - r0) * group) : 0.0;
    } else {  // [D][nKb]: the select kernel reads rows of blocks
      p.k_means[(bkv * D + d) * nKb + x - nQb] = key_block_mean<Element>(p, b, hkv, x - nQb, d);
    }
  }
}

template <typename Element>
__global__ void block_means_kernel(const TopkParams p) {
  for (int64_t bkv = blockIdx.y; bkv < p.B * p.Hkv; bkv += gridDim.y) block_means_of_head<Element>(p, bkv, blockIdx.x);
}

// a ranks before b: higher score, then lower block.
__device__ __forceinline__ bool better(double sa, int ka, double sb, int kb) {
  return sa > sb || (sa == sb && ka < kb);
}

__host__ __device__ inline int64_t kept(const Rules& R) { return min64(R.topk, R.num_key_blocks()); }

// The top K of the CTA's query blocks (group `group` of kQueryGroup) of KV head bkv.
__device__ void select_of_head(const TopkParams& p, int64_t bkv, int64_t group) {
  const Rules& R = p.rules;
  const int64_t nQb = R.num_query_blocks(), nKb = R.num_key_blocks(), D = p.D, K = R.topk;
  const int Kc = int(kept(R));
  const int64_t qb0 = group * kQueryGroup;
  const int tid = threadIdx.x;

  // Shared: the chunk's scores and blocks (-1 = not a contender), then two sorted lists per query block.
  RSWA_DYNAMIC_SHARED(smem);
  double* cs = reinterpret_cast<double*>(smem);
  double* ls = cs + kSelectThreads;                            // [2][kQueryGroup][Kc]
  int* ck = reinterpret_cast<int*>(ls + 2 * kQueryGroup * Kc);  // [kSelectThreads]
  int* lk = ck + kSelectThreads;                                // [2][kQueryGroup][Kc]
  auto list_s = [&](int buf, int qq) { return ls + (buf * kQueryGroup + qq) * Kc; };
  auto list_k = [&](int buf, int qq) { return lk + (buf * kQueryGroup + qq) * Kc; };

  int count[kQueryGroup], buf[kQueryGroup];
#pragma unroll
  for (int qq = 0; qq < kQueryGroup; ++qq) count[qq] = buf[qq] = 0;
  const double* qm = p.q_means + bkv * nQb * D;
  const double* km = p.k_means + bkv * nKb * D;

  for (int64_t base = 0; base < nKb; base += kSelectThreads) {
    const int64_t kb = base + tid;
#pragma unroll
    for (int qq = 0; qq < kQueryGroup; ++qq) {
      const int64_t qb = qb0 + qq;
      if (qb < nQb) {  // uniform
        const bool held = min64(R.L, (qb + 1) * R.Qb) > p.first;  // q holds a row of qb
        bool contender = held && kb < nKb && R.is_candidate(qb, kb);
        double s = 0.0;
        if (contender)
          for (int64_t c = 0; c < D; ++c) s = __dadd_rn(s, __dmul_rn(qm[qb * D + c], km[c * nKb + kb]));
        const double* cur_s = list_s(buf[qq], qq);
        const int* cur_k = list_k(buf[qq], qq);
        // With a full list only what beats its last entry can enter.
        if (contender && count[qq] == Kc) contender = better(s, int(kb), cur_s[Kc - 1], cur_k[Kc - 1]);
        cs[tid] = s;
        ck[tid] = contender ? int(kb) : -1;
        const int n_new = __syncthreads_count(contender);
        if (n_new > 0) {
          double* new_s = list_s(buf[qq] ^ 1, qq);
          int* new_k = list_k(buf[qq] ^ 1, qq);
          // Merged position = own rank among the chunk + entries of the list ahead of it, and vice versa.
          if (contender) {
            int rank = 0;
            for (int u = 0; u < kSelectThreads; ++u) rank += ck[u] >= 0 && better(cs[u], ck[u], s, int(kb));
            if (rank < Kc) {
              int pos = rank;
              for (int e = 0; e < count[qq]; ++e) pos += better(cur_s[e], cur_k[e], s, int(kb));
              if (pos < Kc) {
                new_s[pos] = s;
                new_k[pos] = int(kb);
              }
            }
          }
          for (int e = tid; e < count[qq]; e += kSelectThreads) {
            int pos = e;
            for (int u = 0; u < kSelectThreads; ++u) pos += ck[u] >= 0 && better(cs[u], ck[u], cur_s[e], cur_k[e]);
            if (pos < Kc) {
              new_s[pos] = cur_s[e];
              new_k[pos] = cur_k[e];
            }
          }
          __syncthreads();
          buf[qq] ^= 1;
          count[qq] = int(min64(Kc, count[qq] + n_new));
        }
      }
    }
  }
#pragma unroll
  for (int qq = 0; qq < kQueryGroup; ++qq) {
    const int64_t qb = qb0 + qq;
    if (qb >= nQb) continue;
    const int* best = list_k(buf[qq], qq);
    for (int64_t x = tid; x < K; x += kSelectThreads)
      p.out[(bkv * nQb + qb) * K + x] = x < count[qq] ? best[x] : -1;
  }
}

__global__ void __launch_bounds__(kSelectThreads) topk_select_kernel(const TopkParams p) {
  for (int64_t bkv = blockIdx.y; bkv < p.B * p.Hkv; bkv += gridDim.y) {  // uniform across the CTA
    select_of_head(p, bkv, blockIdx.x);
    __syncthreads();  // the lists are read out before the next head writes them
  }
}

// Packed calls (topk_blocks.h PackedTopk): CTA (x, y) is CTA (x - first[s], y) of sequence s's own launch
// (s = layout.h packed_sequence).

template <typename Element>
__global__ void key_means_packed_kernel(const __grid_constant__ PackedKeyMeans pk) {
  const PackedTopk at{nullptr, pk.first, pk.S};
  const int32_t s = packed_sequence(at, int64_t(blockIdx.x));
  const KeyMeansJob& job = pk.seq[s];
  const TopkParams& p = job.p;
  const int64_t kb = int64_t(blockIdx.x) - pk.first[s];
  for (int64_t bkv = blockIdx.y; bkv < p.B * p.Hkv; bkv += gridDim.y)  // utils.h grid_rows
    for (int64_t d = threadIdx.x; d < p.D; d += blockDim.x)
      job.out[(bkv * job.head_rows + kb) * p.D + d] = key_block_mean<Element>(p, bkv / p.Hkv, bkv % p.Hkv, kb, d);
}

template <typename Element>
__global__ void block_means_packed_kernel(const __grid_constant__ PackedTopk pk) {
  const int32_t s = packed_sequence(pk, int64_t(blockIdx.x));
  const TopkParams& p = pk.seq[s];
  const int64_t x = int64_t(blockIdx.x) - pk.first[s];
  for (int64_t bkv = blockIdx.y; bkv < p.B * p.Hkv; bkv += gridDim.y) block_means_of_head<Element>(p, bkv, x);
}

__global__ void __launch_bounds__(kSelectThreads) topk_select_packed_kernel(const __grid_constant__ PackedTopk pk) {
  const int32_t s = packed_sequence(pk, int64_t(blockIdx.x));
  const TopkParams& p = pk.seq[s];
  const int64_t x = int64_t(blockIdx.x) - pk.first[s];
  for (int64_t bkv = blockIdx.y; bkv < p.B * p.Hkv; bkv += gridDim.y) {  // uniform across the CTA
    select_of_head(p, bkv, x);
    __syncthreads();
  }
}

}  // namespace

size_t topk_blocks_smem_bytes(const TopkParams& p) {
  return size_t(kSelectThreads) * (sizeof(double) + sizeof(int)) +
         size_t(2 * kQueryGroup) * size_t(kept(p.rules)) * (sizeof(double) + sizeof(int));
}

template <typename Element>
cudaError_t launch_topk_blocks(const TopkParams& p, cudaStream_t stream) {
  const Rules& R = p.rules;
  const int64_t nQb = R.num_query_blocks(), nKb = R.num_key_blocks(), BH = p.B * p.Hkv;
  if (R.topk == 0 || R.L == 0 || BH == 0) return cudaSuccess;
  if (nQb + nKb > int64_t(0x7fffffff)) return cudaErrorInvalidConfiguration;
  const int64_t means = nQb + (p.k_means_given ? 0 : nKb);  // given key means: only the query means
  cudaError_t err =
      RSWA_LAUNCH(block_means_kernel<Element>, dim3(unsigned(means), grid_rows(BH)), kMeanThreads, 0, stream, p);
  if (err != cudaSuccess) return err;
  const size_t smem = topk_blocks_smem_bytes(p);
  if (smem > 48 * 1024) {
    err = RSWA_OPT_IN_SMEM(topk_select_kernel, smem);
    if (err != cudaSuccess) return err;
  }
  const unsigned groups = unsigned((nQb + kQueryGroup - 1) / kQueryGroup);
  return RSWA_LAUNCH(topk_select_kernel, dim3(groups, grid_rows(BH)), kSelectThreads, smem, stream, p);
}

int64_t topk_mean_ctas(const TopkParams& p) {
  const Rules& R = p.rules;
  if (R.topk == 0 || R.L == 0 || p.B * p.Hkv == 0) return 0;
  return R.num_query_blocks() + (p.k_means_given ? 0 : R.num_key_blocks());
}
int64_t topk_select_ctas(const TopkParams& p) {
  const Rules& R = p.rules;
  if (R.topk == 0 || R.L == 0 || p.B * p.Hkv == 0) return 0;
  return (R.num_query_blocks() + kQueryGroup - 1) / kQueryGroup;
}

template <typename Element>
cudaError_t launch_topk_blocks_packed(const PackedTopk& means, int64_t mean_ctas, const PackedTopk& select,
                                      int64_t select_ctas, int64_t BH, size_t smem, cudaStream_t stream) {
  if (BH == 0) return cudaSuccess;
  if (mean_ctas > int64_t(0x7fffffff) || select_ctas > int64_t(0x7fffffff)) return cudaErrorInvalidConfiguration;
  if (mean_ctas > 0) {
    const cudaError_t err = RSWA_LAUNCH(block_means_packed_kernel<Element>, dim3(unsigned(mean_ctas), grid_rows(BH)),
                                        kMeanThreads, 0, stream, means);
    if (err != cudaSuccess) return err;
  }
  if (select_ctas == 0) return cudaSuccess;
  if (smem > 48 * 1024) {
    const cudaError_t err = RSWA_OPT_IN_SMEM(topk_select_packed_kernel, smem);
    if (err != cudaSuccess) return err;
  }
  return RSWA_LAUNCH(topk_select_packed_kernel, dim3(unsigned(select_ctas), grid_rows(BH)), kSelectThreads, smem,
                     stream, select);
}

template cudaError_t launch_topk_blocks_packed<float>(const PackedTopk&, int64_t, const PackedTopk&, int64_t, int64_t,
                                                      size_t, cudaStream_t);
template cudaError_t launch_topk_blocks_packed<__nv_bfloat16>(const PackedTopk&, int64_t, const PackedTopk&, int64_t,
                                                              int64_t, size_t, cudaStream_t);
template cudaError_t launch_topk_blocks_packed<__half>(const PackedTopk&, int64_t, const PackedTopk&, int64_t, int64_t,
                                                       size_t, cudaStream_t);

template <typename Element>
cudaError_t launch_key_means(const TopkParams& p, int64_t first_block, double* out, cudaStream_t stream) {
  const int64_t blocks = p.rules.num_key_blocks() - first_block, BH = p.B * p.Hkv;
  if (blocks <= 0 || BH == 0) return cudaSuccess;
  if (blocks > int64_t(0x7fffffff)) return cudaErrorInvalidConfiguration;
  return RSWA_LAUNCH(key_means_kernel<Element>, dim3(unsigned(blocks), grid_rows(BH)), kMeanThreads, 0, stream, p,
                     first_block, out);
}

template <typename Element>
cudaError_t launch_key_means_packed(const PackedKeyMeans& pk, int64_t ctas, int64_t BH, cudaStream_t stream) {
  if (ctas <= 0 || BH == 0) return cudaSuccess;
  if (ctas > int64_t(0x7fffffff)) return cudaErrorInvalidConfiguration;
  return RSWA_LAUNCH(key_means_packed_kernel<Element>, dim3(unsigned(ctas), grid_rows(BH)), kMeanThreads, 0, stream,
                     pk);
}

template cudaError_t launch_key_means_packed<float>(const PackedKeyMeans&, int64_t, int64_t, cudaStream_t);
template cudaError_t launch_key_means_packed<__nv_bfloat16>(const PackedKeyMeans&, int64_t, int64_t, cudaStream_t);
template cudaError_t launch_key_means_packed<__half>(const PackedKeyMeans&, int64_t, int64_t, cudaStream_t);
template cudaError_t launch_key_means<float>(const TopkParams&, int64_t, double*, cudaStream_t);
template cudaError_t launch_key_means<__nv_bfloat16>(const TopkParams&, int64_t, double*, cudaStream_t);
template cudaError_t launch_key_means<__half>(const TopkParams&, int64_t, double*, cudaStream_t);

template cudaError_t launch_topk_blocks<float>(const TopkParams&, cudaStream_t);
template cudaError_t launch_topk_blocks<__nv_bfloat16>(const TopkParams&, cudaStream_t);
template cudaError_t launch_topk_blocks<__half>(const TopkParams&, cudaStream_t);

}  // namespace rangeswa::cuda
