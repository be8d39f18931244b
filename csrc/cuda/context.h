// A prepared context (csrc/prepared.h) on the CUDA kernels' side, host code shared by the op entry points
// (attn_api.cpp) and the host emulation (emulator/host_call.h, plan_emulator.cu), so that both run one
// copy of it: what attn requires of a context, the arrays a call takes from one, and the layout of the
// arrays the prepare op writes (rows padded to the kernel's head dim Dp, rows from first_key on).
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "checks.h"
#include "cuda/attn_setup.h"
#include "cuda/prepare.h"
#include "prepared.h"
#include "schema.h"
#include "varlen.h"

namespace rangeswa::cuda {

// check_prepared with rows Dp apart (the prepare op pads them), plus one head stride per kind of array
// and batches Hkv heads apart: the kernel steps every body array by one stride and every summary array
// by another (AttnBuffers key_stride, sum_stride), so a cache must give each kind one capacity.
inline void check_prepared_cuda(const at::TensorList& prepared, const AttnParams& ap, const at::Tensor& k,
                                int32_t Dp) {
  check_prepared(prepared, ap, k, k.scalar_type(), /*prefix_sums=*/true, Dp);
  auto same_stride = [&](std::initializer_list<int> slots, const char* what) {
    int64_t stride = -1;
    for (int slot : slots) {
      const at::Tensor& t = prepared[slot];
      if (t.numel() == 0) continue;
      TORCH_CHECK_VALUE(t.stride(0) == ap.Hkv * t.stride(1), "prepared[", slot, "] must hold its KV heads at one stride "
                        "(batch stride = H_kv x head stride), got strides ", t.strides());
      TORCH_CHECK_VALUE(stride < 0 || t.stride(1) == stride, "the ", what, " arrays of prepared must share one head "
                        "stride (one cache's capacity), got ", t.stride(1), " and ", stride);
      stride = t.stride(1);
    }
  };
  same_stride({kKeysNat, kKeysGrp, kKeysCond, kPrefixNat, kPrefixGrp}, "body key");
  same_stride({kSumKeys, kSumKeysGrp, kSumValues}, "summary");
  // The kernel copies whole padded rows of Dp elements in 16-byte pieces (cp.async): each array starts on
  // 16 bytes, its strides are whole pieces, and its storage holds the last row's padding too. The padding
  // columns [D, Dp) are read and must hold zeros, as the prepare op's arrays do (not checked: a look at
  // the values would wait for the device).
  for (int slot : {kKeysNat, kKeysGrp, kKeysCond, kSumKeys, kSumKeysGrp, kSumValues, kPrefixNat, kPrefixGrp}) {
    const at::Tensor& t = prepared[slot];
    if (t.numel() == 0) continue;
    const int64_t bytes = t.element_size();
    const bool aligned = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && (t.stride(0) * bytes) % 16 == 0 &&
                         (t.stride(1) * bytes) % 16 == 0 && (t.stride(2) * bytes) % 16 == 0;
    TORCH_CHECK_VALUE(aligned, "prepared[", slot, "] must start on 16 bytes with strides of whole 16-byte pieces (the "
                      "CUDA kernel copies its rows in 16-byte pieces), got address ", t.data_ptr(), " and strides ",
                      t.strides(), "; pass the prepare op's arrays or views of whole rows of them");
    int64_t last = t.storage_offset();  // element offset of the last row's first element
    for (int d = 0; d < 3; ++d) last += (t.size(d) - 1) * t.stride(d);
    TORCH_CHECK_VALUE(int64_t(t.storage().nbytes()) >= (last + Dp) * bytes, "prepared[", slot, "]'s storage ends ",
                      "before its last row's padding to ", Dp, " elements (the CUDA kernel reads whole padded rows)");
  }
}

// A call with a context reads every array computed from k alone from it (a checked context) and writes
// only the control rows and the values itself: sets those pointers and strides of `buf` and leaves the
// call's own preparation `pp` just that work.
inline void use_context(const at::TensorList& prepared, const AttnParams& ap, const AttnSetup& s, AttnBuffers& buf) {
  auto slot = [&](int x, bool needed) -> void* { return needed ? prepared[x].data_ptr() : nullptr; };
  buf.k_nat = slot(kKeysNat, ap.L > 0);
  buf.k_grp = slot(kKeysGrp, s.grouped_keys);
  buf.k_cond = slot(kKeysCond, s.cond_keys);
  buf.s_nat = slot(kSumKeys, s.summaries);
  buf.s_v = slot(kSumValues, s.summaries);
  buf.s_grp = slot(kSumKeysGrp, s.grouped_summaries);
  buf.p_nat = slot(kPrefixNat, s.prefix);
  buf.p_grp = slot(kPrefixGrp, s.prefix);
  buf.key_stride = prepared[kKeysNat].numel() > 0 ? prepared[kKeysNat].stride(1) : 0;
  buf.sum_stride = s.summaries ? prepared[kSumKeys].stride(1) : 0;
}

// A call without a context prepares those arrays itself: `array(needed, rows)` gives one array of `rows`
// rows of Dp elements per KV head (null when not needed), and the head strides are the call's own.
template <typename Array>
void own_arrays(const AttnParams& ap, const AttnSetup& s, AttnBuffers& buf, const Array& array) {
  buf.k_nat = array(ap.L > 0, ap.L);
  buf.k_grp = array(s.grouped_keys, ap.L);
  if (!buf.cond_raw) buf.k_cond = array(s.cond_keys, ap.L);  // attn_setup.h cond_from_keys
  buf.s_nat = array(s.summaries, s.geo.nG);
  buf.s_v = array(s.summaries, s.geo.nG);
  buf.s_grp = array(s.grouped_summaries, s.geo.nG);
  buf.p_nat = array(s.prefix, ap.L);
  buf.p_grp = array(s.prefix, ap.L);
  buf.key_stride = ap.L * s.Dp;
  buf.sum_stride = int64_t(s.geo.nG) * s.Dp;
}

// The arrays of one call, as the op (attn_api.cpp stage_call) and the emulations (emulator/host_call.h build) stage
// them: `buf` holds q, k, v with contiguous rows (k_bytes, v_bytes per element) and their strides; `array(needed,
// rows)` gives one array of `rows` rows of Dp elements per KV head (null when not needed). The control rows' copies,
// the body values (v itself where the kernel reads it in place), then every array computed from k alone: a prepared
// context's, or the call's own (the control rows' body keys k itself where the control CTAs rotate them).
template <typename Array>
void stage_arrays(const AttnParams& ap, const AttnSetup& s, AttnBuffers& buf,
                  const std::optional<at::TensorList>& prepared, int64_t k_bytes, int64_t v_bytes, const Array& array) {
  buf.k_ctrl = array(ap.C > 0, ap.C);
  buf.v_ctrl = array(ap.C > 0, ap.C);
  body_values(ap, s, buf, v_bytes, array);
  if (prepared.has_value()) {
    use_context(*prepared, ap, s, buf);
  } else {
    cond_from_keys(ap, s, buf, k_bytes);
    own_arrays(ap, s, buf, array);
  }
}

// The prepare op's arrays for body rows [first_key, L): the call's setup for the context's numbers, the
// output list (each slot a fresh [B, Hkv, rows, D] view of zeroed [.., Dp] storage on k's device, or empty)
// and the buffers prepare_unit writes. The caller sets the rope tables in `buf`, then runs
// prepare_params() over the body units, and fills key_means and the signature.
struct ContextLayout {
  AttnParams ap;
  AttnSetup s;
  int64_t first_key;
  std::vector<at::Tensor> out;
  AttnBuffers buf;

