#include "tests/fakes/fake_verbs.h"

#include <cstring>

namespace gradlane::transport::verbs::fake {

MemoryKeys FakeNic::Register(void* base, uint64_t bytes, bool remote_write) {
  Region r{static_cast<uint8_t*>(base), bytes, next_key_, next_key_ + 1, remote_write};
  next_key_ += 2;
  regions_.push_back(r);
  return {r.lkey, r.rkey};
}

bool FakeNic::Deregister(uint32_t lkey) {
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (regions_[i].lkey == lkey) {
      regions_.erase(regions_.begin() + static_cast<ptrdiff_t>(i));
      return true;
    }
  }
  return false;
}

std::pair<FakeQueuePair*, FakeQueuePair*> FakeNic::ConnectedPair() {
  queue_pairs_.push_back(std::unique_ptr<FakeQueuePair>(new FakeQueuePair(*this)));
  FakeQueuePair* a = queue_pairs_.back().get();
  queue_pairs_.push_back(std::unique_ptr<FakeQueuePair>(new FakeQueuePair(*this)));
  FakeQueuePair* b = queue_pairs_.back().get();
  a->peer_ = b;
  b->peer_ = a;
  return {a, b};
}

int FakeNic::Run(int steps) {
  int ran = 0;
  while (ran < steps) {
    bool any = false;
    for (size_t i = 0; i < queue_pairs_.size() && ran < steps; ++i) {
      FakeQueuePair& qp = *queue_pairs_[(next_to_run_ + i) % queue_pairs_.size()];
      if (qp.Step()) {
        ++ran;
        any = true;
        next_to_run_ = (next_to_run_ + i + 1) % queue_pairs_.size();
        break;
      }
    }
    if (!any) break;
  }
  return ran;
}

uint8_t* FakeNic::Local(const LocalSpan& span) const {
  for (const Region& r : regions_) {
    if (r.lkey == span.lkey && span.addr >= reinterpret_cast<uint64_t>(r.base) &&
        span.addr + span.length <= reinterpret_cast<uint64_t>(r.base) + r.bytes) {
      return reinterpret_cast<uint8_t*>(span.addr);
    }
  }
  return nullptr;
}

uint8_t* FakeNic::Remote(uint64_t addr, uint64_t bytes, uint32_t rkey) const {
  for (const Region& r : regions_) {
    if (r.rkey == rkey && r.remote_write && addr >= reinterpret_cast<uint64_t>(r.base) &&
        addr + bytes <= reinterpret_cast<uint64_t>(r.base) + r.bytes) {
      return reinterpret_cast<uint8_t*>(addr);
    }
  }
  return nullptr;
}

absl::Status FakeQueuePair::PostSend(const SendWork& work) {
  if (in_error_) return absl::FailedPreconditionError("queue pair in error");
  if (work.num_sge > 2) return absl::InvalidArgumentError("more than two gather elements");
  send_queue_.push_back(work);
  ++sends_;
  if (work.signaled) ++signaled_;
  return absl::OkStatus();
}

absl::Status FakeQueuePair::PostRecv(const RecvWork& work) {
  if (in_error_) return absl::FailedPreconditionError("queue pair in error");
  recv_queue_.push_back(work);
  return absl::OkStatus();
}

std::vector<Completion> FakeQueuePair::TakeCompletions() {
  std::vector<Completion> out;
  out.swap(completions_);
  return out;
}

void FakeQueuePair::EnterError() {
  if (in_error_) return;
  in_error_ = true;
  for (const SendWork& w : send_queue_) {
    Complete({w.wr_id, CompletionKind::kSend, CompletionStatus::kFlushed, 0, 0});
  }
  send_queue_.clear();
  for (const RecvWork& w : recv_queue_) {
    Complete({w.wr_id, CompletionKind::kRecv, CompletionStatus::kFlushed, 0, 0});
  }
  recv_queue_.clear();
}

bool FakeQueuePair::Step() {
  if (send_queue_.empty() || in_error_) return false;
  const SendWork w = send_queue_.front();
  send_queue_.pop_front();
  auto fail = [&](CompletionStatus status, bool peer_too) {
    Complete({w.wr_id, CompletionKind::kSend, status, 0, 0});
    EnterError();
    if (peer_too) peer_->EnterError();  // an RC error breaks the connection at both ends
    return true;
  };
  if (fail_next_) {
    const CompletionStatus status = *fail_next_;
    fail_next_.reset();
    return fail(status, true);
  }
  // Gather the local bytes.
  std::vector<uint8_t> bytes;
  for (int i = 0; i < w.num_sge; ++i) {
    const uint8_t* src = nic_.Local(w.sge[i]);
    if (src == nullptr && w.sge[i].length > 0) return fail(CompletionStatus::kLocalError, false);
    bytes.insert(bytes.end(), src, src + w.sge[i].length);
  }
  FakeQueuePair& peer = *peer_;
  if (peer.in_error_ || !peer.ready_to_receive_)
    return fail(CompletionStatus::kRetryExceeded, false);
  if (w.op == WorkOp::kWrite || w.op == WorkOp::kWriteWithImm) {
    uint8_t* dst = nic_.Remote(w.remote_addr, bytes.size(), w.rkey);
    if (dst == nullptr) return fail(CompletionStatus::kRemoteAccessError, true);
    if (w.op == WorkOp::kWriteWithImm && peer.recv_queue_.empty()) {
      ++nic_.rnr_errors_;
      return fail(CompletionStatus::kReceiverNotReady, true);
    }
    if (!bytes.empty()) std::memcpy(dst, bytes.data(), bytes.size());
    if (w.op == WorkOp::kWriteWithImm) {
      const RecvWork r = peer.recv_queue_.front();
      peer.recv_queue_.pop_front();
      peer.Complete({r.wr_id, CompletionKind::kRecvWithImm, CompletionStatus::kSuccess,
                     static_cast<uint32_t>(bytes.size()), w.imm});
    }
  } else {
    if (peer.recv_queue_.empty()) {
      ++nic_.rnr_errors_;
      return fail(CompletionStatus::kReceiverNotReady, true);
    }
    const RecvWork r = peer.recv_queue_.front();
    peer.recv_queue_.pop_front();
    uint8_t* dst = nic_.Local(r.sge);
    if (bytes.size() > r.sge.length || (dst == nullptr && !bytes.empty())) {
      peer.Complete({r.wr_id, CompletionKind::kRecv, CompletionStatus::kLocalError, 0, 0});
      peer.EnterError();
      return fail(CompletionStatus::kRemoteAccessError, false);
    }
    if (!bytes.empty()) std::memcpy(dst, bytes.data(), bytes.size());
    peer.Complete({r.wr_id, CompletionKind::kRecv, CompletionStatus::kSuccess,
                   static_cast<uint32_t>(bytes.size()), 0});
  }
  if (w.signaled) Complete({w.wr_id, CompletionKind::kSend, CompletionStatus::kSuccess, 0, 0});
  return true;
}

}  // namespace gradlane::transport::verbs::fake
