#include "transport/wire.h"

#include <cstring>

#include "absl/strings/str_format.h"

namespace gradlane::transport {

std::string_view WireErrorName(WireError e) {
  switch (e) {
    case WireError::kNone:
      return "none";
    case WireError::kBadMagic:
      return "bad_magic";
    case WireError::kBadVersion:
      return "bad_version";
    case WireError::kBadType:
      return "bad_type";
    case WireError::kUnknownFlags:
      return "unknown_flags";
    case WireError::kTooLong:
      return "too_long";
    case WireError::kBadLength:
      return "bad_length";
    case WireError::kBadField:
      return "bad_field";
    case WireError::kAuthFailed:
      return "auth_failed";
    case WireError::kUnknownJob:
      return "unknown_job";
    case WireError::kBadRank:
      return "bad_rank";
    case WireError::kUnexpectedFrame:
      return "unexpected_frame";
    case WireError::kShutdown:
      return "shutdown";
    case WireError::kTimeout:
      return "timeout";
    case WireError::kNoTarget:
      return "no_target";
  }
  return "unknown";
}

absl::Status WireErrorStatus(WireError code, const std::string& message) {
  switch (code) {
    case WireError::kAuthFailed:
      return absl::PermissionDeniedError(message);
    case WireError::kUnknownJob:
      return absl::NotFoundError(message);
    case WireError::kBadVersion:
      return absl::FailedPreconditionError(message);
    case WireError::kTimeout:
      return absl::DeadlineExceededError(message);
    case WireError::kShutdown:
    case WireError::kNone:
      return absl::UnavailableError(message);
    case WireError::kNoTarget:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InvalidArgumentError(message);
  }
}

WireError CheckHeader(const FrameHeader& h, uint64_t max_data_bytes) {
  if (h.magic != kFrameMagic) return WireError::kBadMagic;
  if (h.version != kProtocolVersion) return WireError::kBadVersion;
  if (h.type < kMinFrameType || h.type > kMaxFrameType) return WireError::kBadType;
  if ((h.flags & ~kKnownFlags) != 0) return WireError::kUnknownFlags;
  const FrameType type = TypeOf(h);
  if ((h.flags & kFlagAckRejected) != 0 && type != FrameType::kAck) return WireError::kUnknownFlags;
  if ((h.flags & (kFlagScheduleMask | kFlagsGpuDirect)) != 0 && type != FrameType::kData) {
    return WireError::kUnknownFlags;
  }
  switch (type) {
    case FrameType::kHello:
      if (h.payload_bytes != kHelloBodyBytes) return WireError::kBadLength;
      break;
    case FrameType::kHelloOk:
    case FrameType::kAck:
      if (h.payload_bytes != 0) return WireError::kBadLength;
      break;
    case FrameType::kReject:
    case FrameType::kGoodbye:
      if (h.payload_bytes < kErrorBodyBytes || h.payload_bytes > kMaxControlPayloadBytes) {
        return WireError::kBadLength;
      }
      break;
    case FrameType::kData:
      if (h.length > max_data_bytes) return WireError::kTooLong;
      if (h.payload_bytes != h.length) return WireError::kBadLength;
      break;
  }
  if (type == FrameType::kData || type == FrameType::kAck) {
    if (h.dtype > static_cast<uint8_t>(sched::DType::kBF16)) return WireError::kBadField;
    if (h.direction > static_cast<uint8_t>(sched::Direction::kPull)) return WireError::kBadField;
    if (h.offset + h.length < h.offset) return WireError::kBadField;  // wraps
  }
  return WireError::kNone;
}

absl::Status ValidateHeader(const FrameHeader& h, uint64_t max_data_bytes) {
  const WireError e = CheckHeader(h, max_data_bytes);
  switch (e) {
    case WireError::kNone:
      return absl::OkStatus();
    case WireError::kBadMagic:
      return absl::InvalidArgumentError(absl::StrFormat(
          "not a gradlane frame: magic 0x%08x (expected 0x%08x)", h.magic, kFrameMagic));
    case WireError::kBadVersion:
      return absl::FailedPreconditionError(absl::StrFormat(
          "peer speaks protocol version %d, this build speaks %d", h.version, kProtocolVersion));
    case WireError::kBadType:
      return absl::InvalidArgumentError(absl::StrFormat("unknown frame type %d", h.type));
    case WireError::kUnknownFlags:
      return absl::InvalidArgumentError(
          absl::StrFormat("flags 0x%04x not valid for frame type %d", h.flags, h.type));
    case WireError::kTooLong:
      return absl::InvalidArgumentError(absl::StrFormat(
          "segment of %d bytes exceeds the limit of %d bytes", h.length, max_data_bytes));
    case WireError::kBadLength:
      return absl::InvalidArgumentError(
          absl::StrFormat("payload of %d bytes inconsistent with frame type %d (length %d)",
                          h.payload_bytes, h.type, h.length));
    case WireError::kBadField:
      return absl::InvalidArgumentError(
          absl::StrFormat("field out of range: dtype %d, direction %d, offset %d + length %d",
                          h.dtype, h.direction, h.offset, h.length));
    default:
      return absl::InternalError(
          absl::StrFormat("unexpected check result %s", std::string(WireErrorName(e))));
  }
}

WireError CheckHelloBody(const HelloBody& b) {
  if (b.token_bytes > kMaxTokenBytes) return WireError::kBadLength;
  if (b.reserved0 != 0 || b.reserved1 != 0) return WireError::kBadField;
  return WireError::kNone;
}

bool TokensEqual(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  // Lengths over the limit can never match a registered token; still walk the full width.
  uint32_t diff =
      (a.size() != b.size()) | (a.size() > kMaxTokenBytes) | (b.size() > kMaxTokenBytes);
  for (size_t i = 0; i < kMaxTokenBytes; ++i) {
    const uint8_t x = i < a.size() ? a[i] : 0;
    const uint8_t y = i < b.size() ? b[i] : 0;
    diff |= static_cast<uint32_t>(x ^ y);
  }
  return diff == 0;
}

FrameHeader MakeHeader(FrameType type, uint64_t job_id, uint16_t sender_rank) {
  FrameHeader h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kFrameMagic;
  h.version = kProtocolVersion;
  h.type = static_cast<uint8_t>(type);
  h.job_id = job_id;
  h.sender_rank = sender_rank;
  return h;
}

FrameHeader MakeAckHeader(const FrameHeader& data, uint16_t sender_rank, bool rejected) {
  FrameHeader h = MakeHeader(FrameType::kAck, data.job_id, sender_rank);
  h.flags = rejected ? kFlagAckRejected : 0;
  h.key = data.key;
  h.iteration = data.iteration;
  h.offset = data.offset;
  h.length = data.length;
  h.priority = data.priority;
  h.dtype = data.dtype;
  h.direction = data.direction;
  h.seq = data.seq;
  return h;
}

}  // namespace gradlane::transport
