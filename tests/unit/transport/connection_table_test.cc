// transport/common/connection_table.h: handles are slot + generation, so a handle kept after its
// connection is gone never names a later connection in the same slot.
#include "transport/common/connection_table.h"

#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace gradlane::transport {
namespace {

struct Conn {
  int value = 0;
};

TEST(ConnectionTable, InitRejectsSizesHandlesCannotName) {
  ConnectionTable<Conn> t;
  EXPECT_EQ(t.Init(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Init(kMaxConnectionSlots + 1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(t.Init(4).ok());
  EXPECT_EQ(t.Init(4).code(), absl::StatusCode::kFailedPrecondition);
  // The largest slot at the largest generation still is not kNoPeer.
  static_assert(MakePeerHandle(kMaxConnectionSlots - 1, kMaxGeneration) != kNoPeer);
}

TEST(ConnectionTable, AllocHandsOutSlotZeroFirstAndLookupFindsIt) {
  ConnectionTable<Conn> t;
  ASSERT_TRUE(t.Init(3).ok());
  Conn* a = t.Alloc();
  Conn* b = t.Alloc();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(t.IndexOf(*a), 0u);
  EXPECT_EQ(t.IndexOf(*b), 1u);
  EXPECT_EQ(t.high_water(), 2u);
  EXPECT_EQ(t.in_use(), 2u);
  EXPECT_EQ(t.Lookup(t.HandleOf(*a)), a);
  EXPECT_EQ(t.Lookup(t.HandleOf(*b)), b);
  EXPECT_NE(t.HandleOf(*a), kNoPeer);
  EXPECT_NE(t.HandleOf(*a), 0u);
  EXPECT_EQ(t.Lookup(kNoPeer), nullptr);
  EXPECT_EQ(t.Lookup(MakePeerHandle(2, 1)), nullptr) << "a slot never allocated";
  EXPECT_EQ(t.Lookup(MakePeerHandle(7, 1)), nullptr) << "past the capacity";
  EXPECT_NE(t.Alloc(), nullptr);
  EXPECT_EQ(t.Alloc(), nullptr) << "full";
}

TEST(ConnectionTable, StaleHandleNeverResolvesAfterFreeAndRealloc) {
  ConnectionTable<Conn> t;
  ASSERT_TRUE(t.Init(2).ok());
  Conn* c = t.Alloc();
  const PeerHandle old = t.HandleOf(*c);
  t.Retire(*c);
  // Retired: still found, so the rest of the round can see the connection is dead.
  EXPECT_EQ(t.Lookup(old), c);
  EXPECT_TRUE(t.retired(*c));
  int released = 0;
  t.ReleaseRetired([&](Conn& r) {
    EXPECT_EQ(&r, c);
    EXPECT_EQ(t.Lookup(old), c) << "the hook runs before the handle dies";
    ++released;
  });
  EXPECT_EQ(released, 1);
  EXPECT_EQ(t.Lookup(old), nullptr);
  EXPECT_EQ(t.LookupAnyThread(old), nullptr);
  Conn* again = t.Alloc();
  ASSERT_EQ(again, c) << "the freed slot is reused first";
  const PeerHandle fresh = t.HandleOf(*again);
  EXPECT_NE(fresh, old);
  EXPECT_EQ(HandleIndex(fresh), HandleIndex(old));
  EXPECT_EQ(t.Lookup(old), nullptr);
  EXPECT_EQ(t.LookupAnyThread(old), nullptr);
  EXPECT_EQ(t.Lookup(fresh), again);
  EXPECT_EQ(t.LookupAnyThread(fresh), again);
}

TEST(ConnectionTable, RetireIsIdempotentAndReleaseRunsOncePerSlot) {
  ConnectionTable<Conn> t;
  ASSERT_TRUE(t.Init(3).ok());
  Conn* a = t.Alloc();
  Conn* b = t.Alloc();
  t.Retire(*b);
  t.Retire(*a);
  t.Retire(*b);
  std::vector<uint32_t> order;
  t.ReleaseRetired([&](Conn& r) { order.push_back(t.IndexOf(r)); });
  EXPECT_EQ(order, (std::vector<uint32_t>{1, 0}));
  t.ReleaseRetired([&](Conn&) { ADD_FAILURE() << "released twice"; });
  EXPECT_EQ(t.in_use(), 0u);
}

TEST(ConnectionTable, GenerationsCycleWithoutRepeatingBeforeTheWrap) {
  ConnectionTable<Conn> t;
  ASSERT_TRUE(t.Init(1).ok());
  std::set<PeerHandle> seen;
  PeerHandle first = kNoPeer;
  for (uint32_t i = 0; i < kMaxGeneration; ++i) {
    Conn* c = t.Alloc();
    ASSERT_NE(c, nullptr);
    const PeerHandle h = t.HandleOf(*c);
    if (i == 0) first = h;
    ASSERT_NE(h, kNoPeer);
    ASSERT_NE(HandleGeneration(h), 0u);
    ASSERT_TRUE(seen.insert(h).second) << "handle repeated after " << i << " reuses";
    t.Retire(*c);
    t.ReleaseRetired();
  }
  Conn* c = t.Alloc();
  EXPECT_EQ(t.HandleOf(*c), first) << "after 65535 frees of one slot the generation wraps";
}

TEST(ConnectionTable, ForEachVisitsSlotsInUseIncludingRetiredOnes) {
  ConnectionTable<Conn> t;
  ASSERT_TRUE(t.Init(4).ok());
  Conn* a = t.Alloc();
  Conn* b = t.Alloc();
  Conn* c = t.Alloc();
  a->value = 1;
  b->value = 2;
  c->value = 3;
  t.Retire(*b);
  t.Retire(*c);
  t.ReleaseRetired();   // c's slot is free now; b's too
  Conn* d = t.Alloc();  // last freed first: c's slot
  EXPECT_EQ(d, c);
  d->value = 4;
  t.Retire(*a);
  std::vector<int> values;
  t.ForEach([&](Conn& x) {
    values.push_back(x.value);
    if (x.value == 1) t.Alloc()->value = 5;  // allocating during the walk is allowed
  });
  EXPECT_EQ(values, (std::vector<int>{1, 5, 4}));
}

}  // namespace
}  // namespace gradlane::transport
