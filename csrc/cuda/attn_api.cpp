// The CUDA entry points of the four ops (SPEC section 5), registered for the schemas of csrc/schema.h,
// compiled by the host compiler (FlashAttention's flash_api.cpp layout): each checks every input exactly
// as the CPU kernel does (checks.h), the values of a user `retrieved` tensor included, before the CUDA
// guard, any allocation, copy or launch; then it allocates and calls the torch-free launchers of
// launch.h. No nvcc-compiled frame is on the path of an input error.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <list>
#include <mutex>

#include "checks.h"
#include "cuda/api/host.h"
#include "cuda/attn_setup.h"
#include "cuda/context.h"
#include "cuda/kernel_traits.h"
#include "cuda/launch.h"
#include "cuda/packed.h"
#include "cuda/selection.h"
#include "prepared.h"
#include "varlen.h"

namespace rangeswa::cuda {
namespace {

// The positions argument of rope / block_summary: 1-D, n entries, floating, on `device`.
void check_positions_on(const at::Tensor& positions, int64_t n, const char* what, const at::Device& device) {
  TORCH_CHECK_VALUE(positions.device() == device, "positions must be on the device of the inputs (", device,
                    "), got ", positions.device());
  TORCH_CHECK_VALUE(positions.dim() == 1 && positions.size(0) == n, "positions must be a 1-D tensor of ", n,
                    " entries (one per ", what, "), got shape ", positions.sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(positions.scalar_type()), "positions must be a floating tensor, got ",
                    positions.scalar_type());
}

// The given frequencies (the op's inv_freq argument) as float64 on `device`, or undefined when none was given
// (the kernels then use theta's). Copied from the checked host values; the caching allocator keeps the memory
// for the stream's launches that read it.
at::Tensor device_frequencies(const RopeParams& rope, const at::Device& device) {
  if (rope.inv_freq.empty()) return at::Tensor();
  return at::tensor(at::ArrayRef<double>(rope.inv_freq), at::kDouble).to(device);
}

// cos/sin [count, rotary_dim / 2] (float) of positions first + s * step, or `positions`.
std::pair<at::Tensor, at::Tensor> rope_table(const RopeParams& rope, int64_t count, double first, double step,
                                             const double* positions, const at::Device& device, cudaStream_t stream) {
  const int64_t half = rope.rotary_dim / 2;
  const auto opts = at::TensorOptions().device(device).dtype(at::kFloat);
  at::Tensor c = at::empty({count, half}, opts), s = at::empty_like(c);
  const at::Tensor freqs = device_frequencies(rope, device);
  check_launch(launch_rope_table(c.data_ptr<float>(), s.data_ptr<float>(), count, int(half), rope.theta,
                                 freqs.defined() ? freqs.data_ptr<double>() : nullptr, first, step, positions, stream),
               "rope table");
  return {c, s};
}

// The rope tables of attn, built once per shape and configuration and kept (issue: a model calls the op
// with the same positions in every layer): the integer positions 0.. (grown by doubling) per (device,
// frequencies, rotary_dim), and the conditioning positions i T / L per (device, frequencies, rotary_dim, L,
// step); the frequencies are theta's or the given inv_freq (RopeParams::same_frequencies).
// A table built on another stream is waited for through the event recorded after its build, and recorded
// as used on the calling stream (record_stream) so its eviction cannot free it under a pending kernel.
class TableCache {
 public:
  struct Entry {
    int device;
    RopeParams rope;  // theta, rotary_dim and the given frequencies
    double step;
    int64_t rows;
    bool integer;
    at::Tensor cos, sin;
    std::shared_ptr<at::cuda::CUDAEvent> built;
    cudaStream_t stream;
  };

  std::pair<at::Tensor, at::Tensor> get(const RopeParams& rope, bool integer, int64_t rows, double step,
                                        const at::Device& device) {
    std::lock_guard<std::mutex> lock(mutex_);
    cudaStream_t stream = at::cuda::getCurrentCUDAStream(device.index());
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      const bool same = it->device == device.index() && it->rope.same_frequencies(rope) &&
                        it->rope.rotary_dim == rope.rotary_dim && it->integer == integer &&
                        (integer ? it->rows >= rows : it->rows == rows && it->step == step);
      if (!same) continue;
      if (it->stream != stream) {
        // Wait for the build, and tell the allocator the tables are used on this stream too: when the entry
        // is evicted (and its tensors freed) while this stream's kernels still read them, the memory is
        // not reused before they finish.
        const at::cuda::CUDAStream current = at::cuda::getCurrentCUDAStream(device.index());
        it->built->block(current);
        it->cos.record_stream(current);
        it->sin.record_stream(current);
      }
      entries_.splice(entries_.begin(), entries_, it);
      return {entries_.front().cos, entries_.front().sin};
    }
    // Integer tables grow by doubling, so a sweep over lengths builds O(log L) of them.
    int64_t size = rows;
    if (integer)
      for (const Entry& e : entries_)
        if (e.device == device.index() && e.integer && e.rope.same_frequencies(rope) &&
            e.rope.rotary_dim == rope.rotary_dim)
          size = std::max(rows, 2 * e.rows);
    auto table = rope_table(rope, size, 0.0, integer ? 1.0 : step, nullptr, device, stream);
    auto event = std::make_shared<at::cuda::CUDAEvent>();
    event->record(at::cuda::getCurrentCUDAStream(device.index()));
    entries_.push_front(Entry{device.index(), rope, step, size, integer, table.first,
                              table.second, event, stream});
    if (entries_.size() > kEntries) entries_.pop_back();
    return table;
  }

