// The engine's side of the operator telemetry: the heartbeat and the periodic snapshot of jobs,
// peers, queues and estimates (daemon/telemetry.h). Runs in housekeeping on the engine thread;
// it fills a reused buffer (no allocation once the job table and the strings have reached their
// size) and never waits for the reader.
#include "daemon/engine.h"

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
    if (s.jobs.size() <= n) s.jobs.emplace_back();
    jp->FillSnapshot_st(s.jobs[n++], server_->FindSession_st(jp->session_id()) != nullptr);
  }
  s.job_count = n;
  tm.PublishSnapshot_st();
}

}  // namespace gradlane::daemon
