// tests/fakes/fake_verbs.h — an in-memory RDMA NIC for the verbs protocol tests: registered
// memory with keys, reliable-connected queue pairs joined in pairs, SEND / RDMA WRITE / WRITE
// with immediate executed by memcpy, and the completions a real NIC produces.
//
// It keeps the rules transport/verbs/verbs_queue_pair.h lists, and checks what a real NIC checks:
//   - every local gather/scatter element lies in memory registered under its lkey, every remote
//     write in memory registered for remote write under its rkey (else a remote access error);
//   - a SEND or write with immediate that finds no posted receive is an RNR error (counted in
//     rnr_errors(): the protocol must never cause one), a SEND longer than the receive is a
//     local error at the target;
//   - the first error puts the queue pair in error: its outstanding work completes kFlushed,
//     the peer's outstanding receives too, and later posts fail.
// Work runs only when the test calls Run(): each step executes the oldest request of one queue
// pair, so a test controls how requests interleave. Faults: FailNextSend(status) makes the
// queue pair's next send-queue request complete with that status. SetReadyToReceive(false)
// stands for a queue pair its owner has not yet moved to ready-to-receive (RTR): a real NIC drops
// what reaches it and the requester retries until retry_cnt runs out; here the requester's
// request completes kRetryExceeded at once (its queue pair in error), the not-ready one unharmed.
//
// Test-only and single-threaded; it allocates freely.
#ifndef GRADLANE_TESTS_FAKES_FAKE_VERBS_H_
#define GRADLANE_TESTS_FAKES_FAKE_VERBS_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "transport/verbs/verbs_queue_pair.h"

namespace gradlane::transport::verbs::fake {

struct MemoryKeys {
  uint32_t lkey = 0;
  uint32_t rkey = 0;
};

class FakeNic;

class FakeQueuePair final : public QueuePair {
 public:
  absl::Status PostSend(const SendWork& work) override;
  absl::Status PostRecv(const RecvWork& work) override;

  // Completions this queue pair produced (its send requests and its receives), oldest first.
  std::vector<Completion> TakeCompletions();
  void FailNextSend(CompletionStatus status) { fail_next_ = status; }
  void SetReadyToReceive(bool ready) { ready_to_receive_ = ready; }
  bool in_error() const { return in_error_; }
  size_t send_queue() const { return send_queue_.size(); }
  size_t posted_receives() const { return recv_queue_.size(); }
  uint64_t signaled_requests() const { return signaled_; }
  uint64_t send_requests() const { return sends_; }

 private:
  friend class FakeNic;
  explicit FakeQueuePair(FakeNic& nic) : nic_(nic) {}
  // Executes the oldest send request; false if there is none.
  bool Step();
  void EnterError();
  void Complete(const Completion& c) { completions_.push_back(c); }

  FakeNic& nic_;
  FakeQueuePair* peer_ = nullptr;
  std::deque<SendWork> send_queue_;
  std::deque<RecvWork> recv_queue_;
  std::vector<Completion> completions_;
  std::optional<CompletionStatus> fail_next_;
  bool in_error_ = false;
  bool ready_to_receive_ = true;
  uint64_t signaled_ = 0;
  uint64_t sends_ = 0;
};

class FakeNic {
 public:
  // Registers [base, base + bytes): the keys a gather element or a remote write names.
  MemoryKeys Register(void* base, uint64_t bytes, bool remote_write);
  // Forgets the registration whose lkey is `lkey`: elements and writes naming its keys fail
  // from then on, as after ibv_dereg_mr. False when there is none.
  bool Deregister(uint32_t lkey);
  // Two queue pairs connected to each other (owned by the NIC).
  std::pair<FakeQueuePair*, FakeQueuePair*> ConnectedPair();
  // Executes up to `steps` requests, one queue pair after another; returns how many ran.
  int Run(int steps = 1 << 30);
  uint64_t rnr_errors() const { return rnr_errors_; }

 private:
  friend class FakeQueuePair;
  struct Region {
    uint8_t* base;
    uint64_t bytes;
    uint32_t lkey;
    uint32_t rkey;
    bool remote_write;
  };
  // The bytes of a local element, or null when it is not registered memory.
  uint8_t* Local(const LocalSpan& span) const;
  uint8_t* Remote(uint64_t addr, uint64_t bytes, uint32_t rkey) const;

  std::vector<Region> regions_;
  std::vector<std::unique_ptr<FakeQueuePair>> queue_pairs_;
  uint32_t next_key_ = 0x100;
  size_t next_to_run_ = 0;
  uint64_t rnr_errors_ = 0;
};

}  // namespace gradlane::transport::verbs::fake

#endif  // GRADLANE_TESTS_FAKES_FAKE_VERBS_H_
