#include "sched/ready_queue.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/heap_counter.h"  // counts heap allocations for the no-allocation tests

namespace gradlane::sched {
namespace {

// Small field domains so that random segments collide on priority, key, ... and the later
// tie-breaking fields are exercised.
Segment RandomSegment(std::mt19937_64& rng) {
  Segment s;
  s.priority = static_cast<Priority>(rng() % 4);
  s.key = MakeKey(static_cast<uint32_t>(rng() % 3), static_cast<uint32_t>(rng() % 3));
  s.iteration = static_cast<int64_t>(rng() % 2);
  s.direction = rng() % 2 ? Direction::kPush : Direction::kPull;
  s.peer = static_cast<uint16_t>(rng() % 2);
  s.offset = rng() % 2;
  s.length = rng() % 2;
  s.ready_at = static_cast<TimeNs>(rng() % 2);
  s.round = static_cast<uint32_t>(rng() % 2);
  return s;
}

bool Equivalent(const Segment& a, const Segment& b) {
  return !SegmentBefore(a, b) && !SegmentBefore(b, a);
}

TEST(SegmentOrderTest, IsAStrictWeakOrder) {
  std::mt19937_64 rng(42);
  std::vector<Segment> pool(60);
  for (Segment& s : pool) s = RandomSegment(rng);
  for (const Segment& a : pool) {
    ASSERT_FALSE(SegmentBefore(a, a)) << "irreflexive";
    for (const Segment& b : pool) {
      if (SegmentBefore(a, b)) {
        ASSERT_FALSE(SegmentBefore(b, a)) << "asymmetric";
      }
      for (const Segment& c : pool) {
        if (SegmentBefore(a, b) && SegmentBefore(b, c)) {
          ASSERT_TRUE(SegmentBefore(a, c)) << "transitive";
        }
        if (Equivalent(a, b) && Equivalent(b, c)) {
          ASSERT_TRUE(Equivalent(a, c)) << "equivalence is transitive";
        }
      }
    }
  }
}

// Equivalent only when every field is equal: the order is total on distinct segments, which is
// what makes pops deterministic.
TEST(SegmentOrderTest, EquivalentOnlyWhenIdentical) {
  std::mt19937_64 rng(43);
  for (int i = 0; i < 20000; ++i) {
    const Segment a = RandomSegment(rng);
    const Segment b = RandomSegment(rng);
    const bool same = a.priority == b.priority && a.key == b.key && a.iteration == b.iteration &&
                      a.direction == b.direction && a.peer == b.peer && a.offset == b.offset &&
                      a.length == b.length && a.ready_at == b.ready_at && a.round == b.round;
    ASSERT_EQ(Equivalent(a, b), same);
  }
}

TEST(SegmentOrderTest, IterationThenPriorityThenKeyDominate) {
  Segment urgent;
  urgent.iteration = 3;
  urgent.priority = 0;
  urgent.key = MakeKey(9, 9);
  urgent.ready_at = 1000;  // arrived later
  Segment lazy;
  lazy.iteration = 3;
  lazy.priority = 1;
  lazy.key = MakeKey(0, 0);
  EXPECT_TRUE(SegmentBefore(urgent, lazy));
  Segment same_prio_lower_key = urgent;
  same_prio_lower_key.key = MakeKey(9, 8);
  same_prio_lower_key.direction = Direction::kPull;  // a later field must not matter
  EXPECT_TRUE(SegmentBefore(same_prio_lower_key, urgent));
  // A pull response of an older iteration goes before the next iteration's most urgent push:
  // no peer can reduce the newer one before the older one has arrived.
  Segment old_pull = lazy;
  old_pull.iteration = 2;
  old_pull.priority = 100;
  old_pull.key = MakeKey(50, 7);
  old_pull.direction = Direction::kPull;
  EXPECT_TRUE(SegmentBefore(old_pull, urgent));
  EXPECT_FALSE(SegmentBefore(urgent, old_pull));
}

// A slicing policy's rounds: slice j of every partition of a tensor before slice j + 1 of any,
// but never ahead of a more urgent tensor or an older iteration.
TEST(SegmentOrderTest, RoundOrdersSlicesWithinOnePriorityBeforeTheKey) {
  Segment first_slice_of_last_partition;
  first_slice_of_last_partition.priority = 4;
  first_slice_of_last_partition.key = MakeKey(7, 3);
  first_slice_of_last_partition.round = 0;
  Segment second_slice_of_first_partition = first_slice_of_last_partition;
  second_slice_of_first_partition.key = MakeKey(7, 0);
  second_slice_of_first_partition.round = 1;
  EXPECT_TRUE(SegmentBefore(first_slice_of_last_partition, second_slice_of_first_partition));
  Segment more_urgent_late_round = second_slice_of_first_partition;
  more_urgent_late_round.priority = 3;
  more_urgent_late_round.round = 9;
  EXPECT_TRUE(SegmentBefore(more_urgent_late_round, first_slice_of_last_partition));
  // The heap orders by the same rule.
  ReadyQueue q;
  q.Push(second_slice_of_first_partition);
  q.Push(first_slice_of_last_partition);
  q.Push(more_urgent_late_round);
  EXPECT_EQ(q.Pop().round, 9u);
  EXPECT_EQ(q.Pop().key, MakeKey(7, 3));
  EXPECT_EQ(q.Pop().key, MakeKey(7, 0));
}

TEST(ReadyQueueTest, PopsInSortedOrderWhateverThePushOrder) {
  std::mt19937_64 rng(5);
  std::vector<Segment> segs(3000);
  for (Segment& s : segs) s = RandomSegment(rng);
  std::vector<Segment> expected = segs;
  std::sort(expected.begin(), expected.end(), SegmentBefore);

  for (int trial = 0; trial < 3; ++trial) {
    std::shuffle(segs.begin(), segs.end(), rng);
    ReadyQueue q;
    uint64_t bytes = 0;
    for (const Segment& s : segs) {
      q.Push(s);
      bytes += s.length;
    }
    ASSERT_EQ(q.size(), segs.size());
    ASSERT_EQ(q.queued_bytes(), bytes);
    for (const Segment& e : expected) {
      ASSERT_FALSE(q.empty());
      const Segment top = q.Top();
      const Segment got = q.Pop();
      ASSERT_TRUE(Equivalent(top, got));
      ASSERT_TRUE(Equivalent(got, e));
    }
    EXPECT_TRUE(q.empty());
    EXPECT_EQ(q.queued_bytes(), 0u);
  }
}

TEST(ReadyQueueTest, InterleavedPushPopAlwaysYieldsTheMinimum) {
  std::mt19937_64 rng(6);
  ReadyQueue q;
  std::vector<Segment> model;
  for (int i = 0; i < 20000; ++i) {
    if (model.empty() || rng() % 3 != 0) {
      const Segment s = RandomSegment(rng);
      q.Push(s);
      model.push_back(s);
    } else {
      auto it = std::min_element(model.begin(), model.end(), SegmentBefore);
      const Segment got = q.Pop();
      ASSERT_TRUE(Equivalent(got, *it));
      model.erase(it);
    }
    ASSERT_EQ(q.size(), model.size());
  }
}

TEST(ReadyQueueTest, NoAllocationOnceGrown) {
  std::mt19937_64 rng(8);
  std::vector<Segment> segs(10000);
  for (Segment& s : segs) s = RandomSegment(rng);
  ReadyQueue q;
  q.Reserve(segs.size());
  const uint64_t before = gradlane_test::HeapAllocations();
  for (int round = 0; round < 3; ++round) {
    for (const Segment& s : segs) q.Push(s);
    while (!q.empty()) q.Pop();
  }
  EXPECT_EQ(gradlane_test::HeapAllocations(), before);

  // Without Reserve: the first round grows it, later rounds reuse the storage.
  ReadyQueue grown;
  for (const Segment& s : segs) grown.Push(s);
  while (!grown.empty()) grown.Pop();
  const uint64_t after_warmup = gradlane_test::HeapAllocations();
  for (const Segment& s : segs) grown.Push(s);
  while (!grown.empty()) grown.Pop();
  EXPECT_EQ(gradlane_test::HeapAllocations(), after_warmup);
}

}  // namespace
}  // namespace gradlane::sched
