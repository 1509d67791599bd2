// transport/common/hello.h — the handshake every backend speaks: the dialer's hello, the
// acceptor's check of it against the jobs it serves, the dialer's check of the hello-ok, and the
// reject/goodbye frames with the statuses they become on the other side.
//
// Why one copy: the engine treats "wrong token", "unknown job" and "bad rank" the same whichever
// backend carried the refusal (docs/protocol.md), so the checks, their order, the WireError
// codes and the absl statuses are written once here. Checks run in a fixed order — body well
// formed, job known, token (constant time), rank — so a dialer without the token learns nothing
// about ranks or world sizes.
//
// Guarantees: frames are built with every byte set (no stack bytes leak onto the wire); nothing
// here trusts a received field. Pure functions over value types: any thread. The builders do
// not allocate; a refusal's status does (handshakes are the control path).
#ifndef GRADLANE_TRANSPORT_COMMON_HELLO_H_
#define GRADLANE_TRANSPORT_COMMON_HELLO_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "transport/common/job_table.h"
#include "transport/transport.h"
#include "transport/wire.h"

namespace gradlane::transport {

// kHello as the dialer of `job` sends it: header (payload_bytes set) and body.
struct HelloFrame {
  FrameHeader header;
  HelloBody body;
};
HelloFrame MakeHello(const JobCredentials& job);

// The outcome of a handshake check: accepted (code kNone), or the WireError to refuse with —
// counted in TransportStats::errors and sent in the reject/goodbye — and the local status whose
// message is the reason given.
struct HandshakeCheck {
  WireError code = WireError::kNone;
  absl::Status status;
  int job_index = -1;  // CheckHello accepted: the JobTable index of the job
  bool ok() const { return code == WireError::kNone; }
};

// The acceptor's check of a received hello: body well formed (CheckHelloBody's code), job known
// here (kUnknownJob, NotFound), token equal (kAuthFailed, PermissionDenied), world size equal and
// rank in the world, not ours and the one the header names (kBadRank, InvalidArgument).
HandshakeCheck CheckHello(const JobTable& jobs, const FrameHeader& header, const HelloBody& body);

// The dialer's check of a hello-ok for `job`: the acceptor accepted our job (kUnknownJob) and
// its rank fits (kBadRank), both InvalidArgument.
HandshakeCheck CheckHelloOk(const JobCredentials& job, const FrameHeader& header);

// A kReject or kGoodbye: header, ErrorBody and as much of the reason as fits
// (kMaxReasonBytes). header.payload_bytes bytes of `payload` follow the header on the wire.
struct ErrorFrame {
  FrameHeader header;
  struct Payload {
    ErrorBody body;
    char reason[kMaxReasonBytes];
  } payload;
};
static_assert(sizeof(ErrorFrame::Payload) == kErrorBodyBytes + kMaxReasonBytes);
ErrorFrame MakeErrorFrame(FrameType type, uint64_t job_id, uint16_t sender_rank, WireError code,
                          std::string_view reason);

// A received reject/goodbye payload (ErrorBody, then the reason): a code this build does not
// know reads as kNone; `reason` points into the payload and is cut to what was received.
struct PeerError {
  WireError code = WireError::kNone;
  std::string_view reason;
};
PeerError ParseErrorPayload(std::span<const uint8_t> payload);

// The status the peer's kReject (final: the dialer must not retry) or kGoodbye becomes here,
// naming the peer as `peer`: WireErrorStatus of its code (a goodbye without one is kShutdown).
absl::Status PeerClosedStatus(FrameType type, const PeerError& error, std::string_view peer);

}  // namespace gradlane::transport

#endif  // GRADLANE_TRANSPORT_COMMON_HELLO_H_
