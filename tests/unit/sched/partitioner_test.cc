#include "sched/partitioner.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gradlane::sched {
namespace {

struct Piece {
  uint32_t index;
  uint64_t offset;
  uint64_t length;
};

std::vector<Piece> Cut(const PartitionPlan& plan, uint64_t offset, uint64_t length) {
  std::vector<Piece> out;
  plan.ForEachSegment(offset, length, [&](uint32_t i, uint64_t o, uint64_t l) {
    out.push_back({i, o, l});
  });
  return out;
}

constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

TEST(PartitionPlanTest, SizeIsWholeElementsAndNeverZero) {
  std::mt19937_64 rng(1);
  for (DType dt : kAllDTypes) {
    const uint64_t elem = DTypeBytes(dt);
    for (int i = 0; i < 2000; ++i) {
      const uint64_t tensor = (rng() % 10'000'000) * elem;
      const uint64_t requested = rng() % 5'000'000;
      const PartitionPlan plan = PartitionPlan::Make(tensor, dt, requested);
      ASSERT_GT(plan.partition_bytes(), 0u);
      ASSERT_EQ(plan.partition_bytes() % elem, 0u) << "requested " << requested;
      const uint64_t rounded = requested - requested % elem;
      if (rounded > 0 && (tensor + rounded - 1) / rounded <= kMaxPartitions) {
        // Not raised by the cap: rounded down to whole elements only.
        EXPECT_EQ(plan.partition_bytes(), rounded);
      } else if (rounded > 0) {
        EXPECT_GT(plan.partition_bytes(), rounded);
      }
      ASSERT_LE(plan.partition_count(), kMaxPartitions);
    }
  }
}

TEST(PartitionPlanTest, RequestBelowOneElementBecomesOneElement) {
  EXPECT_EQ(PartitionPlan::Make(1000, DType::kF32, 3).partition_bytes(), 4u);
  EXPECT_EQ(PartitionPlan::Make(1000, DType::kF16, 1).partition_bytes(), 2u);
}

TEST(PartitionPlanTest, ZeroRequestMeansWholeTensor) {
  const PartitionPlan plan = PartitionPlan::Make(123456, DType::kF32, 0);
  EXPECT_EQ(plan.partition_count(), 1u);
  const auto pieces = Cut(plan, 0, 123456);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].length, 123456u);
}

TEST(PartitionPlanTest, HugeTensorIsCappedAt65536Partitions) {
  // 4 TiB of f32 at 4-byte partitions would be 2^40 partitions.
  const uint64_t tensor = 1ull << 42;
  const PartitionPlan plan = PartitionPlan::Make(tensor, DType::kF32, 4);
  EXPECT_EQ(plan.partition_count(), kMaxPartitions);
  EXPECT_EQ(plan.partition_bytes() % 4, 0u);
  // The last byte's partition index still fits the key's 16-bit field.
  EXPECT_EQ(plan.PartitionOf(tensor - 1), kMaxPartitions - 1);

  // A size not divisible by 65536: raised and re-aligned, still within the cap.
  const uint64_t odd = 65536ull * 1000 + 2 * 777;
  const PartitionPlan p16 = PartitionPlan::Make(odd, DType::kF16, 2);
  EXPECT_LE(p16.partition_count(), kMaxPartitions);
  EXPECT_EQ(p16.partition_bytes() % 2, 0u);
  uint32_t last = 0;
  p16.ForEachSegment(0, odd, [&](uint32_t i, uint64_t, uint64_t) { last = i; });
  EXPECT_LT(last, kMaxPartitions);
}

TEST(PartitionPlanTest, ExactlyAtTheCapIsNotRaised) {
  const PartitionPlan at = PartitionPlan::Make(65536ull * 4096, DType::kF32, 4096);
  EXPECT_EQ(at.partition_bytes(), 4096u);
  EXPECT_EQ(at.partition_count(), kMaxPartitions);
  const PartitionPlan over = PartitionPlan::Make(65536ull * 4096 + 4, DType::kF32, 4096);
  EXPECT_GT(over.partition_bytes(), 4096u);
  EXPECT_LE(over.partition_count(), kMaxPartitions);
}

