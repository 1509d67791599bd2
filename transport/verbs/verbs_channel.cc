#include "transport/verbs/verbs_channel.h"

#include <atomic>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradlane::transport::verbs {
namespace {

// Reads a word the NIC writes behind the CPU's back: one aligned load, ordered before the reads
// of the entry it guards.
template <typename T>
T LoadAcquire(const uint8_t* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  std::atomic_thread_fence(std::memory_order_acquire);
  return value;
}

absl::Status CompletionError(const Completion& c, const char* side) {
  return absl::UnavailableError(absl::StrCat("verbs ", side, ": work request ", c.wr_id,
                                             " completed with ", CompletionStatusName(c.status)));
}

}  // namespace

const char* CompletionStatusName(CompletionStatus status) {
  switch (status) {
    case CompletionStatus::kSuccess:
      return "success";
    case CompletionStatus::kFlushed:
      return "flushed (queue pair in error)";
    case CompletionStatus::kRemoteAccessError:
      return "remote access error";
    case CompletionStatus::kReceiverNotReady:
      return "receiver not ready (no posted receive)";
    case CompletionStatus::kRetryExceeded:
      return "transport retries exceeded (peer unreachable)";
    case CompletionStatus::kLocalError:
      return "local error";
  }
  return "unknown status";
}

PeerStats DataPathPeerStats(const VerbsStats& v) {
  PeerStats s;
  s.bytes_sent = v.eager_bytes + v.rendezvous_bytes;
  s.frames_sent = v.eager_sends + v.rendezvous_headers;
  s.bytes_received = v.eager_recv_bytes + v.rendezvous_recv_bytes;
  s.frames_received = v.eager_received + v.rendezvous_received + v.segments_refused;
  s.acks_received = v.segments_acked;
  s.sends_failed = v.segments_failed;
  return s;
}

void CountCompletion(VerbsCounters& counters, const Completion& completion) {
  counters.completions.Add_st(1);
  switch (completion.status) {
    case CompletionStatus::kSuccess:
      return;
    case CompletionStatus::kFlushed:
      return counters.flushed_completions.Add_st(1);
    case CompletionStatus::kRemoteAccessError:
      return counters.remote_access_errors.Add_st(1);
    case CompletionStatus::kReceiverNotReady:
      return counters.rnr_errors.Add_st(1);
    case CompletionStatus::kRetryExceeded:
      return counters.retry_exceeded_errors.Add_st(1);
    case CompletionStatus::kLocalError:
      return counters.local_errors.Add_st(1);
  }
}

