// The verbs backend's registration cache (transport/verbs/registration_cache.h) on the in-memory
// NIC: memory registered on another thread (as the session server registers a client's arena)
// is found by a later Acquire (the engine's RegisterRegion_st) without a second device
// registration, and its keys work on the NIC; users are counted, and the last Release
// deregisters (the NIC then refuses the keys); a refused registration caches nothing and names
// RLIMIT_MEMLOCK; device work never holds the lock a lookup needs.
#include "transport/verbs/registration_cache.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/fakes/fake_verbs.h"

namespace gradlane::transport::verbs {
namespace {

// A registration on the fake NIC; destroying it deregisters, as IbvMemory does.
class FakeRegistration final : public MemoryRegistration {
 public:
  FakeRegistration(fake::FakeNic& nic, fake::MemoryKeys keys, std::atomic<int>& deregistered)
      : nic_(nic), keys_(keys), deregistered_(deregistered) {}
  ~FakeRegistration() override {
    EXPECT_TRUE(nic_.Deregister(keys_.lkey));
    ++deregistered_;
  }
  uint32_t lkey() const override { return keys_.lkey; }
  uint32_t rkey() const override { return keys_.rkey; }

 private:
  fake::FakeNic& nic_;
  fake::MemoryKeys keys_;
  std::atomic<int>& deregistered_;
};

class RegistrationTest : public ::testing::Test {
 protected:
  RegistrationTest()
      : cache_([this](void* base,
                      uint64_t bytes) -> absl::StatusOr<std::unique_ptr<MemoryRegistration>> {
          ++registered_;
          if (refuse_) {
            return absl::UnavailableError(RegistrationErrorText(bytes, ENOMEM, uint64_t{65536}));
          }
          return std::unique_ptr<MemoryRegistration>(new FakeRegistration(
              nic_, nic_.Register(base, bytes, /*remote_write=*/true), deregistered_));
        }),
        arena_(1 << 20),
        source_(4096, 0xAB) {
    source_keys_ = nic_.Register(source_.data(), source_.size(), false);
    auto [a, b] = nic_.ConnectedPair();
    writer_ = a;
    (void)b;
  }

  // An RDMA write of `source_` into the arena at `offset` under `rkey`: its completion status.
  CompletionStatus WriteIntoArena(uint32_t rkey, uint64_t offset) {
    SendWork w;
    w.wr_id = 1;
    w.op = WorkOp::kWrite;
    w.sge[0] = LocalSpan{reinterpret_cast<uint64_t>(source_.data()),
                         static_cast<uint32_t>(source_.size()), source_keys_.lkey};
    w.num_sge = 1;
    w.signaled = true;
    w.remote_addr = reinterpret_cast<uint64_t>(arena_.data() + offset);
    w.rkey = rkey;
    EXPECT_TRUE(writer_->PostSend(w).ok());
    nic_.Run();
    std::vector<Completion> c = writer_->TakeCompletions();
    EXPECT_EQ(c.size(), 1u);
    return c.empty() ? CompletionStatus::kLocalError : c.back().status;
  }

