#include "daemon/metrics.h"

#include <exception>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/config.h"
#include "transport/wire.h"

namespace gradlane::daemon {

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

const char* kDirectionNames[kDirections] = {"push", "pull"};

class Families {
 public:
  // The family called `name`, created on first use: counters that share a family (by label)
  // may be emitted from different places, and a family must appear once in an exposition.
  MetricFamily& Family(const std::string& name, const std::string& help, MetricType type) {
    for (MetricFamily& f : out_) {
      if (f.name == name) return f;
    }
    out_.push_back(MetricFamily{name, help, type, {}});
    return out_.back();
  }
  // One sample of a family created just before (families are filled in order).
  void Counter(MetricFamily& f, Labels labels, double v) {
    ClientMetric m;
    m.label = std::move(labels);
    m.counter.value = v;
    f.metric.push_back(std::move(m));
  }
  void Gauge(MetricFamily& f, Labels labels, double v) {
    ClientMetric m;
    m.label = std::move(labels);
    m.gauge.value = v;
    f.metric.push_back(std::move(m));
  }
  void Hist(MetricFamily& f, Labels labels, const Histogram& h) {
    ClientMetric m;
    m.label = std::move(labels);
    m.histogram.sample_count = h.count();
    m.histogram.sample_sum = h.sum();
    uint64_t cum = 0;
    for (size_t i = 0; i < h.counts().size(); ++i) {
      cum += h.counts()[i];
      const double ub =
          i < h.bounds().size() ? h.bounds()[i] : std::numeric_limits<double>::infinity();
      m.histogram.bucket.push_back(ClientMetric::Bucket{cum, ub});
    }
    f.metric.push_back(std::move(m));
  }
  std::vector<MetricFamily> Take() { return std::move(out_); }

 private:
  std::vector<MetricFamily> out_;
};

// One family per metric of a counter list (transport/counters.h, daemon/engine_counters.h);
// entries without a metric are left to the status reply.
template <class Stats, size_t N>
void EmitCounters(Families& fs, const transport::CounterInfo<Stats> (&list)[N],
                  const Stats& stats) {
  for (const transport::CounterInfo<Stats>& c : list) {
    if (c.metric[0] == '\0') continue;
    const bool gauge = c.type == transport::CounterType::Gauge;
    MetricFamily& f = fs.Family(c.metric, c.help, gauge ? MetricType::Gauge : MetricType::Counter);
    Labels labels;
    if (const std::string_view l = c.label; !l.empty()) {
      const size_t eq = l.find('=');
      labels.push_back({std::string(l.substr(0, eq)), std::string(l.substr(eq + 1))});
    }
    const double v = static_cast<double>(stats.*c.field);
    if (gauge) {
      fs.Gauge(f, std::move(labels), v);
    } else {
      fs.Counter(f, std::move(labels), v);
    }
  }
}

// Families are built one at a time into a vector that may reallocate, so each family is
// filled completely before the next is created (references stay valid while filling).

void TrafficFamily(Families& fs, const std::string& name, const std::string& help,
                   const std::map<std::string, TrafficCounters>& by_peer) {
  MetricFamily& f = fs.Family(name, help, MetricType::Counter);
  for (const auto& [peer, t] : by_peer) {
    for (int d = 0; d < kDirections; ++d) {
      for (int c = 0; c < kPriorityClasses; ++c) {
        if (t.segments[d][c] == 0) continue;
        fs.Counter(f,
                   {{"direction", kDirectionNames[d]},
                    {"peer", peer},
                    {"priority_class", PriorityClassName(c)}},
                   static_cast<double>(t.bytes[d][c]));
      }
    }
  }
}

class Collectable final : public prometheus::Collectable {
 public:
  explicit Collectable(TelemetryHub* hub) : hub_(hub) {}
  std::vector<MetricFamily> Collect() const override { return CollectMetrics(*hub_); }

 private:
  TelemetryHub* hub_;
};

}  // namespace

