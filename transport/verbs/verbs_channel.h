// transport/verbs/verbs_channel.h — the verbs protocol of one RDMA connection, both ends: what to
// post, when, and what each completion and reply means. Pure: it drives a QueuePair
// (verbs_queue_pair.h) and reads the memory it is given; it never calls libibverbs, allocates
// on the data path, or reads a clock. The verbs transport owns the queue pairs, the registered
// memory and the completion queue and routes each completion to its channel; the tests run both
// ends against the in-memory NIC (tests/fakes/fake_verbs.h).
//
// The protocol (docs/verbs.md; layouts in verbs_wire.h), for one direction of segments:
//   - Eager: a segment whose payload fits a receive slot goes as one SEND of its FrameHeader
//     and its payload, gathered from the client's registered arena (zero copy at the sender).
//     The receiver resolves the target, copies the payload there and replies kAck, or kRefuse.
//   - Rendezvous: a larger segment sends its FrameHeader alone. The receiver resolves the target
//     and replies kClearToSend {addr, rkey} (or kRefuse); the sender RDMA-WRITEs the payload
//     from the arena straight into the target, with immediate = seq, and that write's own
//     completion is the acknowledgement (RC completes a write only after the target has it).
//   - Replies and credits travel by plain RDMA WRITE into the sender's reply region, which
//     consumes no receive: only the forward direction needs credits, so credits cannot
//     deadlock. The sender's credits are the receives the receiver posted (CreditWord) less
//     the SENDs and writes-with-immediate it issued: it never relies on RNR retry.
//   - Sends complete in posting order (an eager ack that overtakes an earlier rendezvous waits
//     for it), as on every transport.
//   - Every Nth send-queue request is signaled, and every write with immediate (it is an
//     acknowledgement); send-queue room is counted from signaled completions.
//   - An error or flush completion, or a reply that breaks the protocol, fails the channel: the
//     sender fails its pending sends in order and reports down, once.
// Counters: both ends count what they do into the VerbsCounters they are given
// (verbs_counters.h; one set per transport, shared by its channels), and this connection's
// bytes, frames, acknowledgements and failed sends into the PeerCounters they are given (the
// per-peer figures every backend keeps, transport/transport.h; `gradlanectl peers` shows them),
// on the engine thread, a relaxed load+store per event as every backend's counters.
// Thread rules: engine thread only. Ownership: the channel borrows the queue pair, the memory
// and the events object; they outlive it.
#ifndef GRADLANE_TRANSPORT_VERBS_VERBS_CHANNEL_H_
#define GRADLANE_TRANSPORT_VERBS_VERBS_CHANNEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "transport/transport.h"
#include "transport/verbs/verbs_counters.h"
#include "transport/verbs/verbs_queue_pair.h"
#include "transport/verbs/verbs_wire.h"
#include "transport/wire.h"

namespace gradlane::transport::verbs {

struct ChannelLimits {
  uint32_t recv_slots = 64;         // receives the receiver keeps posted (the sender's credits)
  uint32_t slot_bytes = 8256;       // FrameHeader + up to 8 KiB eager payload
  uint32_t reply_entries = 256;     // sender's reply ring; also its most pending segments
  uint32_t send_queue_depth = 128;  // send-queue requests outstanding per queue pair
  uint32_t signal_every = 16;       // signal one send-queue request in this many
  uint64_t max_segment_bytes = 256ull << 20;

