// RoPE on the device (SPEC section 1): angles formed in double like the CPU's RopeTable, rounded to
// float cos/sin, and the rotation of one element of a row in float.
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
