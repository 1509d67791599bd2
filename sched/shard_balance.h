// sched/shard_balance.h — how finely a parameter-server job's tensors must be cut so that its
// W co-located shards carry the same bytes, and every tensor is spread over them, whatever the
// model's size.
//
// Why balance: the shards are assigned whole key partitions, largest first onto the
// least-loaded shard (LPT). With 4 MiB partitions a 9 MB model has a handful of keys for W
// shards, and the heaviest shard — the one whose downlink and uplink every byte of its keys
// crosses — carries far more than total/W; no schedule can undo that (ShuffleNet-style, W = 3,
// 1 Gbit/s: the bound is 106.6 ms with 4 MiB keys against 98.1 ms balanced).
// Why spread: even shards are not enough. A tensor that is one key is pushed by W − 1 senders
// into one shard's downlink and pulled out of one uplink, so its exchange takes up to W times
// as long as the same bytes spread over every shard — the ideal bound assumes every host
// carries 2(W − 1)/W of every tensor. That time is on the critical path for the tensors
// produced last and needed first (the first layers'), where nothing else overlaps it; a model
// of hundreds of tensors under 4 MiB is balanced by the totals yet spreads none of them
// (resnet50, W = 8, 10 Gbit/s, ρ = 1: gradlane's rules 1.24× the bound with 4 MiB keys,
// 1.04× spread; the all-ports fluid schedule 1.16× against 1.02×).
// Finer keys cost messages: every key is at least one message, each paying the per-message
// cost θ. So the rule takes the coarsest key size that is both balanced and spread: start from
// the policy's partition size and halve while LPT's heaviest shard is more than `tolerance`
// above the mean or more than `spread_tolerance` of the bytes are in tensors cut into fewer
// keys than there are shards, never below `min_unit`. A model of big tensors keeps coarse keys
// (vgg16 at W = 3: 4 MiB), and the key count stays the bytes over the unit plus one per tensor
// (resnet152 at W = 8: about 2,000 keys of 128 KiB).
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
// At most this share of the bytes may stay unspread (UnspreadShare). Not 0: a big-tensor model's
// biases and norms (a few per cent of its bytes, each far below W keys of any size the rule
// allows) would then drive every key down to the floor for no gain.
inline constexpr double kShardSpreadTolerance = 0.05;

// The heaviest shard's bytes when every tensor is cut into `unit`-byte pieces (the last one
// shorter) and the pieces are assigned largest first onto the least-loaded of `shards` shards.
uint64_t LptHeaviestShardBytes(absl::Span<const uint64_t> tensor_bytes, uint64_t unit,
                               uint32_t shards);

// The share of the bytes that cannot cross every shard when every tensor is cut into
// `unit`-byte keys: a tensor of k < shards keys leaves (shards − k)/shards of its bytes
// unspread. 0 for no bytes. It counts keys, not owners: LPT puts a tensor's equal keys on
// different shards as a rule (each one raises its shard's load), not by guarantee.
double UnspreadShare(absl::Span<const uint64_t> tensor_bytes, uint64_t unit, uint32_t shards);

// The key partition size for a job: `max_unit` halved until LPT's heaviest shard carries at
// most (1 + tolerance)·total/shards and UnspreadShare is at most `spread_tolerance`, stopping
// at `min_unit` (or when halving would leave a size that is not a multiple of 8 bytes, the
// largest element). Returns `max_unit` when one shard or no bytes; never returns less than
// min(max_unit, min_unit).
uint64_t BalancedShardUnit(absl::Span<const uint64_t> tensor_bytes, uint32_t shards,
                           uint64_t max_unit, uint64_t min_unit = kMinBalancedShardUnitBytes,
                           double tolerance = kShardBalanceTolerance,
                           double spread_tolerance = kShardSpreadTolerance);

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_SHARD_BALANCE_H_
