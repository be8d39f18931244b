// torch.ops.rangeswa_simt: every CUDA kernel of the package run through the host SIMT emulation, launched by
// the device's own launchers, under the schemas of the ops (schema.h): attn and prepare (simt_attn_ops.h),
// topk_blocks, block_summary and rope (here); and the emulator's own test kernels, its options and its
// counters. tests/cuda_emulator.py builds this with torch.utils.cpp_extension.load (-DRANGESWA_SIMT, g++). Not
// part of the extension.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "checks.h"
#include "schema.h"
#include "cuda/launch.h"
#include "cuda/simt/simt.h"
#include "cuda/simt/simt_attn_ops.h"
#include "cuda/simt/simt_guard.h"
#include "cuda/simt/simt_launches.h"
#include "cuda/simt/simt_ops.h"
#include "cuda/simt/simt_tests.h"

namespace rangeswa::cuda::simt_ops {

// What the last attn call did and the faults tests set (simt_ops.h).
double g_kernel_seconds = 0.0;
int64_t g_smem_bytes = 0;
int64_t g_values_in_place = 0;
int64_t g_cond_raw = 0;
int64_t g_folded = 0;
int64_t g_attn_launches = 0;
int64_t g_hopper = 0;
int g_plan_fault = 0;
int g_guard_cut = 0;
int32_t g_packed_seqs = PackedAttnLaunch::kSeqs;

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "simt: the ", what, " launcher refused its launch (cudaError ", int(err), ")");
}

