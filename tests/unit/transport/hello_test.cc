// transport/common/hello.h: the handshake every backend speaks — the hello as built, each
// refusal with its WireError and status, and the status a reject or goodbye becomes.
#include "transport/common/hello.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gradlane::transport {
namespace {

constexpr uint64_t kJob = 42;

JobCredentials Creds(uint16_t rank, std::string token = "secret", uint16_t world = 4) {
  return JobCredentials{kJob, rank, world, std::move(token)};
}

TEST(Hello, MakeHelloCarriesJobRankWorldAndTokenZeroPadded) {
  const HelloFrame f = MakeHello(Creds(2, "abc"));
  EXPECT_EQ(CheckHeader(f.header, 1 << 20), WireError::kNone);
  EXPECT_EQ(TypeOf(f.header), FrameType::kHello);
  EXPECT_EQ(f.header.job_id, kJob);
  EXPECT_EQ(f.header.sender_rank, 2);
  EXPECT_EQ(f.header.payload_bytes, kHelloBodyBytes);
  EXPECT_EQ(f.body.rank, 2);
  EXPECT_EQ(f.body.world_size, 4);
  EXPECT_EQ(f.body.token_bytes, 3);
  EXPECT_EQ(std::memcmp(f.body.token, "abc", 3), 0);
  for (size_t i = 3; i < kMaxTokenBytes; ++i) ASSERT_EQ(f.body.token[i], 0) << i;
  EXPECT_EQ(f.body.reserved0, 0);
  EXPECT_EQ(f.body.reserved1, 0u);
  EXPECT_EQ(CheckHelloBody(f.body), WireError::kNone);
}

class CheckHelloTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(jobs_.Add(JobCredentials{7, 0, 2, "other"}).ok());
    ASSERT_TRUE(jobs_.Add(Creds(1)).ok());  // we are rank 1 of job kJob
  }
  HandshakeCheck Check(const HelloFrame& f) const { return CheckHello(jobs_, f.header, f.body); }
  void ExpectRefused(const HelloFrame& f, WireError code, absl::StatusCode status) const {
    const HandshakeCheck c = Check(f);
    EXPECT_FALSE(c.ok());
    EXPECT_EQ(c.code, code) << WireErrorName(c.code) << ": " << c.status;
    EXPECT_EQ(c.status.code(), status) << c.status;
    EXPECT_FALSE(c.status.message().empty());
  }
  JobTable jobs_;
};

TEST_F(CheckHelloTest, AcceptsAPeerOfTheJob) {
  const HandshakeCheck c = Check(MakeHello(Creds(3)));
  ASSERT_TRUE(c.ok()) << c.status;
  EXPECT_EQ(c.job_index, jobs_.Find(kJob));
  EXPECT_TRUE(c.status.ok());
}

TEST_F(CheckHelloTest, MalformedBody) {
  HelloFrame f = MakeHello(Creds(3));
  f.body.reserved0 = 1;
  ExpectRefused(f, WireError::kBadField, absl::StatusCode::kInvalidArgument);
  f = MakeHello(Creds(3));
  f.body.token_bytes = kMaxTokenBytes + 1;
  ExpectRefused(f, WireError::kBadLength, absl::StatusCode::kInvalidArgument);
}

TEST_F(CheckHelloTest, UnknownOrRemovedJob) {
  HelloFrame f = MakeHello(Creds(3));
  f.header.job_id = 99;
  ExpectRefused(f, WireError::kUnknownJob, absl::StatusCode::kNotFound);
  jobs_.Deactivate(jobs_.Find(kJob));
  ExpectRefused(MakeHello(Creds(3)), WireError::kUnknownJob, absl::StatusCode::kNotFound);
}

TEST_F(CheckHelloTest, WrongTokenIsAuthFailedBeforeAnyRankCheck) {
  ExpectRefused(MakeHello(Creds(3, "secreT")), WireError::kAuthFailed,
                absl::StatusCode::kPermissionDenied);
  ExpectRefused(MakeHello(Creds(3, "secre")), WireError::kAuthFailed,
                absl::StatusCode::kPermissionDenied);
  ExpectRefused(MakeHello(Creds(3, "")), WireError::kAuthFailed,
                absl::StatusCode::kPermissionDenied);
  // A dialer without the token learns nothing about ranks or the world size.
  ExpectRefused(MakeHello(Creds(1, "nope", 9)), WireError::kAuthFailed,
                absl::StatusCode::kPermissionDenied);
}

TEST_F(CheckHelloTest, RankThatDoesNotFit) {
  SCOPED_TRACE("our own rank");
  ExpectRefused(MakeHello(Creds(1)), WireError::kBadRank, absl::StatusCode::kInvalidArgument);
  SCOPED_TRACE("world size differs");
  ExpectRefused(MakeHello(Creds(4, "secret", 5)), WireError::kBadRank,
                absl::StatusCode::kInvalidArgument);
  SCOPED_TRACE("rank outside the world");
  HelloFrame f = MakeHello(Creds(3));
  f.body.rank = 4;
  f.header.sender_rank = 4;
  ExpectRefused(f, WireError::kBadRank, absl::StatusCode::kInvalidArgument);
  SCOPED_TRACE("header and body disagree");
  f = MakeHello(Creds(3));
  f.header.sender_rank = 2;
  ExpectRefused(f, WireError::kBadRank, absl::StatusCode::kInvalidArgument);
}

