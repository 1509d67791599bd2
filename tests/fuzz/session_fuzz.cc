// Fuzz target: what a local client controls in its session (daemon/session.h) — the control
// messages after the hello (register job, register tensor, anything else:
// Session::HandleControl_st), the submission descriptors it writes into shared memory
// (Session::Validate_st), and the ring itself: indices, sequence marks and constants it may
// scribble on (Session::PollSubmissions_st, shm/ring.h). A fresh session per input (a memfd
// arena of 8 ring slots).
//
// Input: one mode byte, then records, op byte first. Mode bits: 0: control messages get a
// correct header.length; 1: ring entries get a correct sequence mark. Ops (op % 6):
//   0: u16 length + control message bytes → HandleControl_st (replies are read off the socket)
//   1: 64 bytes of gl_sqe → Validate
//   2: 64 bytes of gl_sqe published into the submission ring → PollSubmissions_st
//   3: u8 field + u64 value written over a ring-header word → PollSubmissions_st
//   4: the client consumes its completions (completion ring head := tail)
//   5: u16 length + bytes → CheckHello (daemon/session_hello.h), the first message's check
// Posts the daemon accepts are completed at once, as the engine eventually does.
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "daemon/session.h"
#include "daemon/session_hello.h"

namespace {

using gradlane::daemon::PostDescriptor;
using gradlane::daemon::PostSink;
using gradlane::daemon::Session;

constexpr uint32_t kSlots = 8;
constexpr uint64_t kArenaBytes = 1 << 20;

struct Reader {
  const uint8_t* p;
  size_t n;
  bool Take(void* out, size_t k) {
    if (n < k) return false;
    if (k != 0) std::memcpy(out, p, k);
    p += k;
    n -= k;
    return true;
  }
};

class CompleteAtOnce final : public PostSink {
 public:
  void OnPost_st(Session& s, const PostDescriptor& post) override {
    // Validate_st's promise: a post the engine gets lies inside its tensor.
    const auto& t = s.tensors_st().at(post.tensor_id);
    if (post.length == 0 || post.offset > t.bytes || post.length > t.bytes - post.offset)
      std::abort();
    if (t.offset + t.bytes > s.arena_bytes()) std::abort();
    (void)s.Complete_st(post, GL_OK);
  }
};

void Drain(int fd) {
  char buf[4096];
  while (::recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader in{data, size};
  uint8_t mode = 0;
  if (!in.Take(&mode, 1)) return 0;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
    std::abort();
  gradlane::shm::UniqueFd client(sv[1]);
  gradlane::shm::UniqueFd daemon_end(sv[0]);
  auto created = Session::Create(
      1, std::move(daemon_end), gradlane::shm::PeerCredentials{1, 1000, 1000}, kSlots, kArenaBytes);
  if (!created.ok()) std::abort();
  Session& s = **created;
  const Session::Layout layout = Session::ComputeLayout(kSlots, kArenaBytes);
  uint8_t* base = s.arena_base();
  auto* sq = reinterpret_cast<gl_ring_header*>(base + layout.sq_offset);
  auto* cq = reinterpret_cast<gl_ring_header*>(base + layout.cq_offset);
  auto* sq_slots = reinterpret_cast<gl_sqe*>(sq + 1);
  CompleteAtOnce sink;
  bool dead = false;  // the server closes a session whose ring is corrupt
  for (int steps = 0; steps < 128 && !dead; ++steps) {
    uint8_t op = 0;
    if (!in.Take(&op, 1)) break;
    switch (op % 6) {
      case 0: {
        uint16_t len = 0;
        if (!in.Take(&len, 2)) break;
        len = static_cast<uint16_t>(len % 2048);
        std::vector<uint8_t> msg(len);
        if (!in.Take(msg.data(), len)) break;
        if ((mode & 1) && len >= sizeof(gl_msg_header)) {
          const uint32_t l = len;
          std::memcpy(msg.data() + offsetof(gl_msg_header, length), &l, sizeof(l));
        }
        (void)s.HandleControl_st(msg.data(), msg.size());
        Drain(client.get());
        break;
      }
      case 1: {
        gl_sqe e;
        if (!in.Take(&e, sizeof(e))) break;
        PostDescriptor post;
        const gl_status st = s.Validate_st(e, &post);
        if (st == GL_OK) {
          const auto& t = s.tensors_st().at(post.tensor_id);
          if (post.length == 0 || post.offset > t.bytes || post.length > t.bytes - post.offset)
            std::abort();
        }
        break;
      }
      case 2: {
        gl_sqe e;
        if (!in.Take(&e, sizeof(e))) break;
        const uint64_t tail = sq->tail;
        if (mode & 2) e.seq = tail + 1;
        sq_slots[tail & (kSlots - 1)] = e;
        sq->tail = tail + 1;
        bool corrupt = false;
        (void)s.PollSubmissions_st(&sink, 16, &corrupt);
        dead = corrupt;
        break;
      }
      case 3: {
        uint8_t field = 0;
        uint64_t v = 0;
        if (!in.Take(&field, 1) || !in.Take(&v, 8)) break;
        gl_ring_header* h = (field & 1) ? cq : sq;
        switch ((field >> 1) % 5) {
          case 0:
            h->tail = v;
            break;
          case 1:
            h->head = v;
            break;
          case 2:
            h->magic = static_cast<uint32_t>(v);
            break;
          case 3:
            h->slots = static_cast<uint32_t>(v);
            break;
          case 4:
            sq_slots[v & (kSlots - 1)].seq = v >> 3;
            break;
        }
        bool corrupt = false;
        (void)s.PollSubmissions_st(&sink, 16, &corrupt);
        dead = corrupt;
        break;
      }
      case 4:
        cq->head = cq->tail;
        break;
      case 5: {
        uint16_t len = 0;
        if (!in.Take(&len, 2)) break;
        len = static_cast<uint16_t>(len % 512);
        std::vector<uint8_t> msg(len);
        if (!in.Take(msg.data(), len)) break;
        gradlane::daemon::HelloLimits limits;
        limits.max_ring_slots = 1u << (mode >> 4);  // 1..2^15: odd limits too
        const gradlane::daemon::HelloCheck c = gradlane::daemon::CheckHello(msg, limits);
        if (c.status == GL_OK) {
          // The grant must be a ring Session::Create accepts, within the limits.
          if (c.ring_slots < 8 || (c.ring_slots & (c.ring_slots - 1)) != 0 ||
              (c.ring_slots > limits.max_ring_slots && c.ring_slots != 8) ||
              c.arena_bytes > limits.max_arena_bytes) {
            std::abort();
          }
        } else if (c.why.empty()) {
          std::abort();
        }
        break;
      }
    }
    s.FlushCompletions_st();
  }
  if (std::getenv("SESSION_FUZZ_DEBUG") != nullptr) {  // what an input reached, for seed work
    std::fprintf(stderr, "job %d tensors %zu posts_ok %llu completions %llu dead %d\n",
                 s.job_st() != nullptr, s.tensors_st().size(),
                 static_cast<unsigned long long>(s.counters_st().posts_ok),
                 static_cast<unsigned long long>(s.counters_st().completions), dead);
  }
  return 0;
}
