// daemon/ps/shard_map.h — which co-located parameter-server shard owns each segment key of a job.
//
// In parameter-server mode every one of the W daemons of a job is also the shard for a slice of
// the keys; a worker pushes each segment to the shard that owns its key. The daemons never
// negotiate the map: each computes it from the same registered tensor list and partition plan,
// so the construction must be a pure, deterministic function of its input.
//
// Guarantees:
//  - Deterministic: the same set of (key, bytes) and shard count gives the same map on every
//    host, whatever order the keys are listed in (they are sorted internally, ties broken by
//    key, least-loaded shard ties by lowest index). `Fingerprint()` lets daemons cross-check
//    that they agree (e.g. in their hello) without exchanging the map.
//  - Balanced by bytes: greedy largest-first onto the least-loaded shard (LPT). The heaviest
//    shard carries at most total/W + the largest key, and at most 4/3 of the optimum.
//  - Lookup is O(1) (hash map); the map is immutable once built, so concurrent lookups from
//    any number of threads are safe.
// Building allocates (control path, at job registration); lookups do not.
#ifndef GRADLANE_DAEMON_PS_SHARD_MAP_H_
#define GRADLANE_DAEMON_PS_SHARD_MAP_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sched/types.h"

namespace gradlane::ps {

struct KeyBytes {
  sched::SegmentKey key = 0;
  uint64_t bytes = 0;
};

class ShardMap {
 public:
  // Assigns every key to one of `num_shards` shards. Errors: num_shards 0 or > 65536 (shards
  // are peer ranks, `Segment::peer` is 16 bits), a duplicate key.
  // Keys of zero bytes are allowed and assigned like any other (they carry no load).
  static absl::StatusOr<ShardMap> Build(absl::Span<const KeyBytes> keys, uint32_t num_shards);

  // Partitions each tensor into `partition_bytes`-sized pieces (the last one shorter), keys
  // MakeKey(id, p), and builds the map from those. Errors: partition_bytes 0 or not a multiple
  // of a tensor's element size, a tensor size not a multiple of its element size, a tensor
  // needing more than kMaxPartitions partitions (the partitioner raises the partition size for
  // such tensors: pass its actual plan to `Build` instead), a duplicate tensor id.
  static absl::StatusOr<ShardMap> FromTensors(absl::Span<const sched::TensorSpec> tensors,
                                              uint64_t partition_bytes, uint32_t num_shards);

  // As above with each tensor's own partition size (partition_bytes[i] for tensors[i]): pass
  // sched::PartitionPlan::Make(...).partition_bytes() per tensor so the keys are exactly the
  // partitioner's. Same errors, plus a size list of the wrong length.
  static absl::StatusOr<ShardMap> FromTensors(absl::Span<const sched::TensorSpec> tensors,
                                              absl::Span<const uint64_t> partition_bytes,
                                              uint32_t num_shards);

  // The shard (peer rank) owning `key`, or nullopt if the key is not part of the job.
  std::optional<uint32_t> ShardOf(sched::SegmentKey key) const {
    auto it = shard_of_.find(key);
    if (it == shard_of_.end()) return std::nullopt;
    return it->second;
  }

  uint32_t num_shards() const { return static_cast<uint32_t>(load_.size()); }
  size_t num_keys() const { return shard_of_.size(); }
  // Bytes owned by each shard, indexed by shard.
  absl::Span<const uint64_t> shard_bytes() const { return load_; }
  uint64_t max_load() const;
  uint64_t min_load() const;
  // max_load / min_load; 1.0 when every shard is empty, +infinity when some shard is empty and
  // another is not (e.g. fewer keys than shards).
  double LoadRatio() const;

  // The keys owned by `shard`, ascending (so a shard can pre-create its per-key state).
  std::vector<sched::SegmentKey> KeysOf(uint32_t shard) const;

  // A 64-bit digest of the full assignment (every key, its bytes and its shard), independent of
  // input order: equal maps have equal fingerprints.
  uint64_t Fingerprint() const { return fingerprint_; }

 private:
  ShardMap() = default;

  absl::flat_hash_map<sched::SegmentKey, uint32_t> shard_of_;
  std::vector<uint64_t> load_;
  uint64_t fingerprint_ = 0;
};

}  // namespace gradlane::ps

#endif  // GRADLANE_DAEMON_PS_SHARD_MAP_H_
