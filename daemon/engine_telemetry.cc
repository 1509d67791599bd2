// daemon/engine_telemetry.cc — the engine's side of the operator telemetry: the heartbeat and the
// periodic snapshot of jobs, peers, queues and estimates (daemon/telemetry.h). Runs in
// housekeeping on the engine thread; it fills a reused buffer (no allocation once the job table
// and the strings have reached their size) and never waits for the reader.
#include <algorithm>

#include "daemon/engine.h"
#include "daemon/engine_internal.h"

namespace gradlane::daemon {

void Engine::PublishTelemetry_st(sched::TimeNs now) {
  Telemetry& tm = *options_.telemetry;
  if (!tm.Tick_st(now)) return;
  EngineSnapshot& s = tm.SnapshotBack_st();
  s.taken_at = now;
  s.listen_port = listen_port_;
  uint32_t n = 0;
  for (const auto& jp : jobs_) {
    if (jp == nullptr) continue;
    const Job& job = *jp;
    if (s.jobs.size() <= n) s.jobs.emplace_back();
    JobSnapshot& js = s.jobs[n++];
    js.slot = job.slot;
    js.generation = job.generation;
    js.id = job.info.job_id;
    js.rank = job.rank;
    js.world = job.world;
    js.policy = job.policy_name;
    if (job.failed && job.fail_status == GL_E_DISCONNECTED && job.posts_failed == 0 &&
        server_->FindSession(job.session_id) == nullptr) {
      js.phase = "ended";  // its client closed; not a failure
    } else if (job.failed) {
      js.phase = "failed";
    } else if (job.phase == Job::Phase::kDraining) {
      js.phase = "draining";
    } else if (job.phase == Job::Phase::kLeaving) {
      js.phase = "leaving";
    } else if (!job.all_up && job.world > 1) {
      js.phase = "connecting";
    } else {
      js.phase = "active";
    }
    js.fail_reason = job.fail_reason;
    js.tensors = static_cast<uint32_t>(job.tensors.size());
    js.total_bytes = job.total_bytes;
    js.partitions = static_cast<uint32_t>(job.parts.size());
    js.owned_partitions = static_cast<uint32_t>(job.owned.size());
    js.posts_pending = job.posts_pending;
    js.posts_completed = job.posts_completed;
    js.posts_failed = job.posts_failed;
    js.segments_sent = job.segments_sent;
    js.segments_received = job.segments_received;
    js.segments_rejected = job.segments_rejected;
    js.rounds_reduced = job.rounds_reduced;
    js.queued_segments = job.policy != nullptr ? job.policy->queued_segments() : 0;
    js.credit_in_use = job.policy != nullptr ? job.policy->credit_in_use() : 0;
    js.credit_window = job.policy_config.credit_bytes;
    const sched::BandwidthEstimator& e = job.estimator;
    js.bandwidth_bytes_per_s = e.BytesPerSecond().value_or(-1.0);
    js.srtt_ns = e.SmoothedRtt().value_or(-1);
    js.rttvar_ns = e.RttVariation().value_or(-1);
    js.min_rtt_ns = e.MinRtt().value_or(-1);
    js.bdp_bytes = e.BdpBytes();
    js.busy_ns = e.total_busy_time();
    js.acked_bytes = e.total_acked_bytes();
    js.outstanding_bytes = e.outstanding_bytes();
    js.peers_up = job.peers_up;
    uint32_t np = 0;
    for (uint16_t r = 0; r < job.peers.size(); ++r) {
      if (r == job.rank) continue;
      const JobPeer& p = job.peers[r];
      if (js.peers.size() <= np) js.peers.emplace_back();
      PeerSnapshot& ps = js.peers[np++];
      ps.rank = r;
      ps.address = p.address;
      ps.state = p.state == PeerState::kUp     ? PeerStateName::kUp
                 : p.state == PeerState::kDown ? PeerStateName::kDown
                                               : PeerStateName::kConnecting;
      ps.manifest_ok = p.manifest_ok;
      ps.left = p.left;
      ps.connect_attempts = p.connect_attempts;
      transport::PeerStats out{}, in{};
      if (p.out != transport::kNoPeer) out = transport_->PeerStatsOf(p.out);
      if (p.in != transport::kNoPeer) in = transport_->PeerStatsOf(p.in);
      ps.bytes_sent = out.bytes_sent + in.bytes_sent;
      ps.bytes_received = out.bytes_received + in.bytes_received;
      ps.frames_sent = out.frames_sent + in.frames_sent;
      ps.frames_received = out.frames_received + in.frames_received;
      ps.sends_failed = out.sends_failed + in.sends_failed;
    }
    js.peer_count = np;
  }
  s.job_count = n;
  tm.PublishSnapshot_st();
}


}  // namespace gradlane::daemon