 private:
  static constexpr size_t kEntries = 16;
  std::mutex mutex_;
  std::list<Entry> entries_;
};

TableCache& tables() {
  static TableCache cache;
  return cache;
}

// ---------------------------------------------------------------------------------------------- rope

at::Tensor rope_cuda(const at::Tensor& x, const at::Tensor& positions, double theta,
                     std::optional<int64_t> rotary_dim, c10::string_view rope_style,
                     const std::optional<at::Tensor>& inv_freq) {
  check_bhnd(x, "x");
  refuse_capture("rope", x.device());
  const RopeParams rope = check_rope(x.size(3), theta, rotary_dim, rope_style, inv_freq, x.device());
  check_positions_on(positions, x.size(2), "token of x", x.device());
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor pos = positions.to(at::kDouble).contiguous();
  at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t rows = xc.numel() / std::max<int64_t>(1, xc.size(3));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const at::Tensor freqs = device_frequencies(rope, x.device());
  dispatch_dtype(xc.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    check_launch(launch_rope<T>(static_cast<const T*>(xc.data_ptr()), pos.data_ptr<double>(),
                                static_cast<T*>(out.data_ptr()), rows, xc.size(2), xc.size(3), int(rope.rotary_dim),
                                rope.theta, freqs.defined() ? freqs.data_ptr<double>() : nullptr, rope.interleaved,
                                stream),
                 "rope");
  });
  return out;
}

// ------------------------------------------------------------------------------------- block_summary

std::tuple<at::Tensor, at::Tensor> block_summary_cuda(const at::Tensor& k, const at::Tensor& v,
                                                      const std::optional<at::Tensor>& positions,
                                                      int64_t summary_block, double theta,
                                                      std::optional<int64_t> rotary_dim, c10::string_view rope_style,
                                                      const std::optional<at::Tensor>& inv_freq) {
  const RopeParams rope = check_block_summary(k, v, summary_block, theta, rotary_dim, rope_style, inv_freq);
  refuse_capture("block_summary", k.device());
  if (positions.has_value()) check_positions_on(*positions, k.size(2), "body key", k.device());
  const c10::cuda::CUDAGuard guard(k.device());
  const int64_t BH = k.size(0) * k.size(1), L = k.size(2), D = k.size(3);
  const int64_t nG = (L + summary_block - 1) / summary_block;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor kc = k.contiguous(), vc = v.contiguous();
  at::Tensor ks = at::empty({k.size(0), k.size(1), nG, D}, kc.options()), vs = at::empty_like(ks);
  std::pair<at::Tensor, at::Tensor> table;
  if (positions.has_value() && rope.rotary_dim > 0) {
    at::Tensor pos = positions->to(at::kDouble).contiguous();
    table = rope_table(rope, L, 0.0, 0.0, pos.data_ptr<double>(), k.device(), stream);
  }
  dispatch_dtype(kc.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    check_launch(launch_block_summary<T>(static_cast<const T*>(kc.data_ptr()), static_cast<const T*>(vc.data_ptr()),
                                         ptr_or_null<float>(table.first), ptr_or_null<float>(table.second),
                                         static_cast<T*>(ks.data_ptr()), static_cast<T*>(vs.data_ptr()), BH, L, D,
                                         summary_block, int(rope.rotary_dim / 2), rope.interleaved, stream),
                 "block_summary");
  });
  return {ks, vs};
}

// --------------------------------------------------------------------------------------- topk_blocks

// Rule 3 on device q, k with contiguous rows: int32 [B, H_kv, nQb, K], best first, -1 padded. The shared
// memory it needs has been checked (check_topk_fits).
// key_means: a prepared context's key-block means (float64 [B, H_kv, nKb, D]), or undefined.
at::Tensor topk_blocks_device(const at::Tensor& q, const at::Tensor& k, int64_t control_tokens, const Rules& rules,
                              const at::Tensor& key_means = at::Tensor()) {
  Selection sel = selection(q, k, control_tokens, rules, key_means);
  if (!sel.launch) return sel.out;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  dispatch_dtype(q.scalar_type(),
                 [&](auto tag) { check_launch(launch_topk_blocks<decltype(tag)>(sel.p, stream), "topk_blocks"); });
  return sel.out;
}

