// The warp collectives of the host SIMT runtime (simt_runtime.h): the last lane of a warp to reach a collective
// performs it for all 32, reading their operands on their stacks and writing their results, after checking
// that every lane is at the same one. The PTX semantics of shfl.sync, ldmatrix and mma.sync; ldmatrix's race
// checks against cp.async (simt_shared.cpp keeps the shadow they read). Torch-free.
#include <cstdio>

#include "cuda/simt/simt_runtime.h"

namespace simt::runtime {

const char* kind_name(int kind, int sub) {
  switch (kind) {
    case kSyncWarp: return "__syncwarp";
    case kShuffle: return sub == int(Shfl::kXor) ? "__shfl_xor_sync" : sub == int(Shfl::kIdx) ? "__shfl_sync"
                        : sub == int(Shfl::kUp) ? "__shfl_up_sync" : "__shfl_down_sync";
    case kLdmatrix: return sub ? "ldmatrix.x4.trans" : "ldmatrix.x4";
    default: return sub == int(MmaType::kBF16) ? "mma.m16n8k16.bf16" : "mma.m16n8k16.f16";
  }
}

namespace {

// fp16 -> float of every bit pattern (cuda_fp16.h's host conversion), filled when the library loads.
const std::vector<float> g_half_table = [] {
  std::vector<float> t(65536);
  for (uint32_t x = 0; x < 65536; ++x) {
    __half_raw r;
    r.x = uint16_t(x);
    t[x] = __half2float(__half(r));
  }
  return t;
}();

inline float half_to_float(uint16_t h) { return g_half_table[h]; }

inline float bf16_to_float(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

void Worker::warp_collective(int kind, int sub, Site site, void* args) {
  Fiber* f = t_fiber;
  const int warp = f->tid / 32, lane = f->tid % 32;
  WarpSlot& ws = warps[warp];
  if ((warp + 1) * 32 > nthreads)
    fail("simt: " + std::string(kind_name(kind, sub)) + " at " + site.str() + " in warp " + std::to_string(warp) +
         ", which has only " + std::to_string(nthreads - warp * 32) + " threads (blockDim not a multiple of 32)");
  if (ws.exited > 0) {
    std::vector<int> gone;
    for (int l = 0; l < 32; ++l)
      if (fibers[warp * 32 + l]->state == State::kExited) gone.push_back(l);
    fail("simt: " + who(f->tid) + " reached " + kind_name(kind, sub) + " at " + site.str() + ", but lanes " +
         thread_list(gone) + " of warp " + std::to_string(warp) + " have exited (the full-warp collective would hang)");
  }
  if (ws.arrived == 0) {
    ws.kind = kind;
    ws.sub = sub;
    ws.site = site;
  } else if (ws.kind != kind || ws.sub != sub || ((kind == kLdmatrix || kind == kMma) && !(ws.site == site))) {
    std::vector<int> waiting;
    for (int l = 0; l < 32; ++l)
      if (fibers[warp * 32 + l]->state == State::kWarp) waiting.push_back(l);
    fail("simt: lanes of warp " + std::to_string(warp) + " at different collectives: lane " + std::to_string(lane) +
         " reached " + kind_name(kind, sub) + " at " + site.str() + " while lanes " + thread_list(waiting) +
         " wait at " + kind_name(ws.kind, ws.sub) + " at " + ws.site.str() +
         ((kind == kLdmatrix || kind == kMma) ? " (.aligned: every lane must execute the same instruction)" : ""));
  }
  ws.args[lane] = args;
  f->site = site;
  if (++ws.arrived < 32) {
    f->state = State::kWarp;
    yield(f);
    return;
  }
  ws.arrived = 0;
  ++stats.warp_collectives;
  switch (kind) {
    case kShuffle: do_shuffle(ws, sub, site); break;
    case kLdmatrix: do_ldmatrix(ws, warp, sub != 0, site); break;
    case kMma:
      if (MmaType(sub) == MmaType::kBF16) do_mma<MmaType::kBF16>(ws);
      else do_mma<MmaType::kF16>(ws);
      break;
    default: break;
  }
  for (int l = 0; l < 32; ++l)
    if (l != lane) release(warp * 32 + l);
}

// shfl.sync (PTX 9.7.9.6; CUDA __shfl*_sync): lane l reads `value` of lane src(l) within its width segment;
// a source outside the segment (up / down / xor past it) returns the lane's own value.
__attribute__((noinline)) void Worker::do_shuffle(WarpSlot& ws, int mode, Site site) {
  uint32_t values[32];
  for (int l = 0; l < 32; ++l) {
    const ShflArgs& a = *static_cast<ShflArgs*>(ws.args[l]);
    if (a.mask != 0xffffffffu)
      fail("simt: " + std::string(kind_name(kShuffle, mode)) + " at " + site.str() + " with mask 0x" +
           [&] { char b[16]; std::snprintf(b, sizeof b, "%08x", a.mask); return std::string(b); }() +
           ": only full-warp masks are emulated");
    if (a.width <= 0 || a.width > 32 || (a.width & (a.width - 1)))
      fail("simt: shuffle width " + std::to_string(a.width) + " at " + site.str() + " is not a power of 2 <= 32");
    values[l] = a.value;
  }
  for (int l = 0; l < 32; ++l) {
    ShflArgs& a = *static_cast<ShflArgs*>(ws.args[l]);
    const int w = a.width, base = l / w * w;
    int src = l;
    switch (Shfl(mode)) {
      case Shfl::kIdx: src = base + (a.arg % w + w) % w; break;
      case Shfl::kXor: src = l ^ a.arg; src = src >= base + w || src < 0 ? l : src; break;
      case Shfl::kUp: src = l - a.arg < base ? l : l - a.arg; break;
      case Shfl::kDown: src = l + a.arg >= base + w ? l : l + a.arg; break;
    }
    a.result = values[src];
  }
}

void Worker::check_shared_row(const unsigned char* p, Site site, const char* what, int tid) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
    fail("simt: " + std::string(what) + " at " + site.str() + ": " + who(tid) + " gives the misaligned row address " +
         where(p) + " (rows must be 16-byte aligned)");
  if (!in_dynamic(p, 16) && !in_static(p, 16))
    fail("simt: " + std::string(what) + " at " + site.str() + ": " + who(tid) + " gives the row address " + where(p) +
         ", outside the CTA's shared memory");
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX 9.7.14.5.15): lanes 8m..8m+7 give the addresses of
// rows 0..7 of matrix m (8 b16 elements = 16 bytes each). Lane l receives in r[m] two elements of matrix m:
// without .trans row l/4, columns 2(l%4) and 2(l%4)+1; with .trans (column-major load) the same positions
// of the transposed matrix, i.e. column l/4 of rows 2(l%4) and 2(l%4)+1. The lower column (row) is in the
// low 16 bits.
__attribute__((noinline)) void Worker::do_ldmatrix(WarpSlot& ws, int warp, bool trans, Site site) {
  uint16_t m[4][8][8];
  for (int l = 0; l < 32; ++l) {
    const unsigned char* p = static_cast<LdArgs*>(ws.args[l])->addr;
    check_shared_row(p, site, trans ? "ldmatrix.x4.trans" : "ldmatrix.x4", warp * 32 + l);
    if (opts.check_races && in_dynamic(p, 16)) {
      Chunk& c = shadow[(p - dyn) / 16];
      if (c.inflight)
        fail("simt: ldmatrix at " + site.str() + " (warp " + std::to_string(warp) + ") reads " + where(p) +
             ", which a cp.async of " + who(c.inflight - 1) + " has not landed: that thread has not waited "
             "(cp.async.wait_group) for it, and no __syncthreads() followed");
      if (c.landed && c.landed_gen == gen && (c.landed - 1) / 32 != warp)
        fail("simt: ldmatrix at " + site.str() + " (warp " + std::to_string(warp) + ") reads " + where(p) +
             ", landed by the cp.async.wait_group of " + who(c.landed - 1) + " with no __syncthreads() since");
      if (c.read_gen != gen) {
        c.read_gen = gen;
        c.reader = warp + 1;
      } else if (c.reader != warp + 1) {
        c.reader = -1;
      }
    }
    std::memcpy(m[l / 8][l % 8], p, 16);
  }
  ++stats.ldmatrix;
  for (int l = 0; l < 32; ++l) {
    uint32_t* r = static_cast<LdArgs*>(ws.args[l])->r;
    const int row = l / 4, col = 2 * (l % 4);
    for (int x = 0; x < 4; ++x)
      r[x] = trans ? uint32_t(m[x][col][row]) | uint32_t(m[x][col + 1][row]) << 16
                   : uint32_t(m[x][row][col]) | uint32_t(m[x][row][col + 1]) << 16;
  }
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 (PTX 9.7.14.5.14; fragments: 9.7.14.5.8
// "Matrix Fragments for mma.m16n8k16 with floating point type"), groupID g = lane >> 2, t = lane % 4:
//   A (16 x 16, row): a0..a7 in 4 registers, two per register, lower index in the low half;
//     row = g for a_i, i in {0,1,4,5}, else g + 8; col = 2t + (i & 1) for i < 4, 2t + (i & 1) + 8 for i >= 4
//     -> reg 0 = (g, 2t..2t+1), reg 1 = (g+8, 2t..), reg 2 = (g, 2t+8..), reg 3 = (g+8, 2t+8..)
//   B (16 x 8, col): b0..b3 in 2 registers; row (k) = 2t + (i & 1) for i < 2, 2t + (i & 1) + 8 for i >= 2;
//     col (n) = g -> reg 0 = (k 2t..2t+1, n g), reg 1 = (k 2t+8..2t+9, n g)
//   C / D (16 x 8, f32): c0..c3; row = g for i < 2, g + 8 for i >= 2; col = 2t + (i & 1)
// D = A B + C: the products of the 16-bit operands are exact in fp32; they are added to C in fp32 in k order
// (PTX leaves the accumulation order and intermediate precision to the implementation).
template <MmaType kType>
__attribute__((noinline)) void Worker::do_mma(WarpSlot& ws) {
  float A[16][16], B[16][8], D[16][8];
  auto cvt = [](uint32_t bits) {
    return kType == MmaType::kBF16 ? bf16_to_float(uint16_t(bits)) : half_to_float(uint16_t(bits));
  };
  for (int l = 0; l < 32; ++l) {
    const MmaArgs& a = *static_cast<MmaArgs*>(ws.args[l]);
    const int g = l >> 2, t = l & 3;
    for (int r = 0; r < 4; ++r) {
      const int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
      A[row][col] = cvt(a.a[r] & 0xffffu);
      A[row][col + 1] = cvt(a.a[r] >> 16);
    }
    B[2 * t][g] = cvt(a.b0 & 0xffffu);
    B[2 * t + 1][g] = cvt(a.b0 >> 16);
    B[2 * t + 8][g] = cvt(a.b1 & 0xffffu);
    B[2 * t + 9][g] = cvt(a.b1 >> 16);
    D[g][2 * t] = a.d[0];
    D[g][2 * t + 1] = a.d[1];
    D[g + 8][2 * t] = a.d[2];
    D[g + 8][2 * t + 1] = a.d[3];
  }
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k) {
      const float x = A[i][k];
      for (int j = 0; j < 8; ++j) D[i][j] += x * B[k][j];
    }
  for (int l = 0; l < 32; ++l) {
    float* d = static_cast<MmaArgs*>(ws.args[l])->d;
    const int g = l >> 2, t = l & 3;
    d[0] = D[g][2 * t];
    d[1] = D[g][2 * t + 1];
    d[2] = D[g + 8][2 * t];
    d[3] = D[g + 8][2 * t + 1];
  }
  ++stats.mmas;
}

}  // namespace simt::runtime

namespace simt {

using runtime::worker;

void syncwarp(unsigned mask, Site site) {
  runtime::Worker& w = worker();
  if (mask != 0xffffffffu) w.fail("simt: __syncwarp at " + site.str() + " with a partial mask: only full-warp masks are emulated");
  w.warp_collective(runtime::kSyncWarp, 0, site, nullptr);
}

uint32_t shfl(Shfl mode, unsigned mask, uint32_t value, int lane_arg, int width, Site site) {
  runtime::ShflArgs a{value, lane_arg, width, mask, 0};
  worker().warp_collective(runtime::kShuffle, int(mode), site, &a);
  return a.result;
}

void ldmatrix_x4(uint32_t (&r)[4], const void* smem, bool trans, Site site) {
  runtime::LdArgs a{static_cast<const unsigned char*>(smem), r};
  worker().warp_collective(runtime::kLdmatrix, trans ? 1 : 0, site, &a);
}

void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, MmaType type, Site site) {
  runtime::MmaArgs m{d, a, b0, b1};
  worker().warp_collective(runtime::kMma, int(type), site, &m);
}

}  // namespace simt
