// Wire layout and validation: the bytes a peer sees, and every malformed class rejected with
// its own code.
#include "transport/wire.h"

#include "transport/transport.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gradlane::transport {
namespace {

FrameHeader ValidData(uint64_t length = 100) {
  FrameHeader h = MakeHeader(FrameType::kData, 7, 1);
  h.key = sched::MakeKey(3, 2);
  h.iteration = 5;
  h.offset = 4096;
  h.length = length;
  h.payload_bytes = static_cast<uint32_t>(length);
  h.priority = 9;
  h.dtype = static_cast<uint8_t>(sched::DType::kBF16);
  h.direction = static_cast<uint8_t>(sched::Direction::kPull);
  return h;
}

template <class T>
T ReadLE(const uint8_t* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(p[i]) << (8 * i));
  return v;
}

TEST(WireLayout, HeaderBytesAreLittleEndianAtDocumentedOffsets) {
  FrameHeader h = ValidData(0x01020304);
  h.flags = 0;
  h.seq = 0xA1B2C3D4u;
  h.sender_rank = 0x0506;
  uint8_t b[kFrameHeaderBytes];
  std::memcpy(b, &h, sizeof(b));
  EXPECT_EQ(std::string(reinterpret_cast<char*>(b), 4), "GLNF");
  EXPECT_EQ(b[4], kProtocolVersion);
  EXPECT_EQ(b[5], static_cast<uint8_t>(FrameType::kData));
  EXPECT_EQ(ReadLE<uint64_t>(b + 8), 7u);
  EXPECT_EQ(ReadLE<uint64_t>(b + 16), sched::MakeKey(3, 2));
  EXPECT_EQ(ReadLE<uint64_t>(b + 24), 5u);
  EXPECT_EQ(ReadLE<uint64_t>(b + 32), 4096u);
  EXPECT_EQ(ReadLE<uint64_t>(b + 40), 0x01020304u);
  EXPECT_EQ(ReadLE<uint32_t>(b + 48), 0x01020304u);
  EXPECT_EQ(ReadLE<uint32_t>(b + 52), 9u);
  EXPECT_EQ(ReadLE<uint16_t>(b + 56), 0x0506u);
  EXPECT_EQ(b[58], static_cast<uint8_t>(sched::DType::kBF16));
  EXPECT_EQ(b[59], static_cast<uint8_t>(sched::Direction::kPull));
  EXPECT_EQ(ReadLE<uint32_t>(b + 60), 0xA1B2C3D4u);
}

TEST(WireLayout, BuildersLeaveNoUninitialisedBytes) {
  // Two builds over different garbage must give identical bytes: nothing leaks from the stack.
  alignas(FrameHeader) uint8_t a[kFrameHeaderBytes];
  alignas(FrameHeader) uint8_t b[kFrameHeaderBytes];
  std::memset(a, 0xAA, sizeof(a));
  std::memset(b, 0x55, sizeof(b));
  FrameHeader ha = MakeHeader(FrameType::kHelloOk, 1, 2);
  FrameHeader hb = MakeHeader(FrameType::kHelloOk, 1, 2);
  std::memcpy(a, &ha, sizeof(a));
  std::memcpy(b, &hb, sizeof(b));
  EXPECT_EQ(std::memcmp(a, b, sizeof(a)), 0);
}

TEST(WireLayout, AckEchoesTheSegment) {
  const FrameHeader d = ValidData();
  const FrameHeader a = MakeAckHeader(d, 4, false);
  EXPECT_EQ(CheckHeader(a, 1 << 20), WireError::kNone);
  EXPECT_EQ(TypeOf(a), FrameType::kAck);
  EXPECT_EQ(a.key, d.key);
  EXPECT_EQ(a.iteration, d.iteration);
  EXPECT_EQ(a.offset, d.offset);
  EXPECT_EQ(a.length, d.length);
  EXPECT_EQ(a.seq, d.seq);
  EXPECT_EQ(a.payload_bytes, 0u);
  EXPECT_EQ(a.sender_rank, 4);
  EXPECT_EQ(a.flags, 0);
  EXPECT_EQ(MakeAckHeader(d, 4, true).flags, kFlagAckRejected);
}