  fake::FakeNic nic_;
  std::atomic<int> registered_{0};
  std::atomic<int> deregistered_{0};
  bool refuse_ = false;
  RegistrationCache cache_;
  std::vector<uint8_t> arena_;
  std::vector<uint8_t> source_;
  fake::MemoryKeys source_keys_;
  fake::FakeQueuePair* writer_ = nullptr;
};

TEST_F(RegistrationTest, PinnedOnAnotherThreadIsFoundWithoutASecondRegistration) {
  absl::StatusOr<RegionKeys> pinned;
  std::thread session_server([&] { pinned = cache_.Acquire(arena_.data(), arena_.size()); });
  session_server.join();
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_EQ(registered_, 1);

  // The engine thread's RegisterRegion_st of the same range.
  absl::StatusOr<RegionKeys> engine = cache_.Acquire(arena_.data(), arena_.size());
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ(registered_, 1) << "the engine registered the pinned arena a second time";
  EXPECT_EQ(engine->lkey, pinned->lkey);
  EXPECT_EQ(engine->rkey, pinned->rkey);
  const RegistrationStats s = cache_.Stats();
  EXPECT_EQ(s.registrations, 1u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.bytes, arena_.size());

  // The keys are the NIC's: a peer's write under the rkey lands.
  EXPECT_EQ(WriteIntoArena(engine->rkey, 8192), CompletionStatus::kSuccess);
  EXPECT_EQ(arena_[8192], 0xAB);
  EXPECT_EQ(arena_[8192 + 4095], 0xAB);

  // A different range (a sub-range, another length) is another registration.
  ASSERT_TRUE(cache_.Acquire(arena_.data(), 4096).ok());
  EXPECT_EQ(registered_, 2);
}

TEST_F(RegistrationTest, TheLastReleaseDeregistersAndOnlyIt) {
  ASSERT_TRUE(cache_.Acquire(arena_.data(), arena_.size()).ok());  // the session's pin
  absl::StatusOr<RegionKeys> region = cache_.Acquire(arena_.data(), arena_.size());  // a job's
  ASSERT_TRUE(region.ok());
  ASSERT_TRUE(cache_.Acquire(arena_.data(), arena_.size()).ok());  // a second job's

  // The jobs end: the session still holds the arena, so it stays registered.
  ASSERT_TRUE(cache_.Release(arena_.data(), arena_.size()).ok());
  ASSERT_TRUE(cache_.Release(arena_.data(), arena_.size()).ok());
  EXPECT_EQ(deregistered_, 0);
  EXPECT_EQ(WriteIntoArena(region->rkey, 0), CompletionStatus::kSuccess);

  // The session closes: deregistered, and the NIC refuses the old rkey from then on.
  ASSERT_TRUE(cache_.Release(arena_.data(), arena_.size()).ok());
  EXPECT_EQ(deregistered_, 1);
  EXPECT_EQ(cache_.Stats().entries, 0u);
  EXPECT_EQ(cache_.Stats().bytes, 0u);
  EXPECT_EQ(WriteIntoArena(region->rkey, 0), CompletionStatus::kRemoteAccessError);

  // Released once too often: refused, nothing else happens.
  EXPECT_TRUE(absl::IsNotFound(cache_.Release(arena_.data(), arena_.size())));
  EXPECT_EQ(deregistered_, 1);

  // Registered afresh after that (new pages may sit at the same address): new keys.
  absl::StatusOr<RegionKeys> again = cache_.Acquire(arena_.data(), arena_.size());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(registered_, 2);
  EXPECT_NE(again->rkey, region->rkey);
}

TEST_F(RegistrationTest, ARefusedRegistrationNamesTheLimitAndCachesNothing) {
  refuse_ = true;
  absl::StatusOr<RegionKeys> keys = cache_.Acquire(arena_.data(), arena_.size());
  ASSERT_FALSE(keys.ok());
  EXPECT_TRUE(absl::IsUnavailable(keys.status()));
  EXPECT_NE(keys.status().message().find("RLIMIT_MEMLOCK"), std::string::npos) << keys.status();
  EXPECT_NE(keys.status().message().find("is 65536 bytes"), std::string::npos) << keys.status();
  EXPECT_EQ(cache_.Stats().failures, 1u);
  EXPECT_EQ(cache_.Stats().entries, 0u);
  EXPECT_TRUE(absl::IsNotFound(cache_.Release(arena_.data(), arena_.size())));

  // Nothing cached: once the limit allows it, the next Acquire goes to the device again.
  refuse_ = false;
  ASSERT_TRUE(cache_.Acquire(arena_.data(), arena_.size()).ok());
  EXPECT_EQ(registered_, 2);
  EXPECT_TRUE(absl::IsInvalidArgument(cache_.Acquire(nullptr, 4096).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(cache_.Acquire(arena_.data(), 0).status()));
}

TEST(RegistrationErrorTextTest, NamesTheLimitOnlyWhenItCanBeTheCause) {
  const std::string limited = RegistrationErrorText(1 << 30, ENOMEM, uint64_t{8 << 20});
  // The cause first: a client's hello reply holds 127 characters.
  EXPECT_EQ(limited.rfind("RLIMIT_MEMLOCK is 8388608 bytes, too low to pin 1073741824", 0), 0u)
      << limited;
  EXPECT_NE(limited.find("LimitMEMLOCK=infinity"), std::string::npos) << limited;
  EXPECT_EQ(RegistrationErrorText(4096, EFAULT, uint64_t{8 << 20}),
            "ibv_reg_mr of 4096 bytes: Bad address");
  EXPECT_EQ(RegistrationErrorText(4096, ENOMEM, std::nullopt).find("RLIMIT"), std::string::npos);
  EXPECT_EQ(RegistrationErrorText(4096, EFAULT, uint64_t{8 << 20}).find("RLIMIT"),
            std::string::npos);
}

// A registration that takes long (a GiB being pinned on the session server's thread) must not
// hold up a lookup of memory already registered (the engine's data path going on).
TEST(RegistrationCacheThreads, ALookupDoesNotWaitForAnotherThreadsRegistration) {
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, release = false;
  struct Keys final : MemoryRegistration {
    uint32_t lkey() const override { return 1; }
    uint32_t rkey() const override { return 2; }
  };
  static uint8_t small[64], big[64];
  RegistrationCache cache(
      [&](void* base, uint64_t) -> absl::StatusOr<std::unique_ptr<MemoryRegistration>> {
        if (base == big) {
          std::unique_lock<std::mutex> lock(mu);
          entered = true;
          cv.notify_all();
          cv.wait(lock, [&] { return release; });
        }
        return std::unique_ptr<MemoryRegistration>(new Keys);
      });
  ASSERT_TRUE(cache.Acquire(small, sizeof(small)).ok());
  std::thread slow([&] { EXPECT_TRUE(cache.Acquire(big, sizeof(big)).ok()); });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return entered; });
  }
  // The slow registration is in the device now. A lookup must come back at once.
  auto lookup = std::async(std::launch::async, [&] { return cache.Acquire(small, sizeof(small)); });
  const bool returned = lookup.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  slow.join();
  ASSERT_TRUE(returned) << "a lookup waited for another thread's device registration";
  EXPECT_TRUE(lookup.get().ok());
}

