#include "daemon/ps/shard_map.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gradlane::ps {
namespace {

using sched::DType;
using sched::MakeKey;
using sched::TensorSpec;

std::vector<TensorSpec> RandomTensors(std::mt19937_64& rng, int n) {
  // Log-uniform sizes from a few elements to tens of MB, like a real model's mix of biases,
  // norms and big weight matrices.
  std::uniform_real_distribution<double> log_size(2.0, 25.0);
  std::uniform_int_distribution<int> dtype(0, 2);
  std::vector<TensorSpec> tensors;
  for (int i = 0; i < n; ++i) {
    TensorSpec t;
    t.id = static_cast<uint32_t>(i * 3 + 1);  // non-contiguous ids
    t.dtype = static_cast<DType>(dtype(rng));
    const uint64_t elems = static_cast<uint64_t>(std::exp2(log_size(rng)));
    t.bytes = elems * sched::DTypeBytes(t.dtype);
    t.priority = i;
    tensors.push_back(t);
  }
  return tensors;
}

std::vector<KeyBytes> RandomKeys(std::mt19937_64& rng, int n, uint64_t max_bytes) {
  std::uniform_int_distribution<uint64_t> bytes(1, max_bytes);
  std::vector<KeyBytes> keys;
  for (int i = 0; i < n; ++i) keys.push_back({MakeKey(i / 4, i % 4), bytes(rng)});
  return keys;
}

TEST(ShardMapTest, RandomTensorSetsAreBalancedWithinTheListSchedulingBound) {
  std::mt19937_64 rng(20261122);
  for (int trial = 0; trial < 40; ++trial) {
    const uint32_t w = std::vector<uint32_t>{2, 3, 4, 5, 8, 16}[trial % 6];
    const auto tensors = RandomTensors(rng, 20 + trial * 5);
    const uint64_t partition = 4u << (trial % 8 + 10);  // 4 KiB .. 512 KiB
    auto map = ShardMap::FromTensors(tensors, partition, w);
    ASSERT_TRUE(map.ok()) << map.status();

    uint64_t total = 0;
    uint64_t largest = 0;
    size_t nkeys = 0;
    std::vector<uint64_t> load(w, 0);
    for (const TensorSpec& t : tensors) {
      const uint64_t parts = (t.bytes + partition - 1) / partition;
      for (uint64_t p = 0; p < parts; ++p) {
        const uint64_t b = std::min(partition, t.bytes - p * partition);
        const auto shard = map->ShardOf(MakeKey(t.id, static_cast<uint32_t>(p)));
        ASSERT_TRUE(shard.has_value());
        ASSERT_LT(*shard, w);
        load[*shard] += b;
        total += b;
        largest = std::max(largest, b);
        ++nkeys;
      }
    }
    EXPECT_EQ(map->num_keys(), nkeys);
    EXPECT_EQ(std::vector<uint64_t>(map->shard_bytes().begin(), map->shard_bytes().end()), load);
    // Greedy onto the least-loaded shard: the heaviest shard exceeds the average by at most one
    // key (the last one placed on it went where the load was at most the average).
    EXPECT_LE(map->max_load() * w, total + largest * w) << "trial " << trial;
    // Each key lands on the lightest shard, so max - min never exceeds the largest key; when
    // the average load dwarfs that key, the ratio is close to 1.
    EXPECT_LE(map->max_load() - map->min_load(), largest) << "trial " << trial;
    if (total >= 4 * largest * w) {
      EXPECT_LT(map->LoadRatio(), 1.0 + 2.0 * static_cast<double>(largest * w) / total)
          << "trial " << trial;
    }
  }
}

uint64_t OptimalMakespan(const std::vector<KeyBytes>& keys, uint32_t w) {
  uint64_t best = UINT64_MAX;
  std::vector<uint64_t> load(w);
  uint64_t combos = 1;
  for (size_t i = 0; i < keys.size(); ++i) combos *= w;
  for (uint64_t c = 0; c < combos; ++c) {
    std::fill(load.begin(), load.end(), 0);
    uint64_t x = c;
    for (const KeyBytes& k : keys) {
      load[x % w] += k.bytes;
      x /= w;
    }
    best = std::min(best, *std::max_element(load.begin(), load.end()));
  }
  return best;
}

TEST(ShardMapTest, WithinFourThirdsOfOptimalOnSmallInstances) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const uint32_t w = 2 + trial % 3;
    const auto keys = RandomKeys(rng, 8, 1000);
    auto map = ShardMap::Build(keys, w);
    ASSERT_TRUE(map.ok()) << map.status();
    const uint64_t opt = OptimalMakespan(keys, w);
    // LPT bound (Graham): makespan <= (4/3 - 1/(3w)) * OPT.
    EXPECT_LE(map->max_load() * 3 * w, (4 * w - 1) * opt) << "trial " << trial;
  }
}

