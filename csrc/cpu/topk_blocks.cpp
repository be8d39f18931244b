// SPEC section 2 rule 3 on the CPU: per query block and KV head, the top-K candidate key blocks.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "cpu/kernels.h"

namespace rangeswa::cpu {

// mean(k over key block kb), pre-RoPE, in double, for key blocks [kb0, nKb) of one (batch, KV head):
// the keys of a block summed in order, then divided once by its size.
static void key_block_means(const float* kbody, int64_t row_stride, const Rules& rules, int64_t D, int64_t kb0,
                            double* out) {
  const int64_t L = rules.L, nKb = rules.num_key_blocks();
  std::fill(out, out + (nKb - kb0) * D, 0.0);
  for (int64_t j = kb0 * rules.Rb; j < L; ++j)
    for (int64_t c = 0; c < D; ++c) out[(j / rules.Rb - kb0) * D + c] += kbody[j * row_stride + c];
  for (int64_t kb = kb0; kb < nKb; ++kb) {
    double n = double(std::min(L, kb * rules.Rb + rules.Rb) - kb * rules.Rb);
    for (int64_t c = 0; c < D; ++c) out[(kb - kb0) * D + c] /= n;
  }
}

at::Tensor key_means_float(const at::Tensor& kf, int64_t control_tokens, const Rules& rules, int64_t first_block) {
  const int64_t B = kf.size(0), Hkv = kf.size(1), D = kf.size(3), nKb = rules.num_key_blocks();
  at::Tensor out = at::empty({B, Hkv, nKb - first_block, D}, kf.options().dtype(at::kDouble));
  const float* k = kf.data_ptr<float>();
  const RowStrides ks = row_strides(kf);
  double* o = out.data_ptr<double>();
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task)
      key_block_means(k + ks.at(task / Hkv, task % Hkv, control_tokens), ks.row, rules, D, first_block,
                      o + task * (nKb - first_block) * D);
  });
  return out;
}

at::Tensor topk_blocks_float(const at::Tensor& qf, const at::Tensor& kf, int64_t control_tokens, const Rules& rules,
                             const at::Tensor& key_means) {
  const int64_t B = qf.size(0), Hq = qf.size(1), Hkv = kf.size(1), D = qf.size(3);
  const int64_t group = Hq / Hkv, L = rules.L, K = rules.topk;
  // q may hold only the last body rows (SPEC section 7): body row i is q row control_tokens + i - first.
  const int64_t first = L - (qf.size(2) - control_tokens);
  const int64_t nQb = rules.num_query_blocks(), nKb = rules.num_key_blocks();
  at::Tensor out = at::full({B, Hkv, nQb, K}, -1, qf.options().dtype(at::kInt));
  if (K == 0 || L == 0) return out;
  const float* q = qf.data_ptr<float>();
  const float* k = kf.data_ptr<float>();
  const RowStrides qs = row_strides(qf), ks = row_strides(kf);
  int32_t* o = out.data_ptr<int32_t>();
  // Given key means (a prepared context's) are read as they are: the same numbers this would compute.
  const at::Tensor given = key_means.defined() ? key_means.contiguous() : at::Tensor();

  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> kmean(nKb * D), qmean(D);
    std::vector<std::pair<double, int64_t>> scored;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / Hkv, hkv = task % Hkv;
      if (given.defined())
        std::copy_n(given.data_ptr<double>() + task * nKb * D, nKb * D, kmean.data());
      else
        key_block_means(k + ks.at(b, hkv, control_tokens), ks.row, rules, D, 0, kmean.data());
      for (int64_t qb = 0; qb < nQb; ++qb) {
        // mean(q over the rows of qb that q holds and the query heads of the group), pre-RoPE; a block
        // with none of its rows in q retrieves nothing.
        const int64_t r0 = std::max(qb * rules.Qb, first), r1 = std::min(L, qb * rules.Qb + rules.Qb);
        if (r1 <= r0) continue;
        std::fill(qmean.begin(), qmean.end(), 0.0);
        for (int64_t h = hkv * group; h < (hkv + 1) * group; ++h) {
          for (int64_t i = r0; i < r1; ++i) {
            const float* row = q + qs.at(b, h, control_tokens + i - first);
            for (int64_t c = 0; c < D; ++c) qmean[c] += row[c];
          }
        }
        for (int64_t c = 0; c < D; ++c) qmean[c] /= double((r1 - r0) * group);
        scored.clear();
        for (int64_t kb = 0; kb < nKb; ++kb) {
          if (!rules.is_candidate(qb, kb)) continue;
          double s = 0.0;
          for (int64_t c = 0; c < D; ++c) s += qmean[c] * kmean[kb * D + c];
          scored.emplace_back(s, kb);
        }
        const int64_t take = std::min<int64_t>(K, int64_t(scored.size()));
        // Highest score first; equal scores keep the lower block first.
        std::partial_sort(scored.begin(), scored.begin() + take, scored.end(),
                          [](const auto& x, const auto& y) { return x.first > y.first || (x.first == y.first && x.second < y.second); });
        int32_t* row = o + ((b * Hkv + hkv) * nQb + qb) * K;
        for (int64_t c = 0; c < take; ++c) row[c] = int32_t(scored[c].second);
      }
    }
  });
  return out;
}

namespace {

at::Tensor topk_blocks_cpu(const at::Tensor& q, const at::Tensor& k, int64_t control_tokens, int64_t window,
                           int64_t summary_block, int64_t retrieval_block, int64_t query_block, int64_t topk,
                           int64_t causal_block) {
  Rules rules = check_topk(q, k, control_tokens, window, summary_block, retrieval_block, query_block, topk,
                           causal_block);
  return topk_blocks_float(with_contiguous_rows(q.to(at::kFloat)), with_contiguous_rows(k.to(at::kFloat)),
                           control_tokens, rules);
}

}  // namespace

TORCH_LIBRARY_IMPL(rangeswa, CPU, m) { m.impl("topk_blocks", &topk_blocks_cpu); }

}  // namespace rangeswa::cpu
