// transport/verbs/verbs_queue_pair.h — the few RDMA verbs the verbs protocol core uses, as a small
// interface: one reliable-connected queue pair's work posting, and the completions it produces.
//
// Why an interface of our own rather than calling libibverbs from the protocol: the protocol
// (transport/verbs/verbs_channel.h) is pure, so it runs against an in-memory NIC in the tests
// (tests/fakes/fake_verbs.h: writes by memcpy, injected error, flush and RNR completions) under
// the sanitizers on machines without RDMA, and against rdma-core's `ibv_post_send` /
// `ibv_post_recv` / `ibv_poll_cq` on a real or soft-RoCE device. The structs mirror the verbs
// ones field for field where they exist (ibv_sge, ibv_send_wr, ibv_wc), so the libibverbs
// adapter is a field copy.
//
// Semantics every implementation keeps (the InfiniBand RC rules the protocol relies on):
//   - Work requests posted to one queue pair execute in order; a signaled completion of send
//     request k implies requests before k on that queue pair completed too (their own
//     completions are not generated when unsignaled).
//   - SEND and RDMA WRITE with immediate each consume one posted receive at the target, in the
//     order they were posted; plain RDMA WRITE consumes none and produces no completion at the
//     target. A SEND or WRITE-with-immediate that finds no posted receive is an RNR error
//     (the protocol never lets that happen: its credits are the posted receives).
//   - After the first error completion the queue pair is in error: every outstanding work
//     request (signaled or not) completes with kFlushed, and later posts fail.
// Thread rules: a queue pair belongs to the engine thread that owns its transport.
#ifndef GRADLANE_TRANSPORT_VERBS_VERBS_QUEUE_PAIR_H_
#define GRADLANE_TRANSPORT_VERBS_VERBS_QUEUE_PAIR_H_

#include <cstdint>

#include "absl/status/status.h"

namespace gradlane::transport::verbs {

// One scatter-gather element: `length` bytes at `addr` in memory registered with `lkey`.
struct LocalSpan {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

enum class WorkOp : uint8_t {
  kSend = 0,          // into the peer's next posted receive
  kWrite = 1,         // into (remote_addr, rkey); nothing at the peer's completion queue
  kWriteWithImm = 2,  // as kWrite, then a receive completion carrying `imm` at the peer
};

// A send-queue work request. At most two gather elements (a header and a payload).
struct SendWork {
  uint64_t wr_id = 0;
  WorkOp op = WorkOp::kSend;
  LocalSpan sge[2];
  uint8_t num_sge = 0;
  bool signaled = false;
  uint32_t imm = 0;          // kWriteWithImm
  uint64_t remote_addr = 0;  // kWrite, kWriteWithImm
  uint32_t rkey = 0;
};

struct RecvWork {
  uint64_t wr_id = 0;
  LocalSpan sge;  // length 0: a receive for a WRITE with immediate only
};

enum class CompletionStatus : uint8_t {
  kSuccess = 0,
  kFlushed = 1,            // the queue pair was already in error (IBV_WC_WR_FLUSH_ERR)
  kRemoteAccessError = 2,  // bad rkey or range at the target (IBV_WC_REM_ACCESS_ERR)
  kReceiverNotReady = 3,   // no posted receive, retries exhausted (IBV_WC_RNR_RETRY_EXC_ERR)
  kRetryExceeded = 4,      // the peer stopped answering (IBV_WC_RETRY_EXC_ERR)
  kLocalError = 5,         // anything else (length, protection, ...)
};

enum class CompletionKind : uint8_t {
  kSend = 0,         // a signaled send-queue request (any WorkOp), or an error/flush of one
  kRecv = 1,         // a SEND arrived in a posted receive
  kRecvWithImm = 2,  // a WRITE with immediate landed; the receive holds no bytes
};

struct Completion {
  uint64_t wr_id = 0;
  CompletionKind kind = CompletionKind::kSend;
  CompletionStatus status = CompletionStatus::kSuccess;
  uint32_t byte_len = 0;  // kRecv: bytes the SEND delivered
  uint32_t imm = 0;       // kRecvWithImm
};

const char* CompletionStatusName(CompletionStatus status);

// One RC queue pair, already connected to its peer. Posting never blocks; a full queue is the
// caller's accounting error (the protocol sizes its queues) and is reported, not waited out.
class QueuePair {
 public:
  virtual ~QueuePair() = default;
  virtual absl::Status PostSend(const SendWork& work) = 0;
  virtual absl::Status PostRecv(const RecvWork& work) = 0;
};

}  // namespace gradlane::transport::verbs

#endif  // GRADLANE_TRANSPORT_VERBS_VERBS_QUEUE_PAIR_H_
