// Variable-length (packed) calls of attn and prepare (issue 31): the checks of cu_seqlens_q / cu_seqlens_k /
// control_counts, the layout of a packed prepared context, a packed attn call's sequences as views (the CUDA op
// and its SIMT emulation check each as its own call, then run them all in shared launches: attn_api.cpp
// attn_cuda_packed; the CPU kernel runs all sequences in one parallel region, csrc/cpu/attn.cpp), and the
// per-sequence loop of the CPU kernel's packed prepare (the CUDA op writes every sequence in place in shared
// launches: cuda/context.h packed_prepare). Header-only, so that every build that compiles checks.cpp needs
// nothing more.
//
// Layout (csrc/schema.h): q [1, H_q, total_q, D], k and v [1, H_kv, total_k, D]; sequence s holds q rows
// [cu_seqlens_q[s], cu_seqlens_q[s + 1]) and k / v rows [cu_seqlens_k[s], cu_seqlens_k[s + 1]), its C_s control
// rows first. The output and log-sum-exp have q's packed rows. Each sequence is exactly the call
// attn(q_s, k_s, v_s, control_tokens = C_s) on its own rows (docs/spec_decisions.md item 28).
//
// A packed prepared context (prepare with cu_seqlens_k) is the list of csrc/prepared.h with every array's rows
// packed, so that its shapes follow from k's shape and S alone (the fake kernels need no values):
//   body arrays     [1, H_kv, total_k, D]: sequence s's body row j at row cu_seqlens_k[s] + C_s + j
//                   (control rows are zeros, never read);
//   summary arrays  [1, H_kv, (total_k + S (G - 1)) / G, D]: sequence s's block b at sum_{t<s} ceil(L_t / G) + b;
//   key means       [1, H_kv, (total_k + S (Rb - 1)) / Rb, D] (float64), likewise with Rb;
//   signature       [S, kSignatureSize] float64 on the CPU: row s is sequence s's signature.
// An array is present when some sequence of at most total_k body tokens could read it (packed_slots); a
// sequence that does not read it leaves its rows zero. first_key must be 0 with cu_seqlens_k.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <string>
#include <vector>

#include "checks.h"
#include "prepared.h"

namespace rangeswa {

// The sequences of a packed call, read from the offsets (on the host: a CUDA call copies them, one sync).
struct Packed {
  int64_t S = 0;
  std::vector<int64_t> q0, nq, k0, nk, C;  // per sequence: first q row, q rows, first k row, k rows, control rows
};

inline bool is_packed(const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
                      const std::optional<at::Tensor>& control_counts) {
  return cu_seqlens_q.has_value() || cu_seqlens_k.has_value() || control_counts.has_value();
}

// An integer 1-D tensor's values on the host.
inline std::vector<int64_t> host_values(const at::Tensor& t, const char* name, int64_t count, const char* what) {
  TORCH_CHECK_VALUE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, name,
                    " must be an int32 or int64 tensor, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1 && (count < 0 || t.size(0) == count), name, " must be a 1-D tensor", count < 0 ? "" : " of ",
                    count < 0 ? std::string() : std::to_string(count) + " entries (" + what + ")", ", got shape ",
                    t.sizes());
  const at::Tensor h = t.to(at::kCPU, at::kLong).contiguous();
  const int64_t* d = h.data_ptr<int64_t>();
  return std::vector<int64_t>(d, d + h.numel());
}

// Offsets [S + 1]: 0 first, non-decreasing, the last the packed row count.
inline std::vector<int64_t> check_offsets(const at::Tensor& cu, const char* name, int64_t total, const char* rows) {
  std::vector<int64_t> o = host_values(cu, name, -1, "");
  TORCH_CHECK_VALUE(o.size() >= 2, name, " must hold S + 1 >= 2 offsets (at least one sequence), got ", o.size());
  TORCH_CHECK_VALUE(o.front() == 0, name, "[0] must be 0, got ", o.front());
  for (size_t s = 0; s + 1 < o.size(); ++s)
    TORCH_CHECK_VALUE(o[s + 1] >= o[s], name, " must be non-decreasing (sequence lengths >= 0), got ", name, "[",
                      s + 1, "] = ", o[s + 1], " < ", name, "[", s, "] = ", o[s]);
  TORCH_CHECK_VALUE(o.back() == total, name, "[-1] must equal the packed ", rows, " (", total, "), got ", o.back());
  return o;
}

