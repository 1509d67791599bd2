#include "daemon/session_hello.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradlane::daemon {
namespace {

uint32_t NextPowerOfTwo(uint32_t v) {
  uint32_t p = 1;
  while (p < v && p < (1u << 31)) p <<= 1;
  return p;
}

uint32_t FloorPowerOfTwo(uint32_t v) {
  uint32_t p = 1;
  while (p <= v / 2) p <<= 1;
  return p;
}

}  // namespace

HelloCheck CheckHello(std::span<const uint8_t> bytes, const HelloLimits& limits) {
  HelloCheck c;
  gl_hello h{};
  if (bytes.size() != sizeof(gl_hello)) {
    // Read the magic if there is one, so a foreign protocol gets the clearer error.
    uint32_t magic = 0;
    if (bytes.size() >= offsetof(gl_hello, magic) + sizeof(magic)) {
      std::memcpy(&magic, bytes.data() + offsetof(gl_hello, magic), sizeof(magic));
    }
    if (magic != GL_ABI_MAGIC) {
      c.status = GL_E_BAD_MAGIC;
      c.why = "not a gradlane client (bad magic in hello)";
    } else {
      c.status = GL_E_BAD_VERSION;
      c.why = absl::StrCat("hello of ", bytes.size(), " bytes: not ABI version ", GL_ABI_VERSION,
                           " (", sizeof(gl_hello), " bytes)");
    }
    return c;
  }
  std::memcpy(&h, bytes.data(), sizeof(h));
  c.request_id = h.header.request_id;
  if (h.magic != GL_ABI_MAGIC) {
    c.status = GL_E_BAD_MAGIC;
    c.why = absl::StrCat("bad magic 0x", absl::Hex(h.magic), " in hello (want 0x",
                         absl::Hex(GL_ABI_MAGIC), "): not a gradlane client");
    return c;
  }
  if (h.abi_version < GL_ABI_VERSION_MIN || h.abi_version > GL_ABI_VERSION) {
    c.status = GL_E_BAD_VERSION;
    c.why = absl::StrCat("client speaks ABI version ", h.abi_version, ", this daemon speaks ",
                         GL_ABI_VERSION_MIN, " to ", GL_ABI_VERSION);
    return c;
  }
  c.abi_version = h.abi_version;
  if (h.header.type != GL_MSG_HELLO || h.header.length != sizeof(h) || h.reserved != 0) {
    c.status = GL_E_PROTOCOL;
    c.why = "malformed hello header";
    return c;
  }
  // std::clamp needs lo <= hi: a limit under 8 (or not a power of two) is made one here rather
  // than trusted.
  const uint32_t max_slots = FloorPowerOfTwo(std::max<uint32_t>(limits.max_ring_slots, 8));
  const uint32_t want = h.ring_slots == 0 ? limits.default_ring_slots : h.ring_slots;
  c.ring_slots = std::clamp<uint32_t>(NextPowerOfTwo(want), 8, max_slots);
  const uint64_t bytes_wanted = h.arena_bytes == 0 ? limits.default_arena_bytes : h.arena_bytes;
  c.arena_bytes = std::min(bytes_wanted, limits.max_arena_bytes);
  return c;
}

}  // namespace gradlane::daemon
