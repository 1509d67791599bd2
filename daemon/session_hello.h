// daemon/session_hello.h — the check of a client's first message (gl_hello, shm/abi.h) and the
// session geometry it asks for, as a pure function the session server's acceptor calls and a
// fuzz target can drive (tests/fuzz/session_fuzz.cc) without sockets.
//
// Guarantees: reads only the `bytes` it is given, trusts no field; every refusal carries the
// gl_status the client gets and a reason for its message; the geometry it grants is always a
// power-of-two ring of at least 8 slots within the limits, and an arena within the limit. Pure:
// any thread.
#ifndef GRADLANE_DAEMON_SESSION_HELLO_H_
#define GRADLANE_DAEMON_SESSION_HELLO_H_

#include <cstdint>
#include <span>
#include <string>

#include "shm/abi.h"

namespace gradlane::daemon {

struct HelloLimits {
  uint32_t default_ring_slots = 1024;
  uint32_t max_ring_slots = 1u << 16;  // rounded down to a power of two, at least 8
  uint64_t default_arena_bytes = uint64_t{64} << 20;
  uint64_t max_arena_bytes = uint64_t{1} << 30;
};

struct HelloCheck {
  gl_status status = GL_OK;  // GL_E_BAD_MAGIC, GL_E_BAD_VERSION or GL_E_PROTOCOL when refused
  uint64_t request_id = 0;   // echoed in the reply (0 when the message is too short to hold it)
  std::string why;           // the refusal's reason
  uint32_t ring_slots = 0;   // granted (status GL_OK)
  uint64_t arena_bytes = 0;  // granted (status GL_OK)
  // The ABI the session speaks (status GL_OK): the client's, from GL_ABI_VERSION_MIN up to ours.
  uint32_t abi_version = GL_ABI_VERSION;
};

HelloCheck CheckHello(std::span<const uint8_t> bytes, const HelloLimits& limits);

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_SESSION_HELLO_H_
