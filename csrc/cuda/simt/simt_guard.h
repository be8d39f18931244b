// The SIMT ops' kernels on guarded copies of their arrays (simt::GuardedCopy, Options::guard_global): an
// out-of-bounds read or write past the end of an array faults deterministically and is reported as an illegal
// memory access. Header-only, as simt_attn_ops.h. Not part of the extension.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "cuda/emulator/host_call.h"
#include "cuda/launch.h"
#include "cuda/selection.h"
#include "cuda/simt/simt.h"
#include "cuda/simt/simt_ops.h"

namespace rangeswa::cuda::simt_ops {

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

inline void guard(HostCall& hc, GuardedArrays& g) {
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

// The launches whose written arrays guard_cut may shorten (simt_ops.cpp guard_cut).
enum class Small { kSelect = 1, kPrepare = 2, kSort = 3, kPlan = 4 };

// A written array's guarded bytes: 16 fewer (a guarded copy's granule, simt.h GuardedCopy) for the launch
// guard_cut names, so that its last writes fault.
inline size_t written_bytes(Small launch, size_t bytes) {
  return g_guard_cut == int(launch) && bytes >= 16 ? bytes - 16 : bytes;
}

// The bytes of a [heads, rows, Dp] array that a kernel may touch: heads `stride` elements apart.
inline size_t head_rows_bytes(int64_t heads, int64_t stride, int64_t rows, int64_t Dp, size_t element) {
  return heads > 0 && rows > 0 ? size_t((heads - 1) * stride + rows * Dp) * element : 0;
}

// The preparation's arrays (prepare.h PrepareParams) as guarded regions of the extents it may touch: k and v
// [B, Hkv, C + L, D] at their strides, the control rows' copies [BH, C, Dp], the body rows' arrays [BH, L - row0,
// Dp] and the block means [BH, blocks from row0 / G, Dp] at the call's head strides, the rope tables [L, half]
// (the conditioning ones where k_cond is written); the pointers remapped. Returns the written arrays' bases.
inline std::vector<void*> guard_prepare(PrepareParams& pp, GuardedArrays& g, size_t element) {
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
inline cudaError_t rope_table_guarded(float* cos_out, float* sin_out, int64_t count, int half, double theta,
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
inline std::vector<void*> guard_select(TopkParams& p, const at::Tensor& q, const at::Tensor& k, const Selection& sel,
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
inline std::vector<void*> guard_plan(HostCall& hc, AttnKernelParams& p, const int32_t*& given, int32_t*& sorted,
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

}  // namespace rangeswa::cuda::simt_ops
