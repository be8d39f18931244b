// RoPE on the device (SPEC section 1): angles formed in double like the CPU's RopeTable, rounded to
// float cos/sin, and the rotation of a pair in float: the one statement of its products (rotate_pair), for one
// element of a row (rotated_element), and for P pairs loaded in registers (rotate_loaded: the query-slot fills,
// the preparation's vector lanes, and the conditioning rotation's three paths, prepare.h k_cond and
// common/cond_rotation.h's two, all on the tables' row j of the angles j T / L).
#pragma once

#include <cmath>
#include <cstdint>

#include "rules.h"

namespace rangeswa::cuda {

// cos/sin of position * inv_freq[k] in double, as float: inv_freq[k] = given[k] when the op's inv_freq was
// given (`given`: its rotary_dim / 2 entries as doubles, in the memory the caller runs in), else
// theta^(-2k / rotary_dim).
RSWA_HD void rope_cos_sin(double position, int k, int rotary_dim, double theta, const double* given, float* c,
                          float* s) {
  const double inv_freq = given != nullptr ? given[k] : ::pow(theta, -2.0 * double(k) / double(rotary_dim));
  double sd, cd;
  ::sincos(position * inv_freq, &sd, &cd);
  *c = float(cd);
  *s = float(sd);
}

// [gate:rotate-loaded begin]
// The pair (a, b) rotated by the angle of cos c and sin s, in place: a cos - b sin, a sin + b cos (the CPU's
// rotate_row).
RSWA_HD void rotate_pair(float& a, float& b, float c, float s) {
  const float ra = a * c - b * s, rb = a * s + b * c;
  a = ra;
  b = rb;
}

// The rotation of P pairs loaded as common/query_slot.h rotate_pairs loads them (a: dims x.., b: dims y..), in place:
// pair e is (a[e], b[e]) in the half layout, two neighbours of a (e < P / 2) or of b in the interleaved one
// (rotate_pair's products, the sines multiplied by sign).
template <int P>
RSWA_HD void rotate_loaded(float (&a)[P], float (&b)[P], const float (&c)[P], const float (&s)[P], float sign,
                           bool interleaved) {
  constexpr int P2 = P / 2;
  float pa[P], pb[P];
#pragma unroll
  for (int e = 0; e < P; ++e) {
    const float* first = e < P2 ? a : b;
    pa[e] = interleaved ? first[2 * (e % P2)] : a[e];
    pb[e] = interleaved ? first[2 * (e % P2) + 1] : b[e];
    rotate_pair(pa[e], pb[e], c[e], s[e] * sign);
  }
#pragma unroll
  for (int e = 0; e < P; ++e) {
    float* first = e < P2 ? a : b;
    if (interleaved) {
      first[2 * (e % P2)] = pa[e];
      first[2 * (e % P2) + 1] = pb[e];
    } else {
      a[e] = pa[e];
      b[e] = pb[e];
    }
  }
}
// [gate:rotate-loaded end]

// Element d of R x for one row whose cos/sin rows (rotary_half entries each) are given, the sines
// multiplied by sin_sign (-1 rotates by the negative position whose table row is the positive one); x(d)
// reads element d of the unrotated row as float. Pairs: interleaved (2k, 2k+1), half (k, k + rotary_half);
// out_a = a cos - b sin, out_b = a sin + b cos (the CPU's rotate_row). Dims past rotary_dim pass through.
template <typename Load>
RSWA_HD float rotated_element(const Load& x, int d, int rotary_half, bool interleaved, const float* cos_row,
                              const float* sin_row, float sin_sign = 1.f) {
  if (d >= 2 * rotary_half) return x(d);
  const int k = interleaved ? d / 2 : (d < rotary_half ? d : d - rotary_half);
  const int ia = interleaved ? 2 * k : k;
  const int ib = interleaved ? 2 * k + 1 : k + rotary_half;
  const float a = x(ia), b = x(ib), c = cos_row[k], s = sin_sign * sin_row[k];
  return d == ia ? a * c - b * s : a * s + b * c;
}

}  // namespace rangeswa::cuda
