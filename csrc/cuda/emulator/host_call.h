// The host side of one fused attention call without a GPU, shared by the plan census and host prepare op
// (plan_emulator.cu) and the SIMT emulation of the device source (csrc/cuda/simt/simt_attn_ops.h): the checked
// arguments, the setup (attn_setup.h) and the arrays exactly as the op (attn_api.cpp) makes them. The small
// kernels of a call (rope tables, preparation, rule 3's selection, sort and plan) run through a
// `CallKernels`: `HostLanes` here runs their per-unit functions on the host, one lane each, and runs no
// selection (a call that retrieves must be given its blocks); the SIMT emulation launches their device
// source through the device's own launchers (launch.h), selection included, then the kernel and the combine.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "checks.h"
#include "cuda/api/config.h"
#include "cuda/attn_params.h"
#include "cuda/attn_setup.h"
#include "cuda/context.h"
#include "cuda/kernel_traits.h"
#include "cuda/plan.h"
#include "cuda/prepare.h"
#include "cuda/retrieved_blocks.h"
#include "cuda/rotary.h"
#include "cuda/utils.h"

namespace rangeswa::cuda {

// Runs f(Element{}) with the element type of a float32 / bfloat16 / float16 tensor.
template <typename F>
void dispatch_dtype(at::ScalarType type, const F& f) {
  if (type == at::kBFloat16) f(__nv_bfloat16{});
  else if (type == at::kHalf) f(__half{});
  else f(float{});
}

struct HostCall;

// How the small kernels of a call run (see the top of this file).
struct CallKernels {
  virtual ~CallKernels() = default;
  // The rope tables of a call or a prepare op (attn_setup.h int_rows / cond_rows): set in `b`, kept in `keep`.
  virtual void tables(const AttnParams& ap, const AttnSetup& s, AttnBuffers& b, std::vector<at::Tensor>& keep) const = 0;
  // The preparation of every unit of every KV head (prepare.h).
  virtual void prepare(const PrepareParams& pp, int64_t BH, at::ScalarType type) const = 0;
  // Rule 3's blocks, int32 [B, H_kv, nQb, topk], for a call that retrieves and was given none; a prepared
  // context's key means are used when it has them.
  virtual at::Tensor select(const HostCall& hc, const std::optional<at::TensorList>& prepared) const = 0;
  // The retrieved blocks sorted per (KV head, query block), then the records of every body tile (plan.h).
  virtual void plan(HostCall& hc) const = 0;
  // The prepare op's retrieval key means: float64 [B, H_kv, nKb - first_block, D] of the pre-RoPE keys kc.
  virtual at::Tensor key_means(const at::Tensor& kc, const ContextParams& cp, int64_t first_block) const = 0;
  // What choose_config (api/config.h) reads of the emulated device and of the call's kernels (attn_setup.h
  // call_shape): here the plan census's, a device that runs either kernel and no shared-memory limit (the kernels'
  // shared memory not computed); the SIMT emulation's are its emulated device's and its kernels' layouts.
  virtual DeviceCaps device() const { return DeviceCaps{true, SIZE_MAX, 0}; }
  virtual CallShape shape(const AttnSetup& s, at::ScalarType type) const {
    const auto none = [](const AttnKernelParams&) { return size_t(0); };
    return call_shape(s, type != at::kFloat, none, none);
  }
};

// One call's host arrays: inputs, prepared arrays, tables, plan.
struct HostCall {
  AttnParams ap;
  AttnSetup s;
  at::Tensor q, k, v, out, lse;
  std::vector<at::Tensor> keep;  // every array below, alive for the call
  std::vector<int32_t> retrieved_sorted, record_count;
  std::vector<Record> records;
  AttnBuffers buf{};
  AttnKernelParams p{};
  PrepareParams pp{};  // its preparation's parameters (before prepare_ready)
  // The switches the call runs under (api/config.h): the environment's by default, with the emulations' bands and
  // stages (emulator_overrides); a test may give its own before build.
  Overrides overrides = emulator_overrides(overrides_from_env());
};

// How a call of K retrieved blocks per query block runs on the emulated device: setup_attn with choose_config's
// configuration (the op's attn_api.cpp check_call, on `kernels`' device and kernel layouts).
inline AttnSetup emulated_setup(const AttnParams& ap, int64_t K, at::ScalarType type, const CallKernels& kernels,
                                const Overrides& o) {
  AttnSetup s = setup_attn(ap, K);
  apply_config(s, choose_config(kernels.shape(s, type), kernels.device(), o));
  return s;
}

inline at::Tensor table(const AttnParams& ap, int64_t rows, double step) {
  const int64_t half = ap.rope.rotary_dim / 2;
  at::Tensor t = at::empty({2, std::max<int64_t>(rows, 1), std::max<int64_t>(half, 1)}, at::kFloat);
  float* c = t.data_ptr<float>();
  float* s = c + t.size(1) * t.size(2);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t kk = 0; kk < half; ++kk)
      rope_cos_sin(double(i) * step, int(kk), int(ap.rope.rotary_dim), ap.rope.theta, ap.rope.given_frequencies(),
                   c + i * half + kk, s + i * half + kk);
  return t;
}