// Many threads pinning and releasing shared and private ranges (TSan checks the locking): every
// registration is deregistered exactly once, and a shared range is registered once per period
// in which somebody holds it.
TEST(RegistrationCacheThreads, ConcurrentUsersBalance) {
  std::atomic<int> registered{0}, deregistered{0};
  struct Counted final : MemoryRegistration {
    explicit Counted(std::atomic<int>& d) : d_(d) {}
    ~Counted() override { ++d_; }
    uint32_t lkey() const override { return 7; }
    uint32_t rkey() const override { return 8; }
    std::atomic<int>& d_;
  };
  RegistrationCache cache(
      [&](void*, uint64_t) -> absl::StatusOr<std::unique_ptr<MemoryRegistration>> {
        ++registered;
        return std::unique_ptr<MemoryRegistration>(new Counted(deregistered));
      });
  static uint8_t shared[4096];
  static uint8_t own[8][4096];
  ASSERT_TRUE(cache.Acquire(shared, sizeof(shared)).ok());  // held throughout: registered once
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        ASSERT_TRUE(cache.Acquire(shared, sizeof(shared)).ok());
        ASSERT_TRUE(cache.Acquire(own[t], sizeof(own[t])).ok());
        ASSERT_TRUE(cache.Release(own[t], sizeof(own[t])).ok());
        ASSERT_TRUE(cache.Release(shared, sizeof(shared)).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(cache.Release(shared, sizeof(shared)).ok());
  const RegistrationStats s = cache.Stats();
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(registered.load(), deregistered.load());
  EXPECT_EQ(s.registrations, static_cast<uint64_t>(registered.load()));
  EXPECT_EQ(s.registrations - s.duplicates, 1u + 8u * 500u);  // shared once, own every round
}

}  // namespace
}  // namespace gradlane::transport::verbs
