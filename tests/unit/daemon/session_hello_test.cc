// CheckHello (daemon/session_hello.h): the session server's check of a client's first message,
// and the geometry it grants.
#include "daemon/session_hello.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace gradlane::daemon {
namespace {

gl_hello Valid() {
  gl_hello h{};
  h.header.type = GL_MSG_HELLO;
  h.header.length = sizeof(h);
  h.header.request_id = 42;
  h.magic = GL_ABI_MAGIC;
  h.abi_version = GL_ABI_VERSION;
  return h;
}

HelloCheck Check(const gl_hello& h, const HelloLimits& l = {}) {
  return CheckHello(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&h), sizeof(h)), l);
}

TEST(CheckHelloTest, DefaultsAndLimits) {
  HelloCheck c = Check(Valid());
  ASSERT_EQ(c.status, GL_OK) << c.why;
  EXPECT_EQ(c.request_id, 42u);
  EXPECT_EQ(c.ring_slots, 1024u);
  EXPECT_EQ(c.arena_bytes, uint64_t{64} << 20);
  gl_hello h = Valid();
  h.ring_slots = 100;                 // rounded up to a power of two
  h.arena_bytes = uint64_t{8} << 30;  // capped
  c = Check(h);
  EXPECT_EQ(c.ring_slots, 128u);
  EXPECT_EQ(c.arena_bytes, uint64_t{1} << 30);
  h.ring_slots = 3;
  EXPECT_EQ(Check(h).ring_slots, 8u);
  h.ring_slots = 0xFFFFFFFFu;
  EXPECT_EQ(Check(h).ring_slots, 1u << 16);
  HelloLimits odd;
  odd.max_ring_slots = 5;  // below the floor of 8: still a valid ring
  EXPECT_EQ(Check(h, odd).ring_slots, 8u);
  odd.max_ring_slots = 1000;  // not a power of two: the grant is one
  EXPECT_EQ(Check(h, odd).ring_slots, 512u);
}

// A version-1 client (before job modes) is still served, in its own version: the session
// then reads its 256-byte register_job as a parameter-server job.
TEST(CheckHelloTest, TheOlderAbiIsServedInItsOwnVersion) {
  gl_hello h = Valid();
  h.abi_version = 1;
  const HelloCheck c = Check(h);
  EXPECT_EQ(c.status, GL_OK) << c.why;
  EXPECT_EQ(c.abi_version, 1u);
  h.abi_version = GL_ABI_VERSION;
  EXPECT_EQ(Check(h).abi_version, GL_ABI_VERSION);
}

TEST(CheckHelloTest, Refusals) {
  gl_hello h = Valid();
  h.magic = 0x12345678;
  EXPECT_EQ(Check(h).status, GL_E_BAD_MAGIC);
  h = Valid();
  h.abi_version = GL_ABI_VERSION + 1;
  EXPECT_EQ(Check(h).status, GL_E_BAD_VERSION);
  h.abi_version = GL_ABI_VERSION_MIN - 1;
  EXPECT_EQ(Check(h).status, GL_E_BAD_VERSION);
  h = Valid();
  h.reserved = 1;
  EXPECT_EQ(Check(h).status, GL_E_PROTOCOL);
  h = Valid();
  h.header.length = 7;
  EXPECT_EQ(Check(h).status, GL_E_PROTOCOL);
  h = Valid();
  h.header.type = GL_MSG_REGISTER_JOB;
  EXPECT_EQ(Check(h).status, GL_E_PROTOCOL);
  // Wrong sizes: the magic decides between "not gradlane" and "another ABI version".
  EXPECT_EQ(CheckHello({}, {}).status, GL_E_BAD_MAGIC);
  std::vector<uint8_t> longer(sizeof(gl_hello) + 8, 0);
  EXPECT_EQ(CheckHello(longer, {}).status, GL_E_BAD_MAGIC);
  h = Valid();
  std::memcpy(longer.data(), &h, sizeof(h));
  const HelloCheck c = CheckHello(longer, {});
  EXPECT_EQ(c.status, GL_E_BAD_VERSION);
  EXPECT_NE(c.why.find("not ABI version"), std::string::npos);
  EXPECT_EQ(c.request_id, 0u);
}

}  // namespace
}  // namespace gradlane::daemon
