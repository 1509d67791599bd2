// daemon/ps/aggregator.h — the parameter-server shard's reduction: sum (or mean) of the W
// contributions to one key in one iteration, bit-reproducible whatever order they arrive in.
//
// How reproducibility is achieved: floating-point addition is not associative, so the result
// depends on the order of the additions. We fix that order to rank 0, 1, ..., W-1 by keeping a
// pointer to every contribution until all W are present and only then running one pass that
// reads the W buffers side by side and writes the result once (`ReduceInRankOrder`). The result
// is therefore a pure function of the W inputs, never of arrival order, thread timing or which
// CPU the shard runs on (the kernels are IEEE element-wise, no FMA contraction, same bits on
// the SSE2 baseline and the AVX2 path; tests check both).
//
// Memory trade-off (why not fold contributions in as they arrive): an eager fold needs an f32
// accumulator per key (2x the key's bytes for f16/bf16) plus an extra read+write of it per
// contribution, and it still has to wait for rank r before folding r+1 to keep the order. Keeping
// the contributions instead costs no extra memory of ours and moves the minimum number of bytes
// (W reads + 1 write), but it pins up to W receive buffers per in-flight key until the slowest
// rank's contribution lands. The shard's receive pool must be sized for that (W x bytes of the
// keys the shard owns that are in flight).
//
// f16/bf16 are widened to f32, summed in f32 and rounded back once (round-to-nearest-even); the
// mean is the f32 sum divided by W in f32, then rounded. Conversions are the bit-exact
// algorithms of daemon/ps/half.h. A NaN result is always written as the canonical quiet NaN
// (f32 0x7fc00000, f16 0x7e00, bf16 0x7fc0): which NaN payload an addition propagates depends
// on the hardware and operand order, so it would otherwise break bit-reproducibility. Assumes
// the default floating-point environment (no FTZ/DAZ).
//
// Vectorisation: GCC vector extensions at each target's native width, compiled twice — x86-64
// baseline (SSE2, 4 lanes) and `target("avx2")` (8 lanes) — with the AVX2 bodies chosen at run
// time by `__builtin_cpu_supports("avx2")` and CPUID's F16C bit. The only intrinsics are the F16C
// conversions in the AVX2 f16 kernel (behind that check; bit-identical to the software ones).
// So the library builds for any x86-64 without -march flags, and elsewhere the generic vectors
// lower to whatever the target has.
//
// Data path: nothing here allocates. Contributions and output buffers belong to the caller
// (receive buffers / the shm arena). Threading: `KeyAggregation` is not synchronised; one thread
// (the shard's engine thread) owns each instance. `ReduceInRankOrder` is a pure function.
#ifndef GRADLANE_DAEMON_PS_AGGREGATOR_H_
#define GRADLANE_DAEMON_PS_AGGREGATOR_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "sched/types.h"

namespace gradlane::ps {

// Contributions are tracked in a 64-bit mask, one bit per rank; larger jobs are rejected at
// `KeyAggregation::Begin` rather than silently wrapping.
inline constexpr uint32_t kMaxWorldSize = 64;

enum class ReduceOp : uint8_t { kSum = 0, kMean = 1 };

// Which compiled kernel runs. kAuto picks the best the CPU supports; the others exist so tests
// can prove the paths agree bit for bit and benchmarks can compare them.
// kAvx2 means AVX2 + F16C (every AVX2 CPU has both).
enum class KernelIsa : uint8_t { kAuto = 0, kBaseline = 1, kAvx2 = 2 };

// True if `isa` can run on this CPU (kAuto and kBaseline always can).
bool KernelIsaAvailable(KernelIsa isa);
// The kernel kAuto resolves to on this CPU.
KernelIsa ResolvedKernelIsa();
std::string_view KernelIsaName(KernelIsa isa);

// out = contributions[0] + contributions[1] + ... + contributions[n-1], element-wise, added in
// exactly that order (divided by n for kMean), each buffer holding `bytes` bytes of `dtype`.
// Buffers may have any alignment. `out` may be exactly one of the contributions (in-place) but
// must not partially overlap any of them. Errors: no contributions, more than kMaxWorldSize,
// `bytes` not a multiple of the element size, a null buffer, or `isa` not available.
absl::Status ReduceInRankOrder(sched::DType dtype, absl::Span<const std::byte* const> contributions,
                               uint64_t bytes, ReduceOp op, std::byte* out,
                               KernelIsa isa = KernelIsa::kAuto);

// The same, with the divisor given: out = (contributions[0] + ... + contributions[n-1]) / divide_by
// (0: no division), the sum in f32 and rounded once. For a ring all-reduce, whose last step adds
// two inputs but averages over W ranks.
absl::Status ReduceInOrder(sched::DType dtype, absl::Span<const std::byte* const> contributions,
                           uint64_t bytes, uint32_t divide_by, std::byte* out,
                           KernelIsa isa = KernelIsa::kAuto);

// The state of one key for one iteration at its shard: which ranks have contributed and where
// their data lies, reduced in rank order once all W are in. Reusable across iterations via
// `Begin`. Not thread-safe: owned by one engine thread.
class KeyAggregation {
 public:
  KeyAggregation() = default;