// The rope tables of a call or a prepare op, each [2, rows, rotary_half] (cos, then sin) as `make(rows, step)`
// gives it (the host's `table`, or the SIMT emulation's launch of the table kernel): set in `b`, kept in `keep`.
template <typename Make>
void set_tables(const AttnParams& ap, const AttnSetup& s, AttnBuffers& b, std::vector<at::Tensor>& keep,
                const Make& make) {
  const at::Tensor ints = make(s.int_rows, 1.0), cond = make(s.cond_rows, s.cond_step);
  keep.push_back(ints);
  keep.push_back(cond);
  b.cos_int = ints.data_ptr<float>();
  b.sin_int = b.cos_int + ints.size(1) * ints.size(2);
  b.cos_cond = cond.data_ptr<float>();
  b.sin_cond = b.cos_cond + cond.size(1) * cond.size(2);
}

// The preparation kernels on the host: every unit of every KV head, one lane each (prepare_unit) or one lane
// per dim unit in turn (prepare_range), as launch_prepare chooses.
inline void prepare_on_host(const PrepareParams& given, int64_t BH, at::ScalarType type) {
  const int32_t units = prepare_units(given);
  dispatch_dtype(type, [&](auto tag) {
    using Element = decltype(tag);
    const PrepareParams pp = prepare_ready<Element>(given);
    auto range = pp.interleaved ? (pp.lean() ? prepare_range<Element, true, true> : prepare_range<Element, true, false>)
                                : (pp.lean() ? prepare_range<Element, false, true> : prepare_range<Element, false, false>);
    at::parallel_for(0, BH * units, 1, [&](int64_t begin, int64_t end) {
      for (int64_t x = begin; x < end; ++x) {
        const int32_t bh = int32_t(x / units), unit = int32_t(x % units);
        if (pp.vector)
          for (int w = 0; w < prepare_dim_units(pp); ++w) range(pp, bh, unit, w);
        else
          prepare_unit<Element>(pp, bh, unit, 0, 1);
      }
    });
  });
}