void check_topk_fits(const Rules& rules, const at::Device& device) {
  TopkParams p{};
  p.rules = rules;
  const size_t smem = topk_blocks_smem_bytes(p);
  const int limit = max_shared_memory(device);
  TORCH_CHECK_VALUE(smem <= size_t(limit), "topk_blocks on CUDA keeps min(topk, key blocks) = ",
                    std::min(rules.topk, rules.num_key_blocks()), " blocks per query block in shared memory, which needs ",
                    smem, " bytes, more than this GPU's ", limit, "; use a smaller topk");
}

at::Tensor topk_blocks_cuda(const at::Tensor& q, const at::Tensor& k, int64_t control_tokens, int64_t window,
                            int64_t summary_block, int64_t retrieval_block, int64_t query_block, int64_t topk,
                            int64_t causal_block) {
  const Rules rules = check_topk(q, k, control_tokens, window, summary_block, retrieval_block, query_block, topk,
                                 causal_block);
  check_topk_fits(rules, q.device());
  const c10::cuda::CUDAGuard guard(q.device());
  return topk_blocks_device(with_contiguous_rows(q), with_contiguous_rows(k), control_tokens, rules);
}

// ---------------------------------------------------------------------------------------------- attn

template <typename Element>
void run_attn_for(const AttnKernelParams& p, int64_t D, cudaStream_t stream) {
  if (D <= 64) check_launch(run_attn<Element, 64>(p, stream), "attn");
  else if (D <= 80) check_launch(run_attn<Element, 80>(p, stream), "attn");
  else check_launch(run_attn<Element, 128>(p, stream), "attn");
}

template <typename Element>
size_t attn_smem_for(const AttnKernelParams& p, int64_t D) {
  return D <= 64 ? attn_smem_bytes<Element, 64>(p) : D <= 80 ? attn_smem_bytes<Element, 80>(p)
                                                             : attn_smem_bytes<Element, 128>(p);
}

// The warp-specialized sm_90a body kernel (16-bit elements; sm90/body_launch.h): its launch, whether the
// build holds its code for this device, its shared memory per CTA.
template <typename Element>
void run_attn_hopper_for(const AttnKernelParams& p, int64_t D, cudaStream_t stream) {
  if (D <= 64) check_launch(run_attn_hopper<Element, 64>(p, stream), "attn (sm_90a)");
  else if (D <= 80) check_launch(run_attn_hopper<Element, 80>(p, stream), "attn (sm_90a)");
  else check_launch(run_attn_hopper<Element, 128>(p, stream), "attn (sm_90a)");
}

template <typename Element>
bool hopper_built_for(int64_t D) {
  return D <= 64 ? hopper_kernel_built<Element, 64>() : D <= 80 ? hopper_kernel_built<Element, 80>()
                                                                : hopper_kernel_built<Element, 128>();
}

template <typename Element>
size_t hopper_smem_for(const AttnKernelParams& p, int64_t D) {
  return D <= 64 ? hopper_smem_bytes<Element, 64>(p) : D <= 80 ? hopper_smem_bytes<Element, 80>(p)
                                                               : hopper_smem_bytes<Element, 128>(p);
}

// The device's part of choose_config (api/config.h): its shared memory per CTA (opt-in) and per multiprocessor, and
// whether it runs the sm_90a body kernel (compute capability 9.0 and the build's sm_90a code for the call's element
// type and head dim; asked only where the overrides want that kernel).
DeviceCaps device_caps(const at::Tensor& q, int64_t D, const Overrides& o) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(q.device().index());
  DeviceCaps d;
  d.smem_opt_in = size_t(prop->sharedMemPerBlockOptin);
  d.smem_per_sm = size_t(prop->sharedMemPerMultiprocessor);
  if (hopper_wanted(o) && q.scalar_type() != at::kFloat && prop->major == 9 && prop->minor == 0)
    dispatch_dtype(q.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, float>) d.runs_hopper = hopper_built_for<T>(D);
    });
  return d;
}

// One call's checked configuration: every check of attn, before any device work.
struct CallCheck {
  AttnParams ap;
  AttnSetup s;
  bool given, computes, hopper;
  size_t smem;  // the mma.sync kernel's dynamic shared memory per CTA
};