  uint32_t eager_max_bytes() const { return slot_bytes - static_cast<uint32_t>(kFrameHeaderBytes); }
  // OK when the sizes are usable: slots of at least a header, a power-of-two reply ring,
  // 1 <= signal_every <= send_queue_depth / 2 (so room always comes back).
  absl::Status Validate() const;
};

// Counts one polled completion (in all, and errors by status). The channels count their own;
// the transport counts those it routes to no channel (a queue pair already torn down).
void CountCompletion(VerbsCounters& counters, const Completion& completion);

// What the data-path counters amount to as the figures every backend keeps per peer: a segment
// is a frame and its payload bytes (a rendezvous segment's frame is its header, its bytes the
// write's), a refused one a frame received, an acknowledged one an ack. The channels count each
// connection's PeerCounters by the same rule, event by event; the transport adds this, over
// every connection, to its totals.
PeerStats DataPathPeerStats(const VerbsStats& v);

// ---------------------------------------------------------------------------------------- sender

// A segment to send: its header (seq is set by the channel), and the payload's registered source.
struct OutgoingSegment {
  FrameHeader header{};
  uint64_t payload_addr = 0;
  uint32_t payload_lkey = 0;
  uint64_t cookie = 0;
};

class SenderEvents {
 public:
  virtual ~SenderEvents() = default;
  // The receiver has the segment in its target: the source may be reused.
  virtual void OnSendAcked_st(uint64_t cookie) = 0;
  // It never will: refused by the receiver (no target), or the channel failed.
  virtual void OnSendFailed_st(uint64_t cookie, const absl::Status& why) = 0;
  // The channel failed; called once, after the pending sends were failed.
  virtual void OnChannelDown_st(const absl::Status& why) = 0;
};

// Memory the sender works in, registered by its owner.
struct SenderMemory {
  // reply_entries ReplyEntry then the CreditWord (ReplyRegionBytes), zeroed, written by the peer.
  uint8_t* reply_region = nullptr;
  // reply_entries × kFrameHeaderBytes: where each pending segment's header is staged for its
  // SEND (the NIC reads it after PostSend returns).
  uint8_t* headers = nullptr;
  uint32_t headers_lkey = 0;
};

class VerbsSender {
 public:
  // The peer's limits (recv_slots, slot_bytes) come from its hello; reply_entries,
  // send_queue_depth and signal_every are this side's. Allocates the pending table (control
  // path). Counts into `counters` and `peer` (null: counters of its own, for tests that do not
  // look).
  VerbsSender(QueuePair& qp, const ChannelLimits& limits, const SenderMemory& memory,
              SenderEvents& events, VerbsCounters* counters = nullptr,
              PeerCounters* peer = nullptr);
  // Takes its queue pair and its credits out of the gauges.
  ~VerbsSender();
  VerbsSender(const VerbsSender&) = delete;
  VerbsSender& operator=(const VerbsSender&) = delete;

  // Queues a segment behind the earlier ones and posts what credits allow.
  // ResourceExhausted: reply_entries segments pending (back-pressure); FailedPrecondition: the
  // channel failed; InvalidArgument: longer than max_segment_bytes.
  absl::Status Post(const OutgoingSegment& segment);
  // Reads new replies and credits, completes what they finish, posts what they allow. Returns
  // how many replies it handled.
  int Progress_st();
  // A send-queue completion of this queue pair.
  void OnCompletion_st(const Completion& completion);

  // The connection is gone (its peer went down): fails every pending send in order and reports
  // down, once, as an error completion would.
  // Not counted as a channel failure: the peer's going down is counted by the transport.
  void Abort_st(const absl::Status& why) { Fail(why, /*count=*/false); }

  bool failed() const { return failed_; }
  size_t pending() const { return static_cast<size_t>(next_seq_ - done_seq_); }
  // Segments wait for the peer (a reply, a credit, a write's completion): the owner must keep
  // calling Progress_st, since replies arrive as memory writes that raise no event.
  bool AwaitingPeer() const { return !failed_ && pending() > 0; }
  // Grows with every reply read and every send-queue completion: what the transport's liveness
  // check watches while AwaitingPeer() (a peer whose daemon stopped answers neither).
  uint64_t progress_mark() const { return reply_seq_ + sq_completed_; }
  // An RDMA write is posted and not yet completed. The peer's NIC completes it (or the queue
  // pair fails it) whether or not the peer's daemon runs, so while one is out the liveness
  // check waits: a large write on a slow link is progress, not silence.
  bool WriteOutstanding() const { return wrote_ && last_write_request_ >= sq_completed_; }
  uint32_t credits() const;
  uint64_t eager_sent() const { return eager_sent_; }
  uint64_t rendezvous_sent() const { return rendezvous_sent_; }

