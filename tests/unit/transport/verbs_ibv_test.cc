// The verbs protocol core over a real RDMA device through libibverbs (transport/verbs/ibv_device):
// two RC queue pairs of one device connected to each other, the sender's source in a memfd
// mapping (as a client's arena is), eager and rendezvous segments bit-exact, credits never
// overrun, a refusal. Needs an RDMA device: on a host without one it exits 77 (meson: SKIP)
// saying so; tests/rxe/ runs it in a soft-RoCE guest. GRADLANE_VERBS_DEVICE names the device
// (default: the first), GRADLANE_VERBS_GID_INDEX the GID (default 1: soft-RoCE's RoCEv2 IPv4).
// The backend's registrations: an arena pinned on another thread is found by RegisterRegion_st
// without a second device registration; the test prints what RegisterRegion_st of an arena
// costs the engine thread before (registered there) and after (pinned ahead), for an arena of
// GRADLANE_REG_BENCH_BYTES (default 64 MiB; the measurement in docs/verbs.md used 1 GiB in a
// guest with --mem 3072), its pages fresh or, with GRADLANE_REG_BENCH_PREFAULT=1, written first
// (as a client's tensors are by the time its first post activates the job).
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "transport/verbs/ibv_device.h"
#include "transport/verbs/verbs_channel.h"
#include "transport/verbs/verbs_transport.h"

namespace gradlane::transport::verbs {
namespace {

std::string DeviceName() {
  const char* v = std::getenv("GRADLANE_VERBS_DEVICE");
  return v != nullptr ? v : "";
}
int GidIndex() {
  const char* v = std::getenv("GRADLANE_VERBS_GID_INDEX");
  return v != nullptr ? std::atoi(v) : 1;
}

struct Sent : SenderEvents {
  std::vector<uint64_t> acked, failed;
  int downs = 0;
  std::string down;
  void OnSendAcked_st(uint64_t cookie) override { acked.push_back(cookie); }
  void OnSendFailed_st(uint64_t cookie, const absl::Status&) override { failed.push_back(cookie); }
  void OnChannelDown_st(const absl::Status& why) override {
    ++downs;
    down = why.ToString();
  }
};

struct Placed : ReceiverEvents {
  uint8_t* destination = nullptr;
  uint32_t rkey = 0;
  uint64_t refuse_key = ~0ull;
  size_t placed = 0;
  int downs = 0;
  std::string down;
  SegmentTarget ResolveSegment_st(const FrameHeader& h) override {
    if (h.key == refuse_key) return SegmentTarget{};
    return SegmentTarget{true, destination + h.offset,
                         reinterpret_cast<uint64_t>(destination + h.offset), rkey, h.key};
  }
  void OnSegmentPlaced_st(const FrameHeader&, const SegmentTarget&) override { ++placed; }
  void OnChannelDown_st(const absl::Status& why) override {
    ++downs;
    down = why.ToString();
  }
};

class IbvLink {
 public:
  static constexpr size_t kBytes = 8 << 20;

