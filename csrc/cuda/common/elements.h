// Vector loads and stores of floats and of elements as floats (one or two 16-byte accesses).
#pragma once

#include <cstdint>
#include <cstring>

#include "../utils.h"

namespace rangeswa::cuda {

// N consecutive floats (N = 2 or a multiple of 4), from an address aligned to min(N, 4) floats.
template <int N>
RSWA_HD void load_floats(const float* src, float (&x)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 f = *reinterpret_cast<const float4*>(src + i);
      x[i] = f.x, x[i + 1] = f.y, x[i + 2] = f.z, x[i + 3] = f.w;
    }
  } else {
    static_assert(N == 2, "2 floats or a multiple of 4");
    const float2 f = *reinterpret_cast<const float2*>(src);
    x[0] = f.x, x[1] = f.y;
  }
}

// N elements (4, 8, 16 or 32 bytes, aligned so) as floats, and back: one to two vector loads or stores.
template <typename Element, int N>
RSWA_HD void load_elements(const Element* src, float (&x)[N]) {
  constexpr int kBytes = N * int(sizeof(Element));
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16 || kBytes == 32, "4, 8, 16 or 32 bytes");
  Element e[N];
  if constexpr (kBytes == 4) {
    const uint32_t raw = *reinterpret_cast<const uint32_t*>(src);
    memcpy(e, &raw, 4);
  } else if constexpr (kBytes == 8) {
    const uint2 raw = *reinterpret_cast<const uint2*>(src);
    memcpy(e, &raw, 8);
  } else {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      const uint4 raw = reinterpret_cast<const uint4*>(src)[i];
      memcpy(reinterpret_cast<char*>(e) + 16 * i, &raw, 16);
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = to_float(e[i]);
}
template <typename Element, int N>
RSWA_HD void store_elements(Element* dst, const float (&x)[N]) {
  constexpr int kBytes = N * int(sizeof(Element));
  Element e[N];
#pragma unroll
  for (int i = 0; i < N; ++i) e[i] = from_float<Element>(x[i]);
  if constexpr (kBytes == 4) {
    uint32_t raw;
    memcpy(&raw, e, 4);
    *reinterpret_cast<uint32_t*>(dst) = raw;
  } else if constexpr (kBytes == 8) {
    uint2 raw;
    memcpy(&raw, e, 8);
    *reinterpret_cast<uint2*>(dst) = raw;
  } else {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      uint4 raw;
      memcpy(&raw, reinterpret_cast<const char*>(e) + 16 * i, 16);
      reinterpret_cast<uint4*>(dst)[i] = raw;
    }
  }
}

}  // namespace rangeswa::cuda
