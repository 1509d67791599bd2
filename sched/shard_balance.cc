#include "sched/shard_balance.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <vector>

namespace gradlane::sched {

uint64_t LptHeaviestShardBytes(absl::Span<const uint64_t> tensor_bytes, uint64_t unit,
                               uint32_t shards) {
  if (shards == 0 || unit == 0) return 0;
  // Pieces of one size come in runs: a tensor of n·unit + r bytes gives n pieces of `unit` and
  // one of r. Sorting the distinct sizes with their counts keeps this O(tensors · log) per call
  // except for the assignments themselves.
  std::vector<uint64_t> remainders;
  uint64_t full_pieces = 0;
  for (uint64_t bytes : tensor_bytes) {
    full_pieces += bytes / unit;
    if (bytes % unit != 0) remainders.push_back(bytes % unit);
  }
  std::sort(remainders.begin(), remainders.end(), std::greater<>());
  // Min-heap of shard loads: the least-loaded shard takes the next piece (ties do not change
  // the heaviest load's value).
  std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<>> loads;
  for (uint32_t s = 0; s < shards; ++s) loads.push(0);
  auto place = [&loads](uint64_t piece) {
    const uint64_t least = loads.top();
    loads.pop();
    loads.push(least + piece);
  };
  // Every full piece is at least as large as every remainder, so they go first. Placing k equal
  // pieces onto the least-loaded shards one by one: once each shard got one, the order repeats,
  // so whole rounds are added at once.
  if (full_pieces >= shards) {
    const uint64_t rounds = full_pieces / shards;
    std::vector<uint64_t> all;
    while (!loads.empty()) {
      all.push_back(loads.top() + rounds * unit);
      loads.pop();
    }
    for (uint64_t l : all) loads.push(l);
    full_pieces -= rounds * shards;
  }
  for (uint64_t i = 0; i < full_pieces; ++i) place(unit);
  for (uint64_t r : remainders) place(r);
  uint64_t heaviest = 0;
  while (!loads.empty()) {
    heaviest = std::max(heaviest, loads.top());
    loads.pop();
  }
  return heaviest;
}

double UnspreadShare(absl::Span<const uint64_t> tensor_bytes, uint64_t unit, uint32_t shards) {
  if (shards == 0 || unit == 0) return 0.0;
  double total = 0;
  double unspread = 0;
  for (uint64_t bytes : tensor_bytes) {
    total += static_cast<double>(bytes);
    const uint64_t pieces = bytes / unit + (bytes % unit != 0 ? 1 : 0);
    if (pieces < shards) {
      unspread += static_cast<double>(bytes) * static_cast<double>(shards - pieces) /
                  static_cast<double>(shards);
    }
  }
  return total == 0 ? 0.0 : unspread / total;
}

uint64_t BalancedShardUnit(absl::Span<const uint64_t> tensor_bytes, uint32_t shards,
                           uint64_t max_unit, uint64_t min_unit, double tolerance,
                           double spread_tolerance) {
  if (shards <= 1 || max_unit == 0) return max_unit;
  uint64_t total = 0;
  for (uint64_t bytes : tensor_bytes) total += bytes;
  if (total == 0) return max_unit;
  const double allowed = (1.0 + tolerance) * static_cast<double>(total) / shards;
  uint64_t unit = max_unit;
  while (static_cast<double>(LptHeaviestShardBytes(tensor_bytes, unit, shards)) > allowed ||
         UnspreadShare(tensor_bytes, unit, shards) > spread_tolerance) {
    const uint64_t half = unit / 2;
    if (half < min_unit || half % 8 != 0) break;
    unit = half;
  }
  return unit;
}

}  // namespace gradlane::sched