  explicit IbvLink(const ChannelLimits& limits) : limits_(limits) {
    auto device = IbvDevice::Open(DeviceName(), 1, GidIndex());
    EXPECT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
    // The source lives in shared memory, as a client's arena does.
    const int fd = memfd_create("gradlane-verbs-test", 0);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, kBytes), 0);
    source_ =
        static_cast<uint8_t*>(mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    EXPECT_NE(source_, MAP_FAILED);
    std::mt19937 rng(17);
    for (size_t i = 0; i < kBytes; ++i) source_[i] = static_cast<uint8_t>(rng());
    destination_.assign(kBytes, 0);
    reply_region_.assign(ReplyRegionBytes(limits.reply_entries), 0);
    headers_.assign(size_t{limits.reply_entries} * kFrameHeaderBytes, 0);
    slots_.assign(size_t{limits.recv_slots} * limits.slot_bytes, 0);
    staging_.assign(size_t{limits.send_queue_depth} * kReplyEntryBytes, 0);
    source_mr_ = Must(device_->Register(source_, kBytes, false));
    destination_mr_ = Must(device_->Register(destination_.data(), kBytes, true));
    reply_mr_ = Must(device_->Register(reply_region_.data(), reply_region_.size(), true));
    headers_mr_ = Must(device_->Register(headers_.data(), headers_.size(), false));
    slots_mr_ = Must(device_->Register(slots_.data(), slots_.size(), false));
    staging_mr_ = Must(device_->Register(staging_.data(), staging_.size(), false));
    send_qp_ = Must(device_->CreateQueuePair(limits.send_queue_depth, 4));
    recv_qp_ = Must(device_->CreateQueuePair(limits.send_queue_depth, limits.recv_slots));
    EXPECT_TRUE(send_qp_->Connect(recv_qp_->LocalHello()).ok());
    EXPECT_TRUE(recv_qp_->Connect(send_qp_->LocalHello()).ok());
    placed_.destination = destination_.data();
    placed_.rkey = destination_mr_->rkey();
    sender_ = std::make_unique<VerbsSender>(
        *send_qp_, limits, SenderMemory{reply_region_.data(), headers_.data(), headers_mr_->lkey()},
        sent_);
    receiver_ = std::make_unique<VerbsReceiver>(
        *recv_qp_, limits,
        ReceiverMemory{slots_.data(), slots_mr_->lkey(), staging_.data(), staging_mr_->lkey(),
                       reinterpret_cast<uint64_t>(reply_region_.data()), reply_mr_->rkey()},
        placed_);
    EXPECT_TRUE(receiver_->Start_st().ok());
  }
  ~IbvLink() {
    sender_.reset();
    receiver_.reset();
    send_qp_.reset();
    recv_qp_.reset();
    source_mr_.reset();
    destination_mr_.reset();
    reply_mr_.reset();
    headers_mr_.reset();
    slots_mr_.reset();
    staging_mr_.reset();
    munmap(source_, kBytes);
  }

  template <typename T>
  static std::unique_ptr<T> Must(absl::StatusOr<std::unique_ptr<T>> v) {
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? std::move(*v) : nullptr;
  }

  absl::Status Post(uint64_t key, uint64_t offset, uint64_t length) {
    OutgoingSegment s;
    s.header = MakeHeader(FrameType::kData, 3, 0);
    s.header.key = key;
    s.header.offset = offset;
    s.header.length = length;
    s.header.payload_bytes = static_cast<uint32_t>(length);
    s.payload_addr = reinterpret_cast<uint64_t>(source_ + offset);
    s.payload_lkey = source_mr_->lkey();
    s.cookie = key;
    return sender_->Post(s);
  }

  // Polls and routes completions, flushes, progresses until the sender has nothing pending
  // (or a bounded number of idle rounds pass: a real NIC takes its time).
  void Drain() {
    RoutedCompletion wc[64];
    int idle = 0;
    while (sender_->pending() > 0 && !sender_->failed() && idle < 2'000'000) {
      auto n = device_->Poll(wc);
      ASSERT_TRUE(n.ok());
      for (size_t i = 0; i < *n; ++i) {
        if (wc[i].qp_num == send_qp_->qp_num()) {
          sender_->OnCompletion_st(wc[i].completion);
        } else {
          receiver_->OnCompletion_st(wc[i].completion);
        }
      }
      const int moved = static_cast<int>(*n) + receiver_->Flush_st() + sender_->Progress_st();
      idle = moved > 0 ? 0 : idle + 1;
    }
  }

  bool Same(uint64_t offset, uint64_t length) const {
    return std::memcmp(source_ + offset, destination_.data() + offset, length) == 0;
  }

