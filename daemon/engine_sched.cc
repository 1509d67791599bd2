// daemon/engine_sched.cc — the engine's scheduling step: policy dispatches to transport sends, credit
// returned per acknowledged Dispatch, and the online BO tuning of the credit window.
#include "daemon/engine.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/engine_internal.h"

namespace gradlane::daemon {

using sched::TimeNs;
using transport::PeerHandle;
using transport::RecvTarget;
using namespace engine_internal;  // NOLINT: cookies and status helpers of this module

// -------------------------------------------------------------------------- scheduling ----

int Engine::RunPolicy_st(Job& job, TimeNs now) {
  if (!job.all_up && job.world > 1) return 0;  // nothing goes before every peer is up
  int work = 0;
  if (job.blocked_dispatch != kNoDispatch) {
    const uint32_t d = job.blocked_dispatch;
    const size_t from = job.blocked_next;
    job.blocked_dispatch = kNoDispatch;
    if (!SendDispatch_st(job, d, from, now)) return work;
    ++work;
  }
  while (!job.failed && job.policy != nullptr && job.policy->NextDispatch(now, job.dispatch)) {
    ++work;
    uint32_t d;
    if (!job.free_dispatches.empty()) {
      d = job.free_dispatches.back();
      job.free_dispatches.pop_back();
    } else {
      d = static_cast<uint32_t>(job.dispatches.size());
      job.dispatches.emplace_back();
    }
    job.dispatches[d] = DispatchRecord{job.dispatch.bytes,
                                       static_cast<uint32_t>(job.dispatch.segments.size())};
    if (job.dispatch.segments.empty()) {
      job.free_dispatches.push_back(d);
      job.policy->OnAcked(job.dispatch.bytes, now);
      continue;
    }
    if (options_.telemetry != nullptr && job.dispatch.segments.size() > 1) {
      options_.telemetry->Emit_st({EventType::kBlock, 0, 0, job.slot, job.generation, 0,
                                   job.dispatch.segments.size(), 0, 0, job.dispatch.bytes, 0, now});
    }
    if (!SendDispatch_st(job, d, 0, now)) break;
  }
  return work;
}

bool Engine::SendDispatch_st(Job& job, uint32_t d, size_t from, TimeNs now) {
  const auto& segments = job.dispatch.segments;
  for (size_t i = from; i < segments.size(); ++i) {
    const sched::Segment& seg = segments[i];
    transport::SendSpec spec;
    spec.iteration = seg.iteration;
    spec.offset = seg.offset;
    spec.length = seg.length;
    spec.priority = seg.priority;
    spec.dtype = seg.dtype;
    spec.direction = seg.direction;
    const uint32_t tid = sched::KeyTensor(seg.key);
    Part* p = PartAt(job, tid, seg.offset);
    if (p == nullptr || seg.peer >= job.world || seg.peer == job.rank ||
        seg.offset + seg.length > p->offset + p->length) {
      FailJob_st(job, GL_E_INTERNAL, "policy produced a segment outside the job");
      return false;
    }
    // The wire key is the engine's part, which the receiver checks against the offset; a
    // policy's own key may name a coarser partition (fifo: the whole tensor, while the engine
    // cuts at kMaxEnginePartitionBytes).
    spec.key = sched::MakeKey(tid, p->index);
    if (seg.direction == sched::Direction::kPush) {
      spec.region = job.arena_region;
      spec.region_offset = job.tensors[tid].arena_offset + seg.offset;
      spec.cookie = MakeCookie(job.slot, job.generation, 0, d);
    } else {
      const OwnedPart& o = job.owned[p->owned];
      spec.region = job.slab_region;
      spec.region_offset =
          o.slab_offset + uint64_t{job.rank} * p->length + (seg.offset - p->offset);
      spec.cookie = MakeCookie(job.slot, job.generation, kCookiePull, d);
    }
    JobPeer& peer = job.peers[seg.peer];
    if (peer.left) {
      FailJob_st(job, GL_E_DISCONNECTED, DepartureReason(job, seg.iteration, seg.peer));
      return false;
    }
    if (peer.out == transport::kNoPeer) {
      FailJob_st(job, GL_E_DISCONNECTED, absl::StrCat("job ", job.info.job_id,
                                                      ": no connection to rank ", seg.peer));
      return false;
    }
    absl::Status s = transport_->PostSend_st(peer.out, spec);
    if (absl::IsResourceExhausted(s)) {
      // The peer's send queue is full (a policy with a window larger than the queue, e.g.
      // fifo): wait for its acks instead of failing the job.
      job.blocked_dispatch = d;
      job.blocked_next = i;
      return false;
    }
    if (!s.ok()) {
      FailJob_st(job, StatusFor(s), absl::StrCat("job ", job.info.job_id, ": send to rank ",
                                                 seg.peer, ": ", s.message()));
      return false;
    }
    job.estimator.OnSend(seg.length, now);
    if (peer.send_tail - peer.send_head < peer.send_times.size()) {
      peer.send_times[peer.send_tail++ % peer.send_times.size()] = now;
    }
    ++job.segments_sent;
    counters_.segments_sent.Add_st(1);
    if (options_.telemetry != nullptr) {
      options_.telemetry->Segment_st(EventType::kDispatched, job.slot, job.generation, seg,
                                     seg.ready_at, now);
    }
  }
  return true;
}

void Engine::ReturnDispatch_st(Job& job, uint32_t d, TimeNs now) {
  if (d >= job.dispatches.size()) return;
  DispatchRecord& rec = job.dispatches[d];
  if (rec.remaining == 0 || --rec.remaining > 0) return;
  if (job.policy != nullptr) job.policy->OnAcked(rec.bytes, now);
  job.free_dispatches.push_back(d);
}

void Engine::TuneStep_st(Job& job, TimeNs now) {
  auto it = tuners_.find(job.slot);
  if (it == tuners_.end()) return;
  Tuner& tu = *it->second;
  if (tu.iterations == 0) {
    tu.trial = tu.tuner.Suggest();
    tu.started = now;
    tu.bytes = 0;
    tu.pending_apply = true;
  }
  // A new credit window can only replace the policy while nothing is queued or in flight.
  if (tu.pending_apply && job.policy->queued_segments() == 0 && job.policy->credit_in_use() == 0) {
    job.policy_config.credit_bytes = tu.trial.credit_bytes;
    auto p = sched::MakePolicy(job.policy_config);
    if (p.ok()) {
      job.policy = std::move(*p);
      for (JobTensor& t : job.tensors) job.policy->RegisterTensor(t.spec);
      job.dispatches.clear();
      job.free_dispatches.clear();
    }
    tu.pending_apply = false;
    tu.started = now;
    tu.bytes = 0;
  }
  if (++tu.iterations <= options_.autotune_iterations_per_trial) return;
  const double secs = static_cast<double>(now - tu.started) / sched::kSecond;
  if (secs > 0 && tu.bytes > 0 && !tu.pending_apply && !tu.tuner.Done()) {
    if (tu.tuner.Observe(tu.trial, static_cast<double>(tu.bytes) / secs).ok()) {
      counters_.tuner_trials.Add_st(1);
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
