// sched/shard_balance.h — how finely a parameter-server job's tensors must be cut so that its
// W co-located shards carry the same bytes, whatever the model's size.
//
// Why: the shards are assigned whole key partitions, largest first onto the least-loaded shard
// (LPT). With 4 MiB partitions a 9 MB model has a handful of keys for W shards, and the
// heaviest shard — the one whose downlink and uplink every byte of its keys crosses — carries
// far more than total/W; no schedule can undo that (ShuffleNet-style, W = 3, 1 Gbit/s: the
// bound is 106.6 ms with 4 MiB keys against 98.1 ms balanced). Finer keys balance the load but
// every key is at least one message, each paying the per-message cost θ. So the rule takes the
// coarsest key size that is balanced: start from the policy's partition size and halve while
// LPT's heaviest shard is more than `tolerance` above the mean, never below `min_unit`.
// It depends only on the tensor sizes, W and the arguments, so every daemon of a job (and the
// simulator) derives the same keys without talking to each other.
//
// Pure functions: safe from any thread, no allocation beyond the working copy of the sizes.
#ifndef GRADLANE_SCHED_SHARD_BALANCE_H_
#define GRADLANE_SCHED_SHARD_BALANCE_H_

#include <cstdint>

#include "absl/types/span.h"

namespace gradlane::sched {

// Finest key size the rule goes down to: below this a key's message is a few tens of µs even at
// 10 Gbit/s, so θ (a few µs here; docs/benchmarks.md §4) would start to cost more than balance
// gains. A power of two, so every dtype's elements stay whole at every halving.
inline constexpr uint64_t kMinBalancedShardUnitBytes = 64ull << 10;
// The heaviest shard may carry this fraction more than total/W.
inline constexpr double kShardBalanceTolerance = 0.02;

// The heaviest shard's bytes when every tensor is cut into `unit`-byte pieces (the last one
// shorter) and the pieces are assigned largest first onto the least-loaded of `shards` shards.
uint64_t LptHeaviestShardBytes(absl::Span<const uint64_t> tensor_bytes, uint64_t unit,
                               uint32_t shards);

// The key partition size for a job: `max_unit` halved until LPT's heaviest shard carries at
// most (1 + tolerance)·total/shards, stopping at `min_unit` (or when halving would leave a size
// that is not a multiple of 8 bytes, the largest element). Returns `max_unit` when one shard or
// no bytes; never returns less than min(max_unit, min_unit).
uint64_t BalancedShardUnit(absl::Span<const uint64_t> tensor_bytes, uint32_t shards,
                           uint64_t max_unit, uint64_t min_unit = kMinBalancedShardUnitBytes,
                           double tolerance = kShardBalanceTolerance);

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_SHARD_BALANCE_H_
