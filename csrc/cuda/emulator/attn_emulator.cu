// Host emulation of the fused attention kernel (mainloop.h) for machines without a GPU: the same
// setup (attn_setup.h), the same preparation (prepare.h prepare_unit), and the kernel's walk over its
// KV tiles with the kernel's own decisions (block.h plan and tile flags, mask.h per-element logits,
// queries.h rotations and slots), the matrix products done by plain loops on the same rounded
// operands. tests/test_ops_cuda.py builds it with torch.utils.cpp_extension.load and holds it to the
// reference over the CPU test grid; what it cannot check (the mma.sync / ldmatrix fragment layouts,
// cp.async, barriers, shared-memory races) is listed in docs/cuda.md.
// Not part of the extension: setup.py compiles csrc/cuda/*.cu, not this folder.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "checks.h"
#include "schema.h"
#include "cuda/attn_setup.h"
#include "cuda/block.h"
#include "cuda/kernel_traits.h"
#include "cuda/mask.h"
#include "cuda/prepare.h"
#include "cuda/queries.h"
#include "cuda/rotary.h"

namespace rangeswa::cuda {
namespace {

template <typename Element, int kHeadDim>
struct Emulator {
  using Traits = AttnTraits<Element, kHeadDim>;
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  static constexpr bool kRoundP = Traits::kTensorCores;  // P enters the PV mma in the element type

  const AttnKernelParams& p;
  explicit Emulator(const AttnKernelParams& params) : p(params) {}

  static float round(float x) { return to_float(from_float<Element>(x)); }

