// torch.ops.rangeswa_simt.attn and .prepare: the CUDA op's calls run through the SIMT emulation, launched by the
// device's own launchers (launch.h, sm80/attn_launch.h: the same grids, blocks and shared memory) under the ops'
// schemas (schema.h): the rope tables, the preparation, rule 3's selection when no blocks are given, sort,
// plan, the attention kernel and the control rows' combine, one sequence or packed (cu_seqlens). The host side
// of a call (checked arguments, setup, arrays) is the plan emulator's (csrc/cuda/emulator/host_call.h); the
// small kernels run as simt_launches.h launches them. Header-only: simt_ops.cpp registers these ops, and one
// translation unit that includes ATen instead of two keeps the build time. Not part of the extension.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "checks.h"
#include "schema.h"
#include "varlen.h"
#include "cuda/emulator/host_call.h"
#include "cuda/launch.h"
#include "cuda/packed.h"
#include "cuda/selection.h"
#include "cuda/simt/attn_simt.h"
#include "cuda/simt/simt.h"
#include "cuda/simt/simt_guard.h"
#include "cuda/simt/simt_launches.h"
#include "cuda/simt/simt_ops.h"

namespace rangeswa::cuda::simt_ops {

// A call's configuration on the emulated device (an sm_90a GPU whose opt-in shared memory per CTA is
// Options::max_shared_bytes), as attn_api.cpp check_call decides and checks it, before any work: api/config.h
// choose_config (RANGESWA_CUDA_KERNEL=hopper where the sm_90a kernel cannot take the call: the mma.sync kernel, with
// a warning that says why), then launch_refusal on the mma.sync kernel's shared memory (the sm_90a launch's control
// CTAs run that kernel too). K: the given blocks' or topk. build (host_call.h) chooses the same for the call.
inline void check_config(const AttnParams& ap, const std::optional<at::Tensor>& retrieved, at::ScalarType type,
                         const Overrides& o) {
  const Rules& R = ap.rules;
  const bool retrieves = R.method == Method::kRangeSwa && ap.L > 0;
  const int64_t K = !retrieves ? 0 : retrieved.has_value() ? retrieved->size(3) : retrieved_room(R, R.topk);
  const AttnSetup s = emulated_setup(ap, K, type, SimtLaunches{}, o);
  if (!s.config.why.empty() && o.kernel == BodyKernel::kHopper)
    TORCH_WARN("RANGESWA_CUDA_KERNEL=hopper: ", s.config.why);
  const std::string refusal = launch_refusal(ap, s, s.config.smem, ::simt::options().max_shared_bytes);
  TORCH_CHECK_VALUE(refusal.empty(), refusal);
}

inline std::tuple<at::Tensor, at::Tensor> attn_simt_one(RSWA_ATTN_PARAMS, std::optional<at::TensorList> prepared) {
  HostCall hc;
  hc.ap = checked(RSWA_ATTN_ARGS, prepared);
  if (hc.ap.Nq == 0 || hc.ap.B == 0 || hc.ap.Hq == 0)
    return {at::zeros(q.sizes(), q.options()), at::zeros({hc.ap.B, hc.ap.Hq, hc.ap.Nq}, q.options().dtype(at::kFloat))};
  check_config(hc.ap, retrieved, q.scalar_type(), hc.overrides);
  if (::simt::options().workers == 0) ::simt::options().workers = at::get_num_threads();
  const SimtLaunches kernels;
  simt_errors_as_runtime_errors([&] {
    build(hc, q, k, v, retrieved, prepared, kernels);
    return 0;
  });
  // Never read by a correct kernel: NaN out and lse show rows the kernel forgot to write.
  hc.out.fill_(NAN);
  hc.lse.fill_(NAN);
  GuardedArrays guarded;
  g_values_in_place = hc.buf.values_in_place;
  g_cond_raw = hc.buf.cond_raw;
  g_folded = hc.p.fold.k_nat != nullptr;
  g_attn_launches = 1;
  if (::simt::options().guard_global) guard(hc, guarded);
  simt_errors_as_runtime_errors([&] {
    dispatch_dtype(hc.q.scalar_type(), [&](auto tag) {
      using Element = decltype(tag);
      const auto start = std::chrono::steady_clock::now();
      // The sm_90a body kernel where choose_config chose it (16-bit elements only).
      bool hopper = false;
      if constexpr (!std::is_same_v<Element, float>) {
        hopper = hc.s.config.hopper;
        if (hopper) {
          if (hc.s.Dp == 64) g_smem_bytes = int64_t(simt_attn::run_attn_hopper<Element, 64>(hc.p));
          else if (hc.s.Dp == 80) g_smem_bytes = int64_t(simt_attn::run_attn_hopper<Element, 80>(hc.p));
          else g_smem_bytes = int64_t(simt_attn::run_attn_hopper<Element, 128>(hc.p));
        }
      }
      if (!hopper) {
        if (hc.s.Dp == 64) g_smem_bytes = int64_t(simt_attn::run_attn<Element, 64>(hc.p));
        else if (hc.s.Dp == 80) g_smem_bytes = int64_t(simt_attn::run_attn<Element, 80>(hc.p));
        else g_smem_bytes = int64_t(simt_attn::run_attn<Element, 128>(hc.p));
      }
      g_hopper = hopper;
      g_kernel_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (hc.ap.C > 0) kernels.combine(hc.p, hc.q.scalar_type());  // on the guarded arrays, as the op launches it
    });
    return 0;
  });
  guarded.copy_back(hc.out.data_ptr());
  guarded.copy_back(hc.lse.data_ptr());
  return {hc.out, hc.lse};
}

inline std::vector<at::Tensor> prepare_simt_one(RSWA_PREPARE_PARAMS) {
  const ContextParams cp = check_prepare(RSWA_PREPARE_ARGS);
  if (::simt::options().workers == 0) ::simt::options().workers = at::get_num_threads();
  return simt_errors_as_runtime_errors([&] { return prepare_call(k, v, cp, first_key, SimtLaunches{}); });
}

// A packed call as the CUDA op runs it (attn_api.cpp attn_cuda_packed): every sequence checked as its own call,
// then per sequence its tables, preparation and selection (host_call.h build, without the plan), and for all
// sequences at once the sort, the plan, the attention kernel (attn_packed_kernel) and the combine, through the
// same launchers and the same table of per-sequence parameters (packed.h). RANGESWA_CUDA_KERNEL=hopper runs each
// sequence's body on the sm_90a kernel on its own, as the op does.
inline std::tuple<at::Tensor, at::Tensor> attn_simt_packed(RSWA_ATTN_PARAMS, std::optional<at::TensorList> prepared
                                                               RSWA_VARLEN_ATTN_PARAMS) {
  const Packed pk = check_packed_attn(q, k, v, retrieved, cu_seqlens_q, cu_seqlens_k, control_counts, control_tokens,
                                      summary_block, retrieval_block);
  const std::vector<PackedSequence> seqs = packed_sequences(q, k, v, prepared, pk, summary_block, retrieval_block);
  std::vector<AttnParams> aps;
  for (const PackedSequence& x : seqs)
    aps.push_back(for_sequence(x.s, [&] {
      auto one = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t control_tokens,
                     const std::optional<at::TensorList>& prepared) { return checked(RSWA_ATTN_ARGS, prepared); };
      return one(x.q, x.k, x.v, x.C, x.context());
    }));
  const Overrides o = emulator_overrides(overrides_from_env());
  for (const AttnParams& ap : aps)  // every sequence's configuration and launch checked before any work
    check_config(ap, std::nullopt, q.scalar_type(), o);
  const int64_t total_q = q.size(2), D = q.size(3);
  if (q.size(1) == 0 || seqs.empty())
    return {at::zeros(q.sizes(), q.options()), at::zeros({1, q.size(1), total_q}, q.options().dtype(at::kFloat))};
  if (::simt::options().workers == 0) ::simt::options().workers = at::get_num_threads();
  // Never read by a correct kernel: NaN shows rows the kernels forgot to write.
  at::Tensor out = at::full(q.sizes(), NAN, q.options()), lse = at::full({1, q.size(1), total_q}, NAN, q.options().dtype(at::kFloat));
  std::vector<std::unique_ptr<HostCall>> calls;
  std::vector<std::unique_ptr<SimtPackedSequence>> kernels;
  PackedCalls table;
  GuardedArrays small;  // the selection's, preparation's, sort's and plan's arrays
  std::vector<void*> small_written;
  simt_errors_as_runtime_errors([&] {
    for (size_t x = 0; x < seqs.size(); ++x) {
      calls.push_back(std::make_unique<HostCall>());
      HostCall& hc = *calls.back();
      hc.ap = aps[x];
      hc.overrides = o;
      kernels.push_back(std::make_unique<SimtPackedSequence>());
      build(hc, seqs[x].q, seqs[x].k, seqs[x].v, std::nullopt, seqs[x].context(), *kernels.back(), /*packed=*/true);
      // Its rows of the packed output (B = 1): q rows per head are the packed rows.
      hc.p.out = static_cast<char*>(out.data_ptr()) + pk.q0[seqs[x].s] * D * int64_t(out.element_size());
      hc.p.lse = lse.data_ptr<float>() + pk.q0[seqs[x].s];
      hc.p.Nq = int32_t(total_q);
      std::fill(hc.record_count.begin(), hc.record_count.end(), -1);  // a plan the kernel forgets shows
      // Its selection, preparation, sort and plan on guarded copies (as SimtLaunches runs them for one call):
      // each sequence's arrays are its own, so their copies go back whole after the shared launches.
      const SimtPackedSequence& kx = *kernels.back();
      AttnKernelParams p = hc.p;
      PrepareParams given_pp = hc.pp;
      TopkParams topk = kx.sel.p;
      const int32_t* given = hc.buf.retrieved;
      if (::simt::options().guard_global) {
        auto written = [&](const std::vector<void*>& bases) { for (void* a : bases) small_written.push_back(a); };
        if (kx.sel.launch) written(guard_select(topk, hc.q, hc.k, kx.sel, small));  // first: the sort reads its blocks
        written(guard_prepare(given_pp, small, q.element_size()));
        int32_t* sorted = hc.buf.retrieved_sorted;
        Record* records = hc.records.data();
        int32_t* counts = hc.record_count.data();
        written(guard_plan(hc, p, given, sorted, records, counts, small));
      }
      PrepareParams pp{};
      dispatch_dtype(q.scalar_type(), [&](auto tag) { pp = prepare_ready<decltype(tag)>(given_pp); });
      table.add(p, pp, kx.sel.launch ? &topk : nullptr, hc.ap.rules, given, hc.s.given_k, !hc.s.config.hopper,
                attn_smem_of(hc.p, q.scalar_type()));
    }
    TORCH_CHECK(table.prepare_fits, "attn on CUDA: a sequence's preparation has more work items than a launch indexes");
    // The selection (block means, top K), the preparation (per kernel variant), the sort and the plan of every
    // sequence: one launch each.
    std::vector<char> buffer(table.bytes());
    const char* base = buffer.data();
    table.write(buffer.data());
    dispatch_dtype(q.scalar_type(), [&](auto tag) {
      check_launch(launch_topk_blocks_packed<decltype(tag)>(
                       table.topk_launch(base, PackedCalls::kMeans), table.total(PackedCalls::kMeans),
                       table.topk_launch(base, PackedCalls::kSelect), table.total(PackedCalls::kSelect), k.size(1),
                       table.select_smem, nullptr),
                   "topk_blocks");
      for (int x = 0; x < kPrepareVariants; ++x)
        check_launch(launch_prepare_packed<decltype(tag)>(table.prepare_launch(base, x), x,
                                                          table.total(PackedCalls::kPrepare + x), nullptr),
                     "prepare");
    });
    check_launch(launch_sort_packed(table.launch(base, PackedCalls::kSort), table.jobs_in(base),
                                    table.total(PackedCalls::kSort), nullptr), "sort");
    check_launch(launch_plan_packed(table.launch(base, PackedCalls::kPlan), table.total(PackedCalls::kPlan), nullptr),
                 "plan");
    for (void* a : small_written) small.copy_back(a);
    return 0;
  });
  if (g_plan_fault == 1)  // every masked span of KV tiles to the unmasked loop (plan_fault)
    for (auto& hc : calls)
      for (int64_t x = 0; x < hc->s.plans(); ++x) {
        TileSpan* spans = spans_of(hc->p, hc->records.data(), x);
        for (int32_t y = 0; y < hc->record_count[2 * x + 1]; ++y)
          if (spans[y].width == hc->p.geo.tile_cols) spans[y].kind &= ~1;
      }
  // Guarded copies: the packed tensors first, so that each sequence's pointers into them map into one copy.
  GuardedArrays guarded;
  g_values_in_place = calls.front()->buf.values_in_place;
  g_cond_raw = calls.front()->buf.cond_raw;
  g_folded = 0;
  if (::simt::options().guard_global) {
    guarded.add(with_contiguous_rows(q));
    guarded.add(with_contiguous_rows(k));
    guarded.add(with_contiguous_rows(v));
    guarded.add(out);
    guarded.add(lse);
    if (prepared.has_value())
      for (const at::Tensor& t : *prepared) guarded.add(t);
    for (size_t x = 0; x < calls.size(); ++x) {
      guard(*calls[x], guarded);
      table.seq[x] = calls[x]->p;
    }
  }
  std::vector<char> buffer(table.bytes());
  table.write(buffer.data());
  simt_errors_as_runtime_errors([&] {
    dispatch_dtype(q.scalar_type(), [&](auto tag) {
      using Element = decltype(tag);
      const auto start = std::chrono::steady_clock::now();
      g_smem_bytes = 0;
      g_attn_launches = 0;
      for (int x = 0; x < 2; ++x) {
        const int64_t ctas = table.total(PackedCalls::kAttn + x);
        if (ctas == 0) continue;
        const PackedLaunch launch = table.attn_launch(PackedCalls::kAttn + x);
        const size_t smem = table.smem[x];
        g_smem_bytes = std::max(g_smem_bytes, int64_t(smem));
        int32_t busy = 0;  // the sequences with CTAs in this launch: g_packed_seqs of them a launch, or one
        for (int32_t s = 0; s < launch.S; ++s) busy += launch.first[s + 1] > launch.first[s];
        const int32_t per = packed_per_sequence(D <= 64 ? 64 : D <= 80 ? 80 : 128) ? 1 : g_packed_seqs;
        g_attn_launches += (busy + per - 1) / per;
        if (D <= 64) simt_attn::run_attn_packed<Element, 64>(launch, ctas, x + 2, smem, g_packed_seqs);
        else if (D <= 80) simt_attn::run_attn_packed<Element, 80>(launch, ctas, x + 2, smem, g_packed_seqs);
        else simt_attn::run_attn_packed<Element, 128>(launch, ctas, x + 2, smem, g_packed_seqs);
      }
      g_hopper = 0;
      if constexpr (!std::is_same_v<Element, float>) {
        for (size_t x = 0; x < calls.size(); ++x)  // the sm_90a body kernel: per sequence that runs it
          if (calls[x]->s.config.hopper) {
            const AttnKernelParams& p = table.seq[x];
            const int64_t bytes = int64_t(D <= 64    ? simt_attn::run_attn_hopper<Element, 64>(p)
                                          : D <= 80 ? simt_attn::run_attn_hopper<Element, 80>(p)
                                                    : simt_attn::run_attn_hopper<Element, 128>(p));
            g_smem_bytes = std::max(g_smem_bytes, bytes);
            ++g_attn_launches;
            g_hopper = 1;
          }
      }
      g_kernel_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      check_launch(launch_combine_packed<Element>(table.launch(buffer.data(), PackedCalls::kCombine),
                                                  table.total(PackedCalls::kCombine), nullptr),
                   "combine");
    });
    return 0;
  });
  guarded.copy_back(out.data_ptr());
  guarded.copy_back(lse.data_ptr());
  return {out, lse};
}

