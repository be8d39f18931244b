#include "cpu/kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <mutex>

namespace rangeswa::cpu {

RopeTable::RopeTable(const RopeParams& rope, const double* positions, int64_t count) {
  half_ = rope.rotary_dim / 2;
  cos_.resize(count * half_);
  sin_.resize(count * half_);
  std::vector<double> inv_freq(half_);
  for (int64_t k = 0; k < half_; ++k) inv_freq[k] = rope.frequency(k);
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
  // A table of first + s * step serves every count up to its own: a decode step's L is one more than the
  // last call's, so a table is found by (frequencies, rotary dim, first, step) and rebuilt only when it is
  // too short, then with room for twice the rows (O(log L) builds over a generation instead of one per step).
  struct Entry {
    RopeParams rope;  // its theta, rotary dim and given frequencies (the pairing does not enter the table)
    double first, step;
    int64_t count;
    std::shared_ptr<const RopeTable> table;
  };
  static std::mutex mutex;
  static std::vector<Entry> recent;  // newest last
  constexpr size_t kKeep = 8;
  std::lock_guard<std::mutex> lock(mutex);
  int64_t grown = count;
  for (auto entry = recent.begin(); entry != recent.end(); ++entry) {
    if (!entry->rope.same_frequencies(rope) || entry->rope.rotary_dim != rope.rotary_dim || entry->first != first ||
        entry->step != step)
      continue;
    if (entry->count >= count) return entry->table;
    grown = std::max(count, 2 * entry->count);
    recent.erase(entry);
    break;
  }
  std::vector<double> positions(grown);
  for (int64_t s = 0; s < grown; ++s) positions[s] = first + double(s) * step;
  auto table = std::make_shared<const RopeTable>(rope, positions.data(), grown);
  if (recent.size() == kKeep) recent.erase(recent.begin());
  recent.push_back(Entry{rope, first, step, grown, table});
  return table;
}

std::shared_ptr<const RopeTable> rope_table(const RopeParams& rope, std::vector<double> positions) {
  struct Entry {
    RopeParams rope;  // its theta, rotary dim and given frequencies (the pairing does not enter the table)
    std::vector<double> positions;
    std::shared_ptr<const RopeTable> table;
    bool holds(const RopeParams& r, const std::vector<double>& p) const {
      return rope.same_frequencies(r) && rope.rotary_dim == r.rotary_dim && positions == p;
    }
  };
  static std::mutex mutex;
  static std::vector<Entry> recent;  // newest last
  constexpr size_t kKeep = 8;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const Entry& entry : recent)
      if (entry.holds(rope, positions)) return entry.table;
  }
  auto table = std::make_shared<const RopeTable>(rope, positions.data(), int64_t(positions.size()));
  std::lock_guard<std::mutex> lock(mutex);
  if (recent.size() == kKeep) recent.erase(recent.begin());
  recent.push_back(Entry{rope, std::move(positions), table});
  return table;
}

}  // namespace rangeswa::cpu