// Setup, preparation, selection and plan of a call, exactly as the op does them on the device; with a
// prepared context (checked by `checked`), its arrays as the op takes them (context.h use_context). A sequence
// of a packed call (`packed`) is set up and selects its blocks here, and leaves its preparation (hc.pp) and plan
// to the packed call's shared launches (simt_attn_ops.h, as attn_api.cpp attn_cuda_packed).
inline void build(HostCall& hc, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const std::optional<at::Tensor>& retrieved, const std::optional<at::TensorList>& prepared,
                  const CallKernels& kernels, bool packed = false) {
  const AttnParams& ap = hc.ap;
  hc.q = with_contiguous_rows(q);
  hc.k = with_contiguous_rows(k);
  hc.v = with_contiguous_rows(v);
  // Rule 3's blocks as attn_api.cpp takes them: given (values checked by the plan's sort), or selected when
  // none are given.
  const bool retrieves = ap.rules.method == Method::kRangeSwa && ap.L > 0;
  at::Tensor given;
  if (retrieves && retrieved.has_value()) {
    given = retrieved->contiguous();
  } else if (retrieves && ap.rules.topk > 0) {
    given = kernels.select(hc, prepared);
  }
  if (given.defined() && given.size(3) == 0) given = at::Tensor();
  hc.s = emulated_setup(ap, given.defined() ? given.size(3) : 0, hc.q.scalar_type(), kernels, hc.overrides);
  const AttnSetup& s = hc.s;
  hc.out = at::zeros(q.sizes(), hc.q.options());
  hc.lse = at::zeros({ap.B, ap.Hq, ap.Nq}, hc.q.options().dtype(at::kFloat));
  AttnBuffers& b = hc.buf;
  b.q = hc.q.data_ptr();
  b.k = hc.k.data_ptr();
  b.v = hc.v.data_ptr();
  b.q_strides = row_strides(hc.q);
  b.k_strides = row_strides(hc.k);
  b.v_strides = row_strides(hc.v);
  b.out = hc.out.data_ptr();
  b.lse = hc.lse.data_ptr<float>();
  // NaN-filled, so that a row the preparation forgets shows up in the output.
  auto array = [&](bool needed, int64_t rows) -> void* {
    if (!needed) return nullptr;
    hc.keep.push_back(at::full({s.BH, rows, s.Dp}, NAN, hc.q.options()));
    return hc.keep.back().data_ptr();
  };
  stage_arrays(ap, s, b, prepared, int64_t(hc.k.element_size()), int64_t(hc.v.element_size()), array);
  if (prepared.has_value())
    for (const at::Tensor& t : *prepared) hc.keep.push_back(t);  // (the SIMT emulation guards what keep holds)
  kernels.tables(ap, s, b, hc.keep);
  if (given.defined()) {
    hc.retrieved_sorted.resize(given.numel() / std::max<int64_t>(1, s.given_k) * s.retrieved_k);
    b.retrieved = given.data_ptr<int32_t>();
    b.retrieved_sorted = hc.retrieved_sorted.data();
    hc.keep.push_back(given);
  }
  hc.records.resize(s.plans() * s.plan_entries());
  hc.record_count.resize(2 * s.plans());
  b.records = hc.records.data();
  b.record_count = hc.record_count.data();
  hc.keep.push_back(at::zeros({s.control_chunks * kControlSplit, ap.B * ap.Hq, std::max<int64_t>(ap.C, 1), s.Dp}, at::kFloat));
  b.ctrl_o = hc.keep.back().data_ptr<float>();
  hc.keep.push_back(at::zeros({s.control_chunks * kControlSplit, ap.B * ap.Hq, std::max<int64_t>(ap.C, 1)}, at::kFloat));
  b.ctrl_lse = hc.keep.back().data_ptr<float>();
  // The preparation's and kernel's parameters, as the op stages them (the sm_90a launch of one call may fold some
  // of the preparation into its control CTAs: p.fold, the arrays they write).
  const StagedParams staged = stage_params(ap, s, b, prepared.has_value(), packed);
  hc.p = staged.p;
  hc.pp = staged.pp;
  if (!packed) {
    kernels.prepare(hc.pp, s.BH, hc.q.scalar_type());
    kernels.plan(hc);
  }
}

