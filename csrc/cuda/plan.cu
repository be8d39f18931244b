// The small kernels around the fused attention: the plan (sort each query block's retrieved blocks, then
// one thread per (KV head, body tile) writes its records, plan.h, and its tile spans, tile.h) and the control rows' combine
// (combine.h). Launchers are torch-free (launch.h).
#include "launch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "combine.h"
#include "retrieved_blocks.h"
#include "utils.h"

namespace rangeswa::cuda {
namespace {

constexpr int kThreads = 128;

// A user's invalid block stops the kernel with a device-side assertion, as torch's indexing does (the
// host would have to wait for the device to see the values and raise).
// Row `row` (a (KV head, query block)) of one call's blocks: `given_k` given, `k` sorted (retrieved_blocks.h
// sort_retrieved).
__device__ __forceinline__ void sort_row(const Rules& rules, const int32_t* given, int32_t given_k, int32_t* sorted,
                                         int64_t row, int32_t k) {
  const int64_t qb = row % rules.num_query_blocks();
  int32_t bad = -1;
  if (!sort_retrieved(given + row * given_k, given_k, sorted + row * k, k, rules, qb, &bad))
    RSWA_DEVICE_FAIL(RSWA_BAD_RETRIEVED, int(bad), (long long)qb, (long long)rules.num_key_blocks());
}

__global__ void sort_kernel(const Rules rules, const int32_t* given, int32_t given_k, int32_t* sorted, int64_t rows,
                            int32_t k) {
  const int64_t row = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (row >= rows) return;
  sort_row(rules, given, given_k, sorted, row, k);
}

__global__ void plan_kernel(const __grid_constant__ AttnKernelParams p, int64_t plans, Record* records,
                            int32_t* counts) {
  const int64_t x = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (x >= plans) return;
  plan_tile(p, int32_t(x / p.body_tiles), int32_t(x % p.body_tiles), records, counts);
}

// Packed calls (launch.h): thread x is thread x - first[s] of sequence s's own launch, on its parameters.
__global__ void sort_packed_kernel(const __grid_constant__ PackedLaunch pk, const SortJob* jobs, int64_t rows) {
  const int64_t x = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (x >= rows) return;
  const int32_t s = packed_sequence(pk, x);
  const AttnKernelParams& p = pk.seq[s];
  sort_row(jobs[s].rules, jobs[s].given, jobs[s].given_k, const_cast<int32_t*>(p.retrieved), x - pk.first[s],
           p.retrieved_k);
}

__global__ void plan_packed_kernel(const __grid_constant__ PackedLaunch pk, int64_t plans) {
  const int64_t x = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (x >= plans) return;
  const int32_t s = packed_sequence(pk, x);
  const AttnKernelParams& p = pk.seq[s];
  const int64_t y = x - pk.first[s];
  plan_tile(p, int32_t(y / p.body_tiles), int32_t(y % p.body_tiles), const_cast<Record*>(p.records),
            const_cast<int32_t*>(p.record_count));
}

// Item x of one call's combine (x < B Hq C (D + 1)).
template <typename Element>
__device__ __forceinline__ void combine_item(const AttnKernelParams& p, int64_t x) {
  const int32_t per_head = p.geo.C * (p.D + 1);
  const int64_t head = x / per_head;
  const int32_t c = int32_t(x % per_head) / (p.D + 1), d = int32_t(x % per_head) % (p.D + 1);
  const float value = combine_control(p, head, c, d);
  if (d < p.D)
    static_cast<Element*>(p.out)[(head * p.Nq + c) * p.D + d] = from_float<Element>(value);
  else
    p.lse[head * p.Nq + c] = value;
}

template <typename Element>
__global__ void combine_kernel(const __grid_constant__ AttnKernelParams p, int64_t items) {
  const int64_t x = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (x >= items) return;
  combine_item<Element>(p, x);
}

template <typename Element>
__global__ void combine_packed_kernel(const __grid_constant__ PackedLaunch pk, int64_t items) {
  const int64_t x = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (x >= items) return;
  const int32_t s = packed_sequence(pk, x);
  combine_item<Element>(pk.seq[s], x - pk.first[s]);
}

unsigned ctas(int64_t items) { return unsigned((items + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t launch_plan(const AttnKernelParams& p, const Rules& rules, const int32_t* given, int32_t given_k,
                        int32_t* sorted, Record* records, int32_t* counts, int64_t plans, cudaStream_t stream) {
  if (p.retrieved_k > 0) {
    const int64_t rows = int64_t(p.B) * p.Hkv * p.nQb;
    if (rows > 0) {
      const cudaError_t err =
          RSWA_LAUNCH(sort_kernel, ctas(rows), kThreads, 0, stream, rules, given, given_k, sorted, rows, p.retrieved_k);
      if (err != cudaSuccess) return err;
    }
  }
  if (plans == 0) return cudaSuccess;
  return RSWA_LAUNCH(plan_kernel, ctas(plans), kThreads, 0, stream, p, plans, records, counts);
}

template <typename Element>
cudaError_t launch_combine(const AttnKernelParams& p, cudaStream_t stream) {
  const int64_t items = int64_t(p.B) * p.Hq * p.geo.C * (p.D + 1);
  if (items == 0) return cudaSuccess;
  return RSWA_LAUNCH(combine_kernel<Element>, ctas(items), kThreads, 0, stream, p, items);
}

cudaError_t launch_sort_packed(const PackedLaunch& pk, const SortJob* jobs, int64_t rows, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return RSWA_LAUNCH(sort_packed_kernel, ctas(rows), kThreads, 0, stream, pk, jobs, rows);
}

cudaError_t launch_plan_packed(const PackedLaunch& pk, int64_t plans, cudaStream_t stream) {
  if (plans == 0) return cudaSuccess;
  return RSWA_LAUNCH(plan_packed_kernel, ctas(plans), kThreads, 0, stream, pk, plans);
}

template <typename Element>
cudaError_t launch_combine_packed(const PackedLaunch& pk, int64_t items, cudaStream_t stream) {
  if (items == 0) return cudaSuccess;
  return RSWA_LAUNCH(combine_packed_kernel<Element>, ctas(items), kThreads, 0, stream, pk, items);
}

template cudaError_t launch_combine_packed<float>(const PackedLaunch&, int64_t, cudaStream_t);
template cudaError_t launch_combine_packed<__nv_bfloat16>(const PackedLaunch&, int64_t, cudaStream_t);
template cudaError_t launch_combine_packed<__half>(const PackedLaunch&, int64_t, cudaStream_t);
template cudaError_t launch_combine<float>(const AttnKernelParams&, cudaStream_t);
template cudaError_t launch_combine<__nv_bfloat16>(const AttnKernelParams&, cudaStream_t);
template cudaError_t launch_combine<__half>(const AttnKernelParams&, cudaStream_t);

}  // namespace rangeswa::cuda
