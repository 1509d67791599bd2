// Ring semantics over a private mapping: FIFO, wrap-around, full-ring backpressure, batch pops,
// and every way a hostile peer can break the indices or sequence marks.
#include "shm/ring.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "shm/arena.h"

namespace gradlane::shm {
namespace {

struct TestRing {
  explicit TestRing(uint32_t slots) : n(slots) {
    auto a = Arena::Create("ring-test", RingBytes<gl_sqe>(slots));
    if (!a.ok()) std::abort();  // no memfd: nothing below can run
    arena = std::move(*a);
    header = static_cast<gl_ring_header*>(arena.At(0, sizeof(gl_ring_header)));
    if (header == nullptr) std::abort();
    slots_ptr = reinterpret_cast<gl_sqe*>(header + 1);
    InitRing(header, slots_ptr, n);
    producer = RingProducer<gl_sqe>(header, slots_ptr, n);
    consumer = RingConsumer<gl_sqe>(header, slots_ptr, n);
  }
  uint32_t n;
  Arena arena;
  gl_ring_header* header;
  gl_sqe* slots_ptr;
  RingProducer<gl_sqe> producer;
  RingConsumer<gl_sqe> consumer;
};

gl_sqe Entry(uint64_t i) {
  gl_sqe e{};
  e.user_data = i;
  e.iteration = static_cast<int64_t>(i * 7);
  e.offset = i * 64;
  e.length = i + 1;
  e.tensor_id = static_cast<uint32_t>(i % 97);
  e.opcode = GL_OP_POST;
  return e;
}

TEST(Ring, InitWritesConstantsAndZeroes) {
  TestRing r(8);
  EXPECT_EQ(r.header->magic, GL_RING_MAGIC);
  EXPECT_EQ(r.header->slots, 8u);
  EXPECT_EQ(r.header->slot_size, sizeof(gl_sqe));
  EXPECT_EQ(r.header->tail, 0u);
  EXPECT_EQ(r.header->head, 0u);
  gl_sqe out;
  EXPECT_EQ(r.consumer.TryPop(&out), RingResult::kEmpty);
  EXPECT_FALSE(r.consumer.HasEntry());
}

TEST(Ring, FifoAndSequenceMarks) {
  TestRing r(8);
  for (uint64_t i = 0; i < 5; ++i) ASSERT_EQ(r.producer.TryPush(Entry(i)), RingResult::kOk);
  EXPECT_EQ(r.header->tail, 5u);
  EXPECT_EQ(r.slots_ptr[3].seq, 4u);  // mark = index + 1
  for (uint64_t i = 0; i < 5; ++i) {
    gl_sqe out;
    ASSERT_TRUE(r.consumer.HasEntry());
    ASSERT_EQ(r.consumer.TryPop(&out), RingResult::kOk);
    EXPECT_EQ(out.user_data, i);
    EXPECT_EQ(out.iteration, static_cast<int64_t>(i * 7));
    EXPECT_EQ(out.offset, i * 64);
    EXPECT_EQ(out.length, i + 1);
    EXPECT_EQ(out.seq, i + 1);
  }
  EXPECT_EQ(r.header->head, 5u);
  gl_sqe out;
  EXPECT_EQ(r.consumer.TryPop(&out), RingResult::kEmpty);
}

TEST(Ring, WrapAroundManyLaps) {
  TestRing r(4);
  uint64_t next_push = 0, next_pop = 0;
  // Uneven push/pop bursts so the indices cross the slot boundary at every phase.
  for (int round = 0; round < 1000; ++round) {
    const int pushes = 1 + round % 4;
    for (int k = 0; k < pushes; ++k) {
      if (r.producer.TryPush(Entry(next_push)) == RingResult::kOk) ++next_push;
    }
    const int pops = 1 + (round * 7) % 4;
    for (int k = 0; k < pops; ++k) {
      gl_sqe out;
      const RingResult res = r.consumer.TryPop(&out);
      if (res == RingResult::kEmpty) break;
      ASSERT_EQ(res, RingResult::kOk);
      ASSERT_EQ(out.user_data, next_pop);
      ++next_pop;
    }
  }
  EXPECT_GT(next_pop, 500u * 4);  // many laps of a 4-slot ring
  EXPECT_LE(next_push - next_pop, 4u);
  EXPECT_EQ(r.header->tail, next_push);
  EXPECT_EQ(r.header->head, next_pop);
}

TEST(Ring, FullRingBackpressure) {
  TestRing r(8);
  for (uint64_t i = 0; i < 8; ++i) ASSERT_EQ(r.producer.TryPush(Entry(i)), RingResult::kOk);
  EXPECT_EQ(r.producer.TryPush(Entry(8)), RingResult::kFull);
  EXPECT_EQ(r.producer.TryPush(Entry(8)), RingResult::kFull);
  uint32_t free = 99;
  ASSERT_EQ(r.producer.FreeSlots(&free), RingResult::kOk);
  EXPECT_EQ(free, 0u);
  gl_sqe out;
  ASSERT_EQ(r.consumer.TryPop(&out), RingResult::kOk);
  EXPECT_EQ(out.user_data, 0u);
  // One slot freed: exactly one more fits, and the full entry is not overwritten early.
  ASSERT_EQ(r.producer.TryPush(Entry(8)), RingResult::kOk);
  EXPECT_EQ(r.producer.TryPush(Entry(9)), RingResult::kFull);
  for (uint64_t i = 1; i <= 8; ++i) {
    ASSERT_EQ(r.consumer.TryPop(&out), RingResult::kOk);
    EXPECT_EQ(out.user_data, i);
  }
}

TEST(Ring, BatchPopPublishesOnce) {
  TestRing r(16);
  for (uint64_t i = 0; i < 10; ++i) ASSERT_EQ(r.producer.TryPush(Entry(i)), RingResult::kOk);
  std::vector<gl_sqe> out(16);
  RingResult res;
  EXPECT_EQ(r.consumer.TryPopBatch(out.data(), 4, &res), 4u);
  EXPECT_EQ(res, RingResult::kOk);
  EXPECT_EQ(r.header->head, 4u);
  EXPECT_EQ(r.consumer.TryPopBatch(out.data(), 16, &res), 6u);
  EXPECT_EQ(res, RingResult::kEmpty);
  EXPECT_EQ(out[5].user_data, 9u);
  EXPECT_EQ(r.header->head, 10u);
}

TEST(Ring, ConsumerDetectsTailBeyondCapacity) {
  TestRing r(8);
  r.header->tail = 9;  // claims 9 published in an 8-slot ring
  gl_sqe out;
  EXPECT_EQ(r.consumer.TryPop(&out), RingResult::kCorrupt);
}

TEST(Ring, ConsumerDetectsTailGoingBackwards) {
  TestRing r(8);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_EQ(r.producer.TryPush(Entry(i)), RingResult::kOk);
  gl_sqe out;
  for (int i = 0; i < 3; ++i) ASSERT_EQ(r.consumer.TryPop(&out), RingResult::kOk);
  r.header->tail = 1;
  EXPECT_EQ(r.consumer.TryPop(&out), RingResult::kCorrupt);
}

TEST(Ring, TailOneBehindTheMarksIsNotCorruption) {
  // The producer stores the mark, then the index: between the two the consumer can take the
  // entry by its mark and then read the old index. That is an honest state, not corruption.
  TestRing r(8);
  ASSERT_EQ(r.producer.TryPush(Entry(0)), RingResult::kOk);
  r.header->tail = 0;  // as if the index store had not landed yet
  gl_sqe out;
  ASSERT_EQ(r.consumer.TryPop(&out), RingResult::kOk);
  EXPECT_EQ(r.consumer.TryPop(&out), RingResult::kEmpty);
  r.header->tail = 1;
  EXPECT_EQ(r.consumer.TryPop(&out), RingResult::kEmpty);
}

TEST(Ring, TailTwoBehindIsCorruption) {
  TestRing r(8);
  ASSERT_EQ(r.producer.TryPush(Entry(0)), RingResult::kOk);
  ASSERT_EQ(r.producer.TryPush(Entry(1)), RingResult::kOk);
  gl_sqe out;
  ASSERT_EQ(r.consumer.TryPop(&out), RingResult::kOk);
  ASSERT_EQ(r.consumer.TryPop(&out), RingResult::kOk);
  r.header->tail = 0;
  EXPECT_EQ(r.consumer.TryPop(&out), RingResult::kCorrupt);
}

TEST(Ring, ConsumerDetectsMarkMissingBehindPublishedTail) {
  TestRing r(8);
  ASSERT_EQ(r.producer.TryPush(Entry(0)), RingResult::kOk);
  ASSERT_EQ(r.producer.TryPush(Entry(1)), RingResult::kOk);
  r.slots_ptr[0].seq = 12345;  // tail says published, the mark disagrees
  gl_sqe out;
  EXPECT_EQ(r.consumer.TryPop(&out), RingResult::kCorrupt);
}

TEST(Ring, StaleMarkFromPreviousLapIsNotAnEntry) {
  TestRing r(4);
  gl_sqe out;
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_EQ(r.producer.TryPush(Entry(i)), RingResult::kOk);
    ASSERT_EQ(r.consumer.TryPop(&out), RingResult::kOk);
  }
  // Slot 0 still holds mark 1 from lap 0; the consumer wants mark 5 there now.
  EXPECT_EQ(r.slots_ptr[0].seq, 1u);
  EXPECT_FALSE(r.consumer.HasEntry());
  EXPECT_EQ(r.consumer.TryPop(&out), RingResult::kEmpty);
}

TEST(Ring, ProducerDetectsHeadBeyondTail) {
  TestRing r(8);
  for (uint64_t i = 0; i < 8; ++i) ASSERT_EQ(r.producer.TryPush(Entry(i)), RingResult::kOk);
  r.header->head = 100;  // consumer claims to have freed entries never published
  EXPECT_EQ(r.producer.TryPush(Entry(8)), RingResult::kCorrupt);
}

TEST(Ring, ProducerDetectsHeadGoingBackwards) {
  TestRing r(4);
  gl_sqe out;
  for (uint64_t i = 0; i < 4; ++i) ASSERT_EQ(r.producer.TryPush(Entry(i)), RingResult::kOk);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(r.consumer.TryPop(&out), RingResult::kOk);
  for (uint64_t i = 4; i < 8; ++i) ASSERT_EQ(r.producer.TryPush(Entry(i)), RingResult::kOk);
  r.header->head = 2;  // was 4
  uint32_t free = 0;
  EXPECT_EQ(r.producer.FreeSlots(&free), RingResult::kCorrupt);
}

TEST(Ring, CorruptPayloadKeepsCheckedMark) {
  TestRing r(8);
  ASSERT_EQ(r.producer.TryPush(Entry(0)), RingResult::kOk);
  gl_sqe out;
  ASSERT_EQ(r.consumer.TryPop(&out), RingResult::kOk);
  EXPECT_EQ(out.seq, 1u);
}

}  // namespace
}  // namespace gradlane::shm