absl::Status ChannelLimits::Validate() const {
  if (slot_bytes < kFrameHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("receive slots of ", slot_bytes, " bytes cannot hold a frame header"));
  }
  if (recv_slots == 0) return absl::InvalidArgumentError("no receive slots");
  if (reply_entries == 0 || !std::has_single_bit(reply_entries)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reply ring of ", reply_entries, " entries (a power of two is required)"));
  }
  if (send_queue_depth < 2 || signal_every == 0 || signal_every > send_queue_depth / 2) {
    return absl::InvalidArgumentError(absl::StrCat("signal every ", signal_every, " of ",
                                                   send_queue_depth, " send-queue requests"));
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------------------ sender

VerbsSender::VerbsSender(QueuePair& qp, const ChannelLimits& limits, const SenderMemory& memory,
                         SenderEvents& events, VerbsCounters* counters, PeerCounters* peer)
    : qp_(qp),
      limits_(limits),
      memory_(memory),
      events_(events),
      own_counters_(counters == nullptr ? std::make_unique<VerbsCounters>() : nullptr),
      counters_(counters == nullptr ? *own_counters_ : *counters),
      own_peer_(peer == nullptr ? std::make_unique<PeerCounters>() : nullptr),
      peer_(peer == nullptr ? *own_peer_ : *peer),
      pending_(limits.reply_entries) {
  counters_.queue_pairs.Add_st(1);
}

VerbsSender::~VerbsSender() {
  counters_.queue_pairs.Sub_st(1);
  counters_.credits_available.Sub_st(credits_published_);
}

uint32_t VerbsSender::credits() const {
  const uint64_t posted = LoadAcquire<uint64_t>(memory_.reply_region +
                                                size_t{limits_.reply_entries} * kReplyEntryBytes);
  // A receiver never reports fewer receives than it has: a smaller value is not ours to trust.
  return posted > forward_used_
             ? static_cast<uint32_t>(std::min<uint64_t>(posted - forward_used_, UINT32_MAX))
             : 0;
}

absl::Status VerbsSender::Post(const OutgoingSegment& segment) {
  if (failed_) return absl::FailedPreconditionError("verbs channel failed");
  if (segment.header.length > limits_.max_segment_bytes) {
    return absl::InvalidArgumentError("segment longer than max_segment_bytes");
  }
  if (pending() >= pending_.size()) {
    return absl::ResourceExhaustedError("verbs channel: reply ring full");
  }
  Pending& p = At(next_seq_);
  p = Pending{};
  p.segment = segment;
  p.segment.header.seq = static_cast<uint32_t>(next_seq_);
  p.eager = segment.header.length <= limits_.eager_max_bytes() &&
            (segment.header.flags & kFlagRendezvous) == 0;
  ++next_seq_;
  PostReady();
  return absl::OkStatus();
}

absl::Status VerbsSender::PostWork(SendWork& work, bool force_signal) {
  work.wr_id = sq_posted_;
  work.signaled = force_signal || sq_posted_ % limits_.signal_every == limits_.signal_every - 1;
  absl::Status s = qp_.PostSend(work);
  if (s.ok()) ++sq_posted_;
  return s;
}

// Posts, in seq order, the headers and the writes that credits and send-queue room allow. A
// header never overtakes a due write of an earlier segment only because the writes go first:
// both consume the same credits, and the write finishes a segment the peer already holds.
void VerbsSender::PostReady() {
  while (!failed_) {
    // Writes first: in seq order, each needs its clear-to-send.
    while (write_seq_ < header_seq_) {
      Pending& p = At(write_seq_);
      if (p.eager || p.state == State::kRefused || p.state == State::kAcked ||
          p.state == State::kWriting) {
        ++write_seq_;
        continue;
      }
      if (p.state != State::kCleared) break;  // its reply is not in yet
      if (!HasCredit()) return NoteNoCredit();
      if (!SendQueueHasRoom()) return;
      SendWork w;
      w.op = WorkOp::kWriteWithImm;
      w.sge[0] = {p.segment.payload_addr, static_cast<uint32_t>(p.segment.header.length),
                  p.segment.payload_lkey};
      w.num_sge = 1;
      w.imm = p.segment.header.seq;
      w.remote_addr = p.target_addr;
      w.rkey = p.target_rkey;
      // Signaled: its completion is the segment's acknowledgement.
      p.write_request = sq_posted_;
      if (absl::Status s = PostWork(w, /*force_signal=*/true); !s.ok()) return Fail(s);
      last_write_request_ = p.write_request;
      wrote_ = true;
      ++forward_used_;
      p.state = State::kWriting;
      ++write_seq_;
      counters_.rendezvous_writes.Add_st(1);
      counters_.rendezvous_bytes.Add_st(p.segment.header.length);
      peer_.bytes_sent.Add_st(p.segment.header.length);
      credit_stalled_ = false;
    }
    if (header_seq_ == next_seq_) return;
    if (!HasCredit()) return NoteNoCredit();
    if (!SendQueueHasRoom()) return;
    Pending& p = At(header_seq_);
    uint8_t* staged = memory_.headers + (header_seq_ & (pending_.size() - 1)) * kFrameHeaderBytes;
    std::memcpy(staged, &p.segment.header, kFrameHeaderBytes);
    SendWork w;
    w.op = WorkOp::kSend;
    w.sge[0] = {reinterpret_cast<uint64_t>(staged), static_cast<uint32_t>(kFrameHeaderBytes),
                memory_.headers_lkey};
    w.num_sge = 1;
    if (p.eager && p.segment.header.length > 0) {
      w.sge[1] = {p.segment.payload_addr, static_cast<uint32_t>(p.segment.header.length),
                  p.segment.payload_lkey};
      w.num_sge = 2;
    }
    if (absl::Status s = PostWork(w, /*force_signal=*/false); !s.ok()) return Fail(s);
    ++forward_used_;
    p.state = State::kHeaderSent;
    ++(p.eager ? eager_sent_ : rendezvous_sent_);
    ++header_seq_;
    // A rendezvous segment's frame is its header; its bytes are counted when they are written.
    peer_.frames_sent.Add_st(1);
    if (p.eager) {
      counters_.eager_sends.Add_st(1);
      counters_.eager_bytes.Add_st(p.segment.header.length);
      peer_.bytes_sent.Add_st(p.segment.header.length);
    } else {
      counters_.rendezvous_headers.Add_st(1);
    }
    credit_stalled_ = false;
  }
}

void VerbsSender::NoteNoCredit() {
  if (credit_stalled_) return;
  credit_stalled_ = true;
  counters_.credit_stalls.Add_st(1);
}

void VerbsSender::PublishCredits() {
  const uint32_t now = failed_ ? 0 : credits();
  if (now > credits_published_) {
    counters_.credits_available.Add_st(now - credits_published_);
  } else if (now < credits_published_) {
    counters_.credits_available.Sub_st(credits_published_ - now);
  }
  credits_published_ = now;
}

int VerbsSender::Progress_st() {
  if (failed_) return 0;
  int handled = 0;
  while (reply_seq_ < header_seq_) {
    const uint8_t* at =
        memory_.reply_region + (reply_seq_ & (pending_.size() - 1)) * kReplyEntryBytes;
    const uint32_t stamp = LoadAcquire<uint32_t>(at + offsetof(ReplyEntry, stamp));
    if (stamp != static_cast<uint32_t>(reply_seq_ + 1)) break;
    ReplyEntry e;
    std::memcpy(&e, at, sizeof(e));
    Pending& p = At(reply_seq_);
    const bool well_formed =
        e.seq == static_cast<uint32_t>(reply_seq_) && p.state == State::kHeaderSent &&
        (e.kind == static_cast<uint8_t>(ReplyKind::kRefuse) ||
         e.kind == static_cast<uint8_t>(p.eager ? ReplyKind::kAck : ReplyKind::kClearToSend));
    if (!well_formed) {
      Fail(absl::DataLossError(absl::StrCat("verbs: reply ", reply_seq_, " of kind ",
                                            static_cast<int>(e.kind),
                                            " does not answer the segment sent")));
      return handled;
    }
    if (e.kind == static_cast<uint8_t>(ReplyKind::kRefuse)) {
      p.state = State::kRefused;
    } else if (p.eager) {
      p.state = State::kAcked;
    } else {
      p.state = State::kCleared;
      p.target_addr = e.addr;
      p.target_rkey = e.rkey;
      counters_.clear_to_send.Add_st(1);
    }
    ++reply_seq_;
    ++handled;
  }
  CompleteInOrder();
  PostReady();
  // Once a round (the engine calls this every loop round per connection): the credit word is
  // memory the peer writes, so the gauge is as fresh as the sender's last look at it.
  PublishCredits();
  return handled;
}

void VerbsSender::OnCompletion_st(const Completion& c) {
  CountCompletion(counters_, c);
  if (failed_) return;  // the flushes that follow the first error
  if (c.status != CompletionStatus::kSuccess) return Fail(CompletionError(c, "sender"));
  if (c.kind != CompletionKind::kSend || c.wr_id >= sq_posted_) {
    return Fail(absl::InternalError("verbs sender: completion of a request it never posted"));
  }
  sq_completed_ = std::max(sq_completed_, c.wr_id + 1);
  // A signaled completion covers every request posted before it, so each write posted up to
  // wr_id is in the peer's memory now. Writes are posted in seq order: the first one still
  // outstanding ends the scan.
  for (uint64_t seq = done_seq_; seq < write_seq_; ++seq) {
    Pending& p = At(seq);
    if (p.state != State::kWriting) continue;
    if (p.write_request > c.wr_id) break;
    p.state = State::kAcked;
  }
  CompleteInOrder();
  PostReady();
}

void VerbsSender::CompleteInOrder() {
  while (done_seq_ < header_seq_) {
    Pending& p = At(done_seq_);
    if (p.state == State::kAcked) {
      ++done_seq_;
      counters_.segments_acked.Add_st(1);
      peer_.acks_received.Add_st(1);
      events_.OnSendAcked_st(p.segment.cookie);
    } else if (p.state == State::kRefused) {
      ++done_seq_;
      counters_.segments_failed.Add_st(1);
      peer_.sends_failed.Add_st(1);
      events_.OnSendFailed_st(p.segment.cookie,
                              absl::NotFoundError("the receiver had no destination for it"));
    } else {
      return;
    }
  }
}

void VerbsSender::Fail(const absl::Status& why, bool count) {
  if (failed_) return;
  failed_ = true;
  if (count) counters_.channel_failures.Add_st(1);
  PublishCredits();
  counters_.segments_failed.Add_st(next_seq_ - done_seq_);
  peer_.sends_failed.Add_st(next_seq_ - done_seq_);
  for (; done_seq_ < next_seq_; ++done_seq_) {
    events_.OnSendFailed_st(At(done_seq_).segment.cookie, why);
  }
  events_.OnChannelDown_st(why);
}

}  // namespace gradlane::transport::verbs