 private:
  enum class State : uint8_t { kQueued, kHeaderSent, kCleared, kWriting, kAcked, kRefused };
  struct Pending {
    OutgoingSegment segment;
    State state = State::kQueued;
    bool eager = false;
    uint64_t target_addr = 0;
    uint32_t target_rkey = 0;
    uint64_t write_request = 0;  // the write's send-queue request number (its wr_id)
  };

  Pending& At(uint64_t seq) { return pending_[seq & (pending_.size() - 1)]; }
  bool SendQueueHasRoom() const { return sq_posted_ - sq_completed_ < limits_.send_queue_depth; }
  bool HasCredit() const { return credits() > 0; }
  absl::Status PostWork(SendWork& work, bool force_signal);
  void PostReady();
  // A forward request is due and no credit is left: counted once per stall, not per round.
  void NoteNoCredit();
  // Moves the credits gauge by the change since the last call (0 once failed).
  void PublishCredits();
  void CompleteInOrder();
  void Fail(const absl::Status& why, bool count = true);

  QueuePair& qp_;
  ChannelLimits limits_;
  SenderMemory memory_;
  SenderEvents& events_;
  std::unique_ptr<VerbsCounters> own_counters_;  // when none were given
  VerbsCounters& counters_;
  std::unique_ptr<PeerCounters> own_peer_;  // when none were given
  PeerCounters& peer_;
  std::vector<Pending> pending_;     // ring of reply_entries, indexed by seq
  uint64_t next_seq_ = 0;            // the next segment's seq
  uint64_t header_seq_ = 0;          // the next header to post
  uint64_t write_seq_ = 0;           // the next segment whose write may be due (in seq order)
  uint64_t last_write_request_ = 0;  // the last write's send-queue request number
  bool wrote_ = false;
  uint64_t reply_seq_ = 0;     // the next reply expected
  uint64_t done_seq_ = 0;      // segments completed in order
  uint64_t forward_used_ = 0;  // receives consumed at the peer (SENDs + writes with immediate)
  uint64_t sq_posted_ = 0;
  uint64_t sq_completed_ = 0;
  uint64_t eager_sent_ = 0;
  uint64_t rendezvous_sent_ = 0;
  uint32_t credits_published_ = 0;  // this channel's share of counters_.credits_available
  bool credit_stalled_ = false;     // no credit since the last forward request posted
  bool failed_ = false;
};

// -------------------------------------------------------------------------------------- receiver

// Where a segment's payload goes, as the receiver's owner decides it.
struct SegmentTarget {
  bool accept = false;
  uint8_t* local = nullptr;  // eager: the payload is copied here (length bytes)
  uint64_t remote_addr = 0;  // rendezvous: the sender writes here (the same bytes, registered)
  uint32_t rkey = 0;
  uint64_t cookie = 0;
  // False for GPU memory: only the NIC writes it, so an eager payload cannot be placed there.
  bool cpu_writable = true;
};

class ReceiverEvents {
 public:
  virtual ~ReceiverEvents() = default;
  // A well-formed header arrived: where does its payload go? (Reject: accept = false.)
  virtual SegmentTarget ResolveSegment_st(const FrameHeader& header) = 0;
  // The payload is in the target.
  virtual void OnSegmentPlaced_st(const FrameHeader& header, const SegmentTarget& target) = 0;
  // A segment the receiver refused was discarded (counted by the owner).
  virtual void OnSegmentRefused_st(const FrameHeader& /*header*/) {}
  // The channel failed (a bad frame, an error completion); called once.
  virtual void OnChannelDown_st(const absl::Status& why) = 0;
};

struct ReceiverMemory {
  uint8_t* slots = nullptr;  // recv_slots × slot_bytes
  uint32_t slots_lkey = 0;
  // send_queue_depth × kReplyEntryBytes: staging of the replies and credit words this side
  // writes (a slot is reused only once the request that read it is known complete).
  uint8_t* staging = nullptr;
  uint32_t staging_lkey = 0;
  // The sender's reply region (from its hello).
  uint64_t peer_reply_addr = 0;
  uint32_t peer_reply_rkey = 0;
};

class VerbsReceiver {
 public:
  // reply_entries is the sender's (from its hello). Allocates the rendezvous table. Counts into
  // `counters` and `peer` (null: counters of its own).
  VerbsReceiver(QueuePair& qp, const ChannelLimits& limits, const ReceiverMemory& memory,
                ReceiverEvents& events, VerbsCounters* counters = nullptr,
                PeerCounters* peer = nullptr);
  ~VerbsReceiver();  // takes its queue pair out of the gauge
  VerbsReceiver(const VerbsReceiver&) = delete;
  VerbsReceiver& operator=(const VerbsReceiver&) = delete;

