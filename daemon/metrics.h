// daemon/metrics.h — gradlaned's Prometheus endpoint (prometheus-cpp pull exposer, `/metrics`).
//
// One Collectable builds every family at scrape time from the TelemetryHub (counters the engine
// and transport keep in relaxed atomics, the latest engine snapshot, and the histograms folded
// from the engine's events), so nothing on the engine thread knows about Prometheus and series
// of a job that ended disappear after the hub's retention time. Names follow the Prometheus
// conventions (base units in the name, `_total` counters, `_seconds` histograms); labels are
// bounded: job_id, peer (daemon address), direction (push|pull), priority_class (8 values, see
// PriorityClass) and kind — never a tensor. The job label is `job_id`, not `job`: Prometheus
// gives every scraped series its scrape job's name as `job` and would rename ours to
// `exported_job`. docs/operations.md lists every family.
//
// Thread rules: Start on the main thread; scrapes run on the exposer's own threads.
#ifndef GRADLANE_DAEMON_METRICS_H_
#define GRADLANE_DAEMON_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/telemetry_hub.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"

namespace gradlane::daemon {

// Builds every metric family from the hub (the /metrics body, before serialization).
std::vector<prometheus::MetricFamily> CollectMetrics(TelemetryHub& hub);

class MetricsServer {
 public:
  // Listens on "HOST:PORT" (port 0: a free one). A busy port or bad address is an error status
  // naming the address (prometheus-cpp reports them as exceptions; caught here).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                              TelemetryHub* hub);
  ~MetricsServer();
  // The port actually bound.
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::shared_ptr<prometheus::Collectable> collectable_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_METRICS_H_