// The packed layout's arguments; q is null for prepare (which takes no cu_seqlens_q).
inline Packed check_packed(const at::Tensor* q, const at::Tensor& k, const std::optional<at::Tensor>& cu_seqlens_q,
                           const std::optional<at::Tensor>& cu_seqlens_k,
                           const std::optional<at::Tensor>& control_counts, int64_t control_tokens) {
  TORCH_CHECK_VALUE(cu_seqlens_k.has_value() && (q == nullptr || cu_seqlens_q.has_value()),
                    q == nullptr ? "control_counts needs cu_seqlens_k (the packed layout)"
                                 : "a packed call needs both cu_seqlens_q and cu_seqlens_k (control_counts alone is "
                                   "not a packed call)");
  check_bhnd(k, "k");
  TORCH_CHECK_VALUE(k.size(0) == 1, "with cu_seqlens, k and v must be packed as [1, H_kv, total_k, D] (batch 1), "
                    "got k of shape ", k.sizes());
  if (q != nullptr) {
    check_bhnd(*q, "q");
    TORCH_CHECK_VALUE(q->size(0) == 1, "with cu_seqlens, q must be packed as [1, H_q, total_q, D] (batch 1), got "
                      "q of shape ", q->sizes());
  }
  Packed p;
  const std::vector<int64_t> ok = check_offsets(*cu_seqlens_k, "cu_seqlens_k", k.size(2), "k rows");
  p.S = int64_t(ok.size()) - 1;
  std::vector<int64_t> oq = ok;
  if (q != nullptr) {
    oq = check_offsets(*cu_seqlens_q, "cu_seqlens_q", q->size(2), "q rows");
    TORCH_CHECK_VALUE(oq.size() == ok.size(), "cu_seqlens_q and cu_seqlens_k must describe the same sequences, got ",
                      oq.size() - 1, " and ", p.S, " sequences");
  }
  std::vector<int64_t> counts(p.S, control_tokens);
  if (control_counts.has_value()) {
    TORCH_CHECK_VALUE(control_tokens == 0, "give the control rows either as control_tokens (every sequence) or as "
                      "control_counts (per sequence), not both; got control_tokens = ", control_tokens);
    counts = host_values(*control_counts, "control_counts", p.S, "one per sequence");
  }
  for (int64_t s = 0; s < p.S; ++s) {
    p.q0.push_back(oq[s]);
    p.nq.push_back(oq[s + 1] - oq[s]);
    p.k0.push_back(ok[s]);
    p.nk.push_back(ok[s + 1] - ok[s]);
    TORCH_CHECK_VALUE(counts[s] >= 0 && counts[s] <= p.nk.back(), "sequence ", s, ": its control rows (",
                      counts[s], ") must lie in [0, its k rows = ", p.nk.back(), "]");
    p.C.push_back(counts[s]);
  }
  return p;
}

// Runs `check` (a per-sequence check or call), naming the sequence in any error it raises.
template <typename Fn>
auto for_sequence(int64_t s, Fn&& check) -> decltype(check()) {
  try {
    return check();
  } catch (const c10::ValueError& e) {
    TORCH_CHECK_VALUE(false, "sequence ", s, " of the packed call: ", e.what_without_backtrace());
  } catch (const c10::IndexError& e) {
    TORCH_CHECK_INDEX(false, "sequence ", s, " of the packed call: ", e.what_without_backtrace());
  }
}

// Rows of the packed context's arrays of each kind: body rows, summaries, key means.
inline int64_t packed_sum_rows(int64_t total_k, int64_t S, int64_t G) { return (total_k + S * (G - 1)) / G; }

// Which arrays a packed context holds (see the top of this file): those that a sequence of at most total_k body
// tokens, with control rows when any sequence may have some, would read. `prefix` is the device's (CUDA: the
// in-block prefix sums of far summaries).
inline std::array<bool, kPreparedSlots> packed_slots(const ContextParams& longest, bool controls, bool prefix) {
  const Rules& R = longest.rules;
  const bool body = longest.L > 0, grp = body && longest.keys_grp, cond = body && R.extrapolating && R.cond_correction &&
                                                                     controls;
  const bool sums = body && longest.summaries;
  std::array<bool, kPreparedSlots> has{};
  has[kKeysNat] = body;
  has[kKeysGrp] = grp;
  has[kKeysCond] = cond;
  has[kSumKeys] = has[kSumValues] = sums;
  has[kSumKeysGrp] = sums && grp;
  has[kPrefixNat] = has[kPrefixGrp] = prefix && sums && grp && R.far_summaries;
  has[kKeyMeans] = body && longest.means;
  return has;
}

// Row offsets of sequence s in each kind of packed array, and its row counts.
struct SequenceRows {
  int64_t body0, sums0, means0;
  int64_t L, nG, nKb;
};

inline std::vector<SequenceRows> sequence_rows(const Packed& pk, int64_t G, int64_t Rb) {
  std::vector<SequenceRows> rows;
  int64_t sums = 0, means = 0;
  for (int64_t s = 0; s < pk.S; ++s) {
    const int64_t L = pk.nk[s] - pk.C[s];
    rows.push_back({pk.k0[s] + pk.C[s], sums, means, L, ceil_div(L, G), ceil_div(L, Rb)});
    sums += ceil_div(L, G);
    means += ceil_div(L, Rb);
  }
  return rows;
}

