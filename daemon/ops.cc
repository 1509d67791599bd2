#include "daemon/ops.h"

#include <systemd/sd-daemon.h>

#include <cmath>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/config.h"

ABSL_FLAG(std::string, metrics_address, "",
          "Prometheus endpoint HOST:PORT serving /metrics (empty: none; port 0 picks a free one)");
ABSL_FLAG(std::string, admin_socket, "",
          "admin Unix socket for gradlanectl (empty: next to --socket, as NAME.admin.sock; "
          "'none': no admin socket)");
ABSL_FLAG(std::string, link_capacity, "0",
          "rate of the NIC port, e.g. 25gbit or 400mbit, exported for link utilization (0: "
          "unknown)");
ABSL_FLAG(absl::Duration, job_retention, absl::Seconds(300),
          "how long an ended or failed job stays in gradlanectl jobs and the metrics");
ABSL_FLAG(uint64_t, trace_max_spans, uint64_t{1} << 20,
          "largest span buffer one gradlanectl trace may use (about 80 bytes a span)");

namespace gradlane::daemon {

absl::StatusOr<double> ParseLinkRate(absl::string_view rate) {
  std::string r = absl::AsciiStrToLower(rate);
  double mult = 1;
  for (const auto& [suffix, m] : {std::pair<const char*, double>{"tbit", 1e12},
                                  {"gbit", 1e9},
                                  {"mbit", 1e6},
                                  {"kbit", 1e3},
                                  {"bit", 1}}) {
    const std::string s = suffix;
    if (r.size() > s.size() && r.compare(r.size() - s.size(), s.size(), s) == 0) {
      r.resize(r.size() - s.size());
      mult = m;
      break;
    }
  }
  double v = 0;
  if (!absl::SimpleAtod(r, &v) || !std::isfinite(v) || v < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--link_capacity: '", rate, "' is not a rate (e.g. 25gbit, 400mbit, 0 for unknown)"));
  }
  return v * mult / 8;
}

absl::StatusOr<OpsConfig> OpsConfigFromFlags(const std::string& client_socket) {
  OpsConfig c;
  c.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  if (!c.metrics_address.empty()) {
    if (auto hp = ParseHostPort(c.metrics_address); !hp.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--metrics_address: ", hp.status().message()));
    }
  }
  c.admin_socket = absl::GetFlag(FLAGS_admin_socket);
  if (c.admin_socket.empty()) {
    c.admin_socket = DefaultAdminSocket(client_socket);
  } else if (c.admin_socket == "none") {
    c.admin_socket.clear();
  }
  if (!c.admin_socket.empty() && c.admin_socket == client_socket) {
    return absl::InvalidArgumentError("--admin_socket is the client socket (--socket)");
  }
  auto rate = ParseLinkRate(absl::GetFlag(FLAGS_link_capacity));
  if (!rate.ok()) return rate.status();
  c.link_bytes_per_second = *rate;
  const absl::Duration retention = absl::GetFlag(FLAGS_job_retention);
  if (retention < absl::ZeroDuration() || retention > absl::Hours(24 * 7)) {
    return absl::InvalidArgumentError("--job_retention must be between 0s and 168h");
  }
  c.job_retention = absl::ToInt64Nanoseconds(retention);
  c.trace_max_spans = absl::GetFlag(FLAGS_trace_max_spans);
  if (c.trace_max_spans < 1 || c.trace_max_spans > (uint64_t{1} << 26)) {
    return absl::InvalidArgumentError("--trace_max_spans must be 1..67108864");
  }
  return c;
}

absl::StatusOr<std::unique_ptr<OpsServices>> OpsServices::Start(const OpsConfig& config,
                                                                HubSources sources) {
  if (sources.telemetry == nullptr) return absl::InvalidArgumentError("no telemetry");
  auto ops = std::unique_ptr<OpsServices>(new OpsServices());
  ops->config_ = config;
  sources.link_bytes_per_second = config.link_bytes_per_second;
  sources.job_retention = config.job_retention;
  ops->hub_ = std::make_unique<TelemetryHub>(std::move(sources));
  if (!config.metrics_address.empty()) {
    auto m = MetricsServer::Start(config.metrics_address, ops->hub_.get());
    if (!m.ok()) return m.status();
    ops->metrics_ = std::move(*m);
    auto hp = ParseHostPort(config.metrics_address);
    std::string host = hp->first;
    if (host.find(':') != std::string::npos) host = absl::StrCat("[", host, "]");
    ops->metrics_endpoint_ = absl::StrCat(host, ":", ops->metrics_->port());
  }
  AdminOptions ao;
  ao.socket_path = config.admin_socket;
  ao.metrics_address = ops->metrics_endpoint_;
  ao.max_trace_spans = config.trace_max_spans;
  auto a = AdminServer::Start(ao, ops->hub_.get());
  if (!a.ok()) return a.status();
  ops->admin_ = std::move(*a);
  return ops;
}

OpsServices::~OpsServices() {
  admin_.reset();    // its thread uses the hub
  metrics_.reset();  // so do the exposer's
  hub_.reset();
}

SystemdNotifier::SystemdNotifier() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0) watchdog_ns_ = static_cast<sched::TimeNs>(usec) * 1000;
}

void SystemdNotifier::Ready(const std::string& status) {
  (void)sd_notify(0, absl::StrCat("READY=1\nSTATUS=", status).c_str());
}

void SystemdNotifier::Stopping() { (void)sd_notify(0, "STOPPING=1\nSTATUS=shutting down"); }

void SystemdNotifier::Status(const std::string& status) {
  (void)sd_notify(0, absl::StrCat("STATUS=", status).c_str());
}

void SystemdNotifier::PingWatchdog() { (void)sd_notify(0, "WATCHDOG=1"); }

}  // namespace gradlane::daemon
