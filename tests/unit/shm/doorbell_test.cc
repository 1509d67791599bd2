// Doorbell protocol pieces: no eventfd write while the consumer is awake, exactly one while it
// is armed, Wait() wakes on a ring and times out otherwise, extra fd reported.
#include "shm/doorbell.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace gradlane::shm {
namespace {

uint64_t ReadCounter(int fd) {
  uint64_t v = 0;
  if (::read(fd, &v, sizeof(v)) != sizeof(v)) return 0;  // EAGAIN: counter is 0
  return v;
}

TEST(Doorbell, NoWriteWhileConsumerAwake) {
  gl_ring_header h{};
  auto fd = CreateEventFd();
  ASSERT_TRUE(fd.ok());
  Doorbell producer(&h, fd->get());
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(producer.NotifyIfArmed());
  EXPECT_EQ(ReadCounter(fd->get()), 0u);
}

TEST(Doorbell, OneWritePerSleep) {
  gl_ring_header h{};
  auto fd = CreateEventFd();
  ASSERT_TRUE(fd.ok());
  Doorbell producer(&h, fd->get());
  Doorbell consumer(&h, fd->get());
  consumer.Arm();
  EXPECT_EQ(h.armed, 1u);
  EXPECT_TRUE(producer.NotifyIfArmed());
  EXPECT_EQ(h.armed, 0u);  // producer disarmed it: further posts make no system call
  EXPECT_FALSE(producer.NotifyIfArmed());
  EXPECT_EQ(ReadCounter(fd->get()), 1u);
}

TEST(Doorbell, WaitTimesOutWithoutRing) {
  gl_ring_header h{};
  auto fd = CreateEventFd();
  ASSERT_TRUE(fd.ok());
  Doorbell consumer(&h, fd->get());
  consumer.Arm();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(consumer.Wait(30));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(25));
  consumer.Disarm();
}

TEST(Doorbell, WaitWakesOnRingFromAnotherThread) {
  gl_ring_header h{};
  auto fd = CreateEventFd();
  ASSERT_TRUE(fd.ok());
  Doorbell producer(&h, fd->get());
  Doorbell consumer(&h, fd->get());
  consumer.Arm();
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    producer.NotifyIfArmed();
  });
  EXPECT_TRUE(consumer.Wait(5000));
  consumer.Drain();
  consumer.Disarm();
  t.join();
  EXPECT_EQ(ReadCounter(fd->get()), 0u);  // drained
}

TEST(Doorbell, WaitReportsExtraFd) {
  gl_ring_header h{};
  auto fd = CreateEventFd();
  ASSERT_TRUE(fd.ok());
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  Doorbell consumer(&h, fd->get());
  ::close(sv[1]);  // hang-up on sv[0]
  bool extra = false;
  EXPECT_FALSE(consumer.Wait(5000, sv[0], &extra));
  EXPECT_TRUE(extra);
  ::close(sv[0]);
}

}  // namespace
}  // namespace gradlane::shm
