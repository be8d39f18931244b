// The schema of every rangeswa op, in one place. csrc/rangeswa.cpp registers them under
// torch.ops.rangeswa; the host emulation of the CUDA attention (csrc/cuda/emulator) registers the attn
// schema under its own namespace, so that both take exactly the same arguments and defaults.
//
// Defaults are the paper's RangeSWA in its late denoising stage (SPEC sections 2-4): W = 256, G = 16,
// Hn = 512, K = 8 blocks of Rb = 64 per query block of Qb = 128, T = 1024, no control tokens, RoPE base
// 10^4 on every dim (rotary_dim None; inv_freq None: the frequencies theta^(-2k / rotary_dim), else the given
// [rotary_dim / 2] float32 / float64 frequencies in place of theta's), interleaved pairs, scale None = 1/sqrt(D), bidirectional
// (causal_block 0), with the conditioning correction and the block summaries of rule 4 (both can be
// switched off for the paper's ablations), no prepared context. SPEC section 7's cached calls need no argument:
// q may hold the C control rows and only the last Lq body rows of k and v. So
// `torch.ops.rangeswa.attn(q, k, v)` is a drop-in for scaled_dot_product_attention on [B, H, N, D]
// inputs before RoPE. Argument meanings: python/rangeswa_ext/ops.py; they equal RangeSWAConfig's
// defaults, which tests/test_ops_cpu.py checks.
#pragma once

