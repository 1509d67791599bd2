// Cross-process stress of the rings and doorbells: a forked producer pushes millions of
// descriptors (none may be lost, duplicated or reordered), and sleep/wake runs with random
// delays on both sides (a lost wake-up shows up as a wait that times out with data present).
//
// Children only touch the shared mapping and the eventfds, then _exit() (no gtest, no atexit,
// no leak report from a forked copy of the parent's heap).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <random>

#include "shm/arena.h"
#include "shm/doorbell.h"
#include "shm/ring.h"

namespace gradlane::shm {
namespace {

uint64_t EnvOr(const char* name, uint64_t dflt) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::strtoull(v, nullptr, 10) : dflt;
}

struct SharedRing {
  explicit SharedRing(uint32_t slots, uint64_t extra_bytes = 0) : n(slots) {
    auto a = Arena::Create("stress", kPageSize + RingBytes<gl_sqe>(slots) + extra_bytes);
    if (!a.ok()) std::abort();
    arena = std::move(*a);
    header = static_cast<gl_ring_header*>(arena.At(kPageSize, sizeof(gl_ring_header)));
    if (header == nullptr) std::abort();
    slots_ptr = reinterpret_cast<gl_sqe*>(header + 1);
    InitRing(header, slots_ptr, n);
    auto fd = CreateEventFd();
    EXPECT_TRUE(fd.ok());
    efd = std::move(*fd);
  }
  RingProducer<gl_sqe> Producer() { return RingProducer<gl_sqe>(header, slots_ptr, n); }
  RingConsumer<gl_sqe> Consumer() { return RingConsumer<gl_sqe>(header, slots_ptr, n); }
  uint32_t n;
  Arena arena;
  gl_ring_header* header;
  gl_sqe* slots_ptr;
  UniqueFd efd;
};

gl_sqe Make(uint64_t i) {
  gl_sqe e{};
  e.user_data = i;
  e.iteration = static_cast<int64_t>(i);
  e.offset = i ^ 0x5a5a5a5aull;
  e.length = i * 3 + 1;
  e.tensor_id = static_cast<uint32_t>(i & 0xffff);
  e.opcode = GL_OP_POST;
  return e;
}

bool Matches(const gl_sqe& e, uint64_t i) {
  return e.user_data == i && e.iteration == static_cast<int64_t>(i) &&
         e.offset == (i ^ 0x5a5a5a5aull) && e.length == i * 3 + 1 && e.tensor_id == (i & 0xffff) &&
         e.opcode == GL_OP_POST;
}

void BusyWaitNs(uint64_t ns) {
  timespec t0, t;
  ::clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    ::clock_gettime(CLOCK_MONOTONIC, &t);
  } while (uint64_t(t.tv_sec - t0.tv_sec) * 1000000000ull + uint64_t(t.tv_nsec) -
               uint64_t(t0.tv_nsec) <
           ns);
}

// A child must not outlive a parent that failed an assertion and returned.
void DieWithParent() { ::prctl(PR_SET_PDEATHSIG, SIGKILL); }

int WaitChild(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(RingStress, ForkedProducerMillionsNoneLostDuplicatedOrReordered) {
  const uint64_t kCount = EnvOr("GRADLANE_STRESS_DESCRIPTORS", 3'000'000);
  SharedRing ring(1024);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    DieWithParent();
    RingProducer<gl_sqe> p = ring.Producer();
    for (uint64_t i = 0; i < kCount;) {
      const RingResult r = p.TryPush(Make(i));
      if (r == RingResult::kOk) {
        ++i;
      } else if (r == RingResult::kFull) {
        ::sched_yield();  // two cores, two spinners: let the consumer run
      } else {
        ::_exit(2);
      }
    }
    ::_exit(0);
  }
  RingConsumer<gl_sqe> c = ring.Consumer();
  uint64_t next = 0, mismatches = 0, empty_polls = 0;
  gl_sqe batch[64];
  while (next < kCount) {
    RingResult r;
    const uint32_t got = c.TryPopBatch(batch, 64, &r);
    for (uint32_t k = 0; k < got; ++k) {
      if (!Matches(batch[k], next)) ++mismatches;
      ++next;
    }
    ASSERT_NE(r, RingResult::kCorrupt) << "at " << next;
    if (got == 0 && ++empty_polls % 64 == 0) ::sched_yield();
  }
  EXPECT_EQ(WaitChild(pid), 0);
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(next, kCount);
  gl_sqe extra;
  EXPECT_EQ(c.TryPop(&extra), RingResult::kEmpty);  // nothing duplicated past the end
  EXPECT_EQ(ring.header->tail, kCount);
  EXPECT_EQ(ring.header->head, kCount);
}