TEST(JobTable, AddChecksCredentialsAndLookupsSayWhatIsMissing) {
  JobTable jobs;
  EXPECT_EQ(jobs.Add(JobCredentials{1, 0, 2, std::string(kMaxTokenBytes + 1, 't')}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(jobs.Add(JobCredentials{1, 2, 2, "t"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(jobs.Add(JobCredentials{1, 0, 0, "t"}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(jobs.Add(JobCredentials{1, 0, 2, "t"}).ok());
  EXPECT_EQ(jobs.Add(JobCredentials{1, 1, 2, "t"}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(*jobs.FindToDial(1), 0);
  EXPECT_EQ(jobs.FindToDial(2).status().code(), absl::StatusCode::kFailedPrecondition);
  int closed = -1;
  auto close = [&](int j, const absl::Status& why) {
    closed = j;
    EXPECT_EQ(why.code(), absl::StatusCode::kCancelled);
    EXPECT_EQ(jobs.Find(1), j) << "still served while its connections close";
  };
  EXPECT_EQ(jobs.Remove(2, close).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(closed, -1);
  ASSERT_TRUE(jobs.Remove(1, close).ok());
  EXPECT_EQ(closed, 0);
  EXPECT_EQ(jobs.Find(1), -1);
  EXPECT_EQ(jobs.FindToDial(1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(jobs.Remove(1, close).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(jobs.Add(JobCredentials{3, 0, 2, "t"}).ok());
  EXPECT_EQ(jobs.Find(3), 0) << "a removed job's entry is reused";
}

TEST(Hello, CheckHelloOkWantsOurJobAndAFittingRank) {
  const JobCredentials me = Creds(0);
  EXPECT_TRUE(CheckHelloOk(me, MakeHeader(FrameType::kHelloOk, kJob, 3)).ok());
  const HandshakeCheck other_job = CheckHelloOk(me, MakeHeader(FrameType::kHelloOk, kJob + 1, 3));
  EXPECT_EQ(other_job.code, WireError::kUnknownJob);
  EXPECT_EQ(other_job.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckHelloOk(me, MakeHeader(FrameType::kHelloOk, kJob, 0)).code, WireError::kBadRank);
  EXPECT_EQ(CheckHelloOk(me, MakeHeader(FrameType::kHelloOk, kJob, 4)).code, WireError::kBadRank);
}

std::span<const uint8_t> PayloadOf(const ErrorFrame& f) {
  return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&f.payload),
                                  f.header.payload_bytes);
}

TEST(Hello, ErrorFrameRoundTripsAndCutsLongReasons) {
  const ErrorFrame f =
      MakeErrorFrame(FrameType::kReject, kJob, 1, WireError::kAuthFailed, "bad token");
  EXPECT_EQ(CheckHeader(f.header, 1 << 20), WireError::kNone);
  EXPECT_EQ(f.header.payload_bytes, kErrorBodyBytes + 9);
  const PeerError e = ParseErrorPayload(PayloadOf(f));
  EXPECT_EQ(e.code, WireError::kAuthFailed);
  EXPECT_EQ(e.reason, "bad token");

  const std::string long_reason(1000, 'x');
  const ErrorFrame g =
      MakeErrorFrame(FrameType::kGoodbye, kJob, 1, WireError::kTimeout, long_reason);
  EXPECT_EQ(CheckHeader(g.header, 1 << 20), WireError::kNone);
  EXPECT_EQ(g.header.payload_bytes, kMaxControlPayloadBytes);
  EXPECT_EQ(ParseErrorPayload(PayloadOf(g)).reason.size(), kMaxReasonBytes);
}

TEST(Hello, ParseErrorPayloadTrustsNothing) {
  EXPECT_EQ(ParseErrorPayload({}).code, WireError::kNone);
  ErrorFrame f = MakeErrorFrame(FrameType::kReject, kJob, 1, WireError::kBadRank, "abcdef");
  f.payload.body.code = 9999;
  EXPECT_EQ(ParseErrorPayload(PayloadOf(f)).code, WireError::kNone)
      << "a code this build does not know";
  f.payload.body.reason_bytes = 1000;  // claims more than arrived
  EXPECT_EQ(ParseErrorPayload(PayloadOf(f)).reason, "abcdef");
  EXPECT_EQ(ParseErrorPayload(PayloadOf(f).first(kErrorBodyBytes + 2)).reason, "ab");
}

TEST(Hello, PeerClosedStatusMapsEachRejectCode) {
  const struct {
    WireError code;
    absl::StatusCode status;
  } cases[] = {
      {WireError::kAuthFailed, absl::StatusCode::kPermissionDenied},
      {WireError::kUnknownJob, absl::StatusCode::kNotFound},
      {WireError::kBadVersion, absl::StatusCode::kFailedPrecondition},
      {WireError::kBadRank, absl::StatusCode::kInvalidArgument},
      {WireError::kBadField, absl::StatusCode::kInvalidArgument},
      {WireError::kUnexpectedFrame, absl::StatusCode::kInvalidArgument},
      {WireError::kTimeout, absl::StatusCode::kDeadlineExceeded},
      {WireError::kShutdown, absl::StatusCode::kUnavailable},
  };
  for (const auto& c : cases) {
    const absl::Status s =
        PeerClosedStatus(FrameType::kReject, PeerError{c.code, "why"}, "10.0.0.1:9");
    EXPECT_EQ(s.code(), c.status) << WireErrorName(c.code);
    EXPECT_NE(s.message().find("peer 10.0.0.1:9 rejected the connection"), absl::string_view::npos)
        << s;
    EXPECT_NE(s.message().find(std::string(WireErrorName(c.code))), absl::string_view::npos) << s;
  }
  const absl::Status bye =
      PeerClosedStatus(FrameType::kGoodbye, PeerError{WireError::kNone, "done"}, "rank 3");
  EXPECT_EQ(bye.code(), absl::StatusCode::kUnavailable) << "a goodbye without a code is a shutdown";
  EXPECT_EQ(bye.message(), "peer rank 3 closed the connection (none): done");
}

}  // namespace
}  // namespace gradlane::transport