  // Posts every receive slot and tells the sender (its first CreditWord) — at once, or with
  // `hold_writes` only once PeerReady_st is called. A sender's queue pair that is not yet ready
  // to receive (before RTR) drops what reaches it; the RC retries (retry_cnt tries of `timeout`
  // each, about 0.5 s) then run out and fail the connection. So a receiver whose sender may
  // still be setting up its queue pair holds every write until it knows the sender is ready.
  absl::Status Start_st(bool hold_writes = false);
  // The sender's queue pair takes writes now: the held credit word goes out.
  void PeerReady_st();
  // A completion of this queue pair (receives, and this side's reply writes).
  void OnCompletion_st(const Completion& completion);
  // Posts the replies and the credit word that wait for send-queue room. Returns requests posted.
  int Flush_st();

  // Stops handling completions (the owner tears the connection down); reports down once. Not
  // counted as a channel failure.
  void Abort_st(const absl::Status& why) { Fail(why, /*count=*/false); }

  bool failed() const { return failed_; }
  uint64_t placed() const { return placed_; }
  uint64_t refused() const { return refused_; }

 private:
  struct Awaiting {
    FrameHeader header{};
    SegmentTarget target;
    bool waiting = false;
  };

  void OnReceive(const Completion& completion);
  void OnWriteArrived(const Completion& completion);
  void QueueReply(uint64_t seq, ReplyKind kind, uint64_t addr, uint32_t rkey);
  void Repost(uint64_t slot);
  void Fail(const absl::Status& why, bool count = true);

  QueuePair& qp_;
  ChannelLimits limits_;
  ReceiverMemory memory_;
  ReceiverEvents& events_;
  std::unique_ptr<VerbsCounters> own_counters_;  // when none were given
  VerbsCounters& counters_;
  std::unique_ptr<PeerCounters> own_peer_;  // when none were given
  PeerCounters& peer_;
  std::vector<Awaiting> awaiting_;  // rendezvous segments cleared to send, by seq % entries
  // Replies decided but not yet posted (send queue full), in order: ring of reply_entries.
  std::vector<ReplyEntry> queued_replies_;
  uint64_t replies_queued_ = 0;
  uint64_t replies_posted_ = 0;
  uint64_t expected_seq_ = 0;
  uint64_t recv_posted_ = 0;      // receives posted in all (what the CreditWord says)
  uint64_t credit_reported_ = 0;  // the last CreditWord value written
  uint64_t sq_posted_ = 0;
  uint64_t sq_completed_ = 0;
  uint64_t placed_ = 0;
  uint64_t refused_ = 0;
  bool writes_held_ = false;  // nothing is written to the sender until PeerReady_st
  bool failed_ = false;
};

}  // namespace gradlane::transport::verbs

#endif  // GRADLANE_TRANSPORT_VERBS_VERBS_CHANNEL_H_
