// transport/wire.h — the gradlane peer wire protocol: what two daemons say to each other.
//
// Every message on a peer connection is one frame: a fixed 64-byte FrameHeader followed by
// `payload_bytes` bytes. Frame types: the handshake (kHello → kHelloOk | kReject), segment
// data (kData), the receiver's acknowledgement of a segment (kAck), and an orderly close
// carrying a reason (kGoodbye). docs/protocol.md is the normative description; the
// static_asserts below pin the layout so a change that would break it fails to compile.
//
// Guarantees:
//   - Layouts are fixed-size, padding-free, trivially copyable; on the wire they are
//     little-endian. We send the in-memory bytes, so the build refuses big-endian hosts rather
//     than silently speak a different protocol there.
//   - magic, version and type sit at offsets 0, 4 and 5 in every protocol version, so any
//     version can recognise a peer and answer "wrong version" in a form it can read.
//   - CheckHeader() never trusts a field: every malformed class has its own WireError so the
//     caller can count it; nothing here aborts on bad input.
//   - Pure functions and value types: safe from any thread.
#ifndef GRADLANE_TRANSPORT_WIRE_H_
#define GRADLANE_TRANSPORT_WIRE_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/status/status.h"
#include "sched/types.h"

namespace gradlane::transport {

// "GLNF" as bytes on the wire (0x47 0x4C 0x4E 0x46).
inline constexpr uint32_t kFrameMagic = 0x464E4C47u;
// Bumped on any incompatible change; peers must match exactly (no negotiation in v1).
// 3: gradlane's candidates 5 and 6 (the rules with another window); a version-2 follower
// would ignore rank 0's choice of them and run another schedule than the rest of the job.
// 4: the GPUDirect flags of kData frames (kFlagDeviceResult, kFlagRendezvous).
// 5: gradlane's candidate 7 (the rules with blocks of twice δ), as 3 did for 5 and 6.
inline constexpr uint8_t kProtocolVersion = 5;

enum class FrameType : uint8_t {
  kHello = 1,    // dialer → acceptor: job, rank, auth token (HelloBody)
  kHelloOk = 2,  // acceptor → dialer: accepted; header carries the acceptor's rank
  kReject = 3,   // acceptor → dialer: refused (ErrorBody), then the acceptor closes
  kData = 4,     // one segment: header describes it, payload is its bytes
  kAck = 5,      // receiver → sender: segment placed in its destination (no payload)
  kGoodbye = 6,  // either side: closing, with a reason (ErrorBody)
};
inline constexpr uint8_t kMinFrameType = 1;
inline constexpr uint8_t kMaxFrameType = 6;

// Flags. Unknown bits are a protocol error (not ignored), so a future flag that changes
// meaning can never be misread by an old peer; a new flag needs a version bump.
// kFlagAckRejected (kAck only): the receiver had no destination for the segment and discarded
// it; the sender must fail that send rather than count it delivered.
inline constexpr uint16_t kFlagAckRejected = 1u << 0;
// The high byte of a kData frame's flags (version 2): the sending daemon's scheduling decision
// (sched::Policy::Decision; gradlane's choice of schedule, agreed across the job's ranks:
// sched/policies/gradlane_selector.h). 0 on every other type.
inline constexpr int kFlagScheduleShift = 8;
inline constexpr uint16_t kFlagScheduleMask = 0xff00;
// GPUDirect (kData only, version 4), set only where a client has attached GPU memory.
// kFlagDeviceResult (a push): the sender's result for these bytes lands in GPU memory, which
// the CPU cannot write: the pull response must come by rendezvous.
inline constexpr uint16_t kFlagDeviceResult = 1u << 1;
// kFlagRendezvous: sent by rendezvous whatever its size (its target is GPU memory). Only the
// verbs backend acts on it; a receiver that finds such a small segment accepts it.
inline constexpr uint16_t kFlagRendezvous = 1u << 2;
inline constexpr uint16_t kFlagsGpuDirect = kFlagDeviceResult | kFlagRendezvous;
inline constexpr uint16_t kKnownFlags = kFlagAckRejected | kFlagScheduleMask | kFlagsGpuDirect;

// The frame header. Field meaning per type is in docs/protocol.md; for kData/kAck the segment
// fields mirror sched::Segment.
struct FrameHeader {
  uint32_t magic;          // 0  kFrameMagic
  uint8_t version;         // 4  kProtocolVersion
  uint8_t type;            // 5  FrameType
  uint16_t flags;          // 6  kFlag*
  uint64_t job_id;         // 8  job the connection belongs to
  uint64_t key;            // 16 sched::SegmentKey
  int64_t iteration;       // 24 training iteration
  uint64_t offset;         // 32 byte offset of the segment within its tensor
  uint64_t length;         // 40 segment bytes (kData: == payload_bytes; kAck: bytes acknowledged)
  uint32_t payload_bytes;  // 48 bytes following this header on the wire
  int32_t priority;        // 52 sched::Priority (0 = most urgent)
  uint16_t sender_rank;    // 56 rank of the sending daemon in the job
  uint8_t dtype;           // 58 sched::DType
  uint8_t direction;       // 59 sched::Direction
  uint32_t seq;            // 60 per-connection data-frame sequence (low 32 bits); kAck echoes it
};
inline constexpr size_t kFrameHeaderBytes = 64;
static_assert(sizeof(FrameHeader) == kFrameHeaderBytes, "frame header must stay 64 bytes");
static_assert(std::is_trivially_copyable_v<FrameHeader> && std::is_standard_layout_v<FrameHeader>);
static_assert(offsetof(FrameHeader, magic) == 0);
static_assert(offsetof(FrameHeader, version) == 4);
static_assert(offsetof(FrameHeader, type) == 5);
static_assert(offsetof(FrameHeader, flags) == 6);
static_assert(offsetof(FrameHeader, job_id) == 8);
static_assert(offsetof(FrameHeader, key) == 16);
static_assert(offsetof(FrameHeader, iteration) == 24);
static_assert(offsetof(FrameHeader, offset) == 32);
static_assert(offsetof(FrameHeader, length) == 40);
static_assert(offsetof(FrameHeader, payload_bytes) == 48);
static_assert(offsetof(FrameHeader, priority) == 52);
static_assert(offsetof(FrameHeader, sender_rank) == 56);
static_assert(offsetof(FrameHeader, dtype) == 58);
static_assert(offsetof(FrameHeader, direction) == 59);
static_assert(offsetof(FrameHeader, seq) == 60);
static_assert(std::endian::native == std::endian::little,
              "the wire is little-endian and frames are sent as their in-memory bytes");
static_assert(std::is_same_v<sched::SegmentKey, uint64_t> && std::is_same_v<sched::TimeNs, int64_t>,
              "wire fields mirror sched/types.h");
static_assert(sizeof(sched::Priority) == 4 && sizeof(sched::DType) == 1 &&
              sizeof(sched::Direction) == 1);

// Auth tokens are opaque bytes up to this length (the job's shared secret).
inline constexpr size_t kMaxTokenBytes = 64;

// Payload of kHello.
struct HelloBody {
  uint16_t rank;                  // 0  dialer's rank in the job
  uint16_t world_size;            // 2  W as the dialer knows it (must match the acceptor's)
  uint16_t token_bytes;           // 4  valid bytes of `token`
  uint16_t reserved0;             // 6  zero
  uint8_t token[kMaxTokenBytes];  // 8  auth token, zero padded
  uint64_t reserved1;             // 72 zero
};
inline constexpr size_t kHelloBodyBytes = 80;
static_assert(sizeof(HelloBody) == kHelloBodyBytes);
static_assert(std::is_trivially_copyable_v<HelloBody> && std::is_standard_layout_v<HelloBody>);
static_assert(offsetof(HelloBody, rank) == 0 && offsetof(HelloBody, world_size) == 2 &&
              offsetof(HelloBody, token_bytes) == 4 && offsetof(HelloBody, token) == 8 &&
              offsetof(HelloBody, reserved1) == 72);

// Why a frame or a connection was refused. Values are on the wire (ErrorBody::code) and index
// the transport's error counters, so they are append-only.
enum class WireError : uint32_t {
  kNone = 0,              // not an error (kGoodbye on clean shutdown)
  kBadMagic = 1,          // not a gradlane frame
  kBadVersion = 2,        // protocol version differs
  kBadType = 3,           // unknown frame type
  kUnknownFlags = 4,      // flag bits unknown or not valid for the type
  kTooLong = 5,           // payload over the receiver's limit
  kBadLength = 6,         // payload_bytes inconsistent with the type or the segment length
  kBadField = 7,          // dtype / direction out of range, offset+length overflow
  kAuthFailed = 8,        // token mismatch
  kUnknownJob = 9,        // job not registered here (or a frame for another job)
  kBadRank = 10,          // rank out of range, equal to ours, or world size differs
  kUnexpectedFrame = 11,  // valid frame in the wrong state (data before hello, stray ack, ...)
  kShutdown = 12,         // the sender is shutting down / disconnecting this peer
  kTimeout = 13,          // handshake or progress timeout
  kNoTarget = 14,         // receiver had no destination for a segment (used in stats)
};
inline constexpr size_t kWireErrorCount = 15;

std::string_view WireErrorName(WireError e);

// The status a peer's refusal or goodbye with `code` becomes locally, so every backend reports
// the same code for the same cause: kAuthFailed → PermissionDenied, kUnknownJob → NotFound,
// kBadVersion → FailedPrecondition, kTimeout → DeadlineExceeded, kShutdown/kNone → Unavailable,
// malformed classes → InvalidArgument.
absl::Status WireErrorStatus(WireError code, const std::string& message);

// Payload of kReject / kGoodbye: a code and a human-readable reason (not NUL terminated).
struct ErrorBody {
  uint32_t code;          // 0 WireError
  uint32_t reason_bytes;  // 4 bytes of reason text that follow
};
inline constexpr size_t kErrorBodyBytes = 8;
inline constexpr size_t kMaxReasonBytes = 240;
static_assert(sizeof(ErrorBody) == kErrorBodyBytes && offsetof(ErrorBody, reason_bytes) == 4);
static_assert(std::is_trivially_copyable_v<ErrorBody>);

// Largest payload of any non-data frame; receivers read such bodies into a buffer this big.
inline constexpr size_t kMaxControlPayloadBytes = kErrorBodyBytes + kMaxReasonBytes;
static_assert(kHelloBodyBytes <= kMaxControlPayloadBytes);

// Classifies a received header. kNone: well formed. `max_data_bytes` is the receiver's limit on
// one segment (flag-configurable; never above 4 GiB - 1 since payload_bytes is 32-bit).
WireError CheckHeader(const FrameHeader& h, uint64_t max_data_bytes);

// CheckHeader as a status for callers that report rather than count: InvalidArgument for
// malformed frames, FailedPrecondition for a version mismatch; the message names the field.
absl::Status ValidateHeader(const FrameHeader& h, uint64_t max_data_bytes);

// Checks the fields of a HelloBody that do not depend on the job (reserved zero, token length).
WireError CheckHelloBody(const HelloBody& b);

// Constant-time equality of two tokens: time depends only on kMaxTokenBytes, never on where
// they differ or on their lengths, so a dialer cannot learn the token byte by byte.
bool TokensEqual(std::span<const uint8_t> a, std::span<const uint8_t> b);

// Builders. They fill every field (zeros where unused), so a frame never leaks stack bytes.
FrameHeader MakeHeader(FrameType type, uint64_t job_id, uint16_t sender_rank);
FrameHeader MakeAckHeader(const FrameHeader& data, uint16_t sender_rank, bool rejected);

inline FrameType TypeOf(const FrameHeader& h) { return static_cast<FrameType>(h.type); }

}  // namespace gradlane::transport

#endif  // GRADLANE_TRANSPORT_WIRE_H_