  // One CTA of attn_kernel.
  void cta(int64_t block) {
    const Rules& R = p.rules;
    const int64_t tiles_per_head = p.control_tiles + p.body_tiles;
    const int64_t head = block / tiles_per_head;
    const QueryTile t = query_tile<kBlockM>(p, block % tiles_per_head);
    if (t.nrows <= 0) return;
    const int64_t b = head / p.Hq, h = head % p.Hq, kvh = b * p.Hkv + h / (p.Hq / p.Hkv);
    const Element* keys_nat = static_cast<const Element*>(p.keys_nat) + kvh * p.nat_rows * kHeadDim;
    const Element* keys_grp = p.keys_grp ? static_cast<const Element*>(p.keys_grp) + kvh * p.grp_rows * kHeadDim : nullptr;
    const Element* keys_cond = p.keys_cond ? static_cast<const Element*>(p.keys_cond) + kvh * p.L * kHeadDim : nullptr;
    const Element* values = static_cast<const Element*>(p.values) + kvh * p.nat_rows * kHeadDim;
    const int64_t n0 = t.control ? t.i0 : p.C + t.i0 - p.first_row;  // q row of the tile's first row
    const int64_t row0 = head * p.Nq + n0;  // of the contiguous output
    const Element* q_rows = query_row<Element>(p, head, n0);

    Segment fixed[kNumFixedSegments];
    build_segments(p, t, fixed);
    SegmentList segs{fixed, nullptr, 0};
    if (!t.control && R.method == Method::kRangeSwa && p.retrieved != nullptr) {
      segs.retrieved = p.retrieved + (kvh * R.num_query_blocks() + t.qb) * p.retrieved_k;
      segs.retrieved_k = p.retrieved_k;
    }
    std::vector<RowCtx> rows(kBlockM);
    std::vector<float> mixed(2 * kBlockM, 0.f);
    for (int r = 0; r < kBlockM; ++r) rows[r] = make_row_ctx(R, t.i0 + std::min(r, t.nrows - 1));

    std::vector<float> slots(3 * kBlockM * kHeadDim, 0.f);
    auto fill_slot = [&](int slot, QueryRotation rot) {
      for (int r = 0; r < kBlockM; ++r)
        for (int d = 0; d < kHeadDim; ++d) {
          const Element* row = q_rows + int64_t(r) * p.q_strides.row;
          slots[(slot * kBlockM + r) * kHeadDim + d] =
              round(query_element(p, t, rot, r, d, [&](int e) { return to_float(row[e]); }));
        }
    };
    for (int slot = 0; slot < tile_slots(p, t); ++slot) fill_slot(slot, initial_slot_rotation(p, t, slot));
    bool slot1_cond = !t.control && p.cond_queries;

    std::vector<float> m(kBlockM, -INFINITY), l(kBlockM, 0.f), o(kBlockM * kHeadDim, 0.f);
    std::vector<float> s(kBlockM * kBlockN), sk(kBlockN * kHeadDim), sv(kBlockN * kHeadDim);
    auto load = [&](std::vector<float>& dst, const Element* src, int n) {  // zero-filled past n, like cp.async
      for (int r = 0; r < kBlockN; ++r)
        for (int d = 0; d < kHeadDim; ++d) dst[r * kHeadDim + d] = r < n ? to_float(src[int64_t(r) * kHeadDim + d]) : 0.f;
    };
    auto key_ptr = [&](const KvTile& k, bool grouped) {
      const RowRef ref = key_rows(p, t, k, grouped);
      const Element* array = ref.array == KeyArray::kNative ? keys_nat : ref.array == KeyArray::kGrouped ? keys_grp : keys_cond;
      return array + ref.row * kHeadDim;
    };
    auto qk = [&](int slot, std::vector<float>& out) {
      for (int r = 0; r < kBlockM; ++r)
        for (int c = 0; c < kBlockN; ++c) {
          float acc = 0.f;
          for (int d = 0; d < kHeadDim; ++d) acc += slots[(slot * kBlockM + r) * kHeadDim + d] * sk[c * kHeadDim + d];
          out[r * kBlockN + c] = acc;
        }
    };

    KvCursor cursor;
    KvTile cur{};
    bool have = next_kv_tile<kBlockN>(p, t, segs, cursor, cur);
    std::vector<float> s2(kBlockM * kBlockN);
    while (have) {
      KvTile nxt{};
      const bool have_next = next_kv_tile<kBlockN>(p, t, segs, cursor, nxt);
      if (slot1_cond && cur.kind != SegKind::kControl) {
        slot1_cond = false;
        if (p.num_q_slots == 3) fill_slot(1, QueryRotation::kLeft);
      }
      if (cur.kind != SegKind::kMixed) load(sv, values + value_row(p, cur) * kHeadDim, cur.n);
      const bool after_native = (cur.classes & kNativeBit) != 0;
      if (after_native) {
        load(sk, key_ptr(cur, false), cur.n);
        qk(query_slot(cur, 0, slot1_cond), s);
      }
      if (cur.classes & (kLeftBit | kRightBit)) {
        load(sk, key_ptr(cur, true), cur.n);
        bool first = !after_native;
        for (int cls = 1; cls <= 2; ++cls) {
          if (!(cur.classes & (1 << cls))) continue;
          qk(query_slot(cur, cls, slot1_cond), first ? s : s2);
          if (!first)
            for (int r = 0; r < kBlockM; ++r)
              for (int c = 0; c < kBlockN; ++c)
                if (element_class(R, cur.kind, rows[r], cur.a + c) == cls) s[r * kBlockN + c] = s2[r * kBlockN + c];
          first = false;
        }
      }
      if (cur.kind == SegKind::kMixed) {
        for (int r = 0; r < kBlockM; ++r)
          for (int c = 0; c < cur.n; ++c) {
            const int side = mixed_side(rows[r], cur.a + c);
            if (side >= 0) mixed[2 * r + side] += s[r * kBlockN + c];
          }
      } else {
        const bool edge = cur.edge();
        const float bias = tile_bias(p, t, cur);
        for (int r = 0; r < kBlockM; ++r) {
          float* x = s.data() + r * kBlockN;
          float mx = -INFINITY;
          for (int c = 0; c < kBlockN; ++c) {
            x[c] = edge ? edge_logit(p, t, cur, rows[r], c, x[c], mixed.data() + 2 * r) : x[c] * p.scale_log2 + bias;
            mx = std::max(mx, x[c]);
          }
          const float m_new = std::max(m[r], mx), shift = m_new == -INFINITY ? 0.f : m_new;
          const float alpha = std::exp2(m[r] - shift);
          m[r] = m_new;
          float sum = 0.f;
          for (int d = 0; d < kHeadDim; ++d) o[r * kHeadDim + d] *= alpha;
          for (int c = 0; c < kBlockN; ++c) {
            const float pr = std::exp2(x[c] - shift);
            sum += pr;
            const float pv = kRoundP ? round(pr) : pr;
            for (int d = 0; d < kHeadDim; ++d) o[r * kHeadDim + d] += pv * sv[c * kHeadDim + d];
          }
          l[r] = l[r] * alpha + sum;
        }
      }
      cur = nxt;
      have = have_next;
    }
    Element* out = static_cast<Element*>(p.out);
    for (int r = 0; r < t.nrows; ++r) {
      for (int d = 0; d < p.D; ++d) out[(row0 + r) * p.D + d] = from_float<Element>(o[r * kHeadDim + d] / l[r]);
      p.lse[row0 + r] = (m[r] + std::log2(l[r])) * 0.6931471805599453f;
    }
  }
};

template <typename Element>
void run(const AttnKernelParams& p, int64_t Dp) {
  const int64_t blocks = (p.control_tiles + p.body_tiles) * p.B * p.Hq;
  auto all = [&](auto emulator) {
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t block = begin; block < end; ++block) emulator.cta(block);
    });
  };
  if (Dp == 64) all(Emulator<Element, 64>(p));
  else if (Dp == 80) all(Emulator<Element, 80>(p));
  else all(Emulator<Element, 128>(p));
}

