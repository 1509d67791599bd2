// The TCP connection's send-side accounting without sockets: whatever sizes the kernel accepts
// (1 byte, mid-header, mid-payload, several frames at once), the byte stream is exactly the
// frames in post order, and control frames only ever enter it between frames.
#include "transport/tcp/connection.h"

#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace gradlane::transport::tcp {
namespace {

// Simulates writev accepting at most `budget` bytes: copies them out of the iovecs.
size_t Take(const iovec* iov, size_t n, size_t budget, std::vector<uint8_t>& out) {
  size_t taken = 0;
  for (size_t i = 0; i < n && taken < budget; ++i) {
    const size_t k = std::min(iov[i].iov_len, budget - taken);
    const uint8_t* p = static_cast<const uint8_t*>(iov[i].iov_base);
    out.insert(out.end(), p, p + k);
    taken += k;
  }
  return taken;
}

struct Parsed {
  std::vector<FrameHeader> data;
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<FrameHeader> acks;
  bool ok = true;
};

Parsed Parse(const std::vector<uint8_t>& stream) {
  Parsed p;
  size_t at = 0;
  while (at < stream.size()) {
    FrameHeader h;
    if (stream.size() - at < sizeof(h)) return p.ok = false, p;
    std::memcpy(&h, &stream[at], sizeof(h));
    at += sizeof(h);
    if (CheckHeader(h, 1 << 30) != WireError::kNone || stream.size() - at < h.payload_bytes) {
      return p.ok = false, p;
    }
    if (TypeOf(h) == FrameType::kData) {
      p.data.push_back(h);
      p.payloads.emplace_back(stream.begin() + static_cast<ptrdiff_t>(at),
                              stream.begin() + static_cast<ptrdiff_t>(at + h.payload_bytes));
    } else if (TypeOf(h) == FrameType::kAck) {
      p.acks.push_back(h);
    }
    at += h.payload_bytes;
  }
  return p;
}

class ConnectionTest : public ::testing::TestWithParam<size_t> {};

TEST_P(ConnectionTest, AnyWriteSizeGivesTheExactStreamWithControlOnlyBetweenFrames) {
  const size_t step = GetParam();
  auto c = std::make_unique<Connection>();
  c->Init(64);
  const uint64_t sizes[] = {0, 1, 63, 64, 65, 200, 7, 4096, 1};
  std::vector<uint8_t> src(8192);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  uint64_t off = 0;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    PendingSend& s = c->Slot(c->post_idx);
    s.header = MakeHeader(FrameType::kData, 1, 0);
    s.header.key = i;
    s.header.length = s.header.payload_bytes = static_cast<uint32_t>(sizes[i]);
    s.header.seq = static_cast<uint32_t>(c->post_idx);
    s.payload = src.data() + off;
    off += sizes[i];
    ++c->post_idx;
  }
  std::vector<uint8_t> stream;
  iovec iov[Connection::kMaxIov];
  int acks_queued = 0;
  for (int guard = 0; c->HasUnwritten() && guard < 100000; ++guard) {
    // An ack becomes due every few writes, wherever the writer happens to be.
    if (guard % 3 == 0 && acks_queued < 20) {
      FrameHeader data = MakeHeader(FrameType::kData, 1, 1);
      data.seq = static_cast<uint32_t>(1000 + acks_queued);
      ASSERT_TRUE(c->AppendCtrl(MakeAckHeader(data, 0, false), nullptr, 0));
      ++acks_queued;
    }
    const size_t n = c->BuildIov(iov, true);
    ASSERT_GT(n, 0u);
    c->Consume(Take(iov, n, step, stream));
  }
  ASSERT_FALSE(c->HasUnwritten());
  EXPECT_EQ(c->write_idx, c->post_idx);
  EXPECT_EQ(c->write_off, 0u);
  const Parsed p = Parse(stream);
  ASSERT_TRUE(p.ok) << "stream does not parse: a control frame split a data frame";
  ASSERT_EQ(p.data.size(), std::size(sizes));
  off = 0;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    EXPECT_EQ(p.data[i].key, i);
    ASSERT_EQ(p.payloads[i].size(), sizes[i]);
    // memcmp with a zero length still needs valid pointers, and an empty payload has none.
    if (sizes[i] != 0)
      EXPECT_EQ(std::memcmp(p.payloads[i].data(), src.data() + off, sizes[i]), 0) << i;
    off += sizes[i];
  }
  ASSERT_EQ(p.acks.size(), static_cast<size_t>(acks_queued));
  for (int i = 0; i < acks_queued; ++i) EXPECT_EQ(p.acks[i].seq, static_cast<uint32_t>(1000 + i));
}

INSTANTIATE_TEST_SUITE_P(WriteSizes, ConnectionTest,
                         ::testing::Values(1, 2, 5, 63, 64, 65, 100, 129, 1000, 100000));

TEST(Connection, RingAndControlBufferBounds) {
  auto c = std::make_unique<Connection>();
  c->Init(3);  // rounded up to 4
  EXPECT_EQ(c->ring.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_FALSE(c->RingFull());
    c->Slot(c->post_idx).header.length = 0;
    ++c->post_idx;
  }
  EXPECT_TRUE(c->RingFull());
  // A ring's worth of acks always fits in the control buffer (so reading never stalls on it).
  const FrameHeader ack = MakeHeader(FrameType::kAck, 1, 0);
  for (size_t i = 0; i < c->ring.size(); ++i) EXPECT_TRUE(c->AppendCtrl(ack, nullptr, 0));
  size_t extra = 0;
  while (c->AppendCtrl(ack, nullptr, 0)) ++extra;
  EXPECT_LT(extra, 64u);  // and the buffer is bounded
}

}  // namespace
}  // namespace gradlane::transport::tcp