namespace gradlane::transport::verbs {

// ---------------------------------------------------------------------------------------- receiver

VerbsReceiver::VerbsReceiver(QueuePair& qp, const ChannelLimits& limits,
                             const ReceiverMemory& memory, ReceiverEvents& events,
                             VerbsCounters* counters, PeerCounters* peer)
    : qp_(qp),
      limits_(limits),
      memory_(memory),
      events_(events),
      own_counters_(counters == nullptr ? std::make_unique<VerbsCounters>() : nullptr),
      counters_(counters == nullptr ? *own_counters_ : *counters),
      own_peer_(peer == nullptr ? std::make_unique<PeerCounters>() : nullptr),
      peer_(peer == nullptr ? *own_peer_ : *peer),
      awaiting_(limits.reply_entries),
      queued_replies_(limits.reply_entries) {
  counters_.queue_pairs.Add_st(1);
}

VerbsReceiver::~VerbsReceiver() { counters_.queue_pairs.Sub_st(1); }

absl::Status VerbsReceiver::Start_st(bool hold_writes) {
  writes_held_ = hold_writes;
  for (uint64_t slot = 0; slot < limits_.recv_slots; ++slot) {
    RecvWork w;
    w.wr_id = slot;
    w.sge = {reinterpret_cast<uint64_t>(memory_.slots + slot * limits_.slot_bytes),
             limits_.slot_bytes, memory_.slots_lkey};
    if (absl::Status s = qp_.PostRecv(w); !s.ok()) return s;
    ++recv_posted_;
    counters_.receives_posted.Add_st(1);
  }
  Flush_st();
  return absl::OkStatus();
}

void VerbsReceiver::PeerReady_st() {
  if (!writes_held_) return;
  writes_held_ = false;
  Flush_st();
}

void VerbsReceiver::Repost(uint64_t slot) {
  RecvWork w;
  w.wr_id = slot;
  w.sge = {reinterpret_cast<uint64_t>(memory_.slots + slot * limits_.slot_bytes),
           limits_.slot_bytes, memory_.slots_lkey};
  if (absl::Status s = qp_.PostRecv(w); !s.ok()) return Fail(s);
  ++recv_posted_;
  counters_.receives_posted.Add_st(1);
}

void VerbsReceiver::QueueReply(uint64_t seq, ReplyKind kind, uint64_t addr, uint32_t rkey) {
  // At most one reply per segment, and the sender has at most reply_entries segments without
  // a reply: the ring cannot overflow unless the sender breaks that rule.
  if (replies_queued_ - replies_posted_ >= queued_replies_.size()) {
    return Fail(absl::DataLossError("verbs receiver: more segments than the sender's reply ring"));
  }
  ReplyEntry& e = queued_replies_[replies_queued_ & (queued_replies_.size() - 1)];
  e = ReplyEntry{};
  e.seq = static_cast<uint32_t>(seq);
  e.kind = static_cast<uint8_t>(kind);
  e.addr = addr;
  e.rkey = rkey;
  e.stamp = static_cast<uint32_t>(seq + 1);
  ++replies_queued_;
}

void VerbsReceiver::OnCompletion_st(const Completion& c) {
  CountCompletion(counters_, c);
  if (failed_) return;
  if (c.status != CompletionStatus::kSuccess) return Fail(CompletionError(c, "receiver"));
  switch (c.kind) {
    case CompletionKind::kSend:
      if (c.wr_id >= sq_posted_) {
        return Fail(absl::InternalError("verbs receiver: completion of a request never posted"));
      }
      sq_completed_ = std::max(sq_completed_, c.wr_id + 1);
      return;
    case CompletionKind::kRecv:
      OnReceive(c);
      break;
    case CompletionKind::kRecvWithImm:
      OnWriteArrived(c);
      break;
  }
  if (!failed_) Repost(c.wr_id);
}

void VerbsReceiver::OnReceive(const Completion& c) {
  if (c.wr_id >= limits_.recv_slots) {
    return Fail(absl::InternalError("verbs receiver: receive completion for no slot"));
  }
  if (c.byte_len < kFrameHeaderBytes) {
    return Fail(absl::DataLossError(
        absl::StrCat("verbs: a SEND of ", c.byte_len, " bytes is shorter than a frame header")));
  }
  const uint8_t* slot = memory_.slots + c.wr_id * limits_.slot_bytes;
  FrameHeader h;
  std::memcpy(&h, slot, sizeof(h));
  if (WireError e = CheckHeader(h, limits_.max_segment_bytes); e != WireError::kNone) {
    const std::string_view name = WireErrorName(e);
    return Fail(absl::DataLossError(absl::StrCat(
        "verbs: bad frame header (", absl::string_view(name.data(), name.size()), ")")));
  }
  const uint64_t payload = c.byte_len - kFrameHeaderBytes;
  const bool eager = payload == h.length;
  if (static_cast<FrameType>(h.type) != FrameType::kData ||
      h.seq != static_cast<uint32_t>(expected_seq_) || (!eager && payload != 0) ||
      (!eager && h.length <= limits_.eager_max_bytes() && (h.flags & kFlagRendezvous) == 0)) {
    return Fail(absl::DataLossError(absl::StrCat(
        "verbs: unexpected frame (type ", h.type, ", seq ", h.seq, ", ", payload,
        " payload bytes of ", h.length, ") where segment ", expected_seq_, " was due")));
  }
  const uint64_t seq = expected_seq_++;
  const SegmentTarget target = events_.ResolveSegment_st(h);
  if (!target.accept) {
    ++refused_;
    counters_.segments_refused.Add_st(1);
    peer_.frames_received.Add_st(1);
    events_.OnSegmentRefused_st(h);
    return QueueReply(seq, ReplyKind::kRefuse, 0, 0);
  }
  if (eager && !target.cpu_writable && payload > 0) {
    // A sender that ignored kFlagRendezvous: the CPU cannot place it in GPU memory.
    return Fail(absl::DataLossError(absl::StrCat(
        "verbs: segment ", seq, " came eagerly for a target in GPU memory (want rendezvous)")));
  }
  if (eager) {
    if (payload > 0) std::memcpy(target.local, slot + kFrameHeaderBytes, payload);
    ++placed_;
    counters_.eager_received.Add_st(1);
    counters_.eager_recv_bytes.Add_st(payload);
    peer_.frames_received.Add_st(1);
    peer_.bytes_received.Add_st(payload);
    events_.OnSegmentPlaced_st(h, target);
    return QueueReply(seq, ReplyKind::kAck, 0, 0);
  }
  Awaiting& a = awaiting_[seq & (awaiting_.size() - 1)];
  if (a.waiting) {
    return Fail(absl::DataLossError("verbs: more rendezvous segments than the reply ring"));
  }
  a.header = h;
  a.target = target;
  a.waiting = true;
  QueueReply(seq, ReplyKind::kClearToSend, target.remote_addr, target.rkey);
}

void VerbsReceiver::OnWriteArrived(const Completion& c) {
  Awaiting& a = awaiting_[c.imm & (awaiting_.size() - 1)];
  if (!a.waiting || a.header.seq != c.imm || c.byte_len != a.header.length) {
    return Fail(absl::DataLossError(absl::StrCat("verbs: a write with immediate ", c.imm, " of ",
                                                 c.byte_len, " bytes answers no clear-to-send")));
  }
  a.waiting = false;
  ++placed_;
  counters_.rendezvous_received.Add_st(1);
  counters_.rendezvous_recv_bytes.Add_st(c.byte_len);
  peer_.frames_received.Add_st(1);
  peer_.bytes_received.Add_st(c.byte_len);
  events_.OnSegmentPlaced_st(a.header, a.target);
}

int VerbsReceiver::Flush_st() {
  // Held: the sender cannot have used a credit yet (it has none), so nothing else is due either.
  if (failed_ || writes_held_) return 0;
  int posted = 0;
  auto room = [this] { return sq_posted_ - sq_completed_ < limits_.send_queue_depth; };
  auto post_write = [&](const void* value, uint32_t bytes, uint64_t remote) -> bool {
    // The staging slot of request n was last read by request n - depth, complete once room.
    uint8_t* staged = memory_.staging + (sq_posted_ % limits_.send_queue_depth) * kReplyEntryBytes;
    std::memcpy(staged, value, bytes);
    SendWork w;
    w.wr_id = sq_posted_;
    w.op = WorkOp::kWrite;
    w.sge[0] = {reinterpret_cast<uint64_t>(staged), bytes, memory_.staging_lkey};
    w.num_sge = 1;
    w.remote_addr = remote;
    w.rkey = memory_.peer_reply_rkey;
    w.signaled = sq_posted_ % limits_.signal_every == limits_.signal_every - 1;
    if (absl::Status s = qp_.PostSend(w); !s.ok()) {
      Fail(s);
      return false;
    }
    ++sq_posted_;
    ++posted;
    return true;
  };
  while (replies_posted_ < replies_queued_ && room()) {
    const ReplyEntry& e = queued_replies_[replies_posted_ & (queued_replies_.size() - 1)];
    const uint64_t remote =
        memory_.peer_reply_addr + (e.seq & (limits_.reply_entries - 1)) * kReplyEntryBytes;
    if (!post_write(&e, sizeof(e), remote)) return posted;
    ++replies_posted_;
    counters_.replies_written.Add_st(1);
  }
  if (recv_posted_ != credit_reported_ && room()) {
    const CreditWord word{recv_posted_};
    const uint64_t remote =
        memory_.peer_reply_addr + size_t{limits_.reply_entries} * kReplyEntryBytes;
    if (!post_write(&word, sizeof(word), remote)) return posted;
    credit_reported_ = recv_posted_;
    counters_.credit_writes.Add_st(1);
  }
  return posted;
}

void VerbsReceiver::Fail(const absl::Status& why, bool count) {
  if (failed_) return;
  failed_ = true;
  if (count) counters_.channel_failures.Add_st(1);
  events_.OnChannelDown_st(why);
}

}  // namespace gradlane::transport::verbs
