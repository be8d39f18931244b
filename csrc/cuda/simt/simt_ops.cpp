// torch.ops.rangeswa_simt: every CUDA kernel of the package run through the host SIMT emulation, launched by
// the device's own launchers (launch.h, attn_launch.h: the same grids, blocks and shared memory), under the
// schemas of the ops (schema.h): attn (rope tables, preparation, rule 3's selection when no blocks are given,
// sort, plan, the attention kernel, the control rows' combine), prepare (with its key means), topk_blocks,
// block_summary and rope; and the emulator's own test kernels. The host side of a call (checked arguments,
// setup, arrays) is the plan emulator's (csrc/cuda/emulator/host_call.h). tests/cuda_emulator.py builds this
// with torch.utils.cpp_extension.load (-DRANGESWA_SIMT, g++). Not part of the extension.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <cstring>
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
#include "cuda/simt/simt_tests.h"

namespace rangeswa::cuda {
namespace {

// Seconds spent in the last call's kernel launch, and its dynamic shared memory per CTA.
double g_kernel_seconds = 0.0;
int64_t g_smem_bytes = 0;
int64_t g_values_in_place = 0;  // whether the last attn call read its body values from v itself
int64_t g_cond_raw = 0;         // ... and its control rows' body keys from k itself (attn_setup.h cond_from_keys)
int64_t g_folded = 0;           // ... and whether its control CTAs did Lite's preparation (attn_setup.h nat_keys_from_control)
int g_plan_fault = 0;            // plan_fault below
int g_guard_cut = 0;             // guard_cut below
int64_t g_attn_launches = 0;     // launches of the attention kernels in the last attn call (a packed call: one, or
                                 // one per sequence where attn_params.h packed_per_sequence holds)
int32_t g_packed_seqs = PackedAttnLaunch::kSeqs;  // packed_launch_seqs below
int64_t g_hopper = 0;            // whether the last attn call's body ran on the sm_90a kernel (one sequence's did)

// The kernel's arrays as guarded copies (simt::GuardedCopy): every array the kernel parameters point into is
// copied so that it ends at an inaccessible page (the two rope tables of a table tensor separately), the
// parameters are pointed at the copies, and out / lse are copied back afterwards. An out-of-bounds read or
// write past the end of an array then faults deterministically and is reported as an illegal memory access.
struct GuardedArrays {
  struct Region {
    const char* base;
    size_t bytes;
    std::unique_ptr<::simt::GuardedCopy> copy;
  };
  std::vector<Region> regions;

