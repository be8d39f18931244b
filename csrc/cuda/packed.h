// The host side of a packed call's shared launches (csrc/varlen.h; docs/cuda.md "Packed calls"): every
// sequence's own kernel parameters and, per kernel, the first work item of each sequence in the launch
// (attn_params.h PackedLaunch), laid out in one buffer that the op copies to the device once (the SIMT
// emulation reads it where it is). Shared by the op (attn_api.cpp) and the SIMT emulation (simt/simt_attn_ops.h), so
// both run the same launches. Torch-free.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/attn_params.h"
#include "cuda/launch.h"
#include "cuda/prepare.h"
#include "cuda/topk_blocks.h"

namespace rangeswa::cuda {

struct PackedCalls {
  // Per sequence with query rows (in order): its call's parameters (out / lse at its first packed row, Nq the
  // packed rows), its blocks' sort job, its preparation's parameters (prepare_ready'd), and its work in each
  // launch.
  std::vector<AttnKernelParams> seq;
  std::vector<SortJob> jobs;
  std::vector<PrepareParams> prep;
  std::vector<TopkParams> topk;  // its selection's parameters (zero work where it selects nothing)
  // [S + 1] first items per launch (kSort ...): sort rows, plan threads, combine items, the attention kernel's
  // CTAs of the sequences whose body runs on the mma.sync kernel with 2 / 3 K/V stages (a sequence of the other
  // count, or on the sm_90a kernel, has none), and the preparation's CTAs per kernel variant (prepare.h
  // prepare_variant), the selection's block means and top-K CTAs (topk_blocks.h PackedTopk).
  static constexpr int kSort = 0, kPlan = 1, kCombine = 2, kAttn = 3, kPrepare = 5, kMeans = 5 + kPrepareVariants,
                       kSelect = kMeans + 1, kLaunches = kSelect + 1;
  std::vector<int64_t> first[kLaunches];
  size_t smem[2] = {0, 0};  // the largest dynamic shared memory per CTA of each stage count's sequences
  size_t select_smem = 0;   // ... and of the selection kernel
  bool prepare_fits = true;  // every preparation's work items are indexed in 32 bits (prepare_ctas)

  PackedCalls() {
    for (auto& f : first) f.assign(1, 0);
  }
  // Sequence p (its call's parameters) and pp (its preparation's, readied), its selection (null: it selects
  // nothing), the unsorted blocks the sort reads (null: none) and their count per row, whether its body runs on the mma.sync kernel, and
  // that kernel's shared memory for it.
  void add(const AttnKernelParams& p, const PrepareParams& pp, const TopkParams* tp, const Rules& rules,
           const int32_t* given, int32_t given_k, bool mma_body, size_t bytes) {
    seq.push_back(p);
    prep.push_back(pp);
    topk.push_back(tp != nullptr ? *tp : TopkParams{});
    jobs.push_back(SortJob{rules, given, given_k});
    const int64_t heads = int64_t(p.B) * p.Hq;
    auto grow = [&](int x, int64_t n) { first[x].push_back(first[x].back() + n); };
    grow(kSort, p.retrieved != nullptr && p.retrieved_k > 0 ? int64_t(p.B) * p.Hkv * p.nQb : 0);
    grow(kPlan, int64_t(p.B) * p.Hkv * p.body_tiles);
    grow(kCombine, heads * p.geo.C * (p.D + 1));
    for (int x = 0; x < 2; ++x) {
      const bool mine = mma_body && p.kv_stages == x + 2;
      grow(kAttn + x, mine ? int64_t(p.by_ctas_per_head.d) * heads : 0);
      if (mine) smem[x] = std::max(smem[x], bytes);
    }
    const int64_t ctas = prepare_ctas(pp);
    prepare_fits = prepare_fits && ctas >= 0;
    for (int x = 0; x < kPrepareVariants; ++x) grow(kPrepare + x, x == prepare_variant(pp) ? std::max<int64_t>(ctas, 0) : 0);
    grow(kMeans, tp != nullptr ? topk_mean_ctas(*tp) : 0);
    grow(kSelect, tp != nullptr ? topk_select_ctas(*tp) : 0);
    if (tp != nullptr && topk_select_ctas(*tp) > 0) select_smem = std::max(select_smem, topk_blocks_smem_bytes(*tp));
  }
  int32_t S() const { return int32_t(seq.size()); }
  int64_t total(int x) const { return first[x].back(); }

