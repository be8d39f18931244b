// SPEC section 2 rule 3 on the device: per query block and KV head, the top-K candidate key blocks
// by s(qb, kb) = mean(q over qb) . mean(k over kb), pre-RoPE. Used by the topk_blocks op and by attn
// when it retrieves. torch-free; attn_api.cpp allocates the workspaces.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "layout.h"
#include "rules.h"

namespace rangeswa::cuda {

struct TopkParams {
  const void* q;       // [B, Hq, N, D], rows at q_strides.at(b, h, n)
  const void* k;       // [B, Hkv, N, D], rows at k_strides.at(b, h, n)
  RowStrides q_strides, k_strides;
  int32_t* out;        // [B, Hkv, nQb, K], best first, -1 padded
  double* q_means;     // workspace [B * Hkv, nQb, D]
  double* k_means;     // workspace [B * Hkv, D, nKb] (dims-major: coalesced reads in the select kernel)
  bool k_means_given;  // k_means holds a prepared context's means already (not computed here)
  int64_t B, Hq, Hkv, N, C, D;
  int64_t first;       // q holds body rows first .. L - 1 (SPEC section 7; 0 in an ordinary call)
  Rules rules;         // L, G, Rb, Qb, window, causal block (for the candidates) and topk = K
};

// Shared memory the selection kernel needs for K kept blocks; attn_api.cpp checks it against the device.
size_t topk_blocks_smem_bytes(const TopkParams& p);

template <typename Element>
cudaError_t launch_topk_blocks(const TopkParams& p, cudaStream_t stream);

// A packed call's selections in shared launches (docs/cuda.md "Packed calls"): each sequence's own
// TopkParams and the first CTA (grid x) of each in a launch: sequence s takes [first[s], first[s + 1]), its
// own launch's CTAs topk_mean_ctas(p) (block means) and topk_select_ctas(p) (selection); 0 for a sequence
// that selects nothing. Device memory. The selection launch takes the largest shared memory of the sequences.
struct PackedTopk {
  const TopkParams* seq;  // [S]
  const int64_t* first;   // [S + 1]
  int32_t S;
};
int64_t topk_mean_ctas(const TopkParams& p);
int64_t topk_select_ctas(const TopkParams& p);
template <typename Element>
cudaError_t launch_topk_blocks_packed(const PackedTopk& means, int64_t mean_ctas, const PackedTopk& select,
                                      int64_t select_ctas, int64_t BH, size_t smem, cudaStream_t stream);

// A packed prepare op's key means in one launch: per sequence its parameters (key_means_params of its rows),
// its output (rows of D float64: KV head bkv's block kb at out[(bkv * head_rows + kb) * D]) and the first CTA
// (grid x) of each sequence (its own launch_key_means' blocks; 0 for a sequence without key means).
struct KeyMeansJob {
  TopkParams p;
  double* out;
  int64_t head_rows;
};
struct PackedKeyMeans {
  const KeyMeansJob* seq;  // [S]
  const int64_t* first;    // [S + 1]
  int32_t S;
};
template <typename Element>
cudaError_t launch_key_means_packed(const PackedKeyMeans& pk, int64_t ctas, int64_t BH, cudaStream_t stream);

// The key-block means of the prepare op: out [B * Hkv, nKb - first_block, D] (row-major, float64) for key
// blocks [first_block, nKb), the arithmetic of the select kernel's means (p.q is not read).
template <typename Element>
cudaError_t launch_key_means(const TopkParams& p, int64_t first_block, double* out, cudaStream_t stream);

}  // namespace rangeswa::cuda