  void add(const void* base, size_t bytes) {
    if (base != nullptr) regions.push_back({static_cast<const char*>(base), bytes, nullptr});
  }
  // The elements a tensor spans, strides included. A [B, H, rows, D] array whose rows are further apart
  // than D (a prepared context: rows of the kernel's padded head dim Dp, context.h) spans its last row's
  // padding too, as far as its storage holds it: the kernel reads whole padded rows.
  void add(const at::Tensor& t) {
    if (!t.defined() || t.numel() == 0) return;
    int64_t extent = 1;
    for (int64_t d = 0; d < t.dim(); ++d) extent += (t.size(d) - 1) * t.stride(d);
    if (t.dim() == 4 && t.stride(3) == 1 && t.stride(2) > t.size(3)) {
      const int64_t held = int64_t(t.storage().nbytes()) / t.element_size() - t.storage_offset();
      extent = std::max(extent, std::min(extent - t.size(3) + t.stride(2), held));
    }
    add(t.data_ptr(), size_t(extent) * t.element_size());
  }
  // p into the first region that holds it (the attention's arrays: a packed call's sequences into its packed
  // tensors' copies).
  template <typename T>
  void remap(T*& p) {
    if (p == nullptr) return;
    const char* c = reinterpret_cast<const char*>(p);
    for (Region& r : regions)
      if (c >= r.base && c < r.base + r.bytes) return point(r, p, c);
  }
  // p into the region that starts at it, else the first that holds it (the small kernels' arrays: views of one
  // storage, a fused qkv's k and v, overlap, and each array's own region holds all of its rows).
  template <typename T>
  void remap_own(T*& p) {
    if (p == nullptr) return;
    const char* c = reinterpret_cast<const char*>(p);
    for (Region& r : regions)
      if (c == r.base && r.bytes > 0) return point(r, p, c);
    remap(p);
  }
  template <typename T>
  void point(Region& r, T*& p, const char* c) {
    if (!r.copy) r.copy = std::make_unique<::simt::GuardedCopy>(r.base, r.bytes);
    p = reinterpret_cast<T*>(static_cast<char*>(r.copy->data()) + (c - r.base));
  }
  void copy_back(const void* base) {
    for (Region& r : regions)
      if (r.base == base && r.copy) std::memcpy(const_cast<char*>(r.base), r.copy->data(), r.bytes);
  }
};

void guard(HostCall& hc, GuardedArrays& g) {
  g.add(hc.q);
  if (hc.buf.values_in_place) g.add(hc.v);  // the kernel reads the body values from v itself
  if (hc.buf.cond_raw) g.add(hc.k);          // ... and the control rows' body keys from k
  g.add(hc.out);
  g.add(hc.lse);
  for (const at::Tensor& t : hc.keep) {
    if (t.data_ptr() == hc.p.cos_int || t.data_ptr() == hc.p.cos_cond) {  // cos / sin tables [2, rows, half]
      const size_t half = size_t(t.size(1) * t.size(2)) * sizeof(float);
      g.add(t.data_ptr(), half);
      g.add(static_cast<const char*>(t.data_ptr()) + half, half);
    } else {
      g.add(t);
    }
  }
  g.add(hc.records.data(), hc.records.size() * sizeof(Record));
  g.add(hc.record_count.data(), hc.record_count.size() * sizeof(int32_t));
  g.add(hc.retrieved_sorted.data(), hc.retrieved_sorted.size() * sizeof(int32_t));
  AttnKernelParams& p = hc.p;
  g.remap(p.q);
  g.remap(p.out);
  g.remap(p.lse);
  for (const void** a : {&p.kv.k_ctrl, &p.kv.v_ctrl, &p.kv.k_nat, &p.kv.k_grp, &p.kv.k_cond, &p.kv.v_body,
                         &p.kv.s_nat, &p.kv.s_grp, &p.kv.s_v, &p.kv.p_nat, &p.kv.p_grp})
    g.remap(*a);
  for (void** a : {&p.fold.k_nat, &p.fold.s_nat, &p.fold.s_v}) g.remap(*a);  // written by the control CTAs
  g.remap(p.cos_int);
  g.remap(p.sin_int);
  g.remap(p.cos_cond);
  g.remap(p.sin_cond);
  g.remap(p.records);
  g.remap(p.record_count);
  g.remap(p.retrieved);
  g.remap(p.ctrl_o);
  g.remap(p.ctrl_lse);
}

// The small kernels run on guarded copies too (Options::guard_global): each launch registers the arrays it
// reads and writes (by the extents the kernel may touch), points its parameters at their copies, and copies the
// arrays it wrote back afterwards.

// The launches whose written arrays guard_cut may shorten (guard_cut below).
enum class Small { kSelect = 1, kPrepare = 2, kSort = 3, kPlan = 4 };

// A written array's guarded bytes: 16 fewer (a guarded copy's granule, simt.h GuardedCopy) for the launch
// guard_cut names, so that its last writes fault.
size_t written_bytes(Small launch, size_t bytes) {
  return g_guard_cut == int(launch) && bytes >= 16 ? bytes - 16 : bytes;
}

// The bytes of a [heads, rows, Dp] array that a kernel may touch: heads `stride` elements apart.
size_t head_rows_bytes(int64_t heads, int64_t stride, int64_t rows, int64_t Dp, size_t element) {
  return heads > 0 && rows > 0 ? size_t((heads - 1) * stride + rows * Dp) * element : 0;
}

// The preparation's arrays (prepare.h PrepareParams) as guarded regions of the extents it may touch: k and v
// [B, Hkv, C + L, D] at their strides, the control rows' copies [BH, C, Dp], the body rows' arrays [BH, L - row0,
// Dp] and the block means [BH, blocks from row0 / G, Dp] at the call's head strides, the rope tables [L, half]
// (the conditioning ones where k_cond is written); the pointers remapped. Returns the written arrays' bases.
std::vector<void*> guard_prepare(PrepareParams& pp, GuardedArrays& g, size_t element) {
  const int64_t BH = pp.BH, B = pp.Hkv > 0 ? BH / pp.Hkv : 0, N = int64_t(pp.C) + pp.L;
  auto input = [&](const RowStrides& st) {
    return B > 0 && N > 0 ? size_t(st.at(B - 1, pp.Hkv - 1, N - 1) + pp.D) * element : 0;
  };
  g.add(pp.k, input(pp.k_strides));
  g.add(pp.v, input(pp.v_strides));
  const int64_t body = pp.L - pp.row0, blocks = (int64_t(pp.L) + pp.G - 1) / pp.G - pp.row0 / pp.G;
  const size_t table = size_t(pp.L) * pp.rotary_half * sizeof(float);
  g.add(pp.cos_int, table);
  g.add(pp.sin_int, table);
  if (pp.k_cond != nullptr) g.add(pp.cos_cond, table);
  if (pp.k_cond != nullptr) g.add(pp.sin_cond, table);
  std::vector<void*> written;
  auto out = [&](void* a, int64_t stride, int64_t rows) {
    g.add(a, written_bytes(Small::kPrepare, head_rows_bytes(BH, stride, rows, pp.Dp, element)));
    if (a != nullptr) written.push_back(a);
  };
  out(pp.k_ctrl, pp.ctrl_stride, pp.C);
  out(pp.v_ctrl, pp.ctrl_stride, pp.C);
  for (void* a : {pp.k_nat, pp.k_grp, pp.k_cond, pp.v_body, pp.p_nat, pp.p_grp}) out(a, pp.body_stride, body);
  for (void* a : {pp.s_nat, pp.s_grp, pp.s_v}) out(a, pp.sum_stride, blocks);
  g.remap_own(pp.k);
  g.remap_own(pp.v);
  for (const float** t : {&pp.cos_int, &pp.sin_int, &pp.cos_cond, &pp.sin_cond}) g.remap_own(*t);
  for (void** a : {&pp.k_ctrl, &pp.v_ctrl, &pp.k_nat, &pp.k_grp, &pp.k_cond, &pp.v_body, &pp.p_nat, &pp.p_grp,
                   &pp.s_nat, &pp.s_grp, &pp.s_v})
    g.remap_own(*a);
  return written;
}

// The rope table kernel (prepare.h launch_rope_table) on guarded copies of its outputs cos and sin ([count,
// half] each), its frequencies (half) and positions (count).
cudaError_t rope_table_guarded(float* cos_out, float* sin_out, int64_t count, int half, double theta,
                               const double* inv_freq, double first, double step, const double* positions) {
  GuardedArrays g;
  float *c = cos_out, *s = sin_out;
  if (::simt::options().guard_global) {
    const size_t bytes = size_t(std::max<int64_t>(count, 0)) * std::max(half, 0) * sizeof(float);
    g.add(c, bytes);
    g.add(s, bytes);
    g.add(inv_freq, size_t(std::max(half, 0)) * sizeof(double));
    g.add(positions, size_t(std::max<int64_t>(count, 0)) * sizeof(double));
    g.remap_own(c);
    g.remap_own(s);
    g.remap_own(inv_freq);
    g.remap_own(positions);
  }
  const cudaError_t err = launch_rope_table(c, s, count, half, theta, inv_freq, first, step, positions, nullptr);
  g.copy_back(cos_out);
  g.copy_back(sin_out);
  return err;
}

// The selection's arrays (selection.h Selection, its parameters p) as guarded regions: q, k, the blocks and the
// means; the pointers remapped. Returns the written array's base (the blocks).
std::vector<void*> guard_select(TopkParams& p, const at::Tensor& q, const at::Tensor& k, const Selection& sel,
                                GuardedArrays& g) {
  const at::Tensor& out = sel.out;
  g.add(out.data_ptr(), written_bytes(Small::kSelect, size_t(out.numel()) * out.element_size()));
  for (const at::Tensor& t : {q, k, sel.q_means, sel.k_means}) g.add(t);
  g.remap_own(p.q);
  g.remap_own(p.k);
  g.remap_own(p.out);
  g.remap_own(p.q_means);
  g.remap_own(p.k_means);
  return {sel.out.data_ptr()};
}

// The sort's and the plan's arrays of a call as guarded regions: the given blocks (`given`, [rows, given_k]), the
// sorted ones, the records and their counts; `given`, `sorted`, `records`, `counts` and p's pointers to them
// remapped. Returns the written arrays' bases.
std::vector<void*> guard_plan(HostCall& hc, AttnKernelParams& p, const int32_t*& given, int32_t*& sorted,
                              Record*& records, int32_t*& counts, GuardedArrays& g) {
  const int64_t rows = hc.ap.B * hc.ap.Hkv * int64_t(hc.s.nQb);
  g.add(given, size_t(rows) * hc.s.given_k * sizeof(int32_t));
  g.add(sorted, written_bytes(Small::kSort, hc.retrieved_sorted.size() * sizeof(int32_t)));
  g.add(records, hc.records.size() * sizeof(Record));
  g.add(counts, written_bytes(Small::kPlan, hc.record_count.size() * sizeof(int32_t)));
  std::vector<void*> written;
  for (void* a : {static_cast<void*>(sorted), static_cast<void*>(records), static_cast<void*>(counts)})
    if (a != nullptr) written.push_back(a);
  g.remap_own(given);
  g.remap_own(sorted);
  g.remap_own(records);
  g.remap_own(counts);
  g.remap_own(p.retrieved);
  g.remap_own(p.records);
  g.remap_own(p.record_count);
  return written;
}

// A launcher's cudaError_t: its own refusals (grid limits, shared memory) as errors of the op.
void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "simt: the ", what, " launcher refused its launch (cudaError ", int(err), ")");
}

