// The CUDA kernels of the four ops (SPEC section 5), registered for the schemas of csrc/rangeswa.cpp:
// each entry point checks its inputs exactly as the CPU kernel does (checks.h), allocates, and
// launches the torch-free kernels of this folder. The only file here that includes the torch headers,
// so the build compiles them once per architecture.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "checks.h"
#include "cuda/attn_setup.h"
#include "cuda/kernel_traits.h"
#include "cuda/prepare.h"
#include "cuda/rope.h"
#include "cuda/static_switch.h"
#include "cuda/topk_blocks.h"

namespace rangeswa::cuda {
namespace {

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, " failed on the GPU: ", cudaGetErrorString(err));
}

DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return DType::kBFloat16;
    case at::kHalf: return DType::kHalf;
    default: return DType::kFloat;  // check_bhnd admits only float32 besides these
  }
}

int max_shared_memory(const at::Tensor& t) {
  int value = 0;
  check_launch(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, t.device().index()),
               "reading the shared-memory limit");
  return value;
}

// The positions argument of rope / block_summary: 1-D, n entries, floating, on `device`.
at::Tensor positions_as_double(const at::Tensor& positions, int64_t n, const char* what, const char* of,
                               const at::Device& device) {
  TORCH_CHECK_VALUE(positions.device() == device, "positions must be on the device of ", of, " (", device, "), got ",
                    positions.device());
  TORCH_CHECK_VALUE(positions.dim() == 1 && positions.size(0) == n, "positions must be a 1-D tensor of ", n,
                    " entries (one per ", what, "), got shape ", positions.sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(positions.scalar_type()), "positions must be a floating tensor, got ",
                    positions.scalar_type());
  return positions.to(at::kDouble).contiguous();
}

// cos/sin [count, rotary_dim / 2] of positions first + s * step (or `positions`), float32.
std::pair<at::Tensor, at::Tensor> rope_table(const RopeParams& rope, int64_t count, double first, double step,
                                             const double* positions, const at::TensorOptions& like,
                                             cudaStream_t stream) {
  const int64_t half = rope.rotary_dim / 2;
  at::Tensor c = at::empty({count, half}, like.dtype(at::kFloat)), s = at::empty_like(c);
  check_launch(launch_rope_table(c.data_ptr<float>(), s.data_ptr<float>(), count, int(half), rope.theta, first, step,
                                 positions, stream),
               "rope table");
  return {c, s};
}

template <typename T>
const T* ptr_or_null(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 ? static_cast<const T*>(t.data_ptr()) : nullptr;
}

// ---------------------------------------------------------------------------------------------- rope

at::Tensor rope_cuda(const at::Tensor& x, const at::Tensor& positions, double theta,
                     std::optional<int64_t> rotary_dim, c10::string_view rope_style) {
  check_bhnd(x, "x");
  RopeParams rope = check_rope(x.size(3), theta, rotary_dim, rope_style);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor pos = positions_as_double(positions, x.size(2), "token of x", "x", x.device());
  at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t rows = xc.numel() / std::max<int64_t>(1, xc.size(3));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  DTYPE_SWITCH(dtype_of(xc), T, [&] {
    check_launch(launch_rope<T>(static_cast<const T*>(xc.data_ptr()), pos.data_ptr<double>(),
                                static_cast<T*>(out.data_ptr()), rows, xc.size(2), xc.size(3), int(rope.rotary_dim),
                                rope.theta, rope.interleaved, stream),
                 "rope");
  });
  return out;
}

// ------------------------------------------------------------------------------------- block_summary

std::tuple<at::Tensor, at::Tensor> block_summary_cuda(const at::Tensor& k, const at::Tensor& v,
                                                      const std::optional<at::Tensor>& positions,
                                                      int64_t summary_block, double theta,
                                                      std::optional<int64_t> rotary_dim, c10::string_view rope_style) {
  RopeParams rope = check_block_summary(k, v, summary_block, theta, rotary_dim, rope_style);
  const c10::cuda::CUDAGuard guard(k.device());
  const int64_t BH = k.size(0) * k.size(1), L = k.size(2), D = k.size(3);
  const int64_t nG = (L + summary_block - 1) / summary_block;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor kc = k.contiguous(), vc = v.contiguous();
  at::Tensor ks = at::empty({k.size(0), k.size(1), nG, D}, kc.options()), vs = at::empty_like(ks);
  std::pair<at::Tensor, at::Tensor> table;
  if (positions.has_value()) {
    at::Tensor pos = positions_as_double(*positions, L, "body key", "k", k.device());
    if (rope.rotary_dim > 0) table = rope_table(rope, L, 0.0, 0.0, pos.data_ptr<double>(), kc.options(), stream);
  }
  DTYPE_SWITCH(dtype_of(kc), T, [&] {
    check_launch(launch_block_summary<T>(static_cast<const T*>(kc.data_ptr()), static_cast<const T*>(vc.data_ptr()),
                                         ptr_or_null<float>(table.first), ptr_or_null<float>(table.second),
                                         static_cast<T*>(ks.data_ptr()), static_cast<T*>(vs.data_ptr()), BH, L, D,
                                         summary_block, int(rope.rotary_dim / 2), rope.interleaved, stream),
                 "block_summary");
  });
  return {ks, vs};
}