CallCheck check_call(RSWA_ATTN_PARAMS, const std::optional<at::TensorList>& prepared) {
  // Every check first: arguments, what the CUDA kernel runs, the values of given blocks, shared memory.
  const AttnParams ap = check_attn(RSWA_ATTN_ARGS);
  const Rules& R = ap.rules;
  TORCH_CHECK_VALUE(padded_head_dim(ap.D) > 0, "attn on CUDA supports head dims up to 128, got ", ap.D);
  const char* unsupported = cuda_unsupported(ap);
  TORCH_CHECK_VALUE(unsupported == nullptr, unsupported);
  const int32_t Dp = padded_head_dim(ap.D);
  if (prepared.has_value()) check_prepared_cuda(*prepared, ap, k, Dp);
  const bool retrieves = R.method == Method::kRangeSwa && ap.L > 0;
  const bool given = retrieves && retrieved.has_value();
  // A user's blocks are checked by the plan's sort kernel on the device (no host copy, no sync).
  const bool computes = retrieves && !given && R.topk > 0;
  if (computes) check_topk_fits(R, q.device());
  const int64_t K = given ? retrieved->size(3) : computes ? retrieved_room(R, R.topk) : 0;
  AttnSetup s = setup_attn(ap, K);
  // How the call runs (api/config.h choose_config), from the switches (read here, at the op's boundary), this device
  // and both kernels' shared memory for the call's plan room. RANGESWA_CUDA_KERNEL=hopper on a device that cannot
  // run the sm_90a kernel is an error; a call whose configuration keeps it out runs on the mma.sync kernel, with a
  // warning that says why.
  const Overrides o = overrides_from_env();
  const auto mma_smem = [&](const AttnKernelParams& p) {
    size_t bytes = 0;
    dispatch_dtype(q.scalar_type(), [&](auto tag) { bytes = attn_smem_for<decltype(tag)>(p, ap.D); });
    return bytes;
  };
  const auto hopper_smem = [&](const AttnKernelParams& p) {
    size_t bytes = 0;
    dispatch_dtype(q.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, float>) bytes = hopper_smem_for<T>(p, ap.D);
    });
    return bytes;
  };
  const Config cfg = choose_config(call_shape(s, q.scalar_type() != at::kFloat, mma_smem, hopper_smem),
                                   device_caps(q, ap.D, o), o);
  if (cfg.refused) {
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(q.device().index());
    TORCH_CHECK_VALUE(false, "RANGESWA_CUDA_KERNEL=hopper: ", cfg.why, " (this device: ", prop->major, ".",
                      prop->minor, ")");
  }
  if (!cfg.why.empty() && o.kernel == BodyKernel::kHopper) TORCH_WARN("RANGESWA_CUDA_KERNEL=hopper: ", cfg.why);
  apply_config(s, cfg);
  const std::string refusal = launch_refusal(ap, s, cfg.smem, size_t(max_shared_memory(q.device())));
  TORCH_CHECK_VALUE(refusal.empty(), refusal);
  return CallCheck{ap, s, given, computes, cfg.hopper, cfg.smem};
}

// One call's device work before its attention kernel: retrieval, rope tables and, unless `packed`, the
// preparation, sort and plan launches (a packed call launches those for all its sequences at once). Its output
// rows are out / lse's from q row `row0` on, `rows` q rows per head apart (a packed call's sequence: its rows of
// the packed output; B = 1 there). `keep` holds its arrays.
struct CallState {
  AttnKernelParams p;
  PrepareParams pp;      // its preparation's parameters (prepare_ready'd)
  TopkParams topk;       // a packed call's sequence: its selection (when `selects`), launched with the others'
  bool selects;
  const int32_t* given;  // the blocks the sort kernel reads (null: no retrieval)
  std::vector<at::Tensor> keep;
};