  ChannelLimits limits_;
  std::unique_ptr<IbvDevice> device_;
  uint8_t* source_ = nullptr;
  std::vector<uint8_t> destination_, reply_region_, headers_, slots_, staging_;
  std::unique_ptr<IbvMemory> source_mr_, destination_mr_, reply_mr_, headers_mr_, slots_mr_,
      staging_mr_;
  std::unique_ptr<IbvQueuePair> send_qp_, recv_qp_;
  Sent sent_;
  Placed placed_;
  std::unique_ptr<VerbsSender> sender_;
  std::unique_ptr<VerbsReceiver> receiver_;
};

// Limits of a test link: `slots` receive slots of `payload` bytes each, four times as many reply
// entries and send queue entries, every slots-th request signaled.
ChannelLimits LinkLimits(uint32_t slots, uint32_t payload) {
  ChannelLimits limits;
  limits.recv_slots = slots;
  limits.slot_bytes = kFrameHeaderBytes + payload;
  limits.reply_entries = 4 * slots;
  limits.send_queue_depth = 4 * slots;
  limits.signal_every = slots;
  return limits;
}

TEST(VerbsIbvTest, EagerAndRendezvousOverTheDeviceAreBitExactAndInOrder) {
  const ChannelLimits limits = LinkLimits(8, 1024);
  IbvLink link(limits);
  std::mt19937 rng(3);
  uint64_t offset = 0;
  std::vector<std::pair<uint64_t, uint64_t>> posted;
  for (int round = 0; round < 10; ++round) {
    for (int i = 0; i < 24; ++i) {
      const uint64_t n = rng() % 3 == 0 ? rng() % 1024 : 1025 + rng() % 200000;
      if (offset + n > IbvLink::kBytes) offset = 0;
      ASSERT_TRUE(link.Post(posted.size(), offset, n).ok());
      posted.push_back({offset, n});
      offset += n;
    }
    link.Drain();
    ASSERT_EQ(link.sent_.downs, 0) << link.sent_.down;
    ASSERT_EQ(link.placed_.downs, 0) << link.placed_.down;
    ASSERT_EQ(link.sender_->pending(), 0u);
  }
  ASSERT_EQ(link.sent_.acked.size(), posted.size());
  for (size_t i = 0; i < posted.size(); ++i) {
    EXPECT_EQ(link.sent_.acked[i], i);
  }
  // Later segments overwrite earlier ones where the offsets wrapped: compare the last pass.
  for (size_t i = posted.size() - 24; i < posted.size(); ++i) {
    EXPECT_TRUE(link.Same(posted[i].first, posted[i].second)) << "segment " << i;
  }
  EXPECT_GT(link.sender_->eager_sent(), 0u);
  EXPECT_GT(link.sender_->rendezvous_sent(), 0u);
}

TEST(VerbsIbvTest, ARefusedRendezvousFailsOnlyItsSend) {
  const ChannelLimits limits = LinkLimits(4, 256);
  IbvLink link(limits);
  link.placed_.refuse_key = 1;
  ASSERT_TRUE(link.Post(0, 0, 100).ok());
  ASSERT_TRUE(link.Post(1, 4096, 65536).ok());
  ASSERT_TRUE(link.Post(2, 1 << 20, 65536).ok());
  link.Drain();
  EXPECT_EQ(link.sent_.acked, (std::vector<uint64_t>{0, 2}));
  EXPECT_EQ(link.sent_.failed, (std::vector<uint64_t>{1}));
  EXPECT_TRUE(link.Same(1 << 20, 65536));
  EXPECT_EQ(link.sent_.downs, 0);
}

TEST(VerbsIbvTest, RegistrationsAreCountedUntilDeregisteredAndRefusalsToo) {
  const ChannelLimits limits = LinkLimits(4, 256);
  IbvLink link(limits);
  auto now = [&] {
    VerbsStats v;
    link.device_->registrations().SnapshotInto(v);
    return v;
  };
  const uint64_t small =
      link.reply_region_.size() + link.headers_.size() + link.slots_.size() + link.staging_.size();
  VerbsStats v = now();
  EXPECT_EQ(v.registrations, 6u);
  EXPECT_EQ(v.registered_bytes, 2 * IbvLink::kBytes + small);
  EXPECT_EQ(v.registration_failures, 0u);
  // Memory that is not mapped: the kernel refuses to pin it.
  EXPECT_FALSE(link.device_->Register(reinterpret_cast<void*>(uintptr_t{4096}), 4096, false).ok());
  v = now();
  EXPECT_EQ(v.registration_failures, 1u);
  EXPECT_EQ(v.registrations, 6u);
  link.source_mr_.reset();
  v = now();
  EXPECT_EQ(v.registrations, 5u);
  EXPECT_EQ(v.registered_bytes, IbvLink::kBytes + small);
}

// A client arena: a memfd mapping, fresh (its pages are allocated by the registration that pins
// them, as a new session's are) or written first (`prefault`).
uint8_t* MapArena(uint64_t bytes, bool prefault) {
  const int fd = memfd_create("gradlane-verbs-arena", 0);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  EXPECT_NE(p, MAP_FAILED);
  if (prefault && p != MAP_FAILED) std::memset(p, 1, bytes);
  return static_cast<uint8_t*>(p);
}

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

TEST(VerbsIbvTest, AnArenaPinnedOnAnotherThreadIsALookupForRegisterRegion) {
  const char* env = std::getenv("GRADLANE_REG_BENCH_BYTES");
  const uint64_t bytes = env != nullptr ? std::strtoull(env, nullptr, 10) : uint64_t{64} << 20;
  const char* pf = std::getenv("GRADLANE_REG_BENCH_PREFAULT");
  const bool prefault = pf != nullptr && std::strcmp(pf, "1") == 0;
  TransportOptions options;
  options.listen_address = "127.0.0.1";
  VerbsOptions verbs;
  verbs.device = DeviceName();
  verbs.gid_index = GidIndex();
  auto t = VerbsTransport::Create(options, verbs, nullptr);
  ASSERT_TRUE(t.ok()) << t.status();
  VerbsTransport& transport = **t;
  using Clock = std::chrono::steady_clock;

  // Before: the engine thread registers the arena itself.
  uint8_t* before = MapArena(bytes, prefault);
  auto t0 = Clock::now();
  absl::StatusOr<RegionId> direct = transport.RegisterRegion_st(before, bytes);
  const double direct_ms = MsSince(t0);
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(transport.registration_stats().registrations, 1u);
  t0 = Clock::now();
  ASSERT_TRUE(transport.UnregisterRegion_st(*direct).ok());
  const double direct_dereg_ms = MsSince(t0);

  // After: the session server's thread pins it; RegisterRegion_st finds it.
  uint8_t* arena = MapArena(bytes, prefault);
  double pin_ms = 0;
  std::thread session_server([&] {
    const auto p0 = Clock::now();
    EXPECT_TRUE(transport.registrar()->Pin(arena, bytes).ok());
    pin_ms = MsSince(p0);
  });
  session_server.join();
  t0 = Clock::now();
  absl::StatusOr<RegionId> found = transport.RegisterRegion_st(arena, bytes);
  const double found_ms = MsSince(t0);
  ASSERT_TRUE(found.ok()) << found.status();
  RegistrationStats s = transport.registration_stats();
  EXPECT_EQ(s.registrations, 2u) << "RegisterRegion_st registered a pinned arena again";
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.entries, 1u);
  t0 = Clock::now();
  ASSERT_TRUE(transport.UnregisterRegion_st(*found).ok());  // the job ends: still pinned
  const double found_unregister_ms = MsSince(t0);
  EXPECT_EQ(transport.registration_stats().entries, 1u);
  double unpin_ms = 0;
  std::thread acceptor([&] {  // the session closes: deregistered on this thread
    const auto u0 = Clock::now();
    transport.registrar()->Unpin(arena, bytes);
    unpin_ms = MsSince(u0);
  });
  acceptor.join();
  s = transport.registration_stats();
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(s.deregistrations, 2u);
  std::printf(
      "arena of %llu bytes (%s). Engine thread before: RegisterRegion_st %.1f ms, "
      "UnregisterRegion_st "
      "%.1f ms. After: RegisterRegion_st %.3f ms, UnregisterRegion_st %.3f ms; on other threads "
      "Pin %.1f ms, Unpin %.1f ms\n",
      static_cast<unsigned long long>(bytes), prefault ? "written first" : "fresh", direct_ms,
      direct_dereg_ms, found_ms, found_unregister_ms, pin_ms, unpin_ms);
  munmap(before, bytes);
  munmap(arena, bytes);
}

}  // namespace
}  // namespace gradlane::transport::verbs

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto device = gradlane::transport::verbs::IbvDevice::Open(
      gradlane::transport::verbs::DeviceName(), 1, gradlane::transport::verbs::GidIndex());
  if (!device.ok()) {
    std::printf("SKIP: needs an RDMA device (%s); tests/rxe/ runs this test under soft-RoCE\n",
                device.status().ToString().c_str());
    return 77;
  }
  std::printf("RDMA device %s, port 1, GID index %d\n", (*device)->name().c_str(),
              gradlane::transport::verbs::GidIndex());
  device->reset();
  return RUN_ALL_TESTS();
}