TEST(WireCheck, WellFormedFramesPass) {
  EXPECT_EQ(CheckHeader(ValidData(), 1 << 20), WireError::kNone);
  EXPECT_EQ(CheckHeader(ValidData(0), 1 << 20), WireError::kNone);
  EXPECT_EQ(CheckHeader(ValidData(1 << 20), 1 << 20), WireError::kNone);  // at the limit
  FrameHeader hello = MakeHeader(FrameType::kHello, 1, 0);
  hello.payload_bytes = kHelloBodyBytes;
  EXPECT_EQ(CheckHeader(hello, 1), WireError::kNone);
  FrameHeader reject = MakeHeader(FrameType::kReject, 1, 0);
  reject.payload_bytes = kErrorBodyBytes + 10;
  EXPECT_EQ(CheckHeader(reject, 1), WireError::kNone);
  EXPECT_TRUE(ValidateHeader(ValidData(), 1 << 20).ok());
}

TEST(WireCheck, DataFramesCarryTheSchedulingDecision) {
  SendSpec spec;
  spec.length = 64;
  spec.schedule = 0x93;
  const FrameHeader h = MakeDataHeader(7, 2, spec);
  EXPECT_EQ(h.flags, 0x9300);
  EXPECT_EQ(h.flags >> kFlagScheduleShift, 0x93);
  EXPECT_EQ(CheckHeader(h, 1 << 20), WireError::kNone);
  // The ack does not echo it.
  EXPECT_EQ(MakeAckHeader(h, 4, false).flags, 0);
}

TEST(WireCheck, DataFramesCarryTheGpuDirectFlagsBesideTheDecision) {
  SendSpec spec;
  spec.length = 64;
  spec.schedule = 0x93;
  spec.gpudirect_flags =
      kFlagDeviceResult | kFlagRendezvous | kFlagAckRejected;  // the last: not ours
  const FrameHeader h = MakeDataHeader(7, 2, spec);
  EXPECT_EQ(h.flags, 0x9300 | kFlagDeviceResult | kFlagRendezvous);
  EXPECT_EQ(CheckHeader(h, 1 << 20), WireError::kNone);
  EXPECT_EQ(MakeAckHeader(h, 4, false).flags, 0);
}

struct MalformedCase {
  const char* name;
  void (*mutate)(FrameHeader&);
  WireError want;
};