  PrepareParams prepare_params() const {
    PrepareParams pp = cuda::prepare_params(ap, s, buf);
    const int64_t block0 = first_key / s.geo.G;
    pp.row0 = int32_t(first_key);
    pp.body_stride = (ap.L - first_key) * s.Dp;
    pp.sum_stride = (s.geo.nG - block0) * s.Dp;
    return pp;
  }
};

// The layout with its arrays from `array(c, slot, needed, rows)` (a pointer to `rows` rows of Dp elements per KV
// head, null when not needed; it sets c.out[slot]).
template <typename Array>
inline ContextLayout context_layout_with(const ContextParams& cp, const at::Tensor& kc, const at::Tensor& vc,
                                         int64_t first_key, const Array& array_of) {
  ContextLayout c{};
  AttnParams& ap = c.ap;
  ap.rules = cp.rules;
  ap.rope = cp.rope;
  ap.B = cp.B;
  ap.Hq = ap.Hkv = cp.Hkv;
  ap.N = ap.Nq = cp.N;
  ap.C = cp.C;
  ap.L = ap.Lq = cp.L;
  ap.D = cp.D;
  ap.scale = 1.0;
  ap.control_position_scale = cp.position_scale;
  c.s = setup_attn(ap, 0);
  c.first_key = first_key;
  const AttnSetup& s = c.s;
  const int64_t L = cp.L, nG = s.geo.nG, row0 = first_key, block0 = first_key / s.geo.G;
  for (int slot = 0; slot < kPreparedSlots; ++slot) c.out.push_back(at::empty({0}, kc.options()));
  auto array = [&](int slot, bool needed, int64_t rows) -> void* {
    if (!needed || rows == 0) return nullptr;
    return array_of(c, slot, needed, rows);
  };
  AttnBuffers& buf = c.buf;
  buf.k = kc.data_ptr();
  buf.v = vc.data_ptr();
  buf.k_strides = row_strides(kc);
  buf.v_strides = row_strides(vc);
  buf.k_nat = array(kKeysNat, L > 0, L - row0);
  buf.k_grp = array(kKeysGrp, s.grouped_keys, L - row0);
  buf.k_cond = array(kKeysCond, s.cond_keys, L - row0);
  buf.s_nat = array(kSumKeys, s.summaries, nG - block0);
  buf.s_v = array(kSumValues, s.summaries, nG - block0);
  buf.s_grp = array(kSumKeysGrp, s.grouped_summaries, nG - block0);
  buf.p_nat = array(kPrefixNat, s.prefix, L - row0);
  buf.p_grp = array(kPrefixGrp, s.prefix, L - row0);
  return c;
}

inline ContextLayout context_layout(const ContextParams& cp, const at::Tensor& kc, const at::Tensor& vc,
                                    int64_t first_key) {
  return context_layout_with(cp, kc, vc, first_key, [&](ContextLayout& c, int slot, bool, int64_t rows) -> void* {
    at::Tensor storage = at::zeros({cp.B, cp.Hkv, rows, c.s.Dp}, kc.options());
    c.out[slot] = storage.narrow(3, 0, cp.D);
    return storage.data_ptr();
  });
}

// A packed prepare op (csrc/varlen.h, cu_seqlens_k) in shared launches: the packed arrays (zeroed, rows Dp
// wide, those of packed_slots) and every sequence's layout writing straight into its rows of them, so that one
// preparation launch (per kernel variant) and one key-means launch serve every sequence (docs/cuda.md "Packed
// calls"). A sequence's PrepareParams step the packed arrays' head strides.
struct PackedContextLayout {
  std::vector<at::Tensor> out;      // the packed list, its signature not yet set
  std::vector<ContextLayout> seqs;  // per sequence, in order
  std::vector<SequenceRows> rows;
  int64_t body_rows = 0, sum_rows = 0, mean_rows = 0, Dp = 0;