TEST(ShardMapTest, EveryRankComputesTheSameMapWhateverTheListingOrder) {
  std::mt19937_64 rng(99);
  auto keys = RandomKeys(rng, 500, 1 << 20);
  // Many equal sizes, so the tie-breaks are exercised.
  for (size_t i = 0; i < keys.size(); i += 3) keys[i].bytes = 4096;
  auto reference = ShardMap::Build(keys, 6);
  ASSERT_TRUE(reference.ok());
  for (int rank = 0; rank < 6; ++rank) {
    std::shuffle(keys.begin(), keys.end(), rng);
    auto map = ShardMap::Build(keys, 6);
    ASSERT_TRUE(map.ok());
    for (const KeyBytes& k : keys) EXPECT_EQ(map->ShardOf(k.key), reference->ShardOf(k.key));
    EXPECT_EQ(map->Fingerprint(), reference->Fingerprint());
    EXPECT_TRUE(std::equal(map->shard_bytes().begin(), map->shard_bytes().end(),
                           reference->shard_bytes().begin(), reference->shard_bytes().end()));
  }
  // The fingerprint does see a difference: one key's size changed, or another shard count.
  keys[0].bytes += 1;
  auto changed = ShardMap::Build(keys, 6);
  ASSERT_TRUE(changed.ok());
  EXPECT_NE(changed->Fingerprint(), reference->Fingerprint());
  keys[0].bytes -= 1;
  auto other_w = ShardMap::Build(keys, 5);
  ASSERT_TRUE(other_w.ok());
  EXPECT_NE(other_w->Fingerprint(), reference->Fingerprint());
}

TEST(ShardMapTest, FromTensorsCutsPartitionsAtTheGivenSize) {
  // 10 f16 elements = 20 bytes, partitions of 8 bytes: 8, 8, 4. A 4-byte f32 tensor: one key.
  std::vector<TensorSpec> tensors = {{.id = 3, .bytes = 20, .dtype = DType::kF16},
                                     {.id = 9, .bytes = 4, .dtype = DType::kF32}};
  auto map = ShardMap::FromTensors(tensors, 8, 2);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->num_keys(), 4u);
  for (uint32_t p = 0; p < 3; ++p) EXPECT_TRUE(map->ShardOf(MakeKey(3, p)).has_value());
  EXPECT_FALSE(map->ShardOf(MakeKey(3, 3)).has_value());
  EXPECT_TRUE(map->ShardOf(MakeKey(9, 0)).has_value());
  EXPECT_FALSE(map->ShardOf(MakeKey(9, 1)).has_value());
  EXPECT_EQ(map->shard_bytes()[0] + map->shard_bytes()[1], 24u);
  // LPT on {8, 8, 4, 4}: 8 -> s0, 8 -> s1, 4 -> s0, 4 -> s1.
  EXPECT_EQ(map->max_load(), 12u);
  EXPECT_EQ(map->min_load(), 12u);
  EXPECT_DOUBLE_EQ(map->LoadRatio(), 1.0);

  std::vector<sched::SegmentKey> all;
  for (uint32_t s = 0; s < 2; ++s) {
    auto owned = map->KeysOf(s);
    EXPECT_TRUE(std::is_sorted(owned.begin(), owned.end()));
    for (auto k : owned) EXPECT_EQ(map->ShardOf(k), s);
    all.insert(all.end(), owned.begin(), owned.end());
  }
  EXPECT_EQ(all.size(), map->num_keys());
}