CallState stage_call(const CallCheck& c, RSWA_ATTN_PARAMS, const std::optional<at::TensorList>& prepared,
                     const at::Tensor& out, const at::Tensor& lse, int64_t row0, int64_t rows, bool packed,
                     cudaStream_t stream) {
  const AttnParams& ap = c.ap;
  const AttnSetup& s = c.s;
  const Rules& R = ap.rules;
  CallState st{};
  std::vector<at::Tensor>& keep = st.keep;
  at::Tensor qc = with_contiguous_rows(q), kc = with_contiguous_rows(k), vc = with_contiguous_rows(v);
  keep.insert(keep.end(), {qc, kc, vc});
  at::Tensor blocks;
  if (c.given) blocks = retrieved->contiguous();
  const bool given_means = prepared.has_value() && (*prepared)[kKeyMeans].numel() > 0;
  const at::Tensor means = given_means ? (*prepared)[kKeyMeans] : at::Tensor();
  if (c.computes && !packed) blocks = topk_blocks_device(qc, kc, ap.C, selection_rules(R), means);
  if (c.computes && packed) {  // its workspaces and output now, its launches with the other sequences'
    Selection sel = selection(qc, kc, ap.C, selection_rules(R), means);
    blocks = sel.out;
    st.topk = sel.p;
    st.selects = sel.launch;
    keep.insert(keep.end(), {sel.q_means, sel.k_means});
  }
  if (blocks.defined()) keep.push_back(blocks);

  const auto opts = qc.options();
  auto array = [&](bool needed, int64_t rows) -> void* {
    if (!needed) return nullptr;
    keep.push_back(at::empty({s.BH, rows, s.Dp}, opts));
    return keep.back().data_ptr();
  };
  AttnBuffers buf{};
  buf.q = qc.data_ptr();
  buf.k = kc.data_ptr();
  buf.v = vc.data_ptr();
  buf.q_strides = row_strides(qc);
  buf.k_strides = row_strides(kc);
  buf.v_strides = row_strides(vc);
  buf.out = static_cast<char*>(out.data_ptr()) + row0 * ap.D * int64_t(out.element_size());
  buf.lse = lse.data_ptr<float>() + row0;
  // A prepared context gives every array computed from k alone; the call copies its control rows, and its
  // body values unless the kernel reads them in place (attn_setup.h values_in_place).
  const bool context = prepared.has_value();
  stage_arrays(ap, s, buf, prepared, int64_t(kc.element_size()), int64_t(vc.element_size()), array);
  std::pair<at::Tensor, at::Tensor> ints, cond;
  if (s.int_rows > 0) ints = tables().get(ap.rope, true, s.int_rows, 1.0, q.device());
  if (s.cond_rows > 0) cond = tables().get(ap.rope, false, s.cond_rows, s.cond_step, q.device());
  keep.insert(keep.end(), {ints.first, ints.second, cond.first, cond.second});
  buf.cos_int = ptr_or_null<const float>(ints.first);
  buf.sin_int = ptr_or_null<const float>(ints.second);
  buf.cos_cond = ptr_or_null<const float>(cond.first);
  buf.sin_cond = ptr_or_null<const float>(cond.second);
  if (s.retrieved_k > 0) {
    buf.retrieved = blocks.data_ptr<int32_t>();
    keep.push_back(at::empty({ap.B, ap.Hkv, s.nQb, s.retrieved_k}, opts.dtype(at::kInt)));
    buf.retrieved_sorted = keep.back().data_ptr<int32_t>();
  }
  keep.push_back(at::empty({std::max<int64_t>(1, s.plans() * s.plan_entries()), 4}, opts.dtype(at::kInt)));
  buf.records = reinterpret_cast<Record*>(keep.back().data_ptr<int32_t>());
  keep.push_back(at::empty({std::max<int64_t>(1, 2 * s.plans())}, opts.dtype(at::kInt)));
  buf.record_count = keep.back().data_ptr<int32_t>();
  if (ap.C > 0) {
    keep.push_back(at::empty({s.control_chunks * kControlSplit, ap.B * ap.Hq, ap.C, s.Dp}, opts.dtype(at::kFloat)));
    buf.ctrl_o = keep.back().data_ptr<float>();
    keep.push_back(at::empty({s.control_chunks * kControlSplit, ap.B * ap.Hq, ap.C}, opts.dtype(at::kFloat)));
    buf.ctrl_lse = keep.back().data_ptr<float>();
  }

  // The preparation's and kernel's parameters (the preparation's work folded into the control CTAs where the
  // configuration allows it: one call on the sm_90a launch).
  const StagedParams staged = stage_params(ap, s, buf, context, packed);
  PrepareParams pp = staged.pp;
  st.p = staged.p;
  st.p.Nq = int32_t(rows);  // q rows per head of the output (the packed rows in a packed call)
  st.given = buf.retrieved;
  dispatch_dtype(qc.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    st.pp = prepare_ready<T>(pp);
    if (packed) return;
    check_launch(launch_prepare<T>(pp, stream), "attn key preparation");
    check_launch(launch_plan(st.p, R, buf.retrieved, s.given_k, buf.retrieved_sorted, buf.records, buf.record_count,
                             s.plans(), stream),
                 "attn plan");
  });
  return st;
}

// The call's body and control kernels (the sm_90a body kernel where check_call chose it); combine: the control
// rows' combine too.
void body_call(const CallCheck& c, const AttnKernelParams& p, at::ScalarType type, bool combine, cudaStream_t stream) {
  dispatch_dtype(type, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, float>) {
      if (c.hopper) run_attn_hopper_for<T>(p, c.ap.D, stream);
      else run_attn_for<T>(p, c.ap.D, stream);
    } else {
      run_attn_for<T>(p, c.ap.D, stream);
    }
    if (combine && c.ap.C > 0) check_launch(launch_combine<T>(p, stream), "attn control rows");
  });
}

