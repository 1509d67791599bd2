// sched/partitioner.h — where a tensor is cut into partitions, and how a ready byte range is cut
// at those boundaries into schedulable Segments.
//
// Why a plan per tensor rather than per range: a tensor's gradient may become ready in several
// ranges (a client posting pieces as they are produced). Partition k of a tensor must name the
// same bytes whichever range it arrives in, so the shard that owns key (tensor, k) sums the
// same bytes from every worker. The plan therefore depends only on (tensor bytes, dtype,
// requested size), never on the range.
//
// Guarantees:
//   * The partition size is a positive multiple of the dtype's element size (no element is
//     ever split between two partitions, so a shard can sum a partition on its own).
//   * A tensor never has more than kMaxPartitions (65536) partitions: the size is raised
//     (and re-aligned) for huge tensors, so the 16-bit partition field of a SegmentKey never
//     overflows.
//   * Cutting is allocation-free: segments are reported through a callback as byte ranges of
//     the tensor; no data is copied or owned.
// Pure functions and value types: safe from any thread.
#ifndef GRADLANE_SCHED_PARTITIONER_H_
#define GRADLANE_SCHED_PARTITIONER_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "sched/types.h"

namespace gradlane::sched {

// P3 §5.6: slices of at most 50,000 parameters gave the best throughput.
inline constexpr uint64_t kP3PartitionElements = 50000;

class PartitionPlan {
 public:
  // Plans `tensor_bytes` of `dtype` cut into partitions of about `requested_bytes`.
  // requested_bytes == 0 means "whole tensor" (one partition; still capped/aligned).
  // The effective size is requested_bytes rounded down to a whole number of elements (at least
  // one element), then raised to ceil(tensor_bytes / 65536) rounded up to whole elements if
  // the tensor would otherwise have more than 65536 partitions.
  static PartitionPlan Make(uint64_t tensor_bytes, DType dtype, uint64_t requested_bytes) {
    const uint64_t elem = DTypeBytes(dtype);
    uint64_t size = requested_bytes == 0 ? tensor_bytes : requested_bytes;
    size = std::max<uint64_t>(size - size % elem, elem);
    const uint64_t min_size = CeilDiv(tensor_bytes, kMaxPartitions);
    if (size < min_size) size = CeilDiv(min_size, elem) * elem;
    return PartitionPlan(tensor_bytes, size);
  }

  uint64_t tensor_bytes() const { return tensor_bytes_; }
  uint64_t partition_bytes() const { return partition_bytes_; }
  uint32_t partition_count() const {
    return static_cast<uint32_t>(CeilDiv(tensor_bytes_, partition_bytes_));
  }
  uint32_t PartitionOf(uint64_t offset) const {
    return static_cast<uint32_t>(offset / partition_bytes_);
  }

  // Cuts [offset, offset + length) at partition boundaries and calls
  // fn(partition_index, segment_offset, segment_length) for each piece, in increasing offset.
  // A range that starts or ends inside a partition yields a partial piece of that partition
  // (same partition index). Bytes beyond tensor_bytes() are not reported: callers validate
  // ranges with ValidateRange() on the control path. Never allocates.
  template <typename Fn>
  void ForEachSegment(uint64_t offset, uint64_t length, Fn&& fn) const {
    if (offset >= tensor_bytes_) return;
    const uint64_t end = offset + std::min(length, tensor_bytes_ - offset);
    while (offset < end) {
      const uint32_t index = PartitionOf(offset);
      const uint64_t boundary = static_cast<uint64_t>(index + 1ull) * partition_bytes_;
      const uint64_t piece_end = std::min(end, boundary);
      fn(index, offset, piece_end - offset);
      offset = piece_end;
    }
  }

  // OK if [offset, offset+length) lies inside the tensor and is element-aligned.
  absl::Status ValidateRange(uint64_t offset, uint64_t length, DType dtype) const;

 private:
  PartitionPlan(uint64_t tensor_bytes, uint64_t partition_bytes)
      : tensor_bytes_(tensor_bytes), partition_bytes_(partition_bytes) {}
  static constexpr uint64_t CeilDiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

  uint64_t tensor_bytes_;
  uint64_t partition_bytes_;  // > 0, multiple of the element size
};

// Where part k of `total` cut into `parts` near-equal parts begins: floor(k·total / parts), the
// product taken in 128 bits so that no operand overflows it. Consecutive parts differ in length
// by at most one. The one even split shared by gradlane's slices, the ring's chunks (daemon and
// simulator), so that all of them cut the same way. Requires parts > 0.
constexpr uint64_t EvenSplitPoint(uint64_t total, uint64_t parts, uint64_t k) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(k) * total / parts);
}

// Cuts a ReadyRange with `plan` and hands each piece to fn(const Segment&), filled in from the
// range (key = tensor_id << 16 | partition, ready_at = now). Never allocates.
template <typename Fn>
void CutRange(const PartitionPlan& plan, const ReadyRange& range, TimeNs now, Fn&& fn) {
  plan.ForEachSegment(range.offset, range.length, [&](uint32_t index, uint64_t off, uint64_t len) {
    Segment s;
    s.key = MakeKey(range.tensor_id, index);
    s.priority = range.priority;
    s.dtype = range.dtype;
    s.direction = range.direction;
    s.peer = range.peer;
    s.iteration = range.iteration;
    s.offset = off;
    s.length = len;
    s.ready_at = now;
    fn(s);
  });
}

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_PARTITIONER_H_
