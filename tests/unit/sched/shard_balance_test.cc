// The balance rule for parameter-server keys: LPT's heaviest shard, the share of the bytes left
// unspread, and the coarsest key size that keeps the first within the tolerance of total/W and
// the second within its own.
#include "sched/shard_balance.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gradlane::sched {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// Straightforward LPT, one piece at a time, as daemon/ps/shard_map assigns keys.
uint64_t NaiveLpt(const std::vector<uint64_t>& tensors, uint64_t unit, uint32_t shards) {
  std::vector<uint64_t> pieces;
  for (uint64_t t : tensors) {
    for (uint64_t off = 0; off < t; off += unit) pieces.push_back(std::min(unit, t - off));
  }
  std::stable_sort(pieces.begin(), pieces.end(), [](uint64_t a, uint64_t b) { return a > b; });
  std::vector<uint64_t> load(shards, 0);
  for (uint64_t p : pieces) *std::min_element(load.begin(), load.end()) += p;
  return *std::max_element(load.begin(), load.end());
}

TEST(ShardBalanceTest, HeaviestShardMatchesPieceByPieceLpt) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t shards = 1 + rng() % 9;
    const uint64_t unit = (1 + rng() % 16) * 64 * 1024;
    std::vector<uint64_t> tensors(1 + rng() % 40);
    for (uint64_t& t : tensors) {
      // A mix of tiny, medium and multi-unit tensors, some exact multiples of the unit.
      switch (rng() % 4) {
        case 0:
          t = 4 * (1 + rng() % 2000);
          break;
        case 1:
          t = 4 * (1 + rng() % 500000);
          break;
        case 2:
          t = unit * (1 + rng() % 12);
          break;
        default:
          t = 4 * (1 + rng() % 8000000);
          break;
      }
    }
    ASSERT_EQ(LptHeaviestShardBytes(tensors, unit, shards), NaiveLpt(tensors, unit, shards))
        << "trial " << trial << " shards " << shards << " unit " << unit;
  }
}

TEST(ShardBalanceTest, SmallModelGetsFinerKeysUntilBalanced) {
  // Three 3 MiB tensors and a 1 MiB one on 3 shards: with 4 MiB keys one shard carries 4 MiB
  // (two tensors) against a mean of 10/3 MiB; finer keys spread them.
  const std::vector<uint64_t> tensors = {3 * kMiB, 3 * kMiB, 3 * kMiB, 1 * kMiB};
  const double mean = 10.0 * kMiB / 3;
  ASSERT_GT(LptHeaviestShardBytes(tensors, 4 * kMiB, 3), 1.02 * mean);
  const uint64_t unit = BalancedShardUnit(tensors, 3, 4 * kMiB);
  EXPECT_LT(unit, 4 * kMiB);
  EXPECT_LE(LptHeaviestShardBytes(tensors, unit, 3), 1.02 * mean);
  // The coarsest such size: twice it is not balanced.
  EXPECT_GT(LptHeaviestShardBytes(tensors, unit * 2, 3), 1.02 * mean);
}

TEST(ShardBalanceTest, BalancedAndSpreadModelKeepsThePolicyPartitions) {
  // 24 equal 32 MiB tensors over 3 or 8 shards: even, and each is 8 keys already.
  const std::vector<uint64_t> tensors(24, 32 * kMiB);
  EXPECT_EQ(BalancedShardUnit(tensors, 3, 4 * kMiB), 4 * kMiB);
  EXPECT_EQ(BalancedShardUnit(tensors, 8, 4 * kMiB), 4 * kMiB);
}

TEST(ShardBalanceTest, UnspreadShareCountsWhatFewerKeysThanShardsLeave) {
  // 3 shards: a 4 MiB tensor in 4 MiB keys is one key (2/3 of it unspread), in 2 MiB keys two
  // (1/3), in 1 MiB keys four (none); a 12 MiB tensor is three keys of 4 MiB (none).
  const std::vector<uint64_t> one = {4 * kMiB};
  EXPECT_DOUBLE_EQ(UnspreadShare(one, 4 * kMiB, 3), 2.0 / 3);
  EXPECT_DOUBLE_EQ(UnspreadShare(one, 2 * kMiB, 3), 1.0 / 3);
  EXPECT_DOUBLE_EQ(UnspreadShare(one, 1 * kMiB, 3), 0.0);
  const std::vector<uint64_t> two = {4 * kMiB, 12 * kMiB};
  EXPECT_DOUBLE_EQ(UnspreadShare(two, 4 * kMiB, 3), (2.0 / 3) * 4 / 16);
  // A remainder is a key: 5 MiB in 4 MiB keys is two.
  EXPECT_DOUBLE_EQ(UnspreadShare(std::vector<uint64_t>{5 * kMiB}, 4 * kMiB, 3), 1.0 / 3);
  EXPECT_DOUBLE_EQ(UnspreadShare(std::vector<uint64_t>{}, 4 * kMiB, 3), 0.0);
  EXPECT_DOUBLE_EQ(UnspreadShare(one, 4 * kMiB, 1), 0.0);
}