// Packed calls as the CUDA op runs them (attn_api.cpp attn_cuda), so the SIMT emulation covers the CUDA op's
// packed path.
inline std::tuple<at::Tensor, at::Tensor> attn_simt(RSWA_ATTN_PARAMS, std::optional<at::TensorList> prepared
                                                        RSWA_VARLEN_ATTN_PARAMS) {
  if (!is_packed(cu_seqlens_q, cu_seqlens_k, control_counts)) return attn_simt_one(RSWA_ATTN_ARGS, prepared);
  return attn_simt_packed(RSWA_ATTN_ARGS, prepared RSWA_VARLEN_ATTN_ARGS);
}

// A packed prepare as the CUDA op runs it (attn_api.cpp prepare_cuda_packed): each sequence checked as its own
// prepare, its rows of the packed arrays written in place by one preparation launch per kernel variant and one
// key-means launch for every sequence.
inline std::vector<at::Tensor> prepare_simt_packed(RSWA_PREPARE_PARAMS RSWA_VARLEN_PREPARE_PARAMS) {
  auto check_one = [&](const at::Tensor& k, const at::Tensor& v, int64_t control_tokens) {
    const ContextParams cp = check_prepare(RSWA_PREPARE_ARGS);
    TORCH_CHECK_VALUE(padded_head_dim(cp.D) > 0, "prepare on CUDA supports head dims up to 128, got ", cp.D);
    return cp;
  };
  if (::simt::options().workers == 0) ::simt::options().workers = at::get_num_threads();
  const SimtLaunches launches;
  std::vector<at::Tensor> keep;
  auto run = [&](PackedContextLayout& c, const std::vector<ContextParams>& cps, const at::Tensor& kc, const Packed& pk) {
    PackedPrepares calls;
    for (int64_t s = 0; s < pk.S; ++s) {
      ContextLayout& cs = c.seqs[s];
      launches.tables(cs.ap, cs.s, cs.buf, keep);
      PrepareParams pp{};
      dispatch_dtype(kc.scalar_type(), [&](auto tag) { pp = prepare_ready<decltype(tag)>(c.prepare_params(s)); });
      const KeyMeansJob job{key_means_params(kc.narrow(2, pk.k0[s], pk.nk[s]), cps[s]), c.key_means(s), c.mean_rows};
      calls.add(pp, cps[s].L > 0, job, cps[s].means && cps[s].L > 0 && job.out != nullptr);
    }
    TORCH_CHECK(calls.fits, "prepare on CUDA: a sequence has more work items than a launch indexes");
    std::vector<char> buffer(calls.bytes());
    calls.write(buffer.data());
    const char* base = buffer.data();
    simt_errors_as_runtime_errors([&] {
      dispatch_dtype(kc.scalar_type(), [&](auto tag) {
        using T = decltype(tag);
        for (int x = 0; x < kPrepareVariants; ++x)
          check_launch(launch_prepare_packed<T>(calls.prepare_launch(base, x), x, calls.total(x), nullptr), "prepare");
        check_launch(launch_key_means_packed<T>(calls.means_launch(base), calls.total(PackedPrepares::kMeans),
                                                k.size(1), nullptr),
                     "key means");
      });
      return 0;
    });
  };
  return packed_prepare(RSWA_PREPARE_ARGS RSWA_VARLEN_PREPARE_ARGS, check_one, run);
}

inline std::vector<at::Tensor> prepare_simt(RSWA_PREPARE_PARAMS RSWA_VARLEN_PREPARE_PARAMS) {
  if (!is_packed(std::nullopt, cu_seqlens_k, control_counts)) return prepare_simt_one(RSWA_PREPARE_ARGS);
  return prepare_simt_packed(RSWA_PREPARE_ARGS RSWA_VARLEN_PREPARE_ARGS);
}

}  // namespace rangeswa::cuda::simt_ops