TEST(ShardMapTest, FromTensorsTakesEachTensorsOwnPartitionSize) {
  // What the daemon passes from sched::PartitionPlan: a bigger size for a huge tensor.
  const std::vector<TensorSpec> tensors = {{.id = 1, .bytes = 1000, .dtype = DType::kF32},
                                           {.id = 2, .bytes = 2 * 200000, .dtype = DType::kBF16}};
  const std::vector<uint64_t> sizes = {400, 8};  // 3 partitions; 50000 partitions
  auto map = ShardMap::FromTensors(tensors, sizes, 3);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->num_keys(), 3u + 50000u);
  EXPECT_TRUE(map->ShardOf(MakeKey(1, 2)).has_value());
  EXPECT_FALSE(map->ShardOf(MakeKey(1, 3)).has_value());
  EXPECT_TRUE(map->ShardOf(MakeKey(2, 49999)).has_value());
  EXPECT_FALSE(map->ShardOf(MakeKey(2, 50000)).has_value());
  uint64_t total = 0;
  for (uint64_t b : map->shard_bytes()) total += b;
  EXPECT_EQ(total, 1000u + 400000u);
  EXPECT_FALSE(ShardMap::FromTensors(tensors, std::vector<uint64_t>{400}, 3).ok());
  EXPECT_FALSE(ShardMap::FromTensors(tensors, std::vector<uint64_t>{400, 3}, 3).ok());
}

TEST(ShardMapTest, EqualKeysSpreadEvenly) {
  std::vector<KeyBytes> keys;
  for (uint32_t i = 0; i < 64; ++i) keys.push_back({MakeKey(i, 0), 1000});
  auto map = ShardMap::Build(keys, 8);
  ASSERT_TRUE(map.ok());
  for (uint64_t load : map->shard_bytes()) EXPECT_EQ(load, 8000u);
  EXPECT_DOUBLE_EQ(map->LoadRatio(), 1.0);
}

TEST(ShardMapTest, FewerKeysThanShardsLeavesShardsEmpty) {
  auto map = ShardMap::Build(std::vector<KeyBytes>{{1, 10}, {2, 20}}, 4);
  ASSERT_TRUE(map.ok());
  EXPECT_EQ(map->min_load(), 0u);
  EXPECT_EQ(map->max_load(), 20u);
  EXPECT_TRUE(std::isinf(map->LoadRatio()));
  auto empty = ShardMap::Build({}, 3);
  ASSERT_TRUE(empty.ok());
  EXPECT_DOUBLE_EQ(empty->LoadRatio(), 1.0);
  EXPECT_FALSE(empty->ShardOf(0).has_value());
}

TEST(ShardMapTest, RejectsBadInput) {
  EXPECT_FALSE(ShardMap::Build(std::vector<KeyBytes>{{1, 10}}, 0).ok());
  EXPECT_FALSE(ShardMap::Build(std::vector<KeyBytes>{{1, 10}}, 65537).ok());
  EXPECT_FALSE(ShardMap::Build(std::vector<KeyBytes>{{1, 10}, {2, 5}, {1, 7}}, 2).ok());

  const TensorSpec f32{.id = 1, .bytes = 4000, .dtype = DType::kF32};
  EXPECT_FALSE(ShardMap::FromTensors({&f32, 1}, 0, 2).ok());
  EXPECT_FALSE(ShardMap::FromTensors({&f32, 1}, 6, 2).ok());  // splits an f32
  const TensorSpec odd{.id = 2, .bytes = 5, .dtype = DType::kBF16};
  EXPECT_FALSE(ShardMap::FromTensors({&odd, 1}, 2, 2).ok());
  // 65537 partitions of 2 bytes: too many for the 16-bit partition field.
  const TensorSpec huge{.id = 3, .bytes = 2 * 65537, .dtype = DType::kF16};
  EXPECT_FALSE(ShardMap::FromTensors({&huge, 1}, 2, 2).ok());
  const TensorSpec just_fits{.id = 3, .bytes = 2 * 65536, .dtype = DType::kF16};
  EXPECT_TRUE(ShardMap::FromTensors({&just_fits, 1}, 2, 2).ok());
  const std::vector<TensorSpec> dup = {{.id = 4, .bytes = 0}, {.id = 4, .bytes = 0}};
  EXPECT_FALSE(ShardMap::FromTensors(dup, 4, 2).ok());
}

}  // namespace
}  // namespace gradlane::ps