// --------------------------------------------------------------------------------------- topk_blocks

// Rule 3 on device q, k with contiguous rows: int32 [B, H_kv, nQb, K], best first, -1 padded.
at::Tensor topk_blocks_device(const at::Tensor& q, const at::Tensor& k, int64_t control_tokens, const Rules& rules) {
  const int64_t B = q.size(0), Hkv = k.size(1), D = q.size(3);
  const int64_t nQb = rules.num_query_blocks(), nKb = rules.num_key_blocks();
  at::Tensor out = at::full({B, Hkv, nQb, rules.topk}, -1, q.options().dtype(at::kInt));
  if (rules.topk == 0 || rules.L == 0 || out.numel() == 0) return out;
  TopkParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.q_strides = row_strides(q);
  p.k_strides = row_strides(k);
  p.out = out.data_ptr<int32_t>();
  at::Tensor q_means = at::empty({B * Hkv, nQb, D}, q.options().dtype(at::kDouble));
  at::Tensor k_means = at::empty({B * Hkv, nKb, D}, q.options().dtype(at::kDouble));
  p.q_means = q_means.data_ptr<double>();
  p.k_means = k_means.data_ptr<double>();
  p.B = B;
  p.Hq = q.size(1);
  p.Hkv = Hkv;
  p.N = k.size(2);
  p.C = control_tokens;
  p.first = rules.L - (q.size(2) - control_tokens);
  p.D = D;
  p.rules = rules;
  const size_t smem = topk_blocks_smem_bytes(p);
  TORCH_CHECK_VALUE(smem <= size_t(max_shared_memory(q)), "topk_blocks on CUDA keeps min(topk, key blocks) = ",
                    std::min(rules.topk, nKb), " blocks per query block in shared memory, which needs ", smem,
                    " bytes, more than this GPU's ", max_shared_memory(q), "; use a smaller topk");
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  DTYPE_SWITCH(dtype_of(q), T, [&] { check_launch(launch_topk_blocks<T>(p, stream), "topk_blocks"); });
  return out;
}

at::Tensor topk_blocks_cuda(const at::Tensor& q, const at::Tensor& k, int64_t control_tokens, int64_t window,
                            int64_t summary_block, int64_t retrieval_block, int64_t query_block, int64_t topk,
                            int64_t causal_block) {
  Rules rules = check_topk(q, k, control_tokens, window, summary_block, retrieval_block, query_block, topk,
                           causal_block);
  const c10::cuda::CUDAGuard guard(q.device());
  return topk_blocks_device(with_contiguous_rows(q), with_contiguous_rows(k), control_tokens, rules);
}

// ---------------------------------------------------------------------------------------------- attn

