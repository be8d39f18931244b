// Input checks shared by the CPU and CUDA kernels: every op validates its arguments here before
// touching data, and turns them into the small structs the kernels take.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "layout.h"
#include "rules.h"
#include "schema.h"

namespace rangeswa {

struct RopeParams {
  double theta;
  int64_t rotary_dim;
  bool interleaved;  // pairs (2k, 2k+1); otherwise (k, k + rotary_dim/2)
  // The op's inv_freq argument as doubles (rotary_dim / 2 entries), in place of theta's frequencies; empty
  // when not given.
  std::vector<double> inv_freq;

  // The frequency of pair k: inv_freq[k] when given, else theta^(-2k / rotary_dim).
  double frequency(int64_t k) const {
    return inv_freq.empty() ? std::pow(theta, -2.0 * double(k) / double(rotary_dim)) : inv_freq[k];
  }
  // The given frequencies, or null (the device and emulated kernels then use theta).
  const double* given_frequencies() const { return inv_freq.empty() ? nullptr : inv_freq.data(); }
  // One number that names the frequencies, for caches and a prepared context's signature: theta (> 0) when
  // no inv_freq is given, else minus a 52-bit hash of the given values (< 0, so never a theta).
  double frequency_key() const;
  bool same_frequencies(const RopeParams& o) const { return theta == o.theta && inv_freq == o.inv_freq; }
};

// Everything one attention call needs, filled once from the op arguments.
struct AttnParams {
  Rules rules;
  RopeParams rope;
  int64_t B, Hq, Hkv, N, C, L, D;  // k and v hold N = C + L rows
  // q holds Nq = C + Lq rows: the control rows, then body rows first_row .. L - 1 (SPEC section 7;
  // Lq = L and first_row = 0 in an ordinary call). Body index i is q row C + i - first_row.
  int64_t Nq, Lq, first_row;
  double scale;  // resolved: the given scale, or 1/sqrt(D)
  // Section 3 conditioning correction: body<->control positions scaled by T/L, control->body
  // logits shifted by -log(L/T). Active exactly when conditioned(rules, C) (rules.h).
  double control_position_scale;
  double control_bias;
};

// block_summary's arguments: k and v alike [B, H, L, D], summary_block >= 1, valid RoPE numbers.
RopeParams check_block_summary(const at::Tensor& k, const at::Tensor& v, int64_t summary_block, double theta,
                               std::optional<int64_t> rotary_dim, c10::string_view rope_style,
                               const std::optional<at::Tensor>& inv_freq);

Method parse_method(c10::string_view method);
// rotary_dim None rotates the whole head dim. inv_freq, when given: a 1-D float32 / float64 tensor of
// rotary_dim / 2 finite entries on `device` (the inputs'), read here into RopeParams::inv_freq (on CUDA one
// small device-to-host copy).
RopeParams check_rope(int64_t head_dim, double theta, std::optional<int64_t> rotary_dim, c10::string_view rope_style,
                      const std::optional<at::Tensor>& inv_freq, const at::Device& device);
void check_bhnd(const at::Tensor& t, const char* name);
// `positions` of the rope and block_summary ops: 1-D floating, n entries, on the device of `like`.
void check_positions(const at::Tensor& positions, int64_t n, const at::Tensor& like, const char* what);

AttnParams check_attn(RSWA_ATTN_PARAMS);

// The prepared context (csrc/prepared.h) of k and v under one configuration: which arrays it holds and
// the numbers they depend on. check_prepare fills it from the prepare op's arguments.
struct ContextParams {
  Rules rules;   // L, G, Hn, Rb, T, method, g: everything but the per-call window, K, Qb, causal block
  RopeParams rope;
  int64_t B, Hkv, N, C, L, D;
  int64_t first_key;  // the arrays hold rows (blocks, key blocks) from first_key on
  double position_scale;  // T / L of the conditioning positions, 1 without them
  bool keys_grp, keys_cond, summaries, sums_grp, means;
};

ContextParams check_prepare(RSWA_PREPARE_PARAMS);

// The signature of a context (prepared.h kSignatureNames) for these numbers.
std::vector<double> context_signature(const Rules& rules, const RopeParams& rope, int64_t B, int64_t Hkv, int64_t C,
                                      int64_t D);

// An attn call's prepared context: the list's length, its signature against the call, and every array
// the call reads present, on k's device, in `dtype`, [B, Hkv, rows, D] with contiguous rows `row_stride`
// elements apart (D on the CPU; the kernel's padded head dim on CUDA) and any batch / head strides. Arrays
// the call does not read are not looked at.
void check_prepared(const at::TensorList& prepared, const AttnParams& p, const at::Tensor& k, at::ScalarType dtype,
                    bool prefix_sums, int64_t row_stride);

// `t` itself when its last dim is contiguous (any batch / head / row strides), else a contiguous copy;
// kernels then read it through row_strides.
at::Tensor with_contiguous_rows(const at::Tensor& t);
// The batch / head / row strides of a [B, H, N, D] tensor with contiguous last dim.
RowStrides row_strides(const at::Tensor& t);

// Retrieval arguments shared by topk_blocks and attn; returns the rules with only the retrieval
// fields meaningful.
Rules check_topk(const at::Tensor& q, const at::Tensor& k, int64_t control_tokens, int64_t window,
                 int64_t summary_block, int64_t retrieval_block, int64_t query_block, int64_t topk,
                 int64_t causal_block);

// Section 2 rule 3 on user-given blocks: int32 [B, H_kv, nQb, K'], each entry -1 or a candidate
// key block, no block twice in one row. `retrieved` must be on the CPU.
void check_retrieved_values(const at::Tensor& retrieved, const Rules& rules);

}  // namespace rangeswa