// Pieces of any range cover it exactly, lie inside one partition each, and name the partition
// the bytes belong to — whatever range they arrived in.
TEST(PartitionPlanTest, BoundariesAreStableAcrossRanges) {
  std::mt19937_64 rng(7);
  for (DType dt : kAllDTypes) {
    const uint64_t elem = DTypeBytes(dt);
    for (int t = 0; t < 200; ++t) {
      const uint64_t tensor = (1 + rng() % 200'000) * elem;
      const PartitionPlan plan = PartitionPlan::Make(tensor, dt, 1 + rng() % 50'000);
      const uint64_t delta = plan.partition_bytes();
      for (int r = 0; r < 20; ++r) {
        const uint64_t off = (rng() % (tensor / elem)) * elem;
        const uint64_t len = (rng() % ((tensor - off) / elem + 1)) * elem;
        uint64_t cursor = off;
        for (const Piece& p : Cut(plan, off, len)) {
          ASSERT_EQ(p.offset, cursor);
          ASSERT_GT(p.length, 0u);
          ASSERT_EQ(p.index, p.offset / delta);
          ASSERT_EQ(p.index, (p.offset + p.length - 1) / delta) << "piece crosses a boundary";
          ASSERT_EQ(p.offset % elem, 0u);
          ASSERT_EQ(p.length % elem, 0u);
          cursor += p.length;
        }
        ASSERT_EQ(cursor, off + len);
      }
    }
  }
}

TEST(PartitionPlanTest, RangePastTheEndIsClipped) {
  const PartitionPlan plan = PartitionPlan::Make(100, DType::kF32, 40);
  const auto pieces = Cut(plan, 80, 1000);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].index, 2u);
  EXPECT_EQ(pieces[0].offset, 80u);
  EXPECT_EQ(pieces[0].length, 20u);
  EXPECT_TRUE(Cut(plan, 100, 10).empty());
}

TEST(PartitionPlanTest, ValidateRange) {
  const PartitionPlan plan = PartitionPlan::Make(100, DType::kF32, 40);
  EXPECT_TRUE(plan.ValidateRange(0, 100, DType::kF32).ok());
  EXPECT_TRUE(plan.ValidateRange(96, 4, DType::kF32).ok());
  EXPECT_EQ(plan.ValidateRange(96, 8, DType::kF32).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(plan.ValidateRange(~0ull, 8, DType::kF32).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(plan.ValidateRange(2, 4, DType::kF32).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CutRangeTest, FillsSegmentsFromTheRange) {
  ReadyRange r;
  r.tensor_id = 9;
  r.priority = 3;
  r.dtype = DType::kF16;
  r.direction = Direction::kPull;
  r.peer = 5;
  r.iteration = 11;
  r.tensor_bytes = 1000;
  r.offset = 300;
  r.length = 500;
  const PartitionPlan plan = PartitionPlan::Make(r.tensor_bytes, r.dtype, 256);
  std::vector<Segment> segs;
  CutRange(plan, r, 777, [&](const Segment& s) { segs.push_back(s); });
  ASSERT_EQ(segs.size(), 3u);  // [300,512) [512,768) [768,800)
  EXPECT_EQ(segs[0].key, MakeKey(9, 1));
  EXPECT_EQ(segs[1].key, MakeKey(9, 2));
  EXPECT_EQ(segs[2].key, MakeKey(9, 3));
  EXPECT_EQ(segs[0].length, 212u);
  EXPECT_EQ(segs[2].offset, 768u);
  EXPECT_EQ(segs[2].length, 32u);
  for (const Segment& s : segs) {
    EXPECT_EQ(s.priority, 3);
    EXPECT_EQ(s.dtype, DType::kF16);
    EXPECT_EQ(s.direction, Direction::kPull);
    EXPECT_EQ(s.peer, 5);
    EXPECT_EQ(s.iteration, 11);
    EXPECT_EQ(s.ready_at, 777);
  }
}

TEST(EvenSplitTest, PartsCoverTheWholeAndDifferByAtMostOne) {
  for (uint64_t total :
       {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{1000}, uint64_t{4} << 20}) {
    for (uint64_t parts : {uint64_t{1}, uint64_t{3}, uint64_t{8}, uint64_t{70}}) {
      EXPECT_EQ(EvenSplitPoint(total, parts, 0), 0u);
      EXPECT_EQ(EvenSplitPoint(total, parts, parts), total);
      uint64_t shortest = total, longest = 0;
      for (uint64_t k = 0; k < parts; ++k) {
        const uint64_t length =
            EvenSplitPoint(total, parts, k + 1) - EvenSplitPoint(total, parts, k);
        shortest = std::min(shortest, length);
        longest = std::max(longest, length);
      }
      EXPECT_LE(longest - shortest, 1u) << total << " / " << parts;
    }
  }
  // k·total would overflow 64 bits: 2^40 parts of 2^40.
  EXPECT_EQ(EvenSplitPoint(uint64_t{1} << 40, uint64_t{1} << 40, (uint64_t{1} << 40) - 1),
            (uint64_t{1} << 40) - 1);
}

}  // namespace
}  // namespace gradlane::sched