std::tuple<at::Tensor, at::Tensor> attn_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const std::optional<at::Tensor>& retrieved, c10::string_view method,
                                             int64_t control_tokens, int64_t window, int64_t summary_block,
                                             int64_t near_range, int64_t topk, int64_t retrieval_block,
                                             int64_t query_block, int64_t train_length, int64_t sinks,
                                             bool far_summaries, double theta,
                                             std::optional<int64_t> rotary_dim, c10::string_view rope_style,
                                             std::optional<double> scale, int64_t causal_block, bool cond_correction, bool summaries) {
  const AttnParams ap = check_attn(q, k, v, retrieved, method, control_tokens, window, summary_block, near_range,
                                   topk, retrieval_block, query_block, train_length, sinks, far_summaries, theta,
                                   rotary_dim, rope_style, scale, causal_block, cond_correction, summaries);
  const Rules& R = ap.rules;
  TORCH_CHECK_VALUE(padded_head_dim(ap.D) > 0, "attn on CUDA supports head dims up to 128, got ", ap.D);
  const char* unsupported = cuda_unsupported(ap);
  TORCH_CHECK_VALUE(unsupported == nullptr, unsupported);
  const c10::cuda::CUDAGuard guard(q.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  // Inputs are read through their strides (views of a fused qkv projection need no copy).
  at::Tensor qc = with_contiguous_rows(q), kc = with_contiguous_rows(k), vc = with_contiguous_rows(v);
  at::Tensor out = at::empty(q.sizes(), qc.options());
  at::Tensor lse = at::empty({ap.B, ap.Hq, ap.Nq}, qc.options().dtype(at::kFloat));
  if (ap.Nq == 0 || ap.B == 0 || ap.Hq == 0) return {out, lse};
  const int64_t C = ap.C, L = ap.L;

  // Rule 3: given blocks are validated on the host (a small copy), computed ones are valid by construction.
  at::Tensor blocks;
  if (R.method == Method::kRangeSwa && L > 0) {
    if (retrieved.has_value()) {
      blocks = retrieved->contiguous();
      check_retrieved_values(blocks.cpu(), R);
    } else if (R.topk > 0) {
      blocks = topk_blocks_device(qc, kc, C, R);
    }
  }

  // Rope tables, prepared keys / values / summaries (attn_setup.h), then the fused kernel.
  const AttnPlan plan = plan_attn(ap);
  std::pair<at::Tensor, at::Tensor> nat, grp, cnd;
  if (plan.nat_count > 0) nat = rope_table(ap.rope, plan.nat_count, 0.0, 1.0, nullptr, qc.options(), stream);
  if (plan.grp_count > 0) grp = rope_table(ap.rope, plan.grp_count, plan.grp_first, 1.0, nullptr, qc.options(), stream);
  if (plan.cond_count > 0) cnd = rope_table(ap.rope, plan.cond_count, 0.0, plan.cond_step, nullptr, qc.options(), stream);
  const auto opts = qc.options();
  at::Tensor keys_nat = at::empty({plan.BH, plan.nat_rows, plan.Dp}, opts), values = at::empty_like(keys_nat);
  at::Tensor keys_grp = plan.grouping ? at::empty({plan.BH, plan.grp_rows, plan.Dp}, opts) : at::Tensor();
  at::Tensor keys_cond = plan.cond ? at::empty({plan.BH, L, plan.Dp}, opts) : at::Tensor();
  AttnBuffers buf{};
  buf.q = qc.data_ptr();
  buf.k = kc.data_ptr();
  buf.v = vc.data_ptr();
  buf.q_strides = row_strides(qc);
  buf.k_strides = row_strides(kc);
  buf.v_strides = row_strides(vc);
  buf.out = out.data_ptr();
  buf.lse = lse.data_ptr<float>();
  buf.keys_nat = keys_nat.data_ptr();
  buf.values = values.data_ptr();
  buf.keys_grp = keys_grp.defined() ? keys_grp.data_ptr() : nullptr;
  buf.keys_cond = keys_cond.defined() ? keys_cond.data_ptr() : nullptr;
  buf.cos_nat = ptr_or_null<float>(nat.first);
  buf.sin_nat = ptr_or_null<float>(nat.second);
  buf.cos_grp = ptr_or_null<float>(grp.first);
  buf.sin_grp = ptr_or_null<float>(grp.second);
  buf.cos_cond = ptr_or_null<float>(cnd.first);
  buf.sin_cond = ptr_or_null<float>(cnd.second);
  if (blocks.defined() && blocks.size(3) > 0) {
    buf.retrieved = blocks.data_ptr<int32_t>();
    buf.retrieved_k = blocks.size(3);
  }
  const PrepareParams pp = prepare_params(ap, plan, buf);
  DTYPE_SWITCH(dtype_of(qc), T, [&] { check_launch(launch_prepare<T>(pp, stream), "attn key preparation"); });
  const AttnKernelParams p = kernel_params(ap, plan, buf);
  DTYPE_SWITCH(dtype_of(qc), T, [&] {
    HEADDIM_SWITCH(ap.D, kHeadDim, [&] { check_launch(run_attn<T, kHeadDim>(p, stream), "attn"); });
  });
  return {out, lse};
}

}  // namespace

TORCH_LIBRARY_IMPL(rangeswa, CUDA, m) {
  m.impl("rope", &rope_cuda);
  m.impl("block_summary", &block_summary_cuda);
  m.impl("topk_blocks", &topk_blocks_cuda);
  m.impl("attn", &attn_cuda);
}

}  // namespace rangeswa::cuda
