// daemon/telemetry_hub.h — where the control threads (the admin server's, the Prometheus
// exposer's) meet the engine's telemetry: one TelemetryState behind one mutex, fed from the
// engine's event ring and snapshots by whoever reads first (Pump), plus the engine's and the
// transport's own counters, which any thread may read.
//
// The engine thread never touches the mutex: it only writes the ring and the snapshot buffers
// (daemon/telemetry.h). Pumping is cheap (a ring drain and a pointer swap), so both readers pump
// before they look: a scrape or a gradlanectl command sees events up to that moment.
//
// Thread rules: every method from any thread except the engine's. The state and the drain
// buffer are ABSL_GUARDED_BY(mu_) (daemon/mutex.h; checked by clang's -Wthread-safety); the rest
// is fixed at construction, and the sources' counters are atomics.
#ifndef GRADLANE_DAEMON_TELEMETRY_HUB_H_
#define GRADLANE_DAEMON_TELEMETRY_HUB_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "daemon/engine.h"
#include "daemon/mutex.h"
#include "daemon/telemetry.h"
#include "daemon/telemetry_state.h"
#include "transport/transport.h"

namespace gradlane::daemon {

struct HubSources {
  Telemetry* telemetry = nullptr;                              // required
  std::function<EngineStats()> engine_stats;                   // optional
  std::function<transport::TransportStats()> transport_stats;  // optional
  std::function<SessionServerStats()> session_stats;           // optional
  // The backend's name, device and own counters (Transport::DescribeBackend); optional. May
  // read files (the verbs port counters): called per scrape or status request, not cached.
  std::function<transport::BackendDescription()> backend;
  // The NIC port's rate for utilization (bytes/s); 0: unknown (not exported).
  double link_bytes_per_second = 0;
  std::string version;
  sched::TimeNs job_retention = 300 * sched::kSecond;
};

class TelemetryHub {
 public:
  explicit TelemetryHub(HubSources sources);

  // Runs `f(state)` with the state up to date (ring drained, latest snapshot applied), under the
  // hub's lock. `f` must not call back into the hub.
  template <class F>
  auto With(F&& f) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    PumpLocked();
    return f(state_);
  }

  EngineStats engine_stats() const {
    return sources_.engine_stats ? sources_.engine_stats() : EngineStats{};
  }
  transport::TransportStats transport_stats() const {
    return sources_.transport_stats ? sources_.transport_stats() : transport::TransportStats{};
  }
  SessionServerStats session_stats() const {
    return sources_.session_stats ? sources_.session_stats() : SessionServerStats{};
  }
  transport::BackendDescription backend() const {
    return sources_.backend ? sources_.backend() : transport::BackendDescription{};
  }
  uint64_t events_dropped() const { return sources_.telemetry->ring().dropped(); }
  sched::TimeNs heartbeat() const { return sources_.telemetry->heartbeat(); }
  const HubSources& sources() const { return sources_; }
  sched::TimeNs started_at() const { return started_at_; }       // monotonic
  double started_unix_seconds() const { return started_unix_; }  // wall clock

 private:
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const HubSources sources_;
  const sched::TimeNs started_at_;
  double started_unix_;  // set in the constructor, then read-only
  Mutex mu_;
  TelemetryState state_ ABSL_GUARDED_BY(mu_);
  std::vector<TelemetryEvent> scratch_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_TELEMETRY_HUB_H_
