// The schema of every rangeswa op, in one place. csrc/rangeswa.cpp registers them under
// torch.ops.rangeswa; the host emulation of the CUDA attention (csrc/cuda/emulator) registers the attn
// schema under its own namespace, so that both take exactly the same arguments and defaults.
//
// Defaults are the paper's RangeSWA in its late denoising stage (SPEC sections 2-4): W = 256, G = 16,
// Hn = 512, K = 8 blocks of Rb = 64 per query block of Qb = 128, T = 1024, no control tokens, RoPE base
// 10^4 on every dim (rotary_dim None), interleaved pairs, scale None = 1/sqrt(D), bidirectional
// (causal_block 0), with the conditioning correction and the block summaries of rule 4 (both can be
// switched off for the paper's ablations), no prepared context. SPEC section 7's cached calls need no argument:
// q may hold the C control rows and only the last Lq body rows of k and v. So
// `torch.ops.rangeswa.attn(q, k, v)` is a drop-in for scaled_dot_product_attention on [B, H, N, D]
// inputs before RoPE. Argument meanings: python/rangeswa_ext/ops.py; they equal RangeSWAConfig's
// defaults, which tests/test_ops_cpu.py checks.
#pragma once

namespace rangeswa::schema {

inline constexpr const char* kRope =
    "rope(Tensor x, Tensor positions, float theta=10000.0, int? rotary_dim=None, str rope_style=\"interleaved\") "
    "-> Tensor";

inline constexpr const char* kBlockSummary =
    "block_summary(Tensor k, Tensor v, Tensor? positions=None, int summary_block=16, float theta=10000.0, "
    "int? rotary_dim=None, str rope_style=\"interleaved\") -> (Tensor, Tensor)";

inline constexpr const char* kTopkBlocks =
    "topk_blocks(Tensor q, Tensor k, int control_tokens=0, int window=256, int summary_block=16, "
    "int retrieval_block=64, int query_block=128, int topk=8, int causal_block=0) -> Tensor";

inline constexpr const char* kAttn =
    "attn(Tensor q, Tensor k, Tensor v, Tensor? retrieved=None, str method=\"rangeswa\", int control_tokens=0, "
    "int window=256, int summary_block=16, int near_range=512, int topk=8, int retrieval_block=64, "
    "int query_block=128, int train_length=1024, int sinks=0, bool far_summaries=True, float theta=10000.0, "
    "int? rotary_dim=None, str rope_style=\"interleaved\", float? scale=None, int causal_block=0, "
    "bool cond_correction=True, bool summaries=True, Tensor[]? prepared=None) -> (Tensor, Tensor)";

// What attn computes from k and v alone, once: rotated keys under every position map, block summaries,
// prefix sums, retrieval key means (csrc/prepared.h lists the returned tensors). first_key > 0 returns the
// rows from first_key on (block-aligned), for a cache that grows by appending.
inline constexpr const char* kPrepare =
    "prepare(Tensor k, Tensor v, str method=\"rangeswa\", int control_tokens=0, int summary_block=16, "
    "int near_range=512, int retrieval_block=64, int train_length=1024, bool far_summaries=True, "
    "float theta=10000.0, int? rotary_dim=None, str rope_style=\"interleaved\", bool cond_correction=True, "
    "bool summaries=True, int topk=8, int first_key=0) -> Tensor[]";

}  // namespace rangeswa::schema
