// A call's small kernels as the device runs them in the SIMT emulation: their own launchers on the host's
// fibers, on guarded copies of their arrays (simt_guard.h), for host_call.h's build. Header-only, as
// simt_attn_ops.h. Not part of the extension.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "cuda/emulator/host_call.h"
#include "cuda/launch.h"
#include "cuda/selection.h"
#include "cuda/simt/attn_simt.h"
#include "cuda/simt/simt.h"
#include "cuda/simt/simt_guard.h"
#include "cuda/simt/simt_ops.h"

namespace rangeswa::cuda::simt_ops {

// Rule 3's blocks as topk_blocks_device (attn_api.cpp) launches their selection: q, k with contiguous rows.
inline at::Tensor select_blocks(const at::Tensor& q, const at::Tensor& k, int64_t control_tokens, const Rules& rules,
                                const at::Tensor& key_means = at::Tensor()) {
  Selection sel = selection(q, k, control_tokens, rules, key_means);
  if (!sel.launch) return sel.out;
  TopkParams p = sel.p;
  GuardedArrays g;  // q, k, the means and the blocks on guarded copies
  if (::simt::options().guard_global) guard_select(p, q, k, sel, g);
  dispatch_dtype(q.scalar_type(),
                 [&](auto tag) { check_launch(launch_topk_blocks<decltype(tag)>(p, nullptr), "topk_blocks"); });
  g.copy_back(sel.out.data_ptr());
  return sel.out;
}

// The attention kernel's dynamic shared memory per CTA for one call.
inline size_t attn_smem_of(const AttnKernelParams& p, at::ScalarType type) {
  size_t bytes = 0;
  dispatch_dtype(type, [&](auto tag) {
    using Element = decltype(tag);
    bytes = p.Dp == 64 ? simt_attn::attn_smem<Element, 64>(p) : p.Dp == 80 ? simt_attn::attn_smem<Element, 80>(p)
                                                                            : simt_attn::attn_smem<Element, 128>(p);
  });
  return bytes;
}

// The emulated device and a call's shape for choose_config (api/config.h): the kernels' shared memory per CTA from
// their layouts (attn_setup.h call_shape).
inline DeviceCaps simt_device() { return DeviceCaps{true, ::simt::options().max_shared_bytes, 0}; }
inline CallShape simt_shape(const AttnSetup& s, at::ScalarType type) {
  const auto mma = [&](const AttnKernelParams& p) { return attn_smem_of(p, type); };
  const auto hopper = [&](const AttnKernelParams& p) {
    size_t bytes = 0;
    dispatch_dtype(type, [&](auto tag) {
      using Element = decltype(tag);
      if constexpr (!std::is_same_v<Element, float>)
        bytes = p.Dp == 64   ? simt_attn::hopper_smem<Element, 64>(p)
                : p.Dp == 80 ? simt_attn::hopper_smem<Element, 80>(p)
                             : simt_attn::hopper_smem<Element, 128>(p);
    });
    return bytes;
  };
  return call_shape(s, type != at::kFloat, mma, hopper);
}

// The small kernels of a call as the device runs them: their launchers, on the host's fibers.
struct SimtLaunches final : CallKernels {
  DeviceCaps device() const override { return simt_device(); }
  CallShape shape(const AttnSetup& s, at::ScalarType type) const override { return simt_shape(s, type); }
  void tables(const AttnParams& ap, const AttnSetup& s, AttnBuffers& b, std::vector<at::Tensor>& keep) const override {
    set_tables(ap, s, b, keep, [&](int64_t rows, double step) {
      const int64_t half = ap.rope.rotary_dim / 2;
      at::Tensor t = at::full({2, std::max<int64_t>(rows, 1), std::max<int64_t>(half, 1)}, NAN, at::kFloat);
      float* c = t.data_ptr<float>();
      check_launch(rope_table_guarded(c, c + t.size(1) * t.size(2), rows, int(half), ap.rope.theta,
                                      ap.rope.given_frequencies(), 0.0, step, nullptr), "rope table");
      return t;
    });
  }
  void prepare(const PrepareParams& given, int64_t, at::ScalarType type) const override {
    PrepareParams pp = given;
    GuardedArrays g;
    std::vector<void*> written;
    if (::simt::options().guard_global) written = guard_prepare(pp, g, at::elementSize(type));
    dispatch_dtype(type, [&](auto tag) { check_launch(launch_prepare<decltype(tag)>(pp, nullptr), "prepare"); });
    for (void* a : written) g.copy_back(a);
  }
  at::Tensor select(const HostCall& hc, const std::optional<at::TensorList>& prepared) const override {
    const bool given_means = prepared.has_value() && (*prepared)[kKeyMeans].numel() > 0;
    return select_blocks(hc.q, hc.k, hc.ap.C, selection_rules(hc.ap.rules),
                         given_means ? (*prepared)[kKeyMeans] : at::Tensor());
  }
  void plan(HostCall& hc) const override {
    std::fill(hc.record_count.begin(), hc.record_count.end(), -1);  // a plan the kernel forgets shows
    // The sort and the plan on guarded copies of the given blocks, the sorted ones, the records and their counts.
    AttnKernelParams p = hc.p;
    const int32_t* given = hc.buf.retrieved;
    int32_t* sorted = hc.buf.retrieved_sorted;
    Record* records = hc.records.data();
    int32_t* counts = hc.record_count.data();
    GuardedArrays g;
    std::vector<void*> written;
    if (::simt::options().guard_global) written = guard_plan(hc, p, given, sorted, records, counts, g);
    check_launch(launch_plan(p, hc.ap.rules, given, hc.s.given_k, sorted, records, counts, hc.s.plans(), nullptr),
                 "plan");
    for (void* a : written) g.copy_back(a);
    if (g_plan_fault == 1)  // every masked span of KV tiles to the unmasked loop (plan_fault)
      for (int64_t x = 0; x < hc.s.plans(); ++x) {
        TileSpan* spans = spans_of(hc.p, hc.records.data(), x);
        for (int32_t y = 0; y < hc.record_count[2 * x + 1]; ++y)
          if (spans[y].width == hc.p.geo.tile_cols) spans[y].kind &= ~1;
      }
  }
  // The control rows' outputs and log-sum-exp from their chunks (combine.h), as the op launches it.
  void combine(const AttnKernelParams& p, at::ScalarType type) const {
    dispatch_dtype(type, [&](auto tag) { check_launch(launch_combine<decltype(tag)>(p, nullptr), "combine"); });
  }
  at::Tensor key_means(const at::Tensor& kc, const ContextParams& cp, int64_t first_block) const override {
    at::Tensor out = at::full({cp.B, cp.Hkv, cp.rules.num_key_blocks() - first_block, cp.D}, NAN, at::kDouble);
    TopkParams tp = key_means_params(kc, cp);
    double* o = out.data_ptr<double>();
    GuardedArrays g;  // k and the means on guarded copies
    if (::simt::options().guard_global) {
      g.add(kc);
      g.add(out);
      g.remap_own(tp.k);
      g.remap_own(o);
    }
    dispatch_dtype(kc.scalar_type(), [&](auto tag) {
      check_launch(launch_key_means<decltype(tag)>(tp, first_block, o, nullptr), "key means");
    });
    g.copy_back(out.data_ptr());
    return out;
  }
};

// A packed call's sequence (attn_simt_packed): the small kernels as SimtLaunches runs them, except that its
// selection only sets up its arrays (sel), launched with the other sequences'.
struct SimtPackedSequence final : CallKernels {
  SimtLaunches launches;
  DeviceCaps device() const override { return launches.device(); }
  CallShape shape(const AttnSetup& s, at::ScalarType type) const override { return launches.shape(s, type); }
  mutable Selection sel{};
  void tables(const AttnParams& ap, const AttnSetup& s, AttnBuffers& b, std::vector<at::Tensor>& k) const override {
    launches.tables(ap, s, b, k);
  }
  void prepare(const PrepareParams& pp, int64_t BH, at::ScalarType type) const override {
    launches.prepare(pp, BH, type);
  }
  at::Tensor select(const HostCall& hc, const std::optional<at::TensorList>& prepared) const override {
    const bool given_means = prepared.has_value() && (*prepared)[kKeyMeans].numel() > 0;
    sel = selection(hc.q, hc.k, hc.ap.C, selection_rules(hc.ap.rules),
                    given_means ? (*prepared)[kKeyMeans] : at::Tensor());
    return sel.out;
  }
  void plan(HostCall& hc) const override { launches.plan(hc); }
  at::Tensor key_means(const at::Tensor& kc, const ContextParams& cp, int64_t first_block) const override {
    return launches.key_means(kc, cp, first_block);
  }
};

}  // namespace rangeswa::cuda::simt_ops