inline bool is_body_slot(int slot) {
  return slot == kKeysNat || slot == kKeysGrp || slot == kKeysCond || slot == kPrefixNat || slot == kPrefixGrp;
}
inline bool is_sum_slot(int slot) { return slot == kSumKeys || slot == kSumKeysGrp || slot == kSumValues; }

// Sequence s's own context (csrc/prepared.h, batch 1): views of the packed arrays' rows. The packed list's
// shapes are checked here; the per-sequence check_prepared then checks each view against the sequence's call.
inline std::vector<at::Tensor> sequence_context(const at::TensorList& prepared, const Packed& pk,
                                                const std::vector<SequenceRows>& rows, int64_t s, int64_t total_k,
                                                int64_t G, int64_t Rb) {
  TORCH_CHECK_VALUE(prepared.size() == kPreparedSlots, "prepared must be the list the prepare op returns (",
                    int(kPreparedSlots), " tensors), got ", prepared.size(), " tensors");
  const at::Tensor& sig = prepared[kSignature];
  TORCH_CHECK_VALUE(sig.dim() == 2 && sig.size(0) == pk.S && sig.size(1) == kSignatureSize,
                    "a packed call's prepared context must come from prepare with cu_seqlens_k (a signature of [S, ",
                    kSignatureSize, "] = [", pk.S, ", ", kSignatureSize, "]), got a signature of shape ", sig.sizes());
  std::vector<at::Tensor> out;
  const SequenceRows& r = rows[s];
  for (int slot = 0; slot < kSignature; ++slot) {
    const at::Tensor& t = prepared[slot];
    if (t.numel() == 0) {
      out.push_back(t);
      continue;
    }
    const bool body = is_body_slot(slot), sums = is_sum_slot(slot);
    const int64_t packed = body ? total_k : packed_sum_rows(total_k, pk.S, sums ? G : Rb);
    TORCH_CHECK_VALUE(t.dim() == 4 && t.size(0) == 1 && t.size(2) == packed,
                      "prepared[", slot, "] of a packed call must be [1, H_kv, ", packed,
                      ", D] (prepare with the call's cu_seqlens_k and configuration), got shape ", t.sizes());
    out.push_back(t.narrow(2, body ? r.body0 : sums ? r.sums0 : r.means0, body ? r.L : sums ? r.nG : r.nKb));
  }
  out.push_back(sig.select(0, s));
  return out;
}

// The per-sequence loop of a packed prepare: fn(k_s, v_s, C_s) returns the sequence's context, copied into the
// packed arrays (v has k's shape: the caller checks it). `longest` is check_prepare on the whole packed k with no control rows (packed_slots).
template <typename Fn>
std::vector<at::Tensor> prepare_sequences(const at::Tensor& k, const at::Tensor& v, const Packed& pk, const ContextParams& longest,
                                          bool controls, bool prefix, int64_t first_key, Fn&& fn) {
  TORCH_CHECK_VALUE(first_key == 0, "first_key must be 0 with cu_seqlens_k (a packed context is prepared whole), "
                    "got ", first_key);
  const Rules& R = longest.rules;
  const int64_t total = k.size(2), Hkv = k.size(1), D = k.size(3);
  const std::array<bool, kPreparedSlots> has = packed_slots(longest, controls, prefix);
  const std::vector<SequenceRows> rows = sequence_rows(pk, R.G, R.Rb);
  std::vector<std::vector<at::Tensor>> parts;
  for (int64_t s = 0; s < pk.S; ++s)
    parts.push_back(for_sequence(s, [&] { return fn(k.narrow(2, pk.k0[s], pk.nk[s]), v.narrow(2, pk.k0[s], pk.nk[s]), pk.C[s]); }));
  std::vector<at::Tensor> out;
  for (int slot = 0; slot < kSignature; ++slot) {
    const bool body = is_body_slot(slot), sums = is_sum_slot(slot);
    at::ScalarType type = slot == kKeyMeans ? at::kDouble : (k.is_cpu() ? at::kFloat : k.scalar_type());
    if (!has[slot]) {
      out.push_back(at::empty({0}, k.options().dtype(type)));
      continue;
    }
    // The dtype and row stride of the device's arrays (CUDA pads rows to its head dim, and its host emulation
    // keeps the input dtype on the CPU): the first sequence's that has the array.
    int64_t width = D;
    for (const auto& part : parts)
      if (part[slot].numel() > 0) {
        width = part[slot].stride(2);
        type = part[slot].scalar_type();
        break;
      }
    const int64_t packed = body ? total : packed_sum_rows(total, pk.S, sums ? R.G : R.Rb);
    at::Tensor a = at::zeros({1, Hkv, packed, width}, k.options().dtype(type)).narrow(3, 0, D);
    for (int64_t s = 0; s < pk.S; ++s) {
      const at::Tensor& part = parts[s][slot];
      if (part.numel() == 0) continue;
      TORCH_CHECK(part.size(2) == (body ? rows[s].L : sums ? rows[s].nG : rows[s].nKb),
                  "prepare: sequence ", s, " returned ", part.size(2), " rows for array ", slot);
      a.narrow(2, body ? rows[s].body0 : sums ? rows[s].sums0 : rows[s].means0, part.size(2)).copy_(part);
    }
    out.push_back(a);
  }
  at::Tensor sig = at::empty({pk.S, kSignatureSize}, at::TensorOptions().dtype(at::kDouble));
  for (int64_t s = 0; s < pk.S; ++s) sig[s].copy_(parts[s][kSignature]);
  out.push_back(sig);
  return out;
}


