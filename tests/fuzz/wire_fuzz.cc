// Fuzz target: the peer wire decoder (transport/wire.h). The input is what a peer (or anyone
// who reaches the peer port) sends: a stream of frames, decoded the way the receivers do it —
// a 64-byte FrameHeader checked by CheckHeader, then the body its type announces (HelloBody
// checked by CheckHelloBody, ErrorBody + reason clamped to the payload) or the data payload.
// The checks must classify every header without trusting a field, and whatever they accept
// must be safe to act on: a body that fits its buffer, a segment range that does not wrap.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "transport/wire.h"

namespace t = gradlane::transport;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // First byte: the receiver's segment limit, 2^k bytes (k <= 40), as the flag may set it.
  const uint64_t max_data = uint64_t{1} << (data[0] % 41);
  std::span<const uint8_t> in(data + 1, size - 1);
  while (in.size() >= t::kFrameHeaderBytes) {
    t::FrameHeader h;
    std::memcpy(&h, in.data(), sizeof(h));
    in = in.subspan(sizeof(h));
    const t::WireError e = t::CheckHeader(h, max_data);
    const absl::Status st = t::ValidateHeader(h, max_data);
    if ((e == t::WireError::kNone) != st.ok()) std::abort();  // the two views must agree
    (void)t::WireErrorName(e);
    (void)t::WireErrorStatus(e, "x");
    if (e != t::WireError::kNone) return 0;  // the receiver drops the connection here
    const t::FrameType type = t::TypeOf(h);
    switch (type) {
      case t::FrameType::kHello: {
        if (h.payload_bytes != t::kHelloBodyBytes) std::abort();
        if (in.size() < t::kHelloBodyBytes) return 0;
        t::HelloBody b;
        std::memcpy(&b, in.data(), sizeof(b));
        if (t::CheckHelloBody(b) == t::WireError::kNone) {
          if (b.token_bytes > t::kMaxTokenBytes) std::abort();
          const uint8_t want[3] = {1, 2, 3};
          (void)t::TokensEqual(std::span<const uint8_t>(b.token, b.token_bytes), want);
        }
        break;
      }
      case t::FrameType::kReject:
      case t::FrameType::kGoodbye: {
        // Receivers read such bodies into a kMaxControlPayloadBytes buffer.
        if (h.payload_bytes < t::kErrorBodyBytes || h.payload_bytes > t::kMaxControlPayloadBytes) {
          std::abort();
        }
        if (in.size() < h.payload_bytes) return 0;
        uint8_t body[t::kMaxControlPayloadBytes];
        std::memcpy(body, in.data(), h.payload_bytes);
        t::ErrorBody eb;
        std::memcpy(&eb, body, sizeof(eb));
        const size_t reason =
            std::min<size_t>(eb.reason_bytes, h.payload_bytes - t::kErrorBodyBytes);
        (void)t::WireErrorStatus(
            static_cast<t::WireError>(eb.code),
            std::string(reinterpret_cast<const char*>(body) + t::kErrorBodyBytes, reason));
        break;
      }
      case t::FrameType::kData:
        if (h.length > max_data || h.payload_bytes != h.length || h.offset + h.length < h.offset) {
          std::abort();
        }
        break;
      case t::FrameType::kAck: {
        if (h.payload_bytes != 0) std::abort();
        const t::FrameHeader ack = t::MakeAckHeader(h, 1, (h.flags & t::kFlagAckRejected) != 0);
        if (t::CheckHeader(ack, max_data) != t::WireError::kNone)
          std::abort();  // we echo only checked fields
        break;
      }
      case t::FrameType::kHelloOk:
        if (h.payload_bytes != 0) std::abort();
        break;
    }
    if (in.size() < h.payload_bytes) return 0;
    in = in.subspan(h.payload_bytes);
  }
  return 0;
}
