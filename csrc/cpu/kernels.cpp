#include "cpu/kernels.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <mutex>
#include <tuple>

namespace rangeswa::cpu {

RopeTable::RopeTable(const RopeParams& rope, double first, double step, int64_t count) {
  std::vector<double> pos(count);
  for (int64_t s = 0; s < count; ++s) pos[s] = first + double(s) * step;
  fill(rope, pos.data(), count);
}

RopeTable::RopeTable(const RopeParams& rope, const double* positions, int64_t count) {
  fill(rope, positions, count);
}

void RopeTable::fill(const RopeParams& rope, const double* positions, int64_t count) {
  half_ = rope.rotary_dim / 2;
  cos_.resize(count * half_);
  sin_.resize(count * half_);
  std::vector<double> inv_freq(half_);
  for (int64_t k = 0; k < half_; ++k) inv_freq[k] = std::pow(rope.theta, -2.0 * double(k) / double(rope.rotary_dim));
  at::parallel_for(0, count, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      for (int64_t k = 0; k < half_; ++k) {
        double angle = positions[s] * inv_freq[k];
        cos_[s * half_ + k] = float(std::cos(angle));
        sin_[s * half_ + k] = float(std::sin(angle));
      }
    }
  });
}

std::shared_ptr<const RopeTable> rope_table(const RopeParams& rope, double first, double step, int64_t count) {
  using Key = std::tuple<double, int64_t, double, double, int64_t>;
  static std::mutex mutex;
  static std::vector<std::pair<Key, std::shared_ptr<const RopeTable>>> recent;  // newest last
  constexpr size_t kKeep = 8;
  const Key key{rope.theta, rope.rotary_dim, first, step, count};
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& entry : recent)
      if (entry.first == key) return entry.second;
  }
  auto table = std::make_shared<const RopeTable>(rope, first, step, count);
  std::lock_guard<std::mutex> lock(mutex);
  if (recent.size() == kKeep) recent.erase(recent.begin());
  recent.emplace_back(key, table);
  return table;
}

}  // namespace rangeswa::cpu