// The plan emulator's kernels: per-unit functions on the host, one lane each; no selection.
struct HostLanes final : CallKernels {
  void tables(const AttnParams& ap, const AttnSetup& s, AttnBuffers& b, std::vector<at::Tensor>& keep) const override {
    set_tables(ap, s, b, keep, [&](int64_t rows, double step) { return table(ap, rows, step); });
  }
  void prepare(const PrepareParams& pp, int64_t BH, at::ScalarType type) const override {
    prepare_on_host(pp, BH, type);
  }
  at::Tensor select(const HostCall&, const std::optional<at::TensorList>&) const override {
    TORCH_CHECK_VALUE(false, "the host emulation of the CUDA kernel's plan runs no block selection, and this call "
                      "retrieves (method rangeswa, topk > 0) with retrieved=None: pass the call's blocks as retrieved= "
                      "(torch.ops.rangeswa.topk_blocks of the same q, k and configuration), or run "
                      "torch.ops.rangeswa_simt.attn, which emulates the device's own selection");
  }
  void plan(HostCall& hc) const override {
    const AttnKernelParams& p = hc.p;
    if (p.retrieved_k > 0)  // the sort kernel: one thread per (KV head, query block); its assertion a ValueError
      for (int64_t row = 0; row < int64_t(hc.retrieved_sorted.size()) / p.retrieved_k; ++row) {
        const Rules& R = hc.ap.rules;
        const int64_t qb = row % R.num_query_blocks();
        int32_t bad = -1;
        const int32_t given_k = hc.s.given_k;
        if (!sort_retrieved(hc.buf.retrieved + row * given_k, given_k, hc.retrieved_sorted.data() + row * p.retrieved_k,
                            p.retrieved_k, R, qb, &bad)) {
          char message[512];
          std::snprintf(message, sizeof message, RSWA_BAD_RETRIEVED, int(bad), (long long)qb,
                        (long long)R.num_key_blocks());
          TORCH_CHECK_VALUE(false, std::string(message, std::strlen(message) - 1));  // without the newline
        }
      }
    for (int64_t x = 0; x < hc.s.plans(); ++x)  // the plan kernel: one thread per (KV head, body tile)
      plan_tile(p, int32_t(x / hc.s.body_tiles), int32_t(x % hc.s.body_tiles), hc.records.data(),
                hc.record_count.data());
  }
  // The float64 block means computed by ATen (only the device's selection, which this emulator does not run,
  // reads them).
  at::Tensor key_means(const at::Tensor& kc, const ContextParams& cp, int64_t first_block) const override {
    const Rules& R = cp.rules;
    const int64_t blocks = R.num_key_blocks() - first_block;
    const int64_t a = cp.C + first_block * R.Rb, rows = cp.L + cp.C - a;
    at::Tensor body = at::constant_pad_nd(kc.narrow(2, a, rows).to(at::kDouble), {0, 0, 0, blocks * R.Rb - rows});
    at::Tensor counts = at::full({blocks}, double(R.Rb), body.options());
    counts[blocks - 1] = double(rows - (blocks - 1) * R.Rb);
    return body.view({cp.B, cp.Hkv, blocks, R.Rb, cp.D}).sum(3) / counts.view({1, 1, blocks, 1});
  }
};

// The prepare op (checked arguments `cp`) with the CUDA op's layout (context.h context_layout: rows padded to
// Dp, from first_key on), its small kernels run by `kernels`, on CPU tensors: what prepare_cuda returns.
inline std::vector<at::Tensor> prepare_call(const at::Tensor& k, const at::Tensor& v, const ContextParams& cp,
                                            int64_t first_key, const CallKernels& kernels) {
  TORCH_CHECK_VALUE(padded_head_dim(cp.D) > 0, "prepare on CUDA supports head dims up to 128, got ", cp.D);
  const at::Tensor kc = with_contiguous_rows(k), vc = with_contiguous_rows(v);
  ContextLayout c = context_layout(cp, kc, vc, first_key);
  std::vector<at::Tensor> tables;
  kernels.tables(c.ap, c.s, c.buf, tables);
  if (cp.L > first_key) {
    kernels.prepare(c.prepare_params(), c.s.BH, kc.scalar_type());
    if (cp.means) c.out[kKeyMeans] = kernels.key_means(kc, cp, first_key / cp.rules.Rb);
  }
  const std::vector<double> sig = context_signature(cp.rules, cp.rope, cp.B, cp.Hkv, cp.C, cp.D);
  c.out[kSignature] = at::tensor(at::ArrayRef<double>(sig), at::TensorOptions().dtype(at::kDouble));
  return c.out;
}

inline AttnParams checked(RSWA_ATTN_PARAMS, const std::optional<at::TensorList>& prepared) {
  const AttnParams ap = check_attn(RSWA_ATTN_ARGS);
  TORCH_CHECK_VALUE(padded_head_dim(ap.D) > 0, "attn on CUDA supports head dims up to 128, got ", ap.D);
  const char* unsupported = cuda_unsupported(ap);
  TORCH_CHECK_VALUE(unsupported == nullptr, unsupported);
  if (prepared.has_value()) check_prepared_cuda(*prepared, ap, k, padded_head_dim(ap.D));
  return ap;
}

}  // namespace rangeswa::cuda