namespace {

at::Tensor topk_blocks_simt(const at::Tensor& q, const at::Tensor& k, int64_t control_tokens, int64_t window,
                            int64_t summary_block, int64_t retrieval_block, int64_t query_block, int64_t topk,
                            int64_t causal_block) {
  const Rules rules = check_topk(q, k, control_tokens, window, summary_block, retrieval_block, query_block, topk,
                                 causal_block);
  if (::simt::options().workers == 0) ::simt::options().workers = at::get_num_threads();
  return simt_errors_as_runtime_errors(
      [&] { return select_blocks(with_contiguous_rows(q), with_contiguous_rows(k), control_tokens, rules); });
}

// rope and block_summary as attn_api.cpp launches them (the positions as doubles, x and k with contiguous rows).
at::Tensor rope_simt(const at::Tensor& x, const at::Tensor& positions, double theta, std::optional<int64_t> rotary_dim,
                     c10::string_view rope_style, const std::optional<at::Tensor>& inv_freq) {
  check_bhnd(x, "x");
  const RopeParams rope = check_rope(x.size(3), theta, rotary_dim, rope_style, inv_freq, x.device());
  check_positions(positions, x.size(2), x, "token of x");
  if (::simt::options().workers == 0) ::simt::options().workers = at::get_num_threads();
  const at::Tensor pos = positions.to(at::kDouble).contiguous(), xc = x.contiguous();
  at::Tensor out = at::full_like(xc, NAN);
  const int64_t rows = xc.numel() / std::max<int64_t>(1, xc.size(3));
  simt_errors_as_runtime_errors([&] {
    dispatch_dtype(xc.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      const T* x = static_cast<const T*>(xc.data_ptr());
      const double* p = pos.data_ptr<double>();
      const double* freq = rope.given_frequencies();
      T* o = static_cast<T*>(out.data_ptr());
      GuardedArrays g;  // x, the positions, the frequencies and the output on guarded copies
      if (::simt::options().guard_global) {
        g.add(xc);
        g.add(pos);
        g.add(out);
        g.add(freq, size_t(rope.rotary_dim / 2) * sizeof(double));
        g.remap_own(x);
        g.remap_own(p);
        g.remap_own(freq);
        g.remap_own(o);
      }
      check_launch(launch_rope<T>(x, p, o, rows, xc.size(2), xc.size(3), int(rope.rotary_dim), rope.theta, freq,
                                  rope.interleaved, nullptr),
                   "rope");
      g.copy_back(out.data_ptr());
    });
    return 0;
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> block_summary_simt(const at::Tensor& k, const at::Tensor& v,
                                                      const std::optional<at::Tensor>& positions,
                                                      int64_t summary_block, double theta,
                                                      std::optional<int64_t> rotary_dim, c10::string_view rope_style,
                                                      const std::optional<at::Tensor>& inv_freq) {
  const RopeParams rope = check_block_summary(k, v, summary_block, theta, rotary_dim, rope_style, inv_freq);
  if (positions.has_value()) check_positions(*positions, k.size(2), k, "body key");
  if (::simt::options().workers == 0) ::simt::options().workers = at::get_num_threads();
  const int64_t BH = k.size(0) * k.size(1), L = k.size(2), D = k.size(3), half = rope.rotary_dim / 2;
  const int64_t nG = (L + summary_block - 1) / summary_block;
  const at::Tensor kc = k.contiguous(), vc = v.contiguous();
  at::Tensor ks = at::full({k.size(0), k.size(1), nG, D}, NAN, kc.options()), vs = at::full_like(ks, NAN);
  at::Tensor table;  // [2, L, half]: cos, then sin, of the positions
  simt_errors_as_runtime_errors([&] {
    if (positions.has_value() && half > 0) {
      const at::Tensor pos = positions->to(at::kDouble).contiguous();
      table = at::full({2, L, half}, NAN, at::kFloat);
      check_launch(rope_table_guarded(table[0].data_ptr<float>(), table[1].data_ptr<float>(), L, int(half), rope.theta,
                                      rope.given_frequencies(), 0.0, 0.0, pos.data_ptr<double>()),
                   "rope table");
    }
    const float* cos_t = table.defined() && L > 0 ? table[0].data_ptr<float>() : nullptr;
    const float* sin_t = table.defined() && L > 0 ? table[1].data_ptr<float>() : nullptr;
    dispatch_dtype(kc.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      const T *kp = static_cast<const T*>(kc.data_ptr()), *vp = static_cast<const T*>(vc.data_ptr());
      const float *cp = cos_t, *sp = sin_t;
      T *ksp = static_cast<T*>(ks.data_ptr()), *vsp = static_cast<T*>(vs.data_ptr());
      GuardedArrays g;  // k, v, the two rope tables [L, half] and the summaries on guarded copies
      if (::simt::options().guard_global) {
        for (const at::Tensor& t : {kc, vc, ks, vs}) g.add(t);
        g.add(cp, size_t(L) * half * sizeof(float));
        g.add(sp, size_t(L) * half * sizeof(float));
        g.remap_own(kp);
        g.remap_own(vp);
        g.remap_own(cp);
        g.remap_own(sp);
        g.remap_own(ksp);
        g.remap_own(vsp);
      }
      check_launch(launch_block_summary<T>(kp, vp, cp, sp, ksp, vsp, BH, L, D, summary_block, int(half),
                                           rope.interleaved, nullptr),
                   "block_summary");
      g.copy_back(ks.data_ptr());
      g.copy_back(vs.data_ptr());
    });
    return 0;
  });
  return {ks, vs};
}

std::tuple<at::Tensor, at::Tensor> warp_gemm(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& p) {
  TORCH_CHECK(q.dim() == 2 && q.size(0) == 128 && k.dim() == 2 && k.sizes() == v.sizes() && k.size(1) == q.size(1),
              "warp_gemm: q [128, D], k and v [cols, D]");
  TORCH_CHECK(p.dim() == 2 && p.size(0) == 128 && p.size(1) == k.size(0) && p.scalar_type() == at::kFloat,
              "warp_gemm: p [128, cols] float");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), "warp_gemm: one dtype");
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous(), pc = p.contiguous();
  at::Tensor s = at::full({128, k.size(0)}, NAN, q.options().dtype(at::kFloat));
  at::Tensor o = at::full({128, q.size(1)}, NAN, q.options().dtype(at::kFloat));
  const int dtype = q.scalar_type() == at::kBFloat16 ? 1 : q.scalar_type() == at::kHalf ? 2 : 0;
  if (::simt::options().workers == 0) ::simt::options().workers = at::get_num_threads();
  simt_errors_as_runtime_errors([&] {
    simt_tests::warp_gemm(dtype, int(q.size(1)), int(k.size(0)), qc.data_ptr(), kc.data_ptr(), vc.data_ptr(),
                          pc.data_ptr<float>(), s.data_ptr<float>(), o.data_ptr<float>());
    return 0;
  });
  return {s, o};
}

at::Tensor probe(c10::string_view name, const std::optional<at::Tensor>& input) {
  std::vector<float> in;
  if (input.has_value()) {
    const at::Tensor x = input->to(at::kFloat).contiguous();
    in.assign(x.data_ptr<float>(), x.data_ptr<float>() + x.numel());
  }
  const std::vector<float> out =
      simt_errors_as_runtime_errors([&] { return simt_tests::probe(std::string(name), in); });
  return at::tensor(out, at::kFloat);
}

// simt.h Options: workers (0: torch's thread count), poison_shared, check_races, eager_copies, schedule_seed,
// guard_global, stack_bytes, max_shared_bytes (the emulated device's opt-in shared memory per CTA); returns the
// previous values in that order.
std::vector<int64_t> configure(int64_t workers, bool poison_shared, bool check_races, bool eager_copies,
                               int64_t schedule_seed, bool guard_global, int64_t stack_bytes, int64_t max_shared_bytes) {
  ::simt::Options& o = ::simt::options();
  std::vector<int64_t> old{o.workers, o.poison_shared, o.check_races, o.eager_copies, int64_t(o.schedule_seed),
                           o.guard_global, int64_t(o.stack_bytes), int64_t(o.max_shared_bytes)};
  o.max_shared_bytes = size_t(max_shared_bytes);
  o.guard_global = guard_global;
  o.workers = int(workers);
  o.poison_shared = poison_shared;
  o.check_races = check_races;
  o.eager_copies = eager_copies;
  o.schedule_seed = uint64_t(schedule_seed);
  o.stack_bytes = size_t(stack_bytes);
  return old;
}