template <typename F>
auto simt_errors_as_runtime_errors(const F& f) {
  try {
    return f();
  } catch (const ::simt::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

// Rule 3's blocks as topk_blocks_device (attn_api.cpp) launches their selection: q, k with contiguous rows.
at::Tensor select_blocks(const at::Tensor& q, const at::Tensor& k, int64_t control_tokens, const Rules& rules,
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
size_t attn_smem_of(const AttnKernelParams& p, at::ScalarType type) {
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
DeviceCaps simt_device() { return DeviceCaps{true, ::simt::options().max_shared_bytes, 0}; }
CallShape simt_shape(const AttnSetup& s, at::ScalarType type) {
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

// A call's configuration on the emulated device (an sm_90a GPU whose opt-in shared memory per CTA is
// Options::max_shared_bytes), as attn_api.cpp check_call decides and checks it, before any work: api/config.h
// choose_config (RANGESWA_CUDA_KERNEL=hopper where the sm_90a kernel cannot take the call: the mma.sync kernel, with
// a warning that says why), then launch_refusal on the mma.sync kernel's shared memory (the sm_90a launch's control
// CTAs run that kernel too). K: the given blocks' or topk. build (host_call.h) chooses the same for the call.
void check_config(const AttnParams& ap, const std::optional<at::Tensor>& retrieved, at::ScalarType type,
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

std::tuple<at::Tensor, at::Tensor> attn_simt_one(RSWA_ATTN_PARAMS, std::optional<at::TensorList> prepared) {
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

std::vector<at::Tensor> prepare_simt_one(RSWA_PREPARE_PARAMS) {
  const ContextParams cp = check_prepare(RSWA_PREPARE_ARGS);
  if (::simt::options().workers == 0) ::simt::options().workers = at::get_num_threads();
  return simt_errors_as_runtime_errors([&] { return prepare_call(k, v, cp, first_key, SimtLaunches{}); });
}

// A packed call as the CUDA op runs it (attn_api.cpp attn_cuda_packed): every sequence checked as its own call,
// then per sequence its tables, preparation and selection (host_call.h build, without the plan), and for all
// sequences at once the sort, the plan, the attention kernel (attn_packed_kernel) and the combine, through the
// same launchers and the same table of per-sequence parameters (packed.h). RANGESWA_CUDA_KERNEL=hopper runs each
// sequence's body on the sm_90a kernel on its own, as the op does.
std::tuple<at::Tensor, at::Tensor> attn_simt_packed(RSWA_ATTN_PARAMS, std::optional<at::TensorList> prepared
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
std::tuple<at::Tensor, at::Tensor> attn_simt(RSWA_ATTN_PARAMS, std::optional<at::TensorList> prepared
                                                 RSWA_VARLEN_ATTN_PARAMS) {
  if (!is_packed(cu_seqlens_q, cu_seqlens_k, control_counts)) return attn_simt_one(RSWA_ATTN_ARGS, prepared);
  return attn_simt_packed(RSWA_ATTN_ARGS, prepared RSWA_VARLEN_ATTN_ARGS);
}

// A packed prepare as the CUDA op runs it (attn_api.cpp prepare_cuda_packed): each sequence checked as its own
// prepare, its rows of the packed arrays written in place by one preparation launch per kernel variant and one
// key-means launch for every sequence.
std::vector<at::Tensor> prepare_simt_packed(RSWA_PREPARE_PARAMS RSWA_VARLEN_PREPARE_PARAMS) {
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

std::vector<at::Tensor> prepare_simt(RSWA_PREPARE_PARAMS RSWA_VARLEN_PREPARE_PARAMS) {
  if (!is_packed(std::nullopt, cu_seqlens_k, control_counts)) return prepare_simt_one(RSWA_PREPARE_ARGS);
  return prepare_simt_packed(RSWA_PREPARE_ARGS RSWA_VARLEN_PREPARE_ARGS);
}

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

// The sequences a packed call's attention kernel launch takes (attn_launch.h run_attn_packed: at most, and by default,
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
}  // namespace rangeswa::cuda

TORCH_LIBRARY(rangeswa_simt, m) {
  m.def(rangeswa::schema::kAttn);
  m.def(rangeswa::schema::kPrepare);
  m.def(rangeswa::schema::kTopkBlocks);
  m.def(rangeswa::schema::kBlockSummary);
  m.def(rangeswa::schema::kRope);
  m.def("warp_gemm(Tensor q, Tensor k, Tensor v, Tensor p) -> (Tensor, Tensor)");
  // Catch-all kernels: these take no tensor (or an optional one) to dispatch on.
  m.def("probe(str name, Tensor? input=None) -> Tensor", &rangeswa::cuda::probe);
  m.def("configure(int workers=0, bool poison_shared=True, bool check_races=True, bool eager_copies=False, "
        "int schedule_seed=0, bool guard_global=True, int stack_bytes=262144, int max_shared_bytes=232448) -> int[]",
        &rangeswa::cuda::configure);
  m.def("stats() -> int[]", &rangeswa::cuda::stats);
  m.def("plan_fault(int fault) -> int", &rangeswa::cuda::plan_fault);
  m.def("guard_cut(int launch) -> int", &rangeswa::cuda::guard_cut);
  m.def("packed_launch_seqs(int seqs) -> int", &rangeswa::cuda::packed_launch_seqs);
}

TORCH_LIBRARY_IMPL(rangeswa_simt, CPU, m) {
  m.impl("attn", &rangeswa::cuda::attn_simt);
  m.impl("prepare", &rangeswa::cuda::prepare_simt);
  m.impl("topk_blocks", &rangeswa::cuda::topk_blocks_simt);
  m.impl("block_summary", &rangeswa::cuda::block_summary_simt);
  m.impl("rope", &rangeswa::cuda::rope_simt);
  m.impl("warp_gemm", &rangeswa::cuda::warp_gemm);
}