TEST(ShardBalanceTest, EvenShardsStillCutEveryTensorOverTheShards) {
  // 24 equal 4 MiB tensors over 3 or 8 shards are even with 4 MiB keys, but each would be
  // pushed into one shard's downlink: the rule halves until each is at least W keys.
  const std::vector<uint64_t> tensors(24, 4 * kMiB);
  ASSERT_LE(LptHeaviestShardBytes(tensors, 4 * kMiB, 3), 32 * kMiB);
  EXPECT_EQ(BalancedShardUnit(tensors, 3, 4 * kMiB), 1 * kMiB);  // 4 keys each
  EXPECT_EQ(BalancedShardUnit(tensors, 8, 4 * kMiB), kMiB / 2);  // 8 keys each
  // With the spread term off (tolerance 1) the even shards are enough: the old rule.
  EXPECT_EQ(BalancedShardUnit(tensors, 3, 4 * kMiB, kMinBalancedShardUnitBytes,
                              kShardBalanceTolerance, 1.0),
            4 * kMiB);
  // A few small tensors among big ones stay within the spread tolerance: keys stay coarse.
  std::vector<uint64_t> mixed(20, 64 * kMiB);
  mixed.push_back(kMiB);
  mixed.push_back(512 * 1024);
  EXPECT_EQ(BalancedShardUnit(mixed, 8, 4 * kMiB), 4 * kMiB);
}

TEST(ShardBalanceTest, StopsAtTheFloorAndKeepsElementsWhole) {
  // One tiny tensor cannot be spread over 4 shards by any key size the rule allows.
  const std::vector<uint64_t> one = {200 * 1024};
  EXPECT_EQ(BalancedShardUnit(one, 4, 4 * kMiB), kMinBalancedShardUnitBytes);
  // A policy partition already below the floor is kept as it is.
  EXPECT_EQ(BalancedShardUnit(one, 4, 32 * 1024), 32u * 1024);
  // Halving stops before a size that is not a multiple of 8 bytes (an f64 element).
  const uint64_t odd = 8 * 3 * 5 * 4099;  // halves once to 4·3·5·4099 = 245940, not ·8
  const uint64_t unit = BalancedShardUnit(one, 4, odd, 1024);
  EXPECT_EQ(unit % 8, 0u);
  EXPECT_EQ(unit, odd);
}

TEST(ShardBalanceTest, OneShardOrNoBytesKeepsTheSize) {
  const std::vector<uint64_t> tensors = {3 * kMiB, 1024};
  EXPECT_EQ(BalancedShardUnit(tensors, 1, 4 * kMiB), 4 * kMiB);
  EXPECT_EQ(BalancedShardUnit(std::vector<uint64_t>{0, 0}, 3, 4 * kMiB), 4 * kMiB);
  EXPECT_EQ(BalancedShardUnit(std::vector<uint64_t>{}, 3, 4 * kMiB), 4 * kMiB);
}

TEST(ShardBalanceTest, ManySmallTensorsBalanceByThemselvesButAreCutToSpread) {
  // Hundreds of small tensors (a DenseNet-like list) balance by themselves at the policy size,
  // but none of them is spread: the rule goes down to the floor, where the larger ones are.
  std::vector<uint64_t> tensors;
  for (int i = 0; i < 240; ++i) tensors.push_back(4 * (1000 + 97 * i));
  const uint64_t total = 4ull * (240 * 1000 + 97 * 239 * 240 / 2);
  EXPECT_LE(LptHeaviestShardBytes(tensors, 4 * kMiB, 3), (1 + kShardBalanceTolerance) * total / 3);
  EXPECT_EQ(BalancedShardUnit(tensors, 3, 4 * kMiB), kMinBalancedShardUnitBytes);
  EXPECT_LT(UnspreadShare(tensors, kMinBalancedShardUnitBytes, 3),
            UnspreadShare(tensors, 4 * kMiB, 3));
}

}  // namespace
}  // namespace gradlane::sched