namespace rangeswa::schema {

inline constexpr const char* kRope =
    "rope(Tensor x, Tensor positions, float theta=10000.0, int? rotary_dim=None, str rope_style=\"interleaved\", "
    "Tensor? inv_freq=None) -> Tensor";

inline constexpr const char* kBlockSummary =
    "block_summary(Tensor k, Tensor v, Tensor? positions=None, int summary_block=16, float theta=10000.0, "
    "int? rotary_dim=None, str rope_style=\"interleaved\", Tensor? inv_freq=None) -> (Tensor, Tensor)";

inline constexpr const char* kTopkBlocks =
    "topk_blocks(Tensor q, Tensor k, int control_tokens=0, int window=256, int summary_block=16, "
    "int retrieval_block=64, int query_block=128, int topk=8, int causal_block=0) -> Tensor";

// The arguments of attn after (q, k, v, retrieved) and before prepared, in schema order, written once as
// X(C++ type, name, schema type, schema default): the schema string below and every C++ signature that
// takes them (RSWA_ATTN_PARAMS: the CPU kernel, the CUDA entry point, the emulators, check_attn) and
// forwards them (RSWA_ATTN_ARGS) expand it, so none of them lists the arguments again.
#define RSWA_ATTN_OPTIONS(X)                                   \
  X(c10::string_view, method, "str", "\"rangeswa\"")          \
  X(int64_t, control_tokens, "int", "0")                      \
  X(int64_t, window, "int", "256")                            \
  X(int64_t, summary_block, "int", "16")                      \
  X(int64_t, near_range, "int", "512")                        \
  X(int64_t, topk, "int", "8")                                \
  X(int64_t, retrieval_block, "int", "64")                    \
  X(int64_t, query_block, "int", "128")                       \
  X(int64_t, train_length, "int", "1024")                     \
  X(int64_t, sinks, "int", "0")                               \
  X(bool, far_summaries, "bool", "True")                      \
  X(double, theta, "float", "10000.0")                        \
  X(std::optional<int64_t>, rotary_dim, "int?", "None")       \
  X(c10::string_view, rope_style, "str", "\"interleaved\"")   \
  X(const std::optional<at::Tensor>&, inv_freq, "Tensor?", "None") \
  X(std::optional<double>, scale, "float?", "None")           \
  X(int64_t, causal_block, "int", "0")                        \
  X(bool, cond_correction, "bool", "True")                    \
  X(bool, summaries, "bool", "True")

// The same for prepare's arguments after (k, v).
#define RSWA_PREPARE_OPTIONS(X)                                \
  X(c10::string_view, method, "str", "\"rangeswa\"")          \
  X(int64_t, control_tokens, "int", "0")                      \
  X(int64_t, summary_block, "int", "16")                      \
  X(int64_t, near_range, "int", "512")                        \
  X(int64_t, retrieval_block, "int", "64")                    \
  X(int64_t, train_length, "int", "1024")                     \
  X(bool, far_summaries, "bool", "True")                      \
  X(double, theta, "float", "10000.0")                        \
  X(std::optional<int64_t>, rotary_dim, "int?", "None")       \
  X(c10::string_view, rope_style, "str", "\"interleaved\"")   \
  X(const std::optional<at::Tensor>&, inv_freq, "Tensor?", "None") \
  X(bool, cond_correction, "bool", "True")                    \
  X(bool, summaries, "bool", "True")                          \
  X(int64_t, topk, "int", "8")                                \
  X(int64_t, first_key, "int", "0")

// Variable-length (packed) calls, issue 31: the arguments that follow attn's prepared context and prepare's
// options, at the very end of both schemas. With cu_seqlens_q / cu_seqlens_k (int32 or int64 [S + 1], 0 first,
// non-decreasing, last = the packed row count) q is [1, H_q, total_q, D] and k, v are [1, H_kv, total_k, D]:
// sequence s holds q rows [cu_seqlens_q[s], cu_seqlens_q[s + 1]) and k / v rows [cu_seqlens_k[s],
// cu_seqlens_k[s + 1]), each its C_s control rows first, and every rule of SPEC sections 1-4 and 7 applies
// to each sequence on its own (its own L, blocks, retrieval, position maps; q may hold the last Lq_s body rows
// of a sequence, a cached call per sequence). control_counts (int [S]) gives C_s; None gives every sequence
// control_tokens. prepare takes cu_seqlens_k and control_counts (csrc/varlen.h: the packed context's layout).
#define RSWA_VARLEN_ATTN_OPTIONS(X)                                  \
  X(const std::optional<at::Tensor>&, cu_seqlens_q, "Tensor?", "None") \
  X(const std::optional<at::Tensor>&, cu_seqlens_k, "Tensor?", "None") \
  X(const std::optional<at::Tensor>&, control_counts, "Tensor?", "None")
#define RSWA_VARLEN_PREPARE_OPTIONS(X)                               \
  X(const std::optional<at::Tensor>&, cu_seqlens_k, "Tensor?", "None") \
  X(const std::optional<at::Tensor>&, control_counts, "Tensor?", "None")

// One entry as the schema writes it, as a C++ parameter, and as a forwarded argument.
#define RSWA_SCHEMA_ARG(type, name, schema_type, schema_default) ", " schema_type " " #name "=" schema_default
#define RSWA_OPTION_PARAM(type, name, schema_type, schema_default) , type name
#define RSWA_OPTION_ARG(type, name, schema_type, schema_default) , name

// attn's and prepare's C++ parameters up to (not including) attn's prepared context, and the call that
// forwards them.
#define RSWA_ATTN_PARAMS                                                                                     \
  const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const std::optional<at::Tensor> &retrieved \
      RSWA_ATTN_OPTIONS(RSWA_OPTION_PARAM)
#define RSWA_ATTN_ARGS q, k, v, retrieved RSWA_ATTN_OPTIONS(RSWA_OPTION_ARG)
// The varlen arguments after prepared (a leading comma included), as parameters and as forwarded arguments.
#define RSWA_VARLEN_ATTN_PARAMS RSWA_VARLEN_ATTN_OPTIONS(RSWA_OPTION_PARAM)
#define RSWA_VARLEN_ATTN_ARGS RSWA_VARLEN_ATTN_OPTIONS(RSWA_OPTION_ARG)
#define RSWA_VARLEN_PREPARE_PARAMS RSWA_VARLEN_PREPARE_OPTIONS(RSWA_OPTION_PARAM)
#define RSWA_VARLEN_PREPARE_ARGS RSWA_VARLEN_PREPARE_OPTIONS(RSWA_OPTION_ARG)
#define RSWA_PREPARE_PARAMS const at::Tensor &k, const at::Tensor &v RSWA_PREPARE_OPTIONS(RSWA_OPTION_PARAM)
#define RSWA_PREPARE_ARGS k, v RSWA_PREPARE_OPTIONS(RSWA_OPTION_ARG)

inline constexpr const char* kAttn = "attn(Tensor q, Tensor k, Tensor v, Tensor? retrieved=None" RSWA_ATTN_OPTIONS(
    RSWA_SCHEMA_ARG) ", Tensor[]? prepared=None" RSWA_VARLEN_ATTN_OPTIONS(RSWA_SCHEMA_ARG) ") -> (Tensor, Tensor)";

// What attn computes from k and v alone, once: rotated keys under every position map, block summaries,
// prefix sums, retrieval key means (csrc/prepared.h lists the returned tensors). first_key > 0 returns the
// rows from first_key on (block-aligned), for a cache that grows by appending.
inline constexpr const char* kPrepare = "prepare(Tensor k, Tensor v" RSWA_PREPARE_OPTIONS(RSWA_SCHEMA_ARG)
    RSWA_VARLEN_PREPARE_OPTIONS(RSWA_SCHEMA_ARG) ") -> Tensor[]";

}  // namespace rangeswa::schema