  // The buffer: the parameters, the sort jobs, the preparations' parameters, then the offset arrays, each
  // 16-byte aligned.
  static size_t round(size_t n) { return (n + 15) / 16 * 16; }
  size_t jobs_at() const { return round(seq.size() * sizeof(AttnKernelParams)); }
  size_t prep_at() const { return jobs_at() + round(jobs.size() * sizeof(SortJob)); }
  size_t topk_at() const { return prep_at() + round(prep.size() * sizeof(PrepareParams)); }
  size_t first_at(int x) const {
    return topk_at() + round(topk.size() * sizeof(TopkParams)) + size_t(x) * round((seq.size() + 1) * sizeof(int64_t));
  }
  size_t bytes() const { return first_at(kLaunches); }
  void write(char* out) const {
    std::memset(out, 0, bytes());
    std::memcpy(out, seq.data(), seq.size() * sizeof(AttnKernelParams));
    std::memcpy(out + jobs_at(), jobs.data(), jobs.size() * sizeof(SortJob));
    std::memcpy(out + prep_at(), prep.data(), prep.size() * sizeof(PrepareParams));
    std::memcpy(out + topk_at(), topk.data(), topk.size() * sizeof(TopkParams));
    for (int x = 0; x < kLaunches; ++x) std::memcpy(out + first_at(x), first[x].data(), first[x].size() * sizeof(int64_t));
  }
  // Launch x's sequences over the buffer at `base` (device memory for the op).
  PackedLaunch launch(const char* base, int x) const {
    return PackedLaunch{reinterpret_cast<const AttnKernelParams*>(base),
                        reinterpret_cast<const int64_t*>(base + first_at(x)), S()};
  }
  // The attention kernel's launch x (kAttn or kAttn + 1) over the host's copy: run_attn_packed passes the
  // parameters by value (attn_params.h PackedAttnLaunch).
  PackedLaunch attn_launch(int x) const { return PackedLaunch{seq.data(), first[x].data(), S()}; }
  const SortJob* jobs_in(const char* base) const { return reinterpret_cast<const SortJob*>(base + jobs_at()); }
  PackedPrepare prepare_launch(const char* base, int variant) const {
    return PackedPrepare{reinterpret_cast<const PrepareParams*>(base + prep_at()),
                         reinterpret_cast<const int64_t*>(base + first_at(kPrepare + variant)), S()};
  }
  PackedTopk topk_launch(const char* base, int x) const {  // x: kMeans or kSelect
    return PackedTopk{reinterpret_cast<const TopkParams*>(base + topk_at()),
                      reinterpret_cast<const int64_t*>(base + first_at(x)), S()};
  }
};

// The host side of a packed prepare op's shared launches (attn_api.cpp prepare_cuda_packed, simt/simt_attn_ops.h): every
// sequence's preparation (readied) and key-means job, and the first CTA of each per launch (the preparation per
// kernel variant, then the key means), in one buffer.
struct PackedPrepares {
  std::vector<PrepareParams> prep;
  std::vector<KeyMeansJob> means;
  static constexpr int kMeans = kPrepareVariants, kLaunches = kMeans + 1;
  std::vector<int64_t> first[kLaunches];
  bool fits = true;  // every preparation's work items are indexed in 32 bits (prepare_ctas)

  PackedPrepares() {
    for (auto& f : first) f.assign(1, 0);
  }
  // pp: the sequence's preparation (readied; `prepares`: it has body rows to prepare); job: its key means, when
  // `key_means` (job.p.rules gives its key blocks).
  void add(const PrepareParams& pp, bool prepares, const KeyMeansJob& job, bool key_means) {
    prep.push_back(pp);
    means.push_back(job);
    const int64_t ctas = prepares ? prepare_ctas(pp) : 0;
    fits = fits && ctas >= 0;
    for (int x = 0; x < kPrepareVariants; ++x)
      first[x].push_back(first[x].back() + (prepares && x == prepare_variant(pp) ? std::max<int64_t>(ctas, 0) : 0));
    first[kMeans].push_back(first[kMeans].back() + (key_means ? job.p.rules.num_key_blocks() : 0));
  }
  int32_t S() const { return int32_t(prep.size()); }
  int64_t total(int x) const { return first[x].back(); }
  static size_t round(size_t n) { return (n + 15) / 16 * 16; }
  size_t means_at() const { return round(prep.size() * sizeof(PrepareParams)); }
  size_t first_at(int x) const {
    return means_at() + round(means.size() * sizeof(KeyMeansJob)) + size_t(x) * round((prep.size() + 1) * sizeof(int64_t));
  }
  size_t bytes() const { return first_at(kLaunches); }
  void write(char* out) const {
    std::memset(out, 0, bytes());
    std::memcpy(out, prep.data(), prep.size() * sizeof(PrepareParams));
    std::memcpy(out + means_at(), means.data(), means.size() * sizeof(KeyMeansJob));
    for (int x = 0; x < kLaunches; ++x) std::memcpy(out + first_at(x), first[x].data(), first[x].size() * sizeof(int64_t));
  }
  PackedPrepare prepare_launch(const char* base, int variant) const {
    return PackedPrepare{reinterpret_cast<const PrepareParams*>(base),
                         reinterpret_cast<const int64_t*>(base + first_at(variant)), S()};
  }
  PackedKeyMeans means_launch(const char* base) const {
    return PackedKeyMeans{reinterpret_cast<const KeyMeansJob*>(base + means_at()),
                          reinterpret_cast<const int64_t*>(base + first_at(kMeans)), S()};
  }
};

}  // namespace rangeswa::cuda
