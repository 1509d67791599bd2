// sched/types.h — the vocabulary shared by every scheduling component, the simulator and the
// daemon: tensors, segments, keys, virtual time.
//
// Guarantees: header-only value types, no I/O, no clock. Time is always passed in by the caller
// as a TimeNs (nanoseconds on whatever timeline the caller runs: virtual in the simulator,
// CLOCK_MONOTONIC in the daemon). Safe to use from any thread; nothing here is shared state.
#ifndef GRADLANE_SCHED_TYPES_H_
#define GRADLANE_SCHED_TYPES_H_

#include <cstdint>
#include <limits>
#include <string_view>

#include "absl/status/statusor.h"

namespace gradlane::sched {

// Nanoseconds on the caller's timeline.
using TimeNs = int64_t;
inline constexpr TimeNs kNever = std::numeric_limits<TimeNs>::max();
inline constexpr TimeNs kMicrosecond = 1000;
inline constexpr TimeNs kMillisecond = 1000 * kMicrosecond;
inline constexpr TimeNs kSecond = 1000 * kMillisecond;

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

constexpr uint32_t DTypeBytes(DType t) { return t == DType::kF32 ? 4u : 2u; }
constexpr std::string_view DTypeName(DType t) {
  return t == DType::kF32 ? "f32" : (t == DType::kF16 ? "f16" : "bf16");
}
inline absl::StatusOr<DType> ParseDType(std::string_view s) {
  if (s == "f32" || s == "float32") return DType::kF32;
  if (s == "f16" || s == "float16") return DType::kF16;
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  return absl::InvalidArgumentError(std::string("unknown dtype '") + std::string(s) +
                                    "' (expected f32, f16 or bf16)");
}

// Priority 0 is the most urgent: the tensor closest to the input, consumed first by the next
// forward pass. Larger numbers are less urgent.
using Priority = int32_t;

// A segment key names one partition of one tensor: tensor_id << 16 | partition_index.
// The 16-bit partition field caps a tensor at 65536 partitions; the partitioner raises the
// partition size for huge tensors rather than overflow it.
using SegmentKey = uint64_t;
inline constexpr uint32_t kPartitionBits = 16;
inline constexpr uint32_t kMaxPartitions = 1u << kPartitionBits;
constexpr SegmentKey MakeKey(uint32_t tensor_id, uint32_t partition_index) {
  return (static_cast<SegmentKey>(tensor_id) << kPartitionBits) | partition_index;
}
constexpr uint32_t KeyTensor(SegmentKey key) {
  return static_cast<uint32_t>(key >> kPartitionBits);
}
constexpr uint32_t KeyPartition(SegmentKey key) {
  return static_cast<uint32_t>(key & (kMaxPartitions - 1));
}

// Push: a worker's contribution travelling to the shard that owns the key.
// Pull: the shard's reduced result travelling back to a worker.
enum class Direction : uint8_t { kPush = 0, kPull = 1 };

// A registered tensor as the scheduler sees it (names live with the caller).
struct TensorSpec {
  uint32_t id = 0;
  uint64_t bytes = 0;
  DType dtype = DType::kF32;
  Priority priority = 0;
};

// "These bytes of tensor T for iteration k are ready to go to `peer`": what a policy is fed.
// The range is relative to the tensor's start; policies cut it at partition boundaries.
struct ReadyRange {
  uint32_t tensor_id = 0;
  Priority priority = 0;
  DType dtype = DType::kF32;
  Direction direction = Direction::kPush;
  uint16_t peer = 0;  // destination host (rank of the peer daemon in the job)
  int64_t iteration = 0;
  uint64_t tensor_bytes = 0;  // the whole tensor's size, so partitions are stable across ranges
  uint64_t offset = 0;
  uint64_t length = 0;
  // A hop of a ring all-reduce chunk (reduce-scatter or all-gather) to the right neighbour.
  // Every chunk's ring is a chain of hops, each waiting for the previous one, and a policy may
  // order a host's hops by when they arrived rather than where they lie in the tensor
  // (gradlane's rules do: gradlane.h, rule 2).
  bool ring_hop = false;
};

// One schedulable unit: a byte range of a tensor, never a copy of its data.
struct Segment {
  SegmentKey key = 0;
  Priority priority = 0;
  DType dtype = DType::kF32;
  Direction direction = Direction::kPush;
  uint16_t peer = 0;
  int64_t iteration = 0;
  uint64_t offset = 0;  // from the tensor's start
  uint64_t length = 0;
  TimeNs ready_at = 0;  // when it entered the scheduler (for queueing-delay metrics)
  // Order among segments of equal (iteration, priority), before the key: a policy that slices
  // the partitions of one tensor derives it from the slice's index within its partition, so
  // that slice j of several partitions (several shard owners, every pulling peer) goes before
  // slice j + 1 of any (gradlane: GradlaneSliceRound). 0 for policies that send partitions
  // whole, which keeps their key order. gradlane's rules give ring hops (ReadyRange::ring_hop)
  // an arrival count instead, so that they go in the order they arrived.
  uint32_t round = 0;
};

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_TYPES_H_