// attn with the CUDA kernels' plan, on CPU tensors; `retrieved` as the op takes it (computed by the
// caller when the method retrieves).
std::tuple<at::Tensor, at::Tensor> attn_emulated(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 const std::optional<at::Tensor>& retrieved, c10::string_view method,
                                                 int64_t control_tokens, int64_t window, int64_t summary_block,
                                                 int64_t near_range, int64_t topk, int64_t retrieval_block,
                                                 int64_t query_block, int64_t train_length, int64_t sinks,
                                                 bool far_summaries, double theta, std::optional<int64_t> rotary_dim,
                                                 c10::string_view rope_style, std::optional<double> scale,
                                                 int64_t causal_block, bool cond_correction, bool summaries) {
  const AttnParams ap = check_attn(q, k, v, retrieved, method, control_tokens, window, summary_block, near_range,
                                   topk, retrieval_block, query_block, train_length, sinks, far_summaries, theta,
                                   rotary_dim, rope_style, scale, causal_block, cond_correction, summaries);
  TORCH_CHECK(padded_head_dim(ap.D) > 0, "head dims up to 128");
  at::Tensor qc = with_contiguous_rows(q), kc = with_contiguous_rows(k), vc = with_contiguous_rows(v);
  const char* unsupported = cuda_unsupported(ap);
  TORCH_CHECK_VALUE(unsupported == nullptr, unsupported);
  at::Tensor out = at::zeros(q.sizes(), qc.options()), lse = at::zeros({ap.B, ap.Hq, ap.Nq}, qc.options().dtype(at::kFloat));
  if (ap.Nq == 0 || ap.B == 0 || ap.Hq == 0) return {out, lse};
  const AttnPlan plan = plan_attn(ap);
  auto table = [&](int64_t count, double first, double step) {
    const int64_t half = ap.rope.rotary_dim / 2;
    at::Tensor c = at::empty({count, half}, at::kFloat), s = at::empty({count, half}, at::kFloat);
    for (int64_t i = 0; i < count; ++i)
      for (int64_t kk = 0; kk < half; ++kk)
        rope_cos_sin(first + double(i) * step, int(kk), int(ap.rope.rotary_dim), ap.rope.theta,
                     c.data_ptr<float>() + i * half + kk, s.data_ptr<float>() + i * half + kk);
    return std::make_pair(c, s);
  };
  auto nat = table(plan.nat_count, 0.0, 1.0), grp = table(plan.grp_count, plan.grp_first, 1.0),
       cnd = table(plan.cond_count, 0.0, plan.cond_step);
  // NaN-filled, so that a row the preparation forgets shows up in the output.
  auto array = [&](int64_t rows) { return at::full({plan.BH, rows, plan.Dp}, NAN, qc.options()); };
  at::Tensor keys_nat = array(plan.nat_rows), values = array(plan.nat_rows);
  at::Tensor keys_grp = plan.grouping ? array(plan.grp_rows) : at::Tensor();
  at::Tensor keys_cond = plan.cond ? array(ap.L) : at::Tensor();
  at::Tensor blocks = retrieved.has_value() ? retrieved->contiguous() : at::Tensor();
  if (blocks.defined()) check_retrieved_values(blocks, ap.rules);
  auto ptr = [](const at::Tensor& x) { return x.defined() && x.numel() > 0 ? x.data_ptr<float>() : nullptr; };
  AttnBuffers buf{qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), row_strides(qc), row_strides(kc), row_strides(vc),
                  out.data_ptr(), lse.data_ptr<float>(),
                  keys_nat.data_ptr(), values.data_ptr(), keys_grp.defined() ? keys_grp.data_ptr() : nullptr,
                  keys_cond.defined() ? keys_cond.data_ptr() : nullptr, ptr(nat.first), ptr(nat.second),
                  ptr(grp.first), ptr(grp.second), ptr(cnd.first), ptr(cnd.second),
                  blocks.defined() && blocks.size(3) > 0 ? blocks.data_ptr<int32_t>() : nullptr,
                  blocks.defined() ? blocks.size(3) : 0};
  const PrepareParams pp = prepare_params(ap, plan, buf);
  const AttnKernelParams p = kernel_params(ap, plan, buf);
  auto dispatch = [&](auto element) {
    using Element = decltype(element);
    for (int64_t bh = 0; bh < pp.BH; ++bh)
      for (int64_t chunk = 0; chunk < prepare_body_chunks(pp) + prepare_control_chunks(pp); ++chunk)
        for (int u = 0; u < prepare_units(pp); ++u) prepare_unit<Element>(pp, bh, chunk, u);
    run<Element>(p, plan.Dp);
  };
  if (qc.scalar_type() == at::kBFloat16) dispatch(__nv_bfloat16());
  else if (qc.scalar_type() == at::kHalf) dispatch(__half());
  else dispatch(float());
  return {out, lse};
}

}  // namespace
}  // namespace rangeswa::cuda

// torch.ops.rangeswa_emulator.attn: the attn schema (csrc/schema.h) on CPU tensors.
TORCH_LIBRARY(rangeswa_emulator, m) { m.def(rangeswa::schema::kAttn); }
TORCH_LIBRARY_IMPL(rangeswa_emulator, CPU, m) { m.impl("attn", &rangeswa::cuda::attn_emulated); }
