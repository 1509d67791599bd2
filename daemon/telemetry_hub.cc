#include "daemon/telemetry_hub.h"

#include <time.h>

#include <utility>

namespace gradlane::daemon {

TelemetryHub::TelemetryHub(HubSources sources)
    : sources_(std::move(sources)),
      started_at_(SessionServer::MonotonicNow()),
      started_unix_(0),
      state_(sources_.job_retention) {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  started_unix_ = static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
  scratch_.reserve(4096);
}

void TelemetryHub::PumpLocked() {
  const sched::TimeNs now = SessionServer::MonotonicNow();
  // Snapshot first: events of a job are then usually matched to a job the state already knows.
  state_.OnSnapshot(sources_.telemetry->snapshots().Latest(), now);
  EventRing& ring = sources_.telemetry->ring();
  for (;;) {
    scratch_.clear();
    if (ring.Drain(scratch_, 4096) == 0) break;
    for (const TelemetryEvent& e : scratch_) state_.OnEvent(e);
  }
}

}  // namespace gradlane::daemon
