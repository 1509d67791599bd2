// daemon/ops.h — what makes gradlaned operable, wired together for main: the telemetry hub, the
// Prometheus endpoint (daemon/metrics.h), the admin socket for gradlanectl
// (daemon/admin_server.h), their flags, and systemd notification (READY, STOPPING, WATCHDOG
// through libsystemd's sd_notify).
//
// Flags (docs/daemon.md, docs/operations.md):
//   --metrics_address=HOST:PORT  Prometheus /metrics ("" disables; the shipped flagfile uses
//                                0.0.0.0:9464)
//   --admin_socket=PATH          gradlanectl's socket ("" : next to --socket, e.g.
//                                /run/gradlane/gradlaned.admin.sock; "none" disables)
//   --link_capacity=RATE         the NIC port's rate (e.g. 25gbit) for link utilization; 0: unknown
//   --trace_max_spans=N          span buffer of one `gradlanectl trace`
//
// Thread rules: everything from main. Guarantees: a bad flag, a busy metrics port or a live
// daemon on the admin socket is an error status naming it; nothing is left listening then.
#ifndef GRADLANE_DAEMON_OPS_H_
#define GRADLANE_DAEMON_OPS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/admin_server.h"
#include "daemon/metrics.h"
#include "daemon/telemetry_hub.h"

namespace gradlane::daemon {

struct OpsConfig {
  std::string metrics_address;  // empty: no endpoint
  std::string admin_socket;     // empty: no admin socket
  double link_bytes_per_second = 0;
  size_t trace_max_spans = 1 << 20;
  sched::TimeNs job_retention = 300 * sched::kSecond;  // ended jobs kept for gradlanectl/metrics
};

// "25gbit", "400mbit", "1e9" (bits per second) -> bytes per second; "0" -> 0.
absl::StatusOr<double> ParseLinkRate(absl::string_view rate);

// Reads the ops flags (after absl::ParseCommandLine); `client_socket` places the default admin
// socket.
absl::StatusOr<OpsConfig> OpsConfigFromFlags(const std::string& client_socket);

class OpsServices {
 public:
  // `sources.telemetry` must be the engine's (EngineOptions::telemetry).
  static absl::StatusOr<std::unique_ptr<OpsServices>> Start(const OpsConfig& config,
                                                            HubSources sources);
  ~OpsServices();
  // "HOST:PORT" actually bound ("" without an endpoint).
  const std::string& metrics_endpoint() const { return metrics_endpoint_; }
  const std::string& admin_socket() const { return config_.admin_socket; }
  TelemetryHub& hub() { return *hub_; }

 private:
  OpsServices() = default;
  OpsConfig config_;
  std::string metrics_endpoint_;
  std::unique_ptr<TelemetryHub> hub_;
  std::unique_ptr<MetricsServer> metrics_;
  std::unique_ptr<AdminServer> admin_;
};

// systemd's notification socket ($NOTIFY_SOCKET; all no-ops without it).
class SystemdNotifier {
 public:
  SystemdNotifier();
  void Ready(const std::string& status);
  void Stopping();
  void Status(const std::string& status);
  // Watchdog interval systemd asked for (WatchdogSec=), 0 when none.
  sched::TimeNs watchdog_interval() const { return watchdog_ns_; }
  void PingWatchdog();

 private:
  sched::TimeNs watchdog_ns_ = 0;
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_OPS_H_
