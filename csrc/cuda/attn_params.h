// Everything one launch of the fused attention kernel reads, filled once by the op (ops.cu) and
// passed by value as a __grid_constant__ kernel parameter. No torch types, so the kernel
// instantiations compile without the torch headers.
#pragma once

#include <cstdint>

#include "layout.h"
#include "rules.h"

namespace rangeswa::cuda {

// The element types of the op's inputs; bf16 and fp16 run on tensor cores, fp32 on the SIMT path.
enum class DType : int { kFloat = 0, kBFloat16 = 1, kHalf = 2 };

// Rows per KV head of the prepared arrays (prepare.h), each row padded to the kernel's head dim:
//   keys_nat  [C + L + nS]: control keys (never rotated), R(j) k_j, block means of R(j) k_j
//   values    [C + L + nS]: control values, body values, block means of the values
//   keys_grp  [L + nS]    : R(j/g) k_j and its block means (grouped positions; null without grouping)
//   keys_cond [L]         : R(j T/L) k_j (control rows under the conditioning correction; else null)
// nS = ceil(L / G) for rangeswa (the summary keys), 0 for the token-level methods.
struct AttnKernelParams {
  const void* q;     // [B, Hq, N, D], before RoPE; rows at q_strides.at(b, h, n)
  RowStrides q_strides;
  void* out;         // [B, Hq, N, D], contiguous
  float* lse;        // [B, Hq, N], natural log
  const void* keys_nat;
  const void* keys_grp;
  const void* keys_cond;
  const void* values;
  int64_t nat_rows, grp_rows;  // rows per KV head of keys_nat / values and of keys_grp

  // cos/sin [count, rotary_dim / 2] of the query rotations (prepare.h, rope tables): native positions
  // i, grouped positions s - c at row s, conditioning positions i * T / L.
  const float *cos_nat, *sin_nat, *cos_grp, *sin_grp, *cos_cond, *sin_cond;
  int rotary_half;   // rotary_dim / 2
  bool interleaved;

  const int32_t* retrieved;  // [B, Hkv, nQb, retrieved_k] rule-3 blocks, -1 padded; null = none
  int64_t retrieved_k;

  Rules rules;
  int64_t B, Hq, Hkv, N, C, L, D;  // k and v hold N = C + L rows
  // q and the output hold Nq = C + Lq rows: the control rows, then body rows first_row .. L - 1 (SPEC
  // section 7's cached calls; Nq = N and first_row = 0 otherwise). Body row i is q row C + i - first_row.
  int64_t Nq, first_row;
  float scale_log2;         // scale * log2(e): logits are kept in base 2
  float control_bias_log2;  // section 3: -log(L/T) * log2(e) on control-row logits of body keys
  float log2_block;         // log2(G), rule 4's summary bias of a full G-block
  float log2_last_block;    // log2(n_b) of the last (possibly ragged) G-block

  // Query slots in shared memory: 1 (native), 2 (native + conditioning) or 3 (native, grouped-left,
  // grouped-right; slot 1 holds the conditioning rotation while the control keys are scored).
  int num_q_slots;
  bool cond_queries;  // body rows score the control keys with the conditioning rotation

  // Work split: per (batch, query head), control_tiles tiles of control rows, then body tiles.
  // Body tile t holds rows [max(qb * tile_query_block, first_row) + s * kBlockM, ...) with
  // qb = first_tile_query_block + t / tiles_per_query_block, s = t % tiles_per_query_block, clipped to
  // the query block (tile_query_block = Qb for rangeswa); a tile past its block's rows has none.
  int64_t control_tiles, body_tiles, tile_query_block, tiles_per_query_block, first_tile_query_block;
};

}  // namespace rangeswa::cuda
