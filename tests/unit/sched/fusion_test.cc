#include "sched/fusion.h"

#include <algorithm>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradlane::sched {
namespace {

using ::testing::ElementsAre;

// max over all partitions of the chain into `groups` contiguous non-empty groups of the
// smallest group total, by enumerating the cut positions.
int64_t BruteForceMaxMin(const std::vector<uint64_t>& sizes, int groups) {
  const int n = static_cast<int>(sizes.size());
  int64_t best = -1;
  for (uint32_t cuts = 0; cuts < (1u << (n - 1)); ++cuts) {  // bit i: cut after element i
    if (__builtin_popcount(cuts) != groups - 1) continue;
    int64_t smallest = INT64_MAX, current = 0;
    for (int i = 0; i < n; ++i) {
      current += static_cast<int64_t>(sizes[i]);
      if (i == n - 1 || (cuts >> i & 1)) {
        smallest = std::min(smallest, current);
        current = 0;
      }
    }
    best = std::max(best, smallest);
  }
  return best;
}

TEST(MaxMinPartition, EqualsBruteForceOnRandomChains) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 10);
    std::vector<uint64_t> sizes(n);
    for (uint64_t& s : sizes) s = rng() % 21;
    for (int r = 1; r <= n; ++r) {
      const auto part = MaxMinPartition(sizes, r);
      ASSERT_TRUE(part.ok()) << part.status();
      ASSERT_EQ(static_cast<int64_t>(part->min_group_bytes), BruteForceMaxMin(sizes, r))
          << "trial " << trial << " R=" << r;
      // The returned partition is real and achieves the value.
      ASSERT_EQ(part->group_end.size(), static_cast<size_t>(r));
      ASSERT_EQ(part->group_end.back(), n);
      int begin = 0;
      uint64_t smallest = UINT64_MAX;
      for (int32_t end : part->group_end) {
        ASSERT_GT(end, begin);
        uint64_t sum = 0;
        for (int i = begin; i < end; ++i) sum += sizes[i];
        smallest = std::min(smallest, sum);
        begin = end;
      }
      ASSERT_EQ(smallest, part->min_group_bytes);
    }
  }
}

TEST(MaxMinPartition, SmallExampleAndErrors) {
  const std::vector<uint64_t> sizes = {1, 2, 3, 4, 5};
  // {1,2,3 | 4,5}: min(6, 9) = 6 beats {1,2,3,4 | 5} = 5 and {1,2 | 3,4,5} = 3.
  const auto two = MaxMinPartition(sizes, 2);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->min_group_bytes, 6u);
  EXPECT_THAT(two->group_end, ElementsAre(3, 5));
  EXPECT_FALSE(MaxMinPartition(sizes, 0).ok());
  EXPECT_FALSE(MaxMinPartition(sizes, 6).ok());
  EXPECT_FALSE(MaxMinPartition({}, 1).ok());
}

PaceInstance RandomInstance(std::mt19937& rng, int n) {
  PaceInstance inst;
  for (int i = 0; i < n; ++i) {
    inst.tensor.push_back(i);
    inst.bytes.push_back(1 + rng() % 50);
    inst.jobs.push_back({static_cast<TimeNs>(rng() % 200), 0, static_cast<TimeNs>(rng() % 300)});
  }
  return inst;
}

void SetDurations(PaceInstance& inst, const AllReduceCost& cost) {
  for (size_t i = 0; i < inst.jobs.size(); ++i) inst.jobs[i].duration = cost.Time(inst.bytes[i]);
}