std::tuple<at::Tensor, at::Tensor> attn_cuda_one(RSWA_ATTN_PARAMS, std::optional<at::TensorList> prepared) {
  const CallCheck c = check_call(RSWA_ATTN_ARGS, prepared);
  const AttnParams& ap = c.ap;
  // Device work.
  const c10::cuda::CUDAGuard guard(q.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty({ap.B, ap.Hq, ap.Nq}, q.options().dtype(at::kFloat));
  if (ap.Nq == 0 || ap.B == 0 || ap.Hq == 0) return {out, lse};
  const CallState st = stage_call(c, RSWA_ATTN_ARGS, prepared, out, lse, 0, ap.Nq, false, stream);
  body_call(c, st.p, q.scalar_type(), true, stream);
  return {out, lse};
}

// A packed call's table (packed.h: the sequences' parameters and work offsets) on the device of `like`: written
// into pinned host memory and copied once, without a sync.
template <typename Table>
at::Tensor device_table(const Table& calls, const at::Tensor& like) {
  at::Tensor host = at::empty({int64_t(calls.bytes())}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  calls.write(reinterpret_cast<char*>(host.data_ptr()));
  at::Tensor table = at::empty({int64_t(calls.bytes())}, like.options().dtype(at::kByte));
  table.copy_(host, /*non_blocking=*/true);
  return table;
}

// A packed call (csrc/varlen.h) in shared launches (docs/cuda.md "Packed calls"): every sequence checked as its
// own call first; then per sequence its arrays and rope tables (cached across calls), and for all sequences at
// once the retrieval (block means, then top-K selection: topk_blocks.h PackedTopk), the preparation (one launch
// per kernel variant the sequences use, prepare.h prepare_variant), the sort, the plan, the attention kernel (sm80/mainloop.h attn_packed_kernel: one launch per K/V
// stage count the sequences use, one in practice) and the combine. A sequence whose body runs on the sm_90a kernel
// (RANGESWA_CUDA_KERNEL=hopper) has its body and control CTAs launched on its own.
std::tuple<at::Tensor, at::Tensor> attn_cuda_packed(RSWA_ATTN_PARAMS, std::optional<at::TensorList> prepared
                                                        RSWA_VARLEN_ATTN_PARAMS) {
  const Packed pk = check_packed_attn(q, k, v, retrieved, cu_seqlens_q, cu_seqlens_k, control_counts, control_tokens,
                                      summary_block, retrieval_block);
  const std::vector<PackedSequence> seqs = packed_sequences(q, k, v, prepared, pk, summary_block, retrieval_block);
  std::vector<CallCheck> checks;
  for (const PackedSequence& x : seqs)
    checks.push_back(for_sequence(x.s, [&] {
      auto one = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t control_tokens,
                     const std::optional<at::TensorList>& prepared) { return check_call(RSWA_ATTN_ARGS, prepared); };
      return one(x.q, x.k, x.v, x.C, x.context());
    }));

  const c10::cuda::CUDAGuard guard(q.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty({1, q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  if (q.size(1) == 0 || seqs.empty()) return {out, lse};
  const int64_t total_q = q.size(2);
  std::vector<CallState> states;
  PackedCalls calls;
  for (size_t x = 0; x < seqs.size(); ++x) {
    const PackedSequence& sq = seqs[x];
    const CallCheck& c = checks[x];
    auto stage = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t control_tokens,
                     const std::optional<at::TensorList>& prepared) {
      return stage_call(c, RSWA_ATTN_ARGS, prepared, out, lse, pk.q0[sq.s], total_q, true, stream);
    };
    states.push_back(stage(sq.q, sq.k, sq.v, sq.C, sq.context()));
    const CallState& st = states.back();
    size_t smem = 0;  // the mma.sync kernel's shared memory per CTA for its parameters (run_attn's)
    dispatch_dtype(q.scalar_type(), [&](auto tag) { smem = attn_smem_for<decltype(tag)>(st.p, c.ap.D); });
    calls.add(st.p, st.pp, st.selects ? &st.topk : nullptr, c.ap.rules, st.given, c.s.given_k, !c.hopper, smem);
  }
  TORCH_CHECK(calls.prepare_fits, "attn on CUDA: a sequence's preparation has more work items than a launch indexes");
  // The sequences' parameters and work offsets on the device (one copy).
  const at::Tensor table = device_table(calls, q);
  const char* base = reinterpret_cast<const char*>(table.data_ptr());
  const int64_t D = q.size(3);
  dispatch_dtype(q.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    check_launch(launch_topk_blocks_packed<T>(calls.topk_launch(base, PackedCalls::kMeans),
                                              calls.total(PackedCalls::kMeans),
                                              calls.topk_launch(base, PackedCalls::kSelect),
                                              calls.total(PackedCalls::kSelect), k.size(1), calls.select_smem, stream),
                 "topk_blocks");
    for (int x = 0; x < kPrepareVariants; ++x)
      check_launch(launch_prepare_packed<T>(calls.prepare_launch(base, x), x, calls.total(PackedCalls::kPrepare + x),
                                            stream),
                   "attn key preparation");
  });
  check_launch(launch_sort_packed(calls.launch(base, PackedCalls::kSort), calls.jobs_in(base),
                                  calls.total(PackedCalls::kSort), stream),
               "attn plan (sort)");
  check_launch(launch_plan_packed(calls.launch(base, PackedCalls::kPlan), calls.total(PackedCalls::kPlan), stream),
               "attn plan");
  dispatch_dtype(q.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    for (int x = 0; x < 2; ++x) {
      const int64_t ctas = calls.total(PackedCalls::kAttn + x);
      if (ctas == 0) continue;
      const PackedLaunch launch = calls.attn_launch(PackedCalls::kAttn + x);
      const size_t smem = calls.smem[x];
      const int32_t per = PackedAttnLaunch::kSeqs;  // sequences a launch (sm80/attn_launch.h run_attn_packed)
      if (D <= 64) check_launch(run_attn_packed<T, 64>(launch, ctas, x + 2, smem, stream, per), "attn");
      else if (D <= 80) check_launch(run_attn_packed<T, 80>(launch, ctas, x + 2, smem, stream, per), "attn");
      else check_launch(run_attn_packed<T, 128>(launch, ctas, x + 2, smem, stream, per), "attn");
    }
  });
  for (size_t x = 0; x < seqs.size(); ++x)  // the sm_90a body kernel: per sequence
    if (checks[x].hopper) body_call(checks[x], states[x].p, q.scalar_type(), false, stream);
  dispatch_dtype(q.scalar_type(), [&](auto tag) {
    check_launch(launch_combine_packed<decltype(tag)>(calls.launch(base, PackedCalls::kCombine),
                                                      calls.total(PackedCalls::kCombine), stream),
                 "attn control rows");
  });
  // Freed here, the pinned buffer is kept by the caching host allocator until its copy is done (copy_ records
  // the stream's event), and the device arrays are reused only by later work on this stream.
  return {out, lse};
}

// ------------------------------------------------------------------------------------------- prepare

// The prepared context (csrc/prepared.h) on the device: the arrays the attn kernel reads, rows padded to
// its head dim (returned as [B, H_kv, rows, D] views of [.., Dp] storage), rows from first_key on.
std::vector<at::Tensor> prepare_cuda_one(RSWA_PREPARE_PARAMS) {
  const ContextParams cp = check_prepare(RSWA_PREPARE_ARGS);
  TORCH_CHECK_VALUE(padded_head_dim(cp.D) > 0, "prepare on CUDA supports head dims up to 128, got ", cp.D);
  TORCH_CHECK_VALUE(cp.N < kMaxPlanTokens, "prepare on CUDA takes sequences of fewer than 2^29 tokens");
  TORCH_CHECK_VALUE(head_offsets_fit(cp.N, cp.D), "prepare on CUDA takes fewer than 2^31 elements per KV head and "
                    "array: (C + L) x the head dim padded to 64, 80 or 128 (16M tokens at head dim 128, 33M at 64)");
  const c10::cuda::CUDAGuard guard(k.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Rules& R = cp.rules;
  at::Tensor kc = with_contiguous_rows(k), vc = with_contiguous_rows(v);
  ContextLayout c = context_layout(cp, kc, vc, first_key);
  std::vector<at::Tensor>& out = c.out;
  const AttnSetup& s = c.s;
  const int64_t L = cp.L, row0 = first_key;
  std::pair<at::Tensor, at::Tensor> ints, cond;
  if (s.int_rows > 0) ints = tables().get(c.ap.rope, true, s.int_rows, 1.0, k.device());
  if (s.cond_rows > 0) cond = tables().get(c.ap.rope, false, s.cond_rows, s.cond_step, k.device());
  c.buf.cos_int = ptr_or_null<const float>(ints.first);
  c.buf.sin_int = ptr_or_null<const float>(ints.second);
  c.buf.cos_cond = ptr_or_null<const float>(cond.first);
  c.buf.sin_cond = ptr_or_null<const float>(cond.second);
  const PrepareParams pp = c.prepare_params();
  dispatch_dtype(kc.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    if (L > row0) check_launch(launch_prepare<T>(pp, stream), "prepare");
    if (cp.means && L > row0) {
      const TopkParams tp = key_means_params(kc, cp);
      const int64_t first_block = first_key / R.Rb;
      out[kKeyMeans] = at::empty({cp.B, cp.Hkv, R.num_key_blocks() - first_block, cp.D}, kc.options().dtype(at::kDouble));
      check_launch(launch_key_means<T>(tp, first_block, out[kKeyMeans].data_ptr<double>(), stream), "prepare key means");
    }
  });
  const std::vector<double> sig = context_signature(R, cp.rope, cp.B, cp.Hkv, cp.C, cp.D);
  out[kSignature] = at::tensor(at::ArrayRef<double>(sig), at::TensorOptions().dtype(at::kDouble));
  return out;
}

// A packed prepare (csrc/varlen.h, cu_seqlens_k) in shared launches: every sequence checked as its own prepare,
// the packed arrays allocated once with every sequence's rows written in place (context.h
// packed_context_layout), then per sequence its rope tables (cached across calls), and for all sequences at once
// the preparation (one launch per kernel variant they use) and the key means (one launch).
std::vector<at::Tensor> prepare_cuda_packed(RSWA_PREPARE_PARAMS RSWA_VARLEN_PREPARE_PARAMS) {
  auto check_one = [&](const at::Tensor& k, const at::Tensor& v, int64_t control_tokens) {
    const ContextParams cp = check_prepare(RSWA_PREPARE_ARGS);
    TORCH_CHECK_VALUE(padded_head_dim(cp.D) > 0, "prepare on CUDA supports head dims up to 128, got ", cp.D);
    TORCH_CHECK_VALUE(cp.N < kMaxPlanTokens, "prepare on CUDA takes sequences of fewer than 2^29 tokens");
    TORCH_CHECK_VALUE(head_offsets_fit(cp.N, cp.D), "prepare on CUDA takes fewer than 2^31 elements per KV head and "
                      "array: (C + L) x the head dim padded to 64, 80 or 128 (16M tokens at head dim 128, 33M at 64)");
    return cp;
  };
  const c10::cuda::CUDAGuard guard(k.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  std::vector<at::Tensor> keep;
  auto run = [&](PackedContextLayout& c, const std::vector<ContextParams>& cps, const at::Tensor& kc, const Packed& pk) {
    PackedPrepares calls;
    for (int64_t s = 0; s < pk.S; ++s) {
      ContextLayout& cs = c.seqs[s];
      const AttnSetup& st = cs.s;
      std::pair<at::Tensor, at::Tensor> ints, cond;
      if (st.int_rows > 0) ints = tables().get(cs.ap.rope, true, st.int_rows, 1.0, k.device());
      if (st.cond_rows > 0) cond = tables().get(cs.ap.rope, false, st.cond_rows, st.cond_step, k.device());
      keep.insert(keep.end(), {ints.first, ints.second, cond.first, cond.second});
      cs.buf.cos_int = ptr_or_null<const float>(ints.first);
      cs.buf.sin_int = ptr_or_null<const float>(ints.second);
      cs.buf.cos_cond = ptr_or_null<const float>(cond.first);
      cs.buf.sin_cond = ptr_or_null<const float>(cond.second);
      PrepareParams pp{};
      dispatch_dtype(kc.scalar_type(), [&](auto tag) { pp = prepare_ready<decltype(tag)>(c.prepare_params(s)); });
      const KeyMeansJob job{key_means_params(kc.narrow(2, pk.k0[s], pk.nk[s]), cps[s]), c.key_means(s), c.mean_rows};
      calls.add(pp, cps[s].L > 0, job, cps[s].means && cps[s].L > 0 && job.out != nullptr);
    }
    TORCH_CHECK(calls.fits, "prepare on CUDA: a sequence has more work items than a launch indexes");
    const at::Tensor table = device_table(calls, k);
    const char* base = reinterpret_cast<const char*>(table.data_ptr());
    dispatch_dtype(kc.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      for (int x = 0; x < kPrepareVariants; ++x)
        check_launch(launch_prepare_packed<T>(calls.prepare_launch(base, x), x, calls.total(x), stream), "prepare");
      check_launch(launch_key_means_packed<T>(calls.means_launch(base), calls.total(PackedPrepares::kMeans),
                                              k.size(1), stream),
                   "prepare key means");
    });
  };
  return packed_prepare(RSWA_PREPARE_ARGS RSWA_VARLEN_PREPARE_ARGS, check_one, run);
}

}  // namespace

