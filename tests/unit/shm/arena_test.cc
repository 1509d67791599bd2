// Arena: sealing, mapping checks, bounds; allocator: alignment, exhaustion, coalescing.
#include "shm/arena.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gradlane::shm {
namespace {

TEST(Arena, CreateRoundsToPagesAndSeals) {
  auto a = Arena::Create("t", 5000);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->size(), 8192u);
  const int seals = ::fcntl(a->fd(), F_GET_SEALS);
  EXPECT_NE(seals & F_SEAL_SHRINK, 0);
  EXPECT_NE(seals & F_SEAL_GROW, 0);
  EXPECT_NE(seals & F_SEAL_SEAL, 0);
  // A client cannot shrink the file under the daemon's mapping.
  EXPECT_NE(::ftruncate(a->fd(), 0), 0);
  EXPECT_EQ(errno, EPERM);
  std::memset(a->base(), 0xab, a->size());
}

TEST(Arena, MapSharesTheSameBytes) {
  auto a = Arena::Create("t", 4096);
  ASSERT_TRUE(a.ok());
  auto b = Arena::Map(UniqueFd(::dup(a->fd())), 4096);
  ASSERT_TRUE(b.ok()) << b.status();
  a->base()[100] = 42;
  EXPECT_EQ(b->base()[100], 42);
  EXPECT_NE(a->base(), b->base());
}

TEST(Arena, MapRejectsWrongSizeAndUnsealedFd) {
  auto a = Arena::Create("t", 8192);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(Arena::Map(UniqueFd(::dup(a->fd())), 4096).ok());
  EXPECT_FALSE(Arena::Map(UniqueFd(::dup(a->fd())), 1 << 20).ok());
  UniqueFd raw(::memfd_create("unsealed", MFD_CLOEXEC));
  ASSERT_TRUE(raw.valid());
  ASSERT_EQ(::ftruncate(raw.get(), 4096), 0);
  auto m = Arena::Map(std::move(raw), 4096);
  EXPECT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("sealed"), std::string::npos);
}

TEST(Arena, AtBoundsAndOverflow) {
  auto a = Arena::Create("t", 4096);
  ASSERT_TRUE(a.ok());
  EXPECT_NE(a->At(0, 4096), nullptr);
  EXPECT_NE(a->At(4096, 0), nullptr);
  EXPECT_EQ(a->At(4096, 1), nullptr);
  EXPECT_EQ(a->At(1, 4096), nullptr);
  EXPECT_EQ(a->At(UINT64_MAX, 2), nullptr);
  EXPECT_EQ(a->At(8, UINT64_MAX - 4), nullptr);  // offset + length wraps
}

TEST(Arena, CreateRejectsZeroAndAbsurdSizes) {
  EXPECT_FALSE(Arena::Create("t", 0).ok());
  EXPECT_FALSE(Arena::Create("t", uint64_t{1} << 60).ok());
}

TEST(ArenaAllocator, AlignmentAtLeastACacheLine) {
  ArenaAllocator a(100, 1 << 20, 8);  // asks for 8: raised to 64
  for (uint64_t bytes : {1ull, 63ull, 64ull, 65ull, 1000ull}) {
    auto off = a.Allocate(bytes);
    ASSERT_TRUE(off.ok());
    EXPECT_EQ(*off % 64, 0u);
    EXPECT_GE(*off, 100u);
  }
  ArenaAllocator b(0, 1 << 20);  // default 256
  auto o1 = b.Allocate(10), o2 = b.Allocate(10);
  ASSERT_TRUE(o1.ok() && o2.ok());
  EXPECT_EQ(*o2 - *o1, 256u);
}

TEST(ArenaAllocator, ExhaustionAndReuse) {
  ArenaAllocator a(0, 4096, 256);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 16; ++i) {
    auto o = a.Allocate(256);
    ASSERT_TRUE(o.ok());
    offs.push_back(*o);
  }
  EXPECT_EQ(a.bytes_in_use(), 4096u);
  auto full = a.Allocate(1);
  EXPECT_TRUE(absl::IsResourceExhausted(full.status()));
  EXPECT_TRUE(a.Free(offs[3]).ok());
  auto again = a.Allocate(200);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, offs[3]);
  EXPECT_FALSE(a.Allocate(0).ok());
  EXPECT_FALSE(a.Allocate(5000).ok());
}

TEST(ArenaAllocator, FreeCoalescesAndRejectsUnknown) {
  ArenaAllocator a(0, 4096, 256);
  auto x = a.Allocate(1024), y = a.Allocate(1024), z = a.Allocate(1024);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok());
  EXPECT_TRUE(a.Free(*x).ok());
  EXPECT_TRUE(a.Free(*z).ok());
  EXPECT_TRUE(a.Free(*y).ok());  // joins x, y, z and the tail into one block
  EXPECT_EQ(a.free_blocks(), 1u);
  EXPECT_EQ(a.bytes_in_use(), 0u);
  auto whole = a.Allocate(4096);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(*whole, 0u);
  EXPECT_TRUE(absl::IsNotFound(a.Free(17)));
  EXPECT_TRUE(a.Free(*whole).ok());
  EXPECT_TRUE(absl::IsNotFound(a.Free(*whole)));  // double free
}

}  // namespace
}  // namespace gradlane::shm
