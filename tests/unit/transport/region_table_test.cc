// transport/common/region_table.h: registration, id reuse, and the bounds checks of sends and
// receive targets — a range outside its region is refused, never clamped.
#include "transport/common/region_table.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace gradlane::transport {
namespace {

constexpr uint64_t kMaxSegment = 1 << 20;

SendSpec Send(RegionId r, uint64_t offset, uint64_t length) {
  SendSpec s;
  s.region = r;
  s.region_offset = offset;
  s.length = length;
  return s;
}

TEST(RegionTable, RegisterChecksBaseAndLimitAndReusesIdsLowestFirst) {
  std::vector<uint8_t> a(16), b(16);
  RegionTable t(2);
  EXPECT_EQ(t.Register(nullptr, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*t.Register(nullptr, 0), 0u) << "an empty region needs no memory";
  EXPECT_EQ(*t.Register(a.data(), a.size()), 1u);
  EXPECT_EQ(t.Register(b.data(), b.size()).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(t.Unregister(0).ok());
  EXPECT_EQ(t.Unregister(0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.Unregister(9).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.Unregister(kNoRegion).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*t.Register(b.data(), b.size()), 0u);
}

TEST(RegionTable, ResolveSendChecksRegionRangeAndSegmentLimit) {
  std::vector<uint8_t> buf(100);
  RegionTable t(4);
  const RegionId r = *t.Register(buf.data(), buf.size());
  EXPECT_EQ(*t.ResolveSend(Send(r, 0, 100), kMaxSegment), buf.data());
  EXPECT_EQ(*t.ResolveSend(Send(r, 40, 60), kMaxSegment), buf.data() + 40);
  EXPECT_EQ(*t.ResolveSend(Send(r, 100, 0), kMaxSegment), buf.data() + 100) << "empty at the end";
  const auto code = [&](const SendSpec& s, uint64_t max = kMaxSegment) {
    return t.ResolveSend(s, max).status().code();
  };
  EXPECT_EQ(code(Send(r, 40, 61)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Send(r, 101, 0)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Send(r, 1, std::numeric_limits<uint64_t>::max())),
            absl::StatusCode::kInvalidArgument)
      << "offset + length wraps";
  EXPECT_EQ(code(Send(r, 0, 100), 99), absl::StatusCode::kInvalidArgument)
      << "over max_segment_bytes";
  EXPECT_EQ(code(Send(r + 1, 0, 1)), absl::StatusCode::kInvalidArgument) << "never registered";
  EXPECT_EQ(code(Send(kNoRegion, 0, 1)), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(t.Unregister(r).ok());
  EXPECT_EQ(code(Send(r, 0, 1)), absl::StatusCode::kInvalidArgument) << "unregistered";
}

TEST(RegionTable, ResolveRecvRefusesWhatDoesNotFit) {
  std::vector<uint8_t> buf(100);
  RegionTable t(4);
  const RegionId r = *t.Register(buf.data(), buf.size());
  EXPECT_EQ(t.ResolveRecv(RecvTarget::Into(r, 0), 100), buf.data());
  EXPECT_EQ(t.ResolveRecv(RecvTarget::Pieces(r, 30), 70), buf.data() + 30);
  EXPECT_EQ(t.ResolveRecv(RecvTarget::Into(r, 100), 0), buf.data() + 100);
  EXPECT_FALSE(t.ResolveRecv(RecvTarget::Reject(), 0).has_value()) << "the engine said no";
  EXPECT_FALSE(t.ResolveRecv(RecvTarget::Into(r, 30), 71).has_value());
  EXPECT_FALSE(t.ResolveRecv(RecvTarget::Into(r, 101), 0).has_value());
  EXPECT_FALSE(
      t.ResolveRecv(RecvTarget::Into(r, 1), std::numeric_limits<uint64_t>::max()).has_value());
  EXPECT_FALSE(t.ResolveRecv(RecvTarget::Into(r + 1, 0), 0).has_value());
  ASSERT_TRUE(t.Unregister(r).ok());
  EXPECT_FALSE(t.ResolveRecv(RecvTarget::Into(r, 0), 1).has_value());
  // An empty region registered with no memory takes an empty segment.
  const RegionId e = *t.Register(nullptr, 0);
  const std::optional<uint8_t*> dst = t.ResolveRecv(RecvTarget::Into(e, 0), 0);
  ASSERT_TRUE(dst.has_value());
  EXPECT_EQ(*dst, nullptr);
}

}  // namespace
}  // namespace gradlane::transport