std::vector<MetricFamily> CollectMetrics(TelemetryHub& hub) {
  Families fs;
  const EngineStats es = hub.engine_stats();
  const transport::TransportStats ts = hub.transport_stats();
  const HubSources& src = hub.sources();

  {
    MetricFamily& f =
        fs.Family("gradlane_build_info", "gradlaned version (value 1)", MetricType::Gauge);
    fs.Gauge(f, {{"version", src.version}}, 1);
  }
  {
    MetricFamily& f =
        fs.Family("gradlane_start_time_seconds",
                  "when this gradlaned started, seconds since the Unix epoch", MetricType::Gauge);
    fs.Gauge(f, {}, hub.started_unix_seconds());
  }
  if (src.link_bytes_per_second > 0) {
    MetricFamily& f =
        fs.Family("gradlane_link_capacity_bytes_per_second",
                  "configured rate of the NIC port (--link_capacity), for utilization",
                  MetricType::Gauge);
    fs.Gauge(f, {}, src.link_bytes_per_second);
  }
  {
    const sched::TimeNs beat = hub.heartbeat();
    MetricFamily& f = fs.Family("gradlane_engine_heartbeat_age_seconds",
                                "time since the engine loop's last housekeeping round (stays "
                                "near 0.001 while it runs; systemd's watchdog uses the same beat)",
                                MetricType::Gauge);
    if (beat > 0) {
      fs.Gauge(f, {}, static_cast<double>(SessionServer::MonotonicNow() - beat) / 1e9);
    }
  }
  {
    const SessionServerStats ss = hub.session_stats();
    MetricFamily& active =
        fs.Family("gradlane_client_sessions", "client sessions open now", MetricType::Gauge);
    fs.Gauge(active, {}, static_cast<double>(ss.sessions_active));
    MetricFamily& refused = fs.Family(
        "gradlane_client_connections_refused_total",
        "client connections turned away before they became a session, by reason (not_allowed, "
        "pending_limit, pending_per_uid_limit, session_limit, sessions_per_uid_limit, "
        "handshake_timeout, bad_hello, no_memory)",
        MetricType::Counter);
    for (int k = 0; k < static_cast<int>(Refusal::kCount); ++k) {
      fs.Counter(refused, {{"reason", RefusalName(static_cast<Refusal>(k))}},
                 static_cast<double>(ss.refused_by_reason[k]));
    }
    MetricFamily& control = fs.Family(
        "gradlane_client_control_messages_refused_total",
        "control messages on a session refused unread (too long or carrying file descriptors)",
        MetricType::Counter);
    fs.Counter(control, {}, static_cast<double>(ss.control_messages_refused));
  }
  // The engine's and the transport's counters, as their lists declare them. Families that
  // several counters share (told apart by a label) are described here first: a family's help
  // is the one it was created with.
  fs.Family("gradlane_posts_total", "client posts completed, by result", MetricType::Counter);
  fs.Family("gradlane_peer_down_total",
            "peer connections lost, by reason (reset includes clean closes)", MetricType::Counter);
  fs.Family("gradlane_errors_total",
            "errors by kind: malformed or refused peer input (the wire error names), segments "
            "that did not fit their job, manifest mismatches, dropped telemetry events",
            MetricType::Counter);
  EmitCounters(fs, kEngineCounters, es);
  EmitCounters(fs, transport::kTransportCounters, ts);
  EmitCounters(fs, transport::kPeerCounters, ts.total);
  {
    // Created above with the counters' kinds; the wire errors join them.
    MetricFamily& f = fs.Family("gradlane_errors_total", "", MetricType::Counter);
    for (size_t k = 1; k < transport::kWireErrorCount; ++k) {
      const auto e = static_cast<transport::WireError>(k);
      if (e == transport::WireError::kShutdown) continue;  // a goodbye, not an error
      fs.Counter(f, {{"kind", std::string(transport::WireErrorName(e))}},
                 static_cast<double>(ts.errors[k]));
    }
    fs.Counter(f, {{"kind", "telemetry_dropped"}}, static_cast<double>(hub.events_dropped()));
  }
  {
    // Which backend carries the peers' bytes, and the counters only it keeps (verbs: the RDMA
    // data path, registrations and the device's port counters; docs/verbs.md).
    const transport::BackendDescription b = hub.backend();
    if (!b.backend.empty()) {
      MetricFamily& f = fs.Family("gradlane_transport_info",
                                  "the peer transport (value 1): backend (tcp, dpdk, verbs) and, "
                                  "for verbs, the device, port and GID index",
                                  MetricType::Gauge);
      Labels labels{{"backend", b.backend}};
      for (const auto& [k, v] : b.info) labels.push_back({k, v});
      fs.Gauge(f, std::move(labels), 1);
    }
    for (const transport::BackendCounterValue& c : b.counters) {
      if (c.metric.empty()) continue;
      const bool gauge = c.type == transport::CounterType::Gauge;
      MetricFamily& f =
          fs.Family(c.metric, c.help, gauge ? MetricType::Gauge : MetricType::Counter);
      Labels labels;
      for (const auto& [k, v] : c.labels) labels.push_back({k, v});
      if (gauge) {
        fs.Gauge(f, std::move(labels), static_cast<double>(c.value));
      } else {
        fs.Counter(f, std::move(labels), static_cast<double>(c.value));
      }
    }
  }

  hub.With([&](TelemetryState& st) {
    TrafficFamily(fs, "gradlane_sent_bytes_total",
                  "scheduled segment bytes handed to the transport (pushes to shards, pull "
                  "responses to workers), by peer, direction and priority class",
                  st.SentByPeer());
    TrafficFamily(fs, "gradlane_received_bytes_total",
                  "segment bytes received from peers and placed, by peer, direction and "
                  "priority class",
                  st.ReceivedByPeer());
    const auto by_policy = st.ByPolicy();
    {
      MetricFamily& f = fs.Family("gradlane_segments_total", "segments sent, by scheduling policy",
                                  MetricType::Counter);
      for (const auto& [p, c] : by_policy)
        fs.Counter(f, {{"policy", p}}, static_cast<double>(c.segments));
    }
    {
      MetricFamily& f = fs.Family("gradlane_blocks_total",
                                  "dispatches of more than one segment (Prophet gradient blocks)",
                                  MetricType::Counter);
      for (const auto& [p, c] : by_policy)
        fs.Counter(f, {{"policy", p}}, static_cast<double>(c.blocks));
    }
    {
      MetricFamily& f = fs.Family(
          "gradlane_preemptions_total",
          "segments dispatched ahead of bytes that had been queued longer (priority overtaking)",
          MetricType::Counter);
      for (const auto& [p, c] : by_policy) {
        fs.Counter(f, {{"policy", p}}, static_cast<double>(c.preemptions));
      }
    }
    {
      MetricFamily& f = fs.Family("gradlane_queueing_delay_seconds",
                                  "time from a segment's bytes entering the scheduler to its "
                                  "dispatch, by priority class",
                                  MetricType::Histogram);
      for (int c = 0; c < kPriorityClasses; ++c) {
        fs.Hist(f, {{"priority_class", PriorityClassName(c)}}, st.queueing_delay()[c]);
      }
    }
    {
      MetricFamily& f = fs.Family("gradlane_segment_latency_seconds",
                                  "time from sending a segment to the peer's acknowledgement",
                                  MetricType::Histogram);
      for (int d = 0; d < kDirections; ++d) {
        fs.Hist(f, {{"direction", kDirectionNames[d]}}, st.segment_latency()[d]);
      }
    }
    // Per job: from the telemetry (events) and the latest snapshot.
    {
      MetricFamily& f = fs.Family("gradlane_job_iteration_seconds",
                                  "training iteration time as the daemon sees it: first post of "
                                  "iteration k+1 minus first post of iteration k",
                                  MetricType::Histogram);
      for (const auto& [key, j] : st.jobs()) {
        if (!j.id.empty()) fs.Hist(f, {{"job_id", j.id}}, j.iteration_seconds);
      }
    }
    {
      MetricFamily& f = fs.Family("gradlane_job_iteration", "latest iteration the job started",
                                  MetricType::Gauge);
      for (const auto& [key, j] : st.jobs()) {
        if (!j.id.empty() && !j.ended)
          fs.Gauge(f, {{"job_id", j.id}}, static_cast<double>(j.iteration));
      }
    }
    {
      MetricFamily& f =
          fs.Family("gradlane_queued_bytes",
                    "bytes in the job's scheduler queue, by priority class", MetricType::Gauge);
      for (const auto& [key, j] : st.jobs()) {
        if (j.id.empty() || j.ended) continue;
        for (int c = 0; c < kPriorityClasses; ++c) {
          fs.Gauge(f, {{"job_id", j.id}, {"priority_class", PriorityClassName(c)}},
                   static_cast<double>(j.queued_bytes[c]));
        }
      }
    }
    const EngineSnapshot& snap = st.snapshot();
    auto per_job = [&](const std::string& name, const std::string& help, MetricType type,
                       auto value) {
      MetricFamily& f = fs.Family(name, help, type);
      for (const JobSnapshot& j : snap.jobs) {
        const double v = value(j);
        if (v < 0) continue;  // unknown yet
        if (type == MetricType::Counter) {
          fs.Counter(f, {{"job_id", j.id}}, v);
        } else {
          fs.Gauge(f, {{"job_id", j.id}}, v);
        }
      }
    };
    {
      MetricFamily& f = fs.Family("gradlane_job_info",
                                  "one series per job (value 1): policy, the schedule it runs now, "
                                  "mode, rank, world size, phase",
                                  MetricType::Gauge);
      for (const JobSnapshot& j : snap.jobs) {
        fs.Gauge(f,
                 {{"job_id", j.id},
                  {"phase", j.phase},
                  {"policy", j.policy},
                  {"schedule", j.schedule},
                  {"mode", j.mode},
                  {"rank", absl::StrCat(j.rank)},
                  {"world", absl::StrCat(j.world)}},
                 1);
      }
    }
    per_job("gradlane_bandwidth_estimate_bytes_per_second",
            "the job's live estimate of its link's bandwidth (acked bytes over busy time)",
            MetricType::Gauge, [](const JobSnapshot& j) { return j.bandwidth_bytes_per_s; });
    per_job("gradlane_rtt_seconds", "smoothed round-trip time (RFC 6298 srtt) of the job's sends",
            MetricType::Gauge, [](const JobSnapshot& j) {
              return j.srtt_ns < 0 ? -1.0 : static_cast<double>(j.srtt_ns) / 1e9;
            });
    per_job("gradlane_rtt_min_seconds", "minimum round-trip time over the estimator's window",
            MetricType::Gauge, [](const JobSnapshot& j) {
              return j.min_rtt_ns < 0 ? -1.0 : static_cast<double>(j.min_rtt_ns) / 1e9;
            });
    per_job("gradlane_credit_in_use_bytes",
            "bytes committed below the scheduler and not yet acknowledged (credit window use)",
            MetricType::Gauge,
            [](const JobSnapshot& j) { return static_cast<double>(j.credit_in_use); });
    per_job("gradlane_queued_segments", "segments waiting in the job's scheduler",
            MetricType::Gauge,
            [](const JobSnapshot& j) { return static_cast<double>(j.queued_segments); });
    per_job("gradlane_link_busy_seconds_total",
            "time the job had bytes in flight (what the bandwidth estimate divides by)",
            MetricType::Counter,
            [](const JobSnapshot& j) { return static_cast<double>(j.busy_ns) / 1e9; });
    per_job("gradlane_posts_pending", "client posts waiting for their reduced result",
            MetricType::Gauge,
            [](const JobSnapshot& j) { return static_cast<double>(j.posts_pending); });
    {
      MetricFamily& f =
          fs.Family("gradlane_job_peer_up", "1 while the connection to the job's peer daemon is up",
                    MetricType::Gauge);
      for (const JobSnapshot& j : snap.jobs) {
        for (uint32_t i = 0; i < j.peer_count; ++i) {
          const PeerSnapshot& p = j.peers[i];
          fs.Gauge(f, {{"job_id", j.id}, {"peer", p.address}},
                   p.state == PeerStateName::kUp || p.left ? 1 : 0);
        }
      }
    }
    return 0;
  });
  return fs.Take();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    TelemetryHub* hub) {
  if (auto hp = ParseHostPort(address); !hp.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics_address: ", hp.status().message()));
  }
  auto server = std::unique_ptr<MetricsServer>(new MetricsServer());
  // prometheus-cpp (civetweb) reports a busy port or a bad address by throwing: the only
  // exceptions in gradlaned, caught right here at the boundary.
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(address, 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("metrics address ", address,
                                               ": cannot listen (port busy or address not "
                                               "local): ",
                                               e.what()));
  }
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("metrics address ", address, ": not listening"));
  }
  server->port_ = ports.front();
  server->collectable_ = std::make_shared<Collectable>(hub);
  server->exposer_->RegisterCollectable(server->collectable_);
  return server;
}

MetricsServer::~MetricsServer() {
  exposer_.reset();  // stops the HTTP threads before the collectable goes
}

}  // namespace gradlane::daemon
