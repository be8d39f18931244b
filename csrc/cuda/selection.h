// The host side of rule 3's selection on the kernels' side (topk_blocks.h): the parameters and workspaces
// of one launch_topk_blocks, and of the prepare op's launch_key_means, on the device of their inputs. Shared
// by the op (attn_api.cpp) and the SIMT emulation (simt/simt_launches.h), so both launch the selection alike.
#pragma once

#include <ATen/ATen.h>

#include "checks.h"
#include "cuda/topk_blocks.h"

namespace rangeswa::cuda {

struct Selection {
  TopkParams p;
  at::Tensor out;               // int32 [B, H_kv, nQb, K], -1 until the launch fills it
  at::Tensor q_means, k_means;  // the launch's workspaces
  bool launch;                  // false: nothing to select (K = 0, L = 0 or no rows); `out` is the answer
};

// q, k with contiguous rows (with_contiguous_rows); key_means: a prepared context's key-block means (float64
// [B, H_kv, nKb, D]), or undefined.
inline Selection selection(const at::Tensor& q, const at::Tensor& k, int64_t control_tokens, const Rules& rules,
                           const at::Tensor& key_means = at::Tensor()) {
  const int64_t B = q.size(0), Hkv = k.size(1), D = q.size(3);
  const int64_t nQb = rules.num_query_blocks(), nKb = rules.num_key_blocks();
  Selection s{};
  s.out = at::full({B, Hkv, nQb, rules.topk}, -1, q.options().dtype(at::kInt));
  s.launch = rules.topk > 0 && rules.L > 0 && s.out.numel() > 0;
  if (!s.launch) return s;
  TopkParams& p = s.p;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.q_strides = row_strides(q);
  p.k_strides = row_strides(k);
  p.out = s.out.data_ptr<int32_t>();
  s.q_means = at::empty({B * Hkv, nQb, D}, q.options().dtype(at::kDouble));
  // The select kernel reads the key means dims-major.
  s.k_means = key_means.defined() ? key_means.reshape({B * Hkv, nKb, D}).transpose(1, 2).contiguous()
                                  : at::empty({B * Hkv, D, nKb}, q.options().dtype(at::kDouble));
  p.q_means = s.q_means.data_ptr<double>();
  p.k_means = s.k_means.data_ptr<double>();
  p.k_means_given = key_means.defined();
  p.B = B;
  p.Hq = q.size(1);
  p.Hkv = Hkv;
  p.N = k.size(2);
  p.C = control_tokens;
  p.first = rules.L - (q.size(2) - control_tokens);
  p.D = D;
  p.rules = rules;
  return s;
}

// The parameters of the prepare op's key means (launch_key_means reads k, its strides and the sizes only).
inline TopkParams key_means_params(const at::Tensor& kc, const ContextParams& cp) {
  TopkParams p{};
  p.k = kc.data_ptr();
  p.k_strides = row_strides(kc);
  p.B = cp.B;
  p.Hkv = p.Hq = cp.Hkv;
  p.N = cp.N;
  p.C = cp.C;
  p.D = cp.D;
  p.rules = cp.rules;
  return p;
}

}  // namespace rangeswa::cuda
