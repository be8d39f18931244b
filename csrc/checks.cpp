#include "checks.h"

#include "prepared.h"

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

namespace rangeswa {

// Every size argument stays at most 2^31 - 1 (docs/spec_decisions.md item 20): far past any real call,
// and it keeps the sums the rules form (i + r, L + G - 1, ...) clear of int64 overflow.
constexpr int64_t kMaxSize = 2147483647;

static void check_at_most_max(int64_t value, const char* name) {
  TORCH_CHECK_VALUE(value <= kMaxSize, name, " must be at most 2^31 - 1 = ", kMaxSize, ", got ", value);
}

Method parse_method(c10::string_view method) {
  if (method == "full") return Method::kFull;
  if (method == "swa") return Method::kSwa;
  if (method == "self_extend") return Method::kSelfExtend;
  if (method == "rangeswa") return Method::kRangeSwa;
  TORCH_CHECK_VALUE(false, "method must be one of 'full', 'swa', 'self_extend', 'rangeswa' "
                    "(rangeswa_lite is rangeswa with far_summaries=False, topk=0), got '",
                    std::string(method), "'");
}

RopeParams check_rope(int64_t head_dim, double theta, std::optional<int64_t> rotary_dim_arg,
                      c10::string_view rope_style, const std::optional<at::Tensor>& inv_freq,
                      const at::Device& device) {
  TORCH_CHECK_VALUE(rope_style == "interleaved" || rope_style == "half",
                    "rope_style must be 'interleaved' or 'half', got '", std::string(rope_style), "'");
  TORCH_CHECK_VALUE(rotary_dim_arg.has_value() || head_dim % 2 == 0, "rotary_dim None rotates the whole head dim, "
                    "which must then be even, got head dim ", head_dim, "; give an even rotary_dim");
  const int64_t rotary_dim = rotary_dim_arg.value_or(head_dim);
  TORCH_CHECK_VALUE(rotary_dim >= 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim,
                    "rotary_dim must be even and in [0, head dim = ", head_dim, "], got ", rotary_dim);
  TORCH_CHECK_VALUE(std::isfinite(theta) && theta > 0, "theta must be a finite number > 0, got ", theta);
  RopeParams rope{theta, rotary_dim, rope_style == "interleaved", {}};
  if (inv_freq.has_value()) {
    const at::Tensor& f = *inv_freq;
    TORCH_CHECK_VALUE(f.scalar_type() == at::kFloat || f.scalar_type() == at::kDouble,
                      "inv_freq must be a float32 or float64 tensor, got ", f.scalar_type());
    TORCH_CHECK_VALUE(f.device() == device, "inv_freq must be on the device of the inputs (", device, "), got ",
                      f.device());
    TORCH_CHECK_VALUE(f.dim() == 1 && f.size(0) == rotary_dim / 2, "inv_freq must be a 1-D tensor of rotary_dim / 2 = ",
                      rotary_dim / 2, " frequencies (rotary_dim ", rotary_dim, "), got shape ", f.sizes());
    const at::Tensor host = f.detach().to(at::kCPU, at::kDouble).contiguous();
    rope.inv_freq.assign(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
    for (size_t k = 0; k < rope.inv_freq.size(); ++k)
      TORCH_CHECK_VALUE(std::isfinite(rope.inv_freq[k]), "inv_freq must hold finite numbers, got ", rope.inv_freq[k],
                        " at index ", k);
  }
  return rope;
}

double RopeParams::frequency_key() const {
  if (inv_freq.empty()) return theta;
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the bytes of the doubles
  for (double f : inv_freq) {
    unsigned char bytes[sizeof(double)];
    std::memcpy(bytes, &f, sizeof(double));
    for (unsigned char b : bytes) h = (h ^ b) * 1099511628211ull;
  }
  return -double((h >> 12) | 1);  // 52 bits: exact in a double, never 0
}

void check_bhnd(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.dim() == 4, name, " must be a 4-D tensor [B, H, N, D], got ", t.dim(), " dims");
  auto dt = t.scalar_type();
  TORCH_CHECK_VALUE(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf,
                    name, " must be float32, bfloat16 or float16, got ", dt);
}

void check_positions(const at::Tensor& positions, int64_t n, const at::Tensor& like, const char* what) {
  TORCH_CHECK_VALUE(positions.device() == like.device(), "positions must be on the device of the inputs (",
                    like.device(), "), got ", positions.device());
  TORCH_CHECK_VALUE(positions.dim() == 1 && positions.size(0) == n, "positions must be a 1-D tensor of ", n,
                    " entries (one per ", what, "), got shape ", positions.sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(positions.scalar_type()), "positions must be a floating tensor, got ",
                    positions.scalar_type());
}

RopeParams check_block_summary(const at::Tensor& k, const at::Tensor& v, int64_t summary_block, double theta,
                               std::optional<int64_t> rotary_dim, c10::string_view rope_style,
                               const std::optional<at::Tensor>& inv_freq) {
  check_bhnd(k, "k");
  check_bhnd(v, "v");
  TORCH_CHECK_VALUE(k.sizes() == v.sizes(), "k and v must have the same shape, got ", k.sizes(), " and ", v.sizes());
  TORCH_CHECK_VALUE(k.scalar_type() == v.scalar_type(), "k and v must have the same dtype, got ", k.scalar_type(),
                    " and ", v.scalar_type());
  TORCH_CHECK_VALUE(k.device() == v.device(), "k and v must be on the same device");
  TORCH_CHECK_VALUE(summary_block >= 1, "summary_block must be >= 1, got ", summary_block);
  check_at_most_max(summary_block, "summary_block");
  return check_rope(k.size(3), theta, rotary_dim, rope_style, inv_freq, k.device());
}

at::Tensor with_contiguous_rows(const at::Tensor& t) {
  return t.size(3) <= 1 || t.stride(3) == 1 ? t : t.contiguous();
}

RowStrides row_strides(const at::Tensor& t) {
  TORCH_CHECK(t.dim() == 4 && (t.size(3) <= 1 || t.stride(3) == 1), "row_strides needs a [B, H, N, D] tensor "
              "with contiguous rows (with_contiguous_rows)");
  return RowStrides{t.stride(0), t.stride(1), t.stride(2)};
}

static void check_same(const at::Tensor& a, const char* an, const at::Tensor& b, const char* bn) {
  TORCH_CHECK_VALUE(a.device() == b.device(), an, " and ", bn, " must be on the same device, got ",
                    a.device(), " and ", b.device());
  TORCH_CHECK_VALUE(a.scalar_type() == b.scalar_type(), an, " and ", bn,
                    " must have the same dtype, got ", a.scalar_type(), " and ", b.scalar_type());
}

Rules check_topk(const at::Tensor& q, const at::Tensor& k, int64_t control_tokens, int64_t window,
                 int64_t summary_block, int64_t retrieval_block, int64_t query_block, int64_t topk,
                 int64_t causal_block) {
  check_bhnd(q, "q");
  check_bhnd(k, "k");
  check_same(q, "q", k, "k");
  TORCH_CHECK_VALUE(q.size(0) == k.size(0) && q.size(3) == k.size(3),
                    "q [B, H_q, Nq, D] and k [B, H_kv, N, D] must agree in B and D, got ", q.sizes(), " and ",
                    k.sizes());
  TORCH_CHECK_VALUE(k.size(1) > 0 && q.size(1) % k.size(1) == 0,
                    "query heads (", q.size(1), ") must be a multiple of key/value heads (", k.size(1), ")");
  TORCH_CHECK_VALUE(control_tokens >= 0 && control_tokens <= k.size(2),
                    "control_tokens must lie in [0, N = ", k.size(2), "], got ", control_tokens);
  // SPEC section 7: q holds the control rows and the last Lq body rows, 1 <= Lq <= L (or all N rows).
  const int64_t Lq = q.size(2) - control_tokens, L = k.size(2) - control_tokens;
  TORCH_CHECK_VALUE(q.size(2) == k.size(2) || (Lq >= 1 && Lq <= L),
                    "q must hold the ", control_tokens, " control rows and the last Lq body rows of k, "
                    "1 <= Lq <= L = ", L, " (SPEC section 7), got ", q.size(2), " q rows for ", k.size(2),
                    " k rows");
  TORCH_CHECK_VALUE(causal_block >= 0, "causal_block must be >= 0 (0 = bidirectional), got ", causal_block);
  TORCH_CHECK_VALUE(window >= 1, "window must be >= 1, got ", window);
  TORCH_CHECK_VALUE(summary_block >= 1, "summary_block must be >= 1, got ", summary_block);
  TORCH_CHECK_VALUE(retrieval_block >= 1 && retrieval_block % summary_block == 0,
                    "retrieval_block must be a positive multiple of summary_block (", summary_block,
                    "), got ", retrieval_block);
  TORCH_CHECK_VALUE(query_block >= 1, "query_block must be >= 1, got ", query_block);
  TORCH_CHECK_VALUE(topk >= 0, "topk must be >= 0, got ", topk);
  const std::pair<int64_t, const char*> sizes[] = {{causal_block, "causal_block"}, {window, "window"},
      {summary_block, "summary_block"}, {retrieval_block, "retrieval_block"}, {query_block, "query_block"},
      {topk, "topk"}};
  for (const auto& [value, name] : sizes) check_at_most_max(value, name);
  // The retrieved blocks [B, H_kv, nQb, K] are allocated whole (the topk_blocks output, the CUDA attn's table):
  // refuse a K that makes them absurd before anything is allocated. Columns past the key block count only pad.
  const int64_t nQb = ceil_div(L, query_block), nKb = ceil_div(L, retrieval_block);
  const double entries = double(q.size(0)) * double(k.size(1)) * double(nQb) * double(topk);
  TORCH_CHECK_VALUE(entries <= double(kMaxSize),
                    "topk = ", topk, " makes the retrieved blocks [B, H_kv, nQb, K] = [", q.size(0), ", ", k.size(1),
                    ", ", nQb, ", ", topk, "] hold more than 2^31 - 1 entries; every candidate is among the first ",
                    nKb, " (the key blocks of L = ", L, "), more columns would only hold -1");
  return make_rules(Method::kRangeSwa, L, window, summary_block, /*Hn=*/0, topk, retrieval_block,
                    query_block, /*T=*/L, /*sinks=*/0, /*far_summaries=*/true, causal_block);
}

AttnParams check_attn(RSWA_ATTN_PARAMS) {
  Method m = parse_method(method);
  check_topk(q, k, control_tokens, window, summary_block, retrieval_block, query_block, topk, causal_block);
  check_bhnd(v, "v");
  check_same(k, "k", v, "v");
  TORCH_CHECK_VALUE(v.sizes() == k.sizes(), "v must have the shape of k ", k.sizes(), ", got ", v.sizes());
  TORCH_CHECK_VALUE(near_range >= 0, "near_range must be >= 0, got ", near_range);
  TORCH_CHECK_VALUE(train_length >= 1, "train_length must be >= 1, got ", train_length);
  TORCH_CHECK_VALUE(sinks >= 0, "sinks must be >= 0, got ", sinks);
  check_at_most_max(near_range, "near_range");
  check_at_most_max(train_length, "train_length");
  check_at_most_max(sinks, "sinks");
  TORCH_CHECK_VALUE(sinks == 0 || m == Method::kSwa, "sinks are only defined for method 'swa', got sinks=",
                    sinks, " with method '", std::string(method), "'");
  const double softmax_scale = scale.value_or(1.0 / std::sqrt(double(q.size(3))));
  TORCH_CHECK_VALUE(std::isfinite(softmax_scale) && softmax_scale > 0, "scale must be a finite number > 0, got ",
                    softmax_scale);

  AttnParams p{};
  p.B = q.size(0);
  p.Hq = q.size(1);
  p.Hkv = k.size(1);
  p.N = k.size(2);
  p.C = control_tokens;
  p.L = p.N - p.C;
  p.Nq = q.size(2);
  p.Lq = p.Nq - p.C;
  p.first_row = p.L - p.Lq;
  p.D = q.size(3);
  p.scale = softmax_scale;
  p.rope = check_rope(p.D, theta, rotary_dim, rope_style, inv_freq, q.device());
  p.rules = make_rules(m, p.L, window, summary_block, near_range, topk, retrieval_block, query_block,
                       train_length, sinks, far_summaries, causal_block, cond_correction, summaries);
  const bool conditioning = conditioned(p.rules, p.C);
  p.control_position_scale = conditioning ? double(train_length) / double(p.L) : 1.0;
  p.control_bias = conditioning ? -std::log(double(p.L) / double(train_length)) : 0.0;

  if (retrieved.has_value()) {
    const at::Tensor& r = *retrieved;
    TORCH_CHECK_VALUE(m == Method::kRangeSwa, "retrieved blocks are only used by method 'rangeswa'");
    TORCH_CHECK_VALUE(r.scalar_type() == at::kInt, "retrieved must be int32, got ", r.scalar_type());
    TORCH_CHECK_VALUE(r.device() == q.device(), "retrieved must be on the device of q (", q.device(),
                      "), got ", r.device());
    TORCH_CHECK_VALUE(r.dim() == 4 && r.size(0) == p.B && r.size(1) == p.Hkv &&
                          r.size(2) == p.rules.num_query_blocks(),
                      "retrieved must be [B, H_kv, nQb, K] = [", p.B, ", ", p.Hkv, ", ",
                      p.rules.num_query_blocks(), ", K], got ", r.sizes());
  }
  return p;
}

void check_retrieved_values(const at::Tensor& retrieved, const Rules& rules) {
  auto r = retrieved.contiguous();
  const int32_t* data = r.data_ptr<int32_t>();
  int64_t rows = r.numel() / std::max<int64_t>(1, r.size(3)), K = r.size(3);
  int64_t nQb = rules.num_query_blocks(), nKb = rules.num_key_blocks();
  std::vector<int64_t> seen(nKb, -1);
  for (int64_t row = 0; row < rows; ++row) {
    int64_t qb = row % nQb;
    for (int64_t c = 0; c < K; ++c) {
      int64_t kb = data[row * K + c];
      if (kb == -1) continue;
      TORCH_CHECK_VALUE(kb >= 0 && kb < nKb, "retrieved holds block ", kb, " outside [-1, ", nKb, ")");
      TORCH_CHECK_VALUE(rules.is_candidate(qb, kb), "retrieved holds block ", kb, " for query block ", qb,
                        ", but it overlaps that query block's local windows (not a candidate)");
      TORCH_CHECK_VALUE(seen[kb] != row, "retrieved holds block ", kb, " twice for query block ", qb);
      seen[kb] = row;
    }
  }
}

}  // namespace rangeswa

