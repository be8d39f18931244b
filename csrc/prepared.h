// The prepared context of an attention call (op `prepare`, issue 20): what attn computes from k and v
// alone, returned as plain tensors so a cache can keep it between calls. Torch-free.
//
// The list, in this order; an array the configuration does not need is an empty tensor. Rows are per
// (batch, KV head): [B, Hkv, rows, D], float32 on the CPU and the input dtype on CUDA (each device's
// kernels compute in that type), rows read through any batch / head strides (a cache's capacity views).
//   0 keys_nat    [L]   R(j) k_j                        (every call with a body)
//   1 keys_grp    [L]   R(j / g) k_j                    (section 3's grouped positions)
//   2 keys_cond   [L]   R(j T / L) k_j                  (control rows under the conditioning correction)
//   3 sum_keys    [nG]  G-block means of keys_nat       (rangeswa with summaries)
//   4 sum_keys_grp[nG]  G-block means of keys_grp       (... and grouped positions)
//   5 sum_values  [nG]  G-block means of v              (rangeswa with summaries)
//   6 prefix_nat  [L]   in-block prefix sums of keys_nat (CUDA: blocks straddling Hn)
//   7 prefix_grp  [L]   in-block prefix sums of keys_grp (CUDA)
//   8 key_means   [nKb] retrieval key-block means of k, pre-RoPE, float64 (rangeswa with retrieval)
//   9 signature   [kSignatureSize] float64 on the CPU: the numbers the arrays depend on, checked by attn
#pragma once

#include <cstdint>

namespace rangeswa {

enum PreparedSlot : int {
  kKeysNat = 0, kKeysGrp, kKeysCond, kSumKeys, kSumKeysGrp, kSumValues, kPrefixNat, kPrefixGrp, kKeyMeans,
  kSignature, kPreparedSlots
};

// The signature's entries, in order (names for error messages).
inline constexpr const char* kSignatureNames[] = {
    "version", "batch", "KV heads", "body tokens L", "control tokens", "head dim",
    "RoPE frequencies (theta, or minus a hash of inv_freq)", "rotary_dim",
    "rope_style", "group size g", "group offset", "train_length (conditioning positions)", "summary_block",
    "retrieval_block"};
inline constexpr int kSignatureSize = sizeof(kSignatureNames) / sizeof(kSignatureNames[0]);
inline constexpr double kPreparedVersion = 1.0;

}  // namespace rangeswa
