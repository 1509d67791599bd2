#include "sched/credit_window.h"

#include <deque>
#include <random>

#include "gtest/gtest.h"

namespace gradlane::sched {
namespace {

TEST(CreditWindowTest, AdmitsUpToCapacityInclusive) {
  CreditWindow w(10);
  ASSERT_TRUE(w.CanAcquire(4));
  w.Acquire(4);
  ASSERT_TRUE(w.CanAcquire(6));  // exactly full is allowed (<=), as §4.2's window of two needs
  ASSERT_FALSE(w.CanAcquire(7));
  w.Acquire(6);
  EXPECT_EQ(w.in_use(), 10u);
  EXPECT_EQ(w.available(), 0u);
  EXPECT_FALSE(w.CanAcquire(1));
  EXPECT_TRUE(w.Release(4));
  EXPECT_TRUE(w.CanAcquire(4));
  EXPECT_FALSE(w.CanAcquire(5));
}

// No deadlock: a dispatch bigger than the whole window goes out alone.
TEST(CreditWindowTest, OversizedDispatchAdmittedOnlyWhenEmpty) {
  CreditWindow w(10);
  EXPECT_TRUE(w.CanAcquire(1000));
  w.Acquire(1000);
  EXPECT_EQ(w.in_flight_dispatches(), 1u);
  EXPECT_FALSE(w.CanAcquire(1));
  EXPECT_TRUE(w.Release(1000));
  EXPECT_EQ(w.in_use(), 0u);
  EXPECT_TRUE(w.CanAcquire(1000));

  w.Acquire(5);
  EXPECT_FALSE(w.CanAcquire(1000)) << "an oversized dispatch must wait for an empty window";
}

TEST(CreditWindowTest, ZeroCapacityIsStopAndWait) {
  CreditWindow w(0);
  EXPECT_TRUE(w.CanAcquire(123));
  w.Acquire(123);
  EXPECT_FALSE(w.CanAcquire(1));
  w.Release(123);
  EXPECT_TRUE(w.CanAcquire(1));
}

TEST(CreditWindowTest, UnlimitedNeverBlocks) {
  CreditWindow w(CreditWindow::kUnlimited);
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(w.CanAcquire(1ull << 40));
    w.Acquire(1ull << 40);
  }
  EXPECT_EQ(w.in_use(), 100ull << 40);
}

TEST(CreditWindowTest, OverReleaseIsReportedAndClamped) {
  CreditWindow w(10);
  w.Acquire(3);
  EXPECT_FALSE(w.Release(5));
  EXPECT_EQ(w.in_use(), 0u);
  EXPECT_TRUE(w.CanAcquire(10));
}

// Random traffic: the window is never exceeded except by one dispatch alone, and credit is
// conserved (in_use equals the bytes of the dispatches not yet acknowledged).
TEST(CreditWindowTest, NeverExceededUnderRandomTraffic) {
  std::mt19937_64 rng(3);
  for (uint64_t capacity : {0ull, 1ull, 100ull, 1000ull, 65536ull}) {
    CreditWindow w(capacity);
    std::deque<uint64_t> in_flight;
    uint64_t sum = 0;
    for (int step = 0; step < 20000; ++step) {
      if (rng() % 2 == 0) {
        const uint64_t bytes = 1 + rng() % (2 * capacity + 10);
        const bool expected = in_flight.empty() || sum + bytes <= capacity;
        ASSERT_EQ(w.CanAcquire(bytes), expected);
        if (expected) {
          w.Acquire(bytes);
          in_flight.push_back(bytes);
          sum += bytes;
        }
      } else if (!in_flight.empty()) {
        ASSERT_TRUE(w.Release(in_flight.front()));
        sum -= in_flight.front();
        in_flight.pop_front();
      }
      ASSERT_EQ(w.in_use(), sum);
      ASSERT_TRUE(w.in_use() <= capacity || in_flight.size() == 1)
          << "capacity " << capacity << " in_use " << w.in_use();
    }
  }
}

}  // namespace
}  // namespace gradlane::sched