namespace rangeswa {

ContextParams check_prepare(RSWA_PREPARE_PARAMS) {
  const Method m = parse_method(method);
  check_bhnd(k, "k");
  check_bhnd(v, "v");
  check_same(k, "k", v, "v");
  TORCH_CHECK_VALUE(v.sizes() == k.sizes(), "v must have the shape of k ", k.sizes(), ", got ", v.sizes());
  TORCH_CHECK_VALUE(control_tokens >= 0 && control_tokens <= k.size(2),
                    "control_tokens must lie in [0, N = ", k.size(2), "], got ", control_tokens);
  TORCH_CHECK_VALUE(summary_block >= 1, "summary_block must be >= 1, got ", summary_block);
  TORCH_CHECK_VALUE(retrieval_block >= 1 && retrieval_block % summary_block == 0,
                    "retrieval_block must be a positive multiple of summary_block (", summary_block, "), got ",
                    retrieval_block);
  TORCH_CHECK_VALUE(near_range >= 0, "near_range must be >= 0, got ", near_range);
  TORCH_CHECK_VALUE(train_length >= 1, "train_length must be >= 1, got ", train_length);
  TORCH_CHECK_VALUE(topk >= 0, "topk must be >= 0, got ", topk);
  ContextParams c{};
  c.B = k.size(0);
  c.Hkv = k.size(1);
  c.N = k.size(2);
  c.C = control_tokens;
  c.L = c.N - c.C;
  c.D = k.size(3);
  TORCH_CHECK_VALUE(first_key >= 0 && first_key <= c.L && first_key % retrieval_block == 0,
                    "first_key must be a multiple of retrieval_block (", retrieval_block, ") in [0, L = ", c.L,
                    "], got ", first_key);
  c.first_key = first_key;
  c.rope = check_rope(c.D, theta, rotary_dim, rope_style, inv_freq, k.device());
  // The window, K's use, Qb and the causal block are the call's, not the context's.
  c.rules = make_rules(m, c.L, /*window=*/1, summary_block, near_range, topk, retrieval_block, /*Qb=*/1, train_length,
                       /*sinks=*/0, far_summaries, /*causal_block=*/0, cond_correction, summaries);
  c.keys_grp = c.rules.grouping();
  c.keys_cond = conditioned(c.rules, c.C);
  c.position_scale = c.keys_cond ? double(train_length) / double(c.L) : 1.0;
  c.summaries = m == Method::kRangeSwa && summaries;
  c.sums_grp = c.summaries && c.keys_grp;
  c.means = m == Method::kRangeSwa && topk > 0;
  return c;
}

std::vector<double> context_signature(const Rules& rules, const RopeParams& rope, int64_t B, int64_t Hkv, int64_t C,
                                      int64_t D) {
  const bool cond = conditioned(rules, C);
  return {kPreparedVersion, double(B), double(Hkv), double(rules.L), double(C), double(D), rope.frequency_key(),
          double(rope.rotary_dim), rope.interleaved ? 1.0 : 0.0, double(rules.grouping() ? rules.g : 0),
          double(rules.grouping() ? rules.group_offset : 0), cond ? double(rules.T) : 0.0, double(rules.G),
          double(rules.Rb)};
}

void check_prepared(const at::TensorList& prepared, const AttnParams& p, const at::Tensor& k, at::ScalarType dtype,
                    bool prefix_sums, int64_t row_stride) {
  TORCH_CHECK_VALUE(prepared.size() == kPreparedSlots, "prepared must be the list the prepare op returns (",
                    int(kPreparedSlots), " tensors), got ", prepared.size(), " tensors");
  const at::Tensor& sig = prepared[kSignature];
  TORCH_CHECK_VALUE(sig.device().is_cpu() && sig.scalar_type() == at::kDouble && sig.dim() == 1 &&
                        sig.size(0) == kSignatureSize,
                    "prepared[", int(kSignature), "] must be the prepare op's signature (", kSignatureSize,
                    " float64 numbers on the CPU)");
  const Rules& R = p.rules;
  const std::vector<double> expect = context_signature(R, p.rope, p.B, p.Hkv, p.C, p.D);
  const double* got = sig.contiguous().data_ptr<double>();
  for (int x = 0; x < kSignatureSize; ++x)
    TORCH_CHECK_VALUE(got[x] == expect[x], "prepared was made for ", kSignatureNames[x], " = ", got[x],
                      " but this call has ", expect[x], "; prepare k and v with the call's configuration");
  const bool rangeswa = R.method == Method::kRangeSwa && R.summaries;
  const int64_t nG = R.num_summary_blocks();
  auto need = [&](int slot, const char* what, int64_t rows, at::ScalarType type) {
    const at::Tensor& t = prepared[slot];
    TORCH_CHECK_VALUE(t.numel() > 0 || rows == 0, "prepared holds no ", what, " (prepared[", slot,
                      "] is empty), which this call reads; prepare with the call's method and switches");
    if (rows == 0) return;
    TORCH_CHECK_VALUE(t.device() == k.device(), "prepared[", slot, "] (", what, ") must be on ", k.device(), ", got ",
                      t.device());
    TORCH_CHECK_VALUE(t.scalar_type() == type, "prepared[", slot, "] (", what, ") must be ", type, " here, got ",
                      t.scalar_type());
    TORCH_CHECK_VALUE(t.dim() == 4 && t.size(0) == p.B && t.size(1) == p.Hkv && t.size(2) == rows && t.size(3) == p.D &&
                          (p.D <= 1 || t.stride(3) == 1) && t.stride(2) == row_stride,
                      "prepared[", slot, "] (", what, ") must be [B, H_kv, rows, D] = [", p.B, ", ", p.Hkv, ", ",
                      rows, ", ", p.D, "] with rows ", row_stride, " elements apart (as the prepare op makes them), "
                      "got ", t.sizes(), " strides ", t.strides());
  };
  if (p.L == 0) return;
  need(kKeysNat, "native keys", p.L, dtype);
  if (R.grouping()) need(kKeysGrp, "grouped keys", p.L, dtype);
  if (conditioned(R, p.C)) need(kKeysCond, "conditioning keys", p.L, dtype);
  if (rangeswa) {
    need(kSumKeys, "summary keys", nG, dtype);
    need(kSumValues, "summary values", nG, dtype);
    if (R.grouping()) need(kSumKeysGrp, "grouped summary keys", nG, dtype);
    if (prefix_sums && R.grouping() && R.far_summaries) {
      need(kPrefixNat, "native prefix sums", p.L, dtype);
      need(kPrefixGrp, "grouped prefix sums", p.L, dtype);
    }
  }
}

}  // namespace rangeswa