// A fault the next attn calls' plans get after the plan kernel, for tests that must see it: 0 none, 1 every
// masked span of KV tiles moved to the kernel's unmasked loop (tile.h TileSpan). Returns the previous one.
int64_t plan_fault(int64_t fault) {
  const int64_t old = g_plan_fault;
  g_plan_fault = int(fault);
  return old;
}

// For tests that must see the small kernels' guard fault: the launch whose written arrays' guarded copies end 16
// bytes early in the next attn calls (0 none, 1 the selection's blocks, 2 the preparation's arrays, 3 the sorted
// blocks, 4 the plan's counts), so that its last writes are illegal memory accesses. Returns the previous one.
int64_t guard_cut(int64_t launch) {
  const int64_t old = g_guard_cut;
  g_guard_cut = int(launch);
  return old;
}

// The sequences a packed call's attention kernel launch takes (sm80/attn_launch.h run_attn_packed: at most, and by default,
// PackedAttnLaunch::kSeqs), fewer for tests that must see a call split over several launches. Returns the previous.
int64_t packed_launch_seqs(int64_t seqs) {
  const int64_t old = g_packed_seqs;
  g_packed_seqs = int32_t(std::clamp<int64_t>(seqs, 1, PackedAttnLaunch::kSeqs));
  return old;
}

// The last launch: CTAs, fiber switches, warp collectives, CTA barriers, mmas, ldmatrix, cp.async, kernel time
// of the last attn call in microseconds, its dynamic shared memory per CTA, whether it read v in place, how
// many launches of the attention kernels it made (a packed call on the mma.sync kernel: one; at head dim 128 one per
// sequence, attn_params.h packed_per_sequence), whether its
// control CTAs read their body keys from k in place, whether they did Lite's preparation of the body rows,
// and whether its body ran on the sm_90a kernel (choose_config).
std::vector<int64_t> stats() {
  const ::simt::Stats s = ::simt::last_stats();
  return {s.ctas, s.switches, s.warp_collectives, s.barriers, s.mmas, s.ldmatrix, s.cp_async,
          int64_t(g_kernel_seconds * 1e6), g_smem_bytes, g_values_in_place, g_attn_launches, g_cond_raw,
          g_folded, g_hopper};
}

}  // namespace
}  // namespace rangeswa::cuda::simt_ops

TORCH_LIBRARY(rangeswa_simt, m) {
  m.def(rangeswa::schema::kAttn);
  m.def(rangeswa::schema::kPrepare);
  m.def(rangeswa::schema::kTopkBlocks);
  m.def(rangeswa::schema::kBlockSummary);
  m.def(rangeswa::schema::kRope);
  m.def("warp_gemm(Tensor q, Tensor k, Tensor v, Tensor p) -> (Tensor, Tensor)");
  // Catch-all kernels: these take no tensor (or an optional one) to dispatch on.
  m.def("probe(str name, Tensor? input=None) -> Tensor", &rangeswa::cuda::simt_ops::probe);
  m.def("configure(int workers=0, bool poison_shared=True, bool check_races=True, bool eager_copies=False, "
        "int schedule_seed=0, bool guard_global=True, int stack_bytes=262144, int max_shared_bytes=232448) -> int[]",
        &rangeswa::cuda::simt_ops::configure);
  m.def("stats() -> int[]", &rangeswa::cuda::simt_ops::stats);
  m.def("plan_fault(int fault) -> int", &rangeswa::cuda::simt_ops::plan_fault);
  m.def("guard_cut(int launch) -> int", &rangeswa::cuda::simt_ops::guard_cut);
  m.def("packed_launch_seqs(int seqs) -> int", &rangeswa::cuda::simt_ops::packed_launch_seqs);
}

TORCH_LIBRARY_IMPL(rangeswa_simt, CPU, m) {
  m.impl("attn", &rangeswa::cuda::simt_ops::attn_simt);
  m.impl("prepare", &rangeswa::cuda::simt_ops::prepare_simt);
  m.impl("topk_blocks", &rangeswa::cuda::simt_ops::topk_blocks_simt);
  m.impl("block_summary", &rangeswa::cuda::simt_ops::block_summary_simt);
  m.impl("rope", &rangeswa::cuda::simt_ops::rope_simt);
  m.impl("warp_gemm", &rangeswa::cuda::simt_ops::warp_gemm);
}
