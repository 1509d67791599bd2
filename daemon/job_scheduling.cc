// The job's scheduling step: ready ranges into the policy, its dispatches to transport sends,
// credit returned per acknowledged Dispatch, and the online BO tuning of the credit window.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/job_runtime.h"
#include "daemon/log.h"

namespace gradlane::daemon {

using sched::TimeNs;

void JobRuntime::Ready_st(const sched::ReadyRange& r, TimeNs now) {
  policy_->OnReady(r, now);
  // gradlane switches schedules only where one of this rank's iterations starts (its trials,
  // then its choice), so only a push of a new iteration is checked: one line per switch, so
  // that a job's log says what it ran when. schedule_ is reserved for the longest name when the
  // job starts, so the copy does not allocate.
  if (r.direction == sched::Direction::kPush && r.iteration > schedule_iteration_) {
    schedule_iteration_ = r.iteration;
    if (policy_->schedule() != schedule_) {
      schedule_ = policy_->schedule();
      LogLine(absl::StrCat("job ", plan_.info.job_id, " rank ", plan_.rank, ": from iteration ",
                           r.iteration, " the schedule is ", schedule_));
    }
  }
  if (Telemetry* tm = telemetry()) {
    const JobTensor& t = plan_.tensors[r.tensor_id];
    const Part& p = plan_.parts[t.first_part + t.plan.PartitionOf(r.offset)];
    tm->Ready_st(telemetry_tag(), r.direction, r.peer, r.priority,
                 {sched::MakeKey(p.tensor, p.index), r.iteration, r.offset, r.length}, now);
  }
}

int JobRuntime::RunPolicy_st(TimeNs now) {
  if (failed_ || policy_ == nullptr) return 0;
  if (!all_up_ && plan_.world > 1) return 0;  // nothing goes before every peer is up
  int work = 0;
  if (allreduce()) ring_.FlushPlan_st(now);
  if (blocked_dispatch_ != kNoDispatch) {
    const uint32_t d = blocked_dispatch_;
    const size_t from = blocked_next_;
    blocked_dispatch_ = kNoDispatch;
    if (!SendDispatch_st(d, from, now)) return work;
    ++work;
  }
  while (!failed_ && policy_ != nullptr && policy_->NextDispatch(now, dispatch_)) {
    ++work;
    uint32_t d;
    if (!free_dispatches_.empty()) {
      d = free_dispatches_.back();
      free_dispatches_.pop_back();
    } else {
      d = static_cast<uint32_t>(dispatches_.size());
      dispatches_.emplace_back();
    }
    dispatches_[d] =
        DispatchRecord{dispatch_.bytes, static_cast<uint32_t>(dispatch_.segments.size())};
    if (dispatch_.segments.empty()) {
      free_dispatches_.push_back(d);
      policy_->OnAcked(dispatch_.bytes, now);
      continue;
    }
    if (Telemetry* tm = telemetry(); tm != nullptr && dispatch_.segments.size() > 1) {
      tm->Block_st(telemetry_tag(), dispatch_.segments.size(), dispatch_.bytes, now);
    }
    if (!SendDispatch_st(d, 0, now)) break;
  }
  return work;
}

bool JobRuntime::SendDispatch_st(uint32_t d, size_t from, TimeNs now) {
  const auto& segments = dispatch_.segments;
  transport::Transport& transport = host_.transport_st();
  for (size_t i = from; i < segments.size(); ++i) {
    const sched::Segment& seg = segments[i];
    transport::SendSpec spec;
    spec.iteration = seg.iteration;
    spec.offset = seg.offset;
    spec.length = seg.length;
    spec.priority = seg.priority;
    spec.dtype = seg.dtype;
    spec.direction = seg.direction;
    spec.schedule = policy_->Decision();
    const uint32_t tid = sched::KeyTensor(seg.key);
    Part* p = plan_.PartAt(tid, seg.offset);
    if (p == nullptr || seg.peer >= plan_.world || seg.peer == plan_.rank ||
        seg.offset + seg.length > p->offset + p->length) {
      Fail_st(GL_E_INTERNAL, "policy produced a segment outside the job");
      return false;
    }
    // The wire key is the engine's part, which the receiver checks against the offset; a
    // policy's own key may name a coarser partition (fifo: the whole tensor, while the engine
    // cuts at kMaxEnginePartitionBytes).
    spec.key = sched::MakeKey(tid, p->index);
    if (allreduce()) {
      ring_.SendSource(*p, seg, &spec.region, &spec.region_offset);
      spec.cookie = Cookie(seg.direction == sched::Direction::kPull ? kCookiePull : 0, d);
    } else if (seg.direction == sched::Direction::kPush) {
      const JobTensor& t = plan_.tensors[tid];
      if (t.device_region != transport::kNoRegion) {
        // Straight from GPU memory: the client staged only what the local shard reads. The
        // result comes back there too, which the shard must send by rendezvous.
        spec.region = t.device_region;
        spec.region_offset = t.device_offset + seg.offset;
        spec.gpudirect_flags = transport::kFlagDeviceResult;
      } else {
        spec.region = arena_region_;
        spec.region_offset = t.arena_offset + seg.offset;
      }
      spec.cookie = Cookie(0, d);
    } else {
      spec.region = shard_.slab_region();
      spec.region_offset = shard_.ResultOffset(*p) + (seg.offset - p->offset);
      spec.cookie = Cookie(kCookiePull, d);
      if (DeviceResult(seg.peer, tid)) spec.gpudirect_flags = transport::kFlagRendezvous;
    }
    JobPeer& peer = peers_[seg.peer];
    if (peer.left) {
      Fail_st(GL_E_DISCONNECTED, DepartureReason(seg.iteration, seg.peer));
      return false;
    }
    if (peer.out == transport::kNoPeer) {
      Fail_st(GL_E_DISCONNECTED, absl::StrCat("job ", id(), ": no connection to rank ", seg.peer));
      return false;
    }
    absl::Status s = transport.PostSend_st(peer.out, spec);
    if (absl::IsResourceExhausted(s)) {
      // The peer's send queue is full (a policy with a window larger than the queue, e.g.
      // fifo): wait for its acks instead of failing the job.
      blocked_dispatch_ = d;
      blocked_next_ = i;
      return false;
    }
    if (!s.ok()) {
      Fail_st(StatusFor(s),
              absl::StrCat("job ", id(), ": send to rank ", seg.peer, ": ", s.message()));
      return false;
    }
    estimator_.OnSend(seg.length, now);
    if (peer.send_tail - peer.send_head < peer.send_times.size()) {
      peer.send_times[peer.send_tail++ % peer.send_times.size()] = now;
    }
    ++segments_sent_;
    host_.counters_st().segments_sent.Add_st(1);
    if (Telemetry* tm = telemetry()) tm->Dispatched_st(telemetry_tag(), seg, now);
  }
  return true;
}

void JobRuntime::ReturnDispatch_st(uint32_t d, TimeNs now) {
  if (d >= dispatches_.size()) return;
  DispatchRecord& rec = dispatches_[d];
  if (rec.remaining == 0 || --rec.remaining > 0) return;
  if (policy_ != nullptr) policy_->OnAcked(rec.bytes, now);
  free_dispatches_.push_back(d);
}

void JobRuntime::TuneOnPost_st(int64_t iteration, uint64_t bytes, TimeNs now) {
  if (tuner_ == nullptr) return;
  tuner_->bytes += bytes;
  if (iteration > tuner_->last_iteration) {
    tuner_->last_iteration = iteration;
    TuneStep_st(now);
  }
}

void JobRuntime::TuneStep_st(TimeNs now) {
  Tuner& tu = *tuner_;
  if (tu.iterations == 0) {
    tu.trial = tu.tuner.Suggest();
    tu.started = now;
    tu.bytes = 0;
    tu.pending_apply = true;
  }
  // A new credit window can only replace the policy while nothing is queued or in flight.
  if (tu.pending_apply && policy_->queued_segments() == 0 && policy_->credit_in_use() == 0) {
    policy_config_.credit_bytes = tu.trial.credit_bytes;
    auto p = sched::MakePolicy(policy_config_);
    if (p.ok()) {
      policy_ = std::move(*p);
      policy_->SetRank(plan_.rank);
      for (JobTensor& t : plan_.tensors) policy_->RegisterTensor(t.spec);
      dispatches_.clear();
      free_dispatches_.clear();
    }
    tu.pending_apply = false;
    tu.started = now;
    tu.bytes = 0;
  }
  if (++tu.iterations <= host_.options().autotune_iterations_per_trial) return;
  const double secs = static_cast<double>(now - tu.started) / sched::kSecond;
  if (secs > 0 && tu.bytes > 0 && !tu.pending_apply && !tu.tuner.Done()) {
    if (tu.tuner.Observe(tu.trial, static_cast<double>(tu.bytes) / secs).ok()) {
      host_.counters_st().tuner_trials.Add_st(1);
    }
  }
  if (tu.tuner.Done()) {
    if (auto best = tu.tuner.Best(); best.ok() && !(best->params == tu.trial)) {
      tu.trial = best->params;
      tu.pending_apply = true;
    }
    tu.iterations = 1;
    return;
  }
  tu.iterations = 0;
}

}  // namespace gradlane::daemon