  // Starts collecting `key` for `iteration` from `world_size` ranks, `bytes` bytes of `dtype`
  // each. Forgets any previous round (its buffers are no longer referenced). Errors:
  // world_size 0 or > kMaxWorldSize, bytes 0 or not a multiple of the element size.
  absl::Status Begin(sched::SegmentKey key, int64_t iteration, uint32_t world_size,
                     sched::DType dtype, uint64_t bytes);

  // Records rank `rank`'s contribution. `data` is not copied: it must stay valid and unchanged
  // until `Reduce` returns or `Begin` starts another round. Rejected (and counted, never summed):
  //  - FailedPrecondition: no round begun, already reduced, or `iteration` is not this round's;
  //  - OutOfRange: rank >= world_size;
  //  - InvalidArgument: data.size() != bytes (wrong length) or null data;
  //  - AlreadyExists: this rank already contributed this round (duplicate; the first stands).
  absl::Status Contribute(uint32_t rank, int64_t iteration, absl::Span<const std::byte> data);

  // Whether all world_size ranks have contributed.
  bool complete() const { return active_ && mask_ == full_mask_; }
  // Bit r set iff rank r has contributed this round.
  uint64_t contributed_mask() const { return mask_; }
  uint32_t missing() const;

  // Writes the rank-ordered sum or mean into `out` (`bytes` long; may be one of the
  // contributions' buffers) and ends the round, releasing the references to the contributions.
  // FailedPrecondition if the round is not complete or was already reduced; InvalidArgument if
  // `out` has the wrong size.
  absl::Status Reduce(ReduceOp op, absl::Span<std::byte> out, KernelIsa isa = KernelIsa::kAuto);

  sched::SegmentKey key() const { return key_; }
  int64_t iteration() const { return iteration_; }
  uint32_t world_size() const { return world_size_; }
  sched::DType dtype() const { return dtype_; }
  uint64_t bytes() const { return bytes_; }

  // Rejection counters, cumulative over the object's lifetime (Begin does not reset them), for
  // the daemon's error metrics.
  uint64_t duplicate_count() const { return duplicates_; }
  uint64_t wrong_length_count() const { return wrong_length_; }
  uint64_t rejected_count() const { return rejected_; }  // all rejections, including the above

 private:
  const std::byte* contributions_[kMaxWorldSize] = {};
  uint64_t mask_ = 0;
  uint64_t full_mask_ = 0;
  uint64_t bytes_ = 0;
  int64_t iteration_ = 0;
  sched::SegmentKey key_ = 0;
  uint32_t world_size_ = 0;
  sched::DType dtype_ = sched::DType::kF32;
  bool active_ = false;  // a round is begun and not yet reduced
  uint64_t duplicates_ = 0;
  uint64_t wrong_length_ = 0;
  uint64_t rejected_ = 0;
};

}  // namespace gradlane::ps

#endif  // GRADLANE_DAEMON_PS_AGGREGATOR_H_