TEST(WireCheck, EachMalformedClassHasItsOwnCode) {
  const MalformedCase cases[] = {
      {"bad magic", [](FrameHeader& h) { h.magic = 0x12345678; }, WireError::kBadMagic},
      {"the previous version", [](FrameHeader& h) { h.version = kProtocolVersion - 1; },
       WireError::kBadVersion},
      {"the next version", [](FrameHeader& h) { h.version = kProtocolVersion + 1; },
       WireError::kBadVersion},
      {"version 0", [](FrameHeader& h) { h.version = 0; }, WireError::kBadVersion},
      {"type 0", [](FrameHeader& h) { h.type = 0; }, WireError::kBadType},
      {"type 7", [](FrameHeader& h) { h.type = 7; }, WireError::kBadType},
      {"unknown flag", [](FrameHeader& h) { h.flags = 0x0080; }, WireError::kUnknownFlags},
      {"schedule byte on an ack",
       [](FrameHeader& h) {
         h = MakeAckHeader(h, 1, false);
         h.flags = 0x9300;
       },
       WireError::kUnknownFlags},
      {"ack flag on data", [](FrameHeader& h) { h.flags = kFlagAckRejected; },
       WireError::kUnknownFlags},
      {"GPUDirect flag on an ack",
       [](FrameHeader& h) {
         h = MakeAckHeader(h, 1, false);
         h.flags = kFlagRendezvous;
       },
       WireError::kUnknownFlags},
      {"GPUDirect flag on a goodbye",
       [](FrameHeader& h) {
         h.type = 6;
         h.payload_bytes = 0;
         h.flags = kFlagDeviceResult;
       },
       WireError::kUnknownFlags},
      {"too long", [](FrameHeader& h) { h.length = h.payload_bytes = (1 << 20) + 1; },
       WireError::kTooLong},
      {"payload != length", [](FrameHeader& h) { h.payload_bytes = 99; }, WireError::kBadLength},
      {"dtype 3", [](FrameHeader& h) { h.dtype = 3; }, WireError::kBadField},
      {"direction 2", [](FrameHeader& h) { h.direction = 2; }, WireError::kBadField},
      {"offset wraps", [](FrameHeader& h) { h.offset = ~0ull - 10; }, WireError::kBadField},
      {"hello body size",
       [](FrameHeader& h) {
         h.type = 1;
         h.payload_bytes = kHelloBodyBytes + 1;
       },
       WireError::kBadLength},
      {"hello-ok with payload",
       [](FrameHeader& h) {
         h.type = 2;
         h.payload_bytes = 1;
       },
       WireError::kBadLength},
      {"ack with payload",
       [](FrameHeader& h) {
         h.type = 5;
         h.payload_bytes = 8;
       },
       WireError::kBadLength},
      {"reject too short",
       [](FrameHeader& h) {
         h.type = 3;
         h.payload_bytes = 4;
       },
       WireError::kBadLength},
      {"goodbye too long",
       [](FrameHeader& h) {
         h.type = 6;
         h.payload_bytes = kMaxControlPayloadBytes + 1;
       },
       WireError::kBadLength},
  };
  for (const MalformedCase& c : cases) {
    FrameHeader h = ValidData();
    c.mutate(h);
    EXPECT_EQ(CheckHeader(h, 1 << 20), c.want) << c.name;
    EXPECT_FALSE(ValidateHeader(h, 1 << 20).ok()) << c.name;
  }
}

TEST(WireCheck, StatusNamesTheProblem) {
  FrameHeader h = ValidData();
  h.version = 9;
  absl::Status s = ValidateHeader(h, 1 << 20);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("version 9"), absl::string_view::npos) << s;
  h = ValidData();
  h.magic = 0;
  s = ValidateHeader(h, 1 << 20);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("magic"), absl::string_view::npos) << s;
}

TEST(WireCheck, HelloBody) {
  HelloBody b;
  std::memset(&b, 0, sizeof(b));
  b.token_bytes = kMaxTokenBytes;
  EXPECT_EQ(CheckHelloBody(b), WireError::kNone);
  b.token_bytes = kMaxTokenBytes + 1;
  EXPECT_EQ(CheckHelloBody(b), WireError::kBadLength);
  b.token_bytes = 3;
  b.reserved1 = 1;
  EXPECT_EQ(CheckHelloBody(b), WireError::kBadField);
}

TEST(WireAuth, TokensCompareByContentAndLength) {
  auto span = [](const std::string& s) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  const std::string a = "s3cret-token", b = "s3cret-token", c = "s3cret-tokeN", d = "s3cret-toke";
  EXPECT_TRUE(TokensEqual(span(a), span(b)));
  EXPECT_FALSE(TokensEqual(span(a), span(c)));  // last byte differs
  EXPECT_FALSE(TokensEqual(span(a), span(d)));  // prefix
  EXPECT_FALSE(TokensEqual(span(d), span(a)));
  const std::string z1("ab\0", 3), z2("ab", 2);
  EXPECT_FALSE(TokensEqual(span(z1), span(z2)));  // zero padding must not make lengths equal
  EXPECT_TRUE(TokensEqual(span(std::string()), span(std::string())));
  const std::string big(kMaxTokenBytes + 1, 'x');
  EXPECT_FALSE(TokensEqual(span(big), span(big)));  // over the limit never authenticates
}

TEST(WireNames, EveryErrorHasAName) {
  for (uint32_t i = 0; i < kWireErrorCount; ++i) {
    EXPECT_NE(WireErrorName(static_cast<WireError>(i)), "unknown") << i;
  }
}

}  // namespace
}  // namespace gradlane::transport