// Packed calls (csrc/varlen.h): the offsets are copied to the host (one sync), each sequence is checked as its
// own call, and the sequences share the launches of the sort, plan, attention and combine kernels
// (attn_cuda_packed; docs/cuda.md, "Packed calls").
std::tuple<at::Tensor, at::Tensor> attn_cuda(RSWA_ATTN_PARAMS, std::optional<at::TensorList> prepared
                                                 RSWA_VARLEN_ATTN_PARAMS) {
  refuse_capture("attn", q.device());
  if (!is_packed(cu_seqlens_q, cu_seqlens_k, control_counts)) return attn_cuda_one(RSWA_ATTN_ARGS, prepared);
  return attn_cuda_packed(RSWA_ATTN_ARGS, prepared RSWA_VARLEN_ATTN_ARGS);
}

std::vector<at::Tensor> prepare_cuda(RSWA_PREPARE_PARAMS RSWA_VARLEN_PREPARE_PARAMS) {
  refuse_capture("prepare", k.device());
  if (!is_packed(std::nullopt, cu_seqlens_k, control_counts)) return prepare_cuda_one(RSWA_PREPARE_ARGS);
  return prepare_cuda_packed(RSWA_PREPARE_ARGS RSWA_VARLEN_PREPARE_ARGS);
}

TORCH_LIBRARY_IMPL(rangeswa, CUDA, m) {
  m.impl("prepare", &prepare_cuda);
  m.impl("rope", &rope_cuda);
  m.impl("block_summary", &block_summary_cuda);
  m.impl("topk_blocks", &topk_blocks_cuda);
  m.impl("attn", &attn_cuda);
}

}  // namespace rangeswa::cuda
