#include "transport/common/hello.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace gradlane::transport {

HelloFrame MakeHello(const JobCredentials& job) {
  HelloFrame f;
  f.header = MakeHeader(FrameType::kHello, job.job_id, job.local_rank);
  f.header.payload_bytes = kHelloBodyBytes;
  std::memset(&f.body, 0, sizeof(f.body));
  f.body.rank = job.local_rank;
  f.body.world_size = job.world_size;
  // JobTable::Add refused longer tokens; clamp anyway so a bad caller cannot overrun the body.
  const size_t n = std::min(job.token.size(), kMaxTokenBytes);
  f.body.token_bytes = static_cast<uint16_t>(n);
  std::memcpy(f.body.token, job.token.data(), n);
  return f;
}

HandshakeCheck CheckHello(const JobTable& jobs, const FrameHeader& h, const HelloBody& b) {
  if (const WireError e = CheckHelloBody(b); e != WireError::kNone) {
    return {e, absl::InvalidArgumentError("malformed hello body")};
  }
  const int j = jobs.Find(h.job_id);
  if (j < 0) {
    return {WireError::kUnknownJob, absl::NotFoundError(absl::StrCat(
                                        "job ", h.job_id, " is not registered on this daemon"))};
  }
  const JobCredentials& job = jobs[j].creds;
  const std::span<const uint8_t> given(b.token, b.token_bytes);
  const std::span<const uint8_t> want(reinterpret_cast<const uint8_t*>(job.token.data()),
                                      job.token.size());
  if (!TokensEqual(given, want)) {
    return {WireError::kAuthFailed,
            absl::PermissionDeniedError(absl::StrCat("auth token mismatch for job ", h.job_id))};
  }
  if (b.world_size != job.world_size || b.rank >= job.world_size || b.rank == job.local_rank ||
      h.sender_rank != b.rank) {
    return {WireError::kBadRank,
            absl::InvalidArgumentError(absl::StrCat(
                "rank ", b.rank, " of world ", b.world_size, " does not fit job ", h.job_id,
                " (world ", job.world_size, ", we are rank ", job.local_rank, ")"))};
  }
  return {WireError::kNone, absl::OkStatus(), j};
}

HandshakeCheck CheckHelloOk(const JobCredentials& job, const FrameHeader& h) {
  if (h.job_id != job.job_id) {
    return {WireError::kUnknownJob, absl::InvalidArgumentError("peer accepted a different job")};
  }
  if (h.sender_rank >= job.world_size || h.sender_rank == job.local_rank) {
    return {WireError::kBadRank,
            absl::InvalidArgumentError(absl::StrCat("peer claims rank ", h.sender_rank))};
  }
  return {};
}

ErrorFrame MakeErrorFrame(FrameType type, uint64_t job_id, uint16_t sender_rank, WireError code,
                          std::string_view reason) {
  ErrorFrame f;
  f.header = MakeHeader(type, job_id, sender_rank);
  std::memset(&f.payload, 0, sizeof(f.payload));
  f.payload.body.code = static_cast<uint32_t>(code);
  f.payload.body.reason_bytes = static_cast<uint32_t>(std::min(reason.size(), kMaxReasonBytes));
  std::memcpy(f.payload.reason, reason.data(), f.payload.body.reason_bytes);
  f.header.payload_bytes = static_cast<uint32_t>(kErrorBodyBytes + f.payload.body.reason_bytes);
  return f;
}

PeerError ParseErrorPayload(std::span<const uint8_t> payload) {
  if (payload.size() < kErrorBodyBytes) return {};
  ErrorBody eb;
  std::memcpy(&eb, payload.data(), sizeof(eb));
  const size_t n =
      std::min<size_t>({eb.reason_bytes, payload.size() - kErrorBodyBytes, kMaxReasonBytes});
  PeerError e;
  e.code = eb.code < kWireErrorCount ? static_cast<WireError>(eb.code) : WireError::kNone;
  e.reason = std::string_view(reinterpret_cast<const char*>(payload.data()) + kErrorBodyBytes, n);
  return e;
}

absl::Status PeerClosedStatus(FrameType type, const PeerError& e, std::string_view peer) {
  // std::string: this absl's StrCat takes absl::string_view, which is not std's here.
  const std::string who(peer), name(WireErrorName(e.code)), reason(e.reason);
  if (type == FrameType::kReject) {
    return WireErrorStatus(e.code, absl::StrCat("peer ", who, " rejected the connection (", name,
                                                "): ", reason));
  }
  return WireErrorStatus(e.code == WireError::kNone ? WireError::kShutdown : e.code,
                         absl::StrCat("peer ", who, " closed the connection (", name,
                                      "): ", reason));
}

}  // namespace gradlane::transport