  PrepareParams prepare_params(size_t s) const {
    PrepareParams pp = seqs[s].prepare_params();
    pp.body_stride = body_rows * Dp;
    pp.sum_stride = sum_rows * Dp;
    return pp;
  }
  // Sequence s's key means: its first row of the packed array (rows of D float64), and the rows per KV head.
  double* key_means(size_t s) const {
    return out[kKeyMeans].numel() > 0 ? out[kKeyMeans].data_ptr<double>() + rows[s].means0 * out[kKeyMeans].size(3)
                                      : nullptr;
  }
};

// kc, vc: the packed k and v with contiguous rows; cps: each sequence's checked prepare (its rows, its C_s);
// has: the packed arrays (varlen.h packed_slots).
inline PackedContextLayout packed_context_layout(const at::Tensor& kc, const at::Tensor& vc, const Packed& pk,
                                                 const std::vector<ContextParams>& cps,
                                                 const std::array<bool, kPreparedSlots>& has, int64_t G, int64_t Rb) {
  PackedContextLayout c;
  const int64_t total = kc.size(2), Hkv = kc.size(1), D = kc.size(3);
  c.Dp = padded_head_dim(D);
  c.rows = sequence_rows(pk, G, Rb);
  c.body_rows = total;
  c.sum_rows = packed_sum_rows(total, pk.S, G);
  c.mean_rows = packed_sum_rows(total, pk.S, Rb);
  for (int slot = 0; slot < kSignature; ++slot) {
    const bool body = is_body_slot(slot);
    if (!has[slot]) {
      // (as varlen.h prepare_sequences leaves an array no sequence has)
      const at::ScalarType type = slot == kKeyMeans ? at::kDouble : kc.is_cpu() ? at::kFloat : kc.scalar_type();
      c.out.push_back(at::empty({0}, kc.options().dtype(type)));
    } else if (slot == kKeyMeans) {
      c.out.push_back(at::zeros({1, Hkv, c.mean_rows, D}, kc.options().dtype(at::kDouble)));
    } else {
      c.out.push_back(at::zeros({1, Hkv, body ? c.body_rows : c.sum_rows, c.Dp}, kc.options()).narrow(3, 0, D));
    }
  }
  c.out.push_back(at::Tensor());  // the signature
  for (int64_t s = 0; s < pk.S; ++s) {
    const SequenceRows& r = c.rows[s];
    const at::Tensor ks = kc.narrow(2, pk.k0[s], pk.nk[s]), vs = vc.narrow(2, pk.k0[s], pk.nk[s]);
    c.seqs.push_back(context_layout_with(cps[s], ks, vs, 0, [&](ContextLayout& own, int slot, bool, int64_t) -> void* {
      TORCH_CHECK(has[slot], "prepare: sequence ", s, " writes array ", slot, ", which the packed context lacks");
      own.out[slot] = c.out[slot];
      const int64_t row = is_body_slot(slot) ? r.body0 : r.sums0;
      return static_cast<char*>(c.out[slot].data_ptr()) + row * c.Dp * int64_t(c.out[slot].element_size());
    }));
  }
  return c;
}

// A packed prepare op, its host side shared by the op (attn_api.cpp) and its emulations: the layout's checks
// (first_key 0, varlen.h check_packed, check_prepare of the whole packed k for packed_slots), each sequence
// checked as its own prepare by `check_one(k_s, v_s, C_s)` (a ContextParams; errors name the sequence), the
// packed layout, then `run(c, cps, kc)` writes every sequence's arrays (the op: its shared launches), and the
// signature rows. Returns the packed list.
template <typename CheckOne, typename Run>
std::vector<at::Tensor> packed_prepare(RSWA_PREPARE_PARAMS RSWA_VARLEN_PREPARE_PARAMS, const CheckOne& check_one,
                                       const Run& run) {
  const Packed pk = check_packed(nullptr, k, std::nullopt, cu_seqlens_k, control_counts, control_tokens);
  TORCH_CHECK_VALUE(first_key == 0, "first_key must be 0 with cu_seqlens_k (a packed context is prepared whole), "
                    "got ", first_key);
  const ContextParams longest = [&](const at::Tensor& k, const at::Tensor& v, int64_t control_tokens) {
    return check_prepare(RSWA_PREPARE_ARGS);
  }(k, v, 0);
  std::vector<ContextParams> cps;
  for (int64_t s = 0; s < pk.S; ++s)
    cps.push_back(for_sequence(s, [&] {
      return check_one(k.narrow(2, pk.k0[s], pk.nk[s]), v.narrow(2, pk.k0[s], pk.nk[s]), pk.C[s]);
    }));
  const Rules& R = longest.rules;
  const at::Tensor kc = with_contiguous_rows(k), vc = with_contiguous_rows(v);
  const bool controls = control_counts.has_value() || control_tokens > 0;
  PackedContextLayout c = packed_context_layout(kc, vc, pk, cps, packed_slots(longest, controls, /*prefix=*/true),
                                                R.G, R.Rb);
  run(c, cps, kc, pk);
  at::Tensor sig = at::empty({pk.S, kSignatureSize}, at::TensorOptions().dtype(at::kDouble));
  for (int64_t s = 0; s < pk.S; ++s) {
    const ContextParams& cp = cps[s];
    const std::vector<double> row = context_signature(cp.rules, cp.rope, cp.B, cp.Hkv, cp.C, cp.D);
    sig[s].copy_(at::tensor(at::ArrayRef<double>(row), at::TensorOptions().dtype(at::kDouble)));
  }
  c.out[kSignature] = sig;
  return c.out;
}

}  // namespace rangeswa::cuda