// Producer child with random gaps (none, busy, sleeping); the parent consumer sleeps on the
// doorbell whenever the ring is empty after a random short spin.
TEST(RingStress, SleepWakeRandomDelaysNoLostWakeup) {
  const uint64_t kCount = EnvOr("GRADLANE_STRESS_WAKEUPS", 50'000);
  SharedRing ring(64);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    DieWithParent();
    std::mt19937_64 rng(12345);
    RingProducer<gl_sqe> p = ring.Producer();
    Doorbell bell(ring.header, ring.efd.get());
    for (uint64_t i = 0; i < kCount;) {
      const RingResult r = p.TryPush(Make(i));
      if (r == RingResult::kCorrupt) ::_exit(2);
      if (r == RingResult::kFull) {
        ::sched_yield();
        continue;
      }
      bell.NotifyIfArmed();
      ++i;
      const uint32_t dice = rng() % 1000;
      if (dice < 20) {
        ::usleep(20 + rng() % 200);  // consumer falls asleep
      } else if (dice < 300) {
        BusyWaitNs(rng() % 20'000);  // races with the consumer arming
      }
    }
    ::_exit(0);
  }
  std::mt19937_64 rng(777);
  RingConsumer<gl_sqe> c = ring.Consumer();
  Doorbell bell(ring.header, ring.efd.get());
  uint64_t next = 0, mismatches = 0, sleeps = 0, lost = 0;
  while (next < kCount) {
    gl_sqe e;
    const RingResult r = c.TryPop(&e);
    ASSERT_NE(r, RingResult::kCorrupt);
    if (r == RingResult::kOk) {
      if (!Matches(e, next)) ++mismatches;
      ++next;
      continue;
    }
    const uint32_t spins = rng() % 2000;
    bool found = false;
    for (uint32_t s = 0; s < spins && !found; ++s) found = c.HasEntry();
    if (found) continue;
    bell.Arm();
    if (c.HasEntry()) {
      bell.Disarm();
      continue;
    }
    ++sleeps;
    if (!bell.Wait(5000)) {
      // Timed out. If an entry is there, its producer skipped the eventfd: a lost wake-up
      // (5 s: far beyond any scheduling delay of the producer between publish and ring).
      if (c.HasEntry()) ++lost;
      ASSERT_TRUE(c.HasEntry()) << "producer stalled (child died?) at " << next;
    }
    bell.Drain();
    bell.Disarm();
  }
  EXPECT_EQ(WaitChild(pid), 0);
  EXPECT_EQ(lost, 0u);
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(next, kCount);
  EXPECT_GT(sleeps, 500u) << "the sleeping path was hardly exercised";
}

// Ping-pong where both sides always sleep: every message needs a wake-up, so one lost
// wake-up stalls the exchange and the 5 s timeout fails the test.
TEST(RingStress, PingPongBothSidesSleeping) {
  const uint64_t kRounds = EnvOr("GRADLANE_STRESS_PINGPONG", 20'000);
  SharedRing req(8), resp(8);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  auto receive = [](RingConsumer<gl_sqe>& c, Doorbell& bell, gl_sqe* out) {
    for (;;) {
      const RingResult r = c.TryPop(out);
      if (r == RingResult::kOk) return true;
      if (r == RingResult::kCorrupt) return false;
      bell.Arm();
      if (c.HasEntry()) {
        bell.Disarm();
        continue;
      }
      const bool woke = bell.Wait(5000);
      bell.Drain();
      bell.Disarm();
      if (!woke && !c.HasEntry()) return false;  // nobody rang within 5 s
    }
  };
  if (pid == 0) {
    DieWithParent();
    RingConsumer<gl_sqe> in = req.Consumer();
    RingProducer<gl_sqe> out = resp.Producer();
    Doorbell in_bell(req.header, req.efd.get()), out_bell(resp.header, resp.efd.get());
    for (uint64_t i = 0; i < kRounds; ++i) {
      gl_sqe e;
      if (!receive(in, in_bell, &e) || !Matches(e, i)) ::_exit(3);
      if (out.TryPush(Make(i + 1'000'000)) != RingResult::kOk) ::_exit(4);
      out_bell.NotifyIfArmed();
    }
    ::_exit(0);
  }
  RingProducer<gl_sqe> out = req.Producer();
  RingConsumer<gl_sqe> in = resp.Consumer();
  Doorbell out_bell(req.header, req.efd.get()), in_bell(resp.header, resp.efd.get());
  uint64_t ok = 0;
  for (uint64_t i = 0; i < kRounds; ++i) {
    ASSERT_EQ(out.TryPush(Make(i)), RingResult::kOk);
    out_bell.NotifyIfArmed();
    gl_sqe e;
    ASSERT_TRUE(receive(in, in_bell, &e)) << "lost wake-up at round " << i;
    if (Matches(e, i + 1'000'000)) ++ok;
  }
  EXPECT_EQ(WaitChild(pid), 0);
  EXPECT_EQ(ok, kRounds);
}

}  // namespace
}  // namespace gradlane::shm