TEST(BalancedFusion, PicksTheBestMaxMinPartitionAndFusesItFaithfully) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 100; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 9);
    const AllReduceCost cost{static_cast<TimeNs>(rng() % 40), 1.0};
    PaceInstance inst = RandomInstance(rng, n);
    SetDurations(inst, cost);
    const auto plan = BalancedFusion(inst, cost);
    ASSERT_TRUE(plan.ok()) << plan.status();

    // Independently: chain by release, each R's max-min partition, fused and scheduled.
    std::vector<int> chain(n);
    for (int i = 0; i < n; ++i) chain[i] = i;
    std::stable_sort(chain.begin(), chain.end(),
                     [&](int a, int b) { return inst.jobs[a].release < inst.jobs[b].release; });
    std::vector<uint64_t> sizes;
    for (int c : chain) sizes.push_back(inst.bytes[c]);
    TimeNs best = kNever;
    for (int r = 1; r <= n; ++r) {
      const auto part = MaxMinPartition(sizes, r);
      ASSERT_TRUE(part.ok());
      std::vector<PaceJob> fused;
      int begin = 0;
      for (int32_t end : part->group_end) {
        PaceJob job;
        uint64_t bytes = 0;
        for (int k = begin; k < end; ++k) {
          job.release = std::max(job.release, inst.jobs[chain[k]].release);
          job.tail = std::max(job.tail, inst.jobs[chain[k]].tail);
          bytes += inst.bytes[chain[k]];
        }
        job.duration = cost.Time(bytes);
        fused.push_back(job);
        begin = end;
      }
      best = std::min(best, HornSchedule(fused)->objective);
    }
    ASSERT_EQ(plan->iteration_time, best) << "trial " << trial;

    // The groups cover every tensor once, as contiguous runs of the release-ordered chain.
    ASSERT_EQ(plan->members.size(), static_cast<size_t>(plan->groups));
    std::vector<int> flat;
    for (const auto& g : plan->members) flat.insert(flat.end(), g.begin(), g.end());
    ASSERT_EQ(flat, chain);
    for (size_t g = 0; g < plan->members.size(); ++g) {
      TimeNs release = 0, tail = 0;
      uint64_t bytes = 0;
      for (int m : plan->members[g]) {
        release = std::max(release, inst.jobs[m].release);
        tail = std::max(tail, inst.jobs[m].tail);
        bytes += inst.bytes[m];
      }
      EXPECT_EQ(plan->fused.jobs[g].release, release);
      EXPECT_EQ(plan->fused.jobs[g].tail, tail);
      EXPECT_EQ(plan->fused.jobs[g].duration, cost.Time(bytes));
    }
  }
}

TEST(BalancedFusion, WithoutOverheadFusionCannotBeatNoFusion) {
  // Fusing only delays releases, so with g linear and no fixed cost the best is the unfused
  // optimum (R = n reproduces it).
  std::mt19937 rng(13);
  for (int trial = 0; trial < 100; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 8);
    const AllReduceCost cost{0, 3.0};
    PaceInstance inst = RandomInstance(rng, n);
    SetDurations(inst, cost);
    const auto plan = BalancedFusion(inst, cost);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->iteration_time, HornSchedule(inst.jobs)->objective);
  }
}

TEST(BalancedFusion, FusesSmallTensorsWhenOverheadDominates) {
  // Eight tiny gradients ready one time unit apart, each all-reduce paying 100 units of fixed
  // overhead: fusing wins clearly.
  const AllReduceCost cost{100, 1.0};
  PaceInstance inst;
  for (int i = 0; i < 8; ++i) {
    inst.tensor.push_back(i);
    inst.bytes.push_back(10);
    inst.jobs.push_back({i, cost.Time(10), 10 * (8 - i)});
  }
  const auto plan = BalancedFusion(inst, cost);
  ASSERT_TRUE(plan.ok());
  const TimeNs unfused = HornSchedule(inst.jobs)->objective;
  EXPECT_LT(plan->groups, 8);
  EXPECT_LT(plan->iteration_time, unfused);
  // Capping R at 1 gives the single fused tensor: released at 7, 180 long, tail 80.
  const auto one = BalancedFusion(inst, cost, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->groups, 1);
  EXPECT_EQ(one->iteration_time, 7 + 180 + 80);
  EXPECT_FALSE(BalancedFusion(PaceInstance{}, cost).ok());
  EXPECT_FALSE(BalancedFusion(inst, cost, -1).ok());
}

TEST(BalancedFusion, RunsOnADag) {
  std::vector<ChainLayer> layers;
  for (int i = 0; i < 12; ++i) layers.push_back({"l" + std::to_string(i), 64, 5, 8});
  const Dag dag = *BuildChainDag(layers);
  const AllReduceCost cost{500, 0.5};
  const auto plan = BalancedFusion(dag, cost);
  ASSERT_TRUE(plan.ok());
  const auto unfused = PlanPace(dag, cost);
  ASSERT_TRUE(unfused.ok());
  EXPECT_LT(plan->iteration_time, unfused->iteration_time);
  size_t covered = 0;
  for (const auto& g : plan->members) covered += g.size();
  EXPECT_EQ(covered, 12u);
}

}  // namespace
}  // namespace gradlane::sched