// A backend's prepare, packed or not: `one_call(RSWA_PREPARE_ARGS)` prepares one call; a packed one runs it on
// each sequence (prepare_sequences). `prefix`: the backend's contexts hold prefix sums (CUDA and its emulations).
template <typename One>
std::vector<at::Tensor> prepare_packed_or_one(RSWA_PREPARE_PARAMS RSWA_VARLEN_PREPARE_PARAMS, bool prefix, One&& one_call) {
  if (!is_packed(std::nullopt, cu_seqlens_k, control_counts)) return one_call(RSWA_PREPARE_ARGS);
  const Packed pk = check_packed(nullptr, k, std::nullopt, cu_seqlens_k, control_counts, control_tokens);
  // The lambdas' k, v, control_tokens and first_key are one sequence's (or the whole packed k's, for `longest`).
  auto check_longest = [&](const at::Tensor& k, const at::Tensor& v, int64_t control_tokens, int64_t first_key) {
    return check_prepare(RSWA_PREPARE_ARGS);
  };
  const ContextParams longest = check_longest(k, v, 0, 0);
  auto one = [&](const at::Tensor& k, const at::Tensor& v, int64_t control_tokens) {
    const int64_t first_key = 0;
    return one_call(RSWA_PREPARE_ARGS);
  };
  return prepare_sequences(k, v, pk, longest, control_counts.has_value() || control_tokens > 0, prefix, first_key, one);
}

// The checks of a packed attn call's layout (before any per-sequence check): its sequences.
inline Packed check_packed_attn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& retrieved, const std::optional<at::Tensor>& cu_seqlens_q,
                                const std::optional<at::Tensor>& cu_seqlens_k,
                                const std::optional<at::Tensor>& control_counts, int64_t control_tokens,
                                int64_t summary_block, int64_t retrieval_block) {
  TORCH_CHECK_VALUE(!retrieved.has_value(), "retrieved cannot be combined with cu_seqlens: each sequence retrieves "
                    "over its own length; leave retrieved=None");
  const Packed pk = check_packed(&q, k, cu_seqlens_q, cu_seqlens_k, control_counts, control_tokens);
  TORCH_CHECK_VALUE(v.sizes() == k.sizes(), "v must have the shape of k ", k.sizes(), ", got ", v.sizes());
  TORCH_CHECK_VALUE(summary_block >= 1 && retrieval_block >= 1, "summary_block and retrieval_block must be >= 1");
  return pk;
}

// One sequence of a packed attn call with query rows: its index, its rows of q, k, v (views), its control rows
// and its part of a packed prepared context (sequence_context).
struct PackedSequence {
  int64_t s;
  at::Tensor q, k, v;
  int64_t C;
  std::optional<std::vector<at::Tensor>> ctx;
  std::optional<at::TensorList> context() const {
    if (!ctx.has_value()) return std::nullopt;
    return at::TensorList(*ctx);
  }
};

// The sequences of a packed call that have query rows (a sequence without any has no output), in order.
inline std::vector<PackedSequence> packed_sequences(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                    const std::optional<at::TensorList>& prepared, const Packed& pk,
                                                    int64_t G, int64_t Rb) {
  const std::vector<SequenceRows> rows = sequence_rows(pk, G, Rb);
  std::vector<PackedSequence> out;
  for (int64_t s = 0; s < pk.S; ++s) {
    if (pk.nq[s] == 0) continue;
    PackedSequence x{s, q.narrow(2, pk.q0[s], pk.nq[s]), k.narrow(2, pk.k0[s], pk.nk[s]),
                     v.narrow(2, pk.k0[s], pk.nk[s]), pk.C[s], std::nullopt};
    if (prepared.has_value())
      x.ctx = for_sequence(s, [&] { return sequence_context(*prepared, pk, rows, s, k.size(2), G, Rb); });
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace rangeswa
