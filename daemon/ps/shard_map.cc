#include "daemon/ps/shard_map.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace gradlane::ps {
namespace {

// This Abseil build's string_view is its own type, so std::string_view needs converting for
// StrCat.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// splitmix64's finaliser: a fixed, well-mixed function, so the fingerprint is identical on
// every host and build (unlike absl::Hash, which is seeded per process).
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline constexpr uint32_t kMaxShards = 1u << 16;

}  // namespace

absl::StatusOr<ShardMap> ShardMap::Build(absl::Span<const KeyBytes> keys, uint32_t num_shards) {
  if (num_shards == 0 || num_shards > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard count ", num_shards, " outside 1..", kMaxShards));
  }
  // Largest first, ties by key: a total order on distinct keys, so the placement sequence (and
  // hence the map) does not depend on the caller's listing order.
  std::vector<KeyBytes> order(keys.begin(), keys.end());
  std::sort(order.begin(), order.end(), [](const KeyBytes& a, const KeyBytes& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.key < b.key;
  });

  ShardMap map;
  map.load_.assign(num_shards, 0);
  map.shard_of_.reserve(order.size());
  // Min-heap on (load, shard): the least-loaded shard, lowest index on ties.
  using Entry = std::pair<uint64_t, uint32_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (uint32_t s = 0; s < num_shards; ++s) heap.push({0, s});
  for (const KeyBytes& kb : order) {
    auto [load, shard] = heap.top();
    if (!map.shard_of_.emplace(kb.key, shard).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("key ", kb.key, " (tensor ", sched::KeyTensor(kb.key), " partition ",
                       sched::KeyPartition(kb.key), ") listed twice"));
    }
    heap.pop();
    if (kb.bytes > std::numeric_limits<uint64_t>::max() - load) {
      return absl::InvalidArgumentError("total bytes overflow 64 bits");
    }
    load += kb.bytes;
    map.load_[shard] = load;
    heap.push({load, shard});
  }

  // Fingerprint over the assignment in key order, so it is independent of input order.
  std::sort(order.begin(), order.end(),
            [](const KeyBytes& a, const KeyBytes& b) { return a.key < b.key; });
  uint64_t h = Mix(num_shards);
  for (const KeyBytes& kb : order) {
    h = Mix(h ^ kb.key);
    h = Mix(h ^ kb.bytes);
    h = Mix(h ^ map.shard_of_.at(kb.key));
  }
  map.fingerprint_ = h;
  return map;
}

absl::StatusOr<ShardMap> ShardMap::FromTensors(absl::Span<const sched::TensorSpec> tensors,
                                               uint64_t partition_bytes, uint32_t num_shards) {
  const std::vector<uint64_t> sizes(tensors.size(), partition_bytes);
  return FromTensors(tensors, sizes, num_shards);
}

absl::StatusOr<ShardMap> ShardMap::FromTensors(absl::Span<const sched::TensorSpec> tensors,
                                               absl::Span<const uint64_t> partition_sizes,
                                               uint32_t num_shards) {
  if (partition_sizes.size() != tensors.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(partition_sizes.size(), " partition sizes for ", tensors.size(), " tensors"));
  }
  std::vector<KeyBytes> keys;
  absl::flat_hash_set<uint32_t> ids;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const sched::TensorSpec& t = tensors[i];
    const uint64_t partition_bytes = partition_sizes[i];
    if (partition_bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.id, ": partition size 0"));
    }
    if (!ids.insert(t.id).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor id ", t.id, " listed twice"));
    }
    const uint32_t elem = sched::DTypeBytes(t.dtype);
    if (partition_bytes % elem != 0) {
      return absl::InvalidArgumentError(absl::StrCat("partition size ", partition_bytes,
                                                     " splits a ", Sv(sched::DTypeName(t.dtype)),
                                                     " element of tensor ", t.id));
    }
    if (t.bytes % elem != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.id, ": ", t.bytes,
                                                     " bytes is not a whole number of ",
                                                     Sv(sched::DTypeName(t.dtype)), " elements"));
    }
    const uint64_t parts = t.bytes / partition_bytes + (t.bytes % partition_bytes != 0);
    if (parts > sched::kMaxPartitions) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.id, " needs ", parts,
                                                     " partitions of ", partition_bytes,
                                                     " bytes (max ", sched::kMaxPartitions, ")"));
    }
    for (uint64_t p = 0; p < parts; ++p) {
      const uint64_t begin = p * partition_bytes;
      keys.push_back({sched::MakeKey(t.id, static_cast<uint32_t>(p)),
                      std::min(partition_bytes, t.bytes - begin)});
    }
  }
  return Build(keys, num_shards);
}

uint64_t ShardMap::max_load() const {
  return load_.empty() ? 0 : *std::max_element(load_.begin(), load_.end());
}

uint64_t ShardMap::min_load() const {
  return load_.empty() ? 0 : *std::min_element(load_.begin(), load_.end());
}

double ShardMap::LoadRatio() const {
  const uint64_t hi = max_load();
  const uint64_t lo = min_load();
  if (hi == 0) return 1.0;
  if (lo == 0) return std::numeric_limits<double>::infinity();
  return static_cast<double>(hi) / static_cast<double>(lo);
}

std::vector<sched::SegmentKey> ShardMap::KeysOf(uint32_t shard) const {
  std::vector<sched::SegmentKey> keys;
  for (const auto& [key, s] : shard_of_) {
    if (s == shard) keys.push_back(key);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

}  // namespace gradlane::ps
