#include "daemon/admin_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace gradlane::daemon {

namespace {

using nlohmann::json;
using sched::TimeNs;

constexpr int kPumpIntervalMs = 10;
constexpr size_t kMaxRequestBytes = 4096;
constexpr TimeNs kClientIdleTimeout = 10 * sched::kSecond;
constexpr TimeNs kMaxTraceTimeout = 600 * sched::kSecond;

json Error(const std::string& why) { return json{{"ok", false}, {"error", why}}; }

double Sec(int64_t ns) { return ns < 0 ? -1.0 : static_cast<double>(ns) / 1e9; }

// An approximate quantile from a histogram's buckets (the upper bound of the bucket it falls
// in); -1 when empty.
double Quantile(const Histogram& h, double q) {
  if (h.count() == 0) return -1;
  const double want = q * static_cast<double>(h.count());
  uint64_t cum = 0;
  for (size_t i = 0; i < h.counts().size(); ++i) {
    cum += h.counts()[i];
    if (static_cast<double>(cum) >= want) {
      return i < h.bounds().size() ? h.bounds()[i] : INFINITY;
    }
  }
  return INFINITY;
}

json JobsJson(const TelemetryState& st) {
  json jobs = json::array();
  for (const JobSnapshot& j : st.snapshot().jobs) {
    const JobTelemetry* t = st.FindJob(j.slot, j.generation);
    json o = {{"job", j.id},
              {"rank", j.rank},
              {"world", j.world},
              {"policy", j.policy},
              {"schedule", j.schedule},
              {"mode", j.mode},
              {"phase", j.phase},
              {"tensors", j.tensors},
              {"bytes", j.total_bytes},
              {"partitions", j.partitions},
              {"owned_partitions", j.owned_partitions},
              {"posts_pending", j.posts_pending},
              {"posts_completed", j.posts_completed},
              {"posts_failed", j.posts_failed},
              {"segments_sent", j.segments_sent},
              {"segments_received", j.segments_received},
              {"segments_rejected", j.segments_rejected},
              {"rounds_reduced", j.rounds_reduced}};
    if (t != nullptr) {
      o["iteration"] = t->iteration;
      o["last_iteration_seconds"] = t->last_iteration_seconds;
      o["mean_iteration_seconds"] =
          t->iteration_seconds.count() > 0
              ? t->iteration_seconds.sum() / static_cast<double>(t->iteration_seconds.count())
              : -1.0;
      o["preemptions"] = t->preemptions;
      o["blocks"] = t->blocks;
    }
    if (!j.fail_reason.empty()) o["fail_reason"] = j.fail_reason;
    jobs.push_back(std::move(o));
  }
  return jobs;
}

json PeersJson(const TelemetryState& st) {
  json peers = json::array();
  for (const JobSnapshot& j : st.snapshot().jobs) {
    for (uint32_t i = 0; i < j.peer_count; ++i) {
      const PeerSnapshot& p = j.peers[i];
      peers.push_back({{"job", j.id},
                       {"rank", p.rank},
                       {"address", p.address},
                       {"state", p.left ? "left" : PeerStateText(p.state)},
                       {"manifest_ok", p.manifest_ok},
                       {"connect_attempts", p.connect_attempts},
                       {"bytes_sent", p.bytes_sent},
                       {"bytes_received", p.bytes_received},
                       {"frames_sent", p.frames_sent},
                       {"frames_received", p.frames_received},
                       {"sends_failed", p.sends_failed}});
    }
  }
  return peers;
}

json QueuesJson(const TelemetryState& st) {
  json jobs = json::array();
  for (const JobSnapshot& j : st.snapshot().jobs) {
    const JobTelemetry* t = st.FindJob(j.slot, j.generation);
    json classes = json::array();
    for (int c = 0; c < kPriorityClasses; ++c) {
      uint64_t sent = 0;
      if (t != nullptr) {
        for (const TrafficCounters& tc : t->sent) sent += tc.bytes[0][c] + tc.bytes[1][c];
      }
      classes.push_back({{"priority_class", PriorityClassName(c)},
                         {"queued_bytes", t != nullptr ? t->queued_bytes[c] : 0},
                         {"sent_bytes", sent}});
    }
    jobs.push_back({{"job", j.id},
                    {"policy", j.policy},
                    {"schedule", j.schedule},
                    {"queued_segments", j.queued_segments},
                    {"credit_in_use_bytes", j.credit_in_use},
                    {"credit_window_bytes", j.credit_window},
                    {"classes", std::move(classes)}});
  }
  json delay = json::array();
  for (int c = 0; c < kPriorityClasses; ++c) {
    const Histogram& h = st.queueing_delay()[c];
    delay.push_back(
        {{"priority_class", PriorityClassName(c)},
         {"segments", h.count()},
         {"mean_seconds", h.count() > 0 ? h.sum() / static_cast<double>(h.count()) : -1.0},
         {"p50_seconds", Quantile(h, 0.5)},
         {"p99_seconds", Quantile(h, 0.99)}});
  }
  return json{{"jobs", std::move(jobs)}, {"queueing_delay", std::move(delay)}};
}

json BandwidthJson(const TelemetryState& st) {
  json jobs = json::array();
  for (const JobSnapshot& j : st.snapshot().jobs) {
    jobs.push_back({{"job", j.id},
                    {"bandwidth_bytes_per_second", j.bandwidth_bytes_per_s},
                    {"srtt_seconds", Sec(j.srtt_ns)},
                    {"rttvar_seconds", Sec(j.rttvar_ns)},
                    {"min_rtt_seconds", Sec(j.min_rtt_ns)},
                    {"bdp_bytes", j.bdp_bytes},
                    {"busy_seconds", Sec(j.busy_ns)},
                    {"acked_bytes", j.acked_bytes},
                    {"outstanding_bytes", j.outstanding_bytes}});
  }
  json lat = json::array();
  const char* dirs[kDirections] = {"push", "pull"};
  for (int d = 0; d < kDirections; ++d) {
    const Histogram& h = st.segment_latency()[d];
    lat.push_back(
        {{"direction", dirs[d]},
         {"segments", h.count()},
         {"mean_seconds", h.count() > 0 ? h.sum() / static_cast<double>(h.count()) : -1.0},
         {"p99_seconds", Quantile(h, 0.99)}});
  }
  return json{{"jobs", std::move(jobs)}, {"segment_latency", std::move(lat)}};
}

}  // namespace

std::string DefaultAdminSocket(const std::string& client_socket) {
  const std::string suffix = ".sock";
  if (client_socket.size() > suffix.size() &&
      client_socket.compare(client_socket.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return client_socket.substr(0, client_socket.size() - suffix.size()) + ".admin.sock";
  }
  return client_socket + ".admin";
}

AdminLimits AdminLimitsOf(const AdminOptions& options) {
  AdminLimits l;
  l.max_request_bytes = kMaxRequestBytes;
  l.max_trace_spans = options.max_trace_spans;
  l.max_trace_timeout_s = static_cast<double>(kMaxTraceTimeout) / 1e9;
  return l;
}

json AdminCommand(TelemetryHub& hub, const AdminOptions& options, const json& req) {
  absl::StatusOr<AdminRequest> r = AdminRequestFromJson(req, AdminLimitsOf(options));
  if (!r.ok()) return Error(std::string(r.status().message()));
  if (r->cmd == AdminCmd::kTrace) return Error("trace is answered by the admin server's thread");
  return AdminCommand(hub, options, r->cmd);
}

json AdminCommand(TelemetryHub& hub, const AdminOptions& options, AdminCmd cmd) {
  if (cmd == AdminCmd::kStatus) {
    const EngineStats es = hub.engine_stats();
    const transport::TransportStats ts = hub.transport_stats();
    const TimeNs now = SessionServer::MonotonicNow();
    const TimeNs hb = hub.heartbeat();
    const SessionServerStats ss = hub.session_stats();
    // Outside the hub's lock: a backend may read files to describe itself (verbs: sysfs).
    const transport::BackendDescription backend = hub.backend();
    json backend_info = json::object();
    for (const auto& [k, v] : backend.info) backend_info[k] = v;
    json backend_counters = json::array();
    for (const transport::BackendCounterValue& c : backend.counters) {
      backend_counters.push_back(json{{"name", c.name}, {"value", c.value}, {"help", c.help}});
    }
    json refused = json::object();
    for (int k = 0; k < static_cast<int>(Refusal::kCount); ++k) {
      refused[RefusalName(static_cast<Refusal>(k))] = ss.refused_by_reason[k];
    }
    return hub.With([&](TelemetryState& st) {
      json j{{"ok", true},
             {"version", hub.sources().version},
             {"pid", ::getpid()},
             {"uptime_seconds", Sec(now - hub.started_at())},
             {"listen_port", st.snapshot().listen_port},
             {"metrics_address", options.metrics_address},
             {"engine_heartbeat_age_seconds", hb > 0 ? Sec(now - hb) : -1.0},
             {"client_sessions", ss.sessions_active},
             {"client_connections_refused", refused},
             {"wire_errors", ts.malformed()},
             {"tracing", st.trace().armed() ? st.trace().job_id() : std::string()},
             {"telemetry_events", st.events()},
             {"telemetry_events_dropped", hub.events_dropped()},
             {"backend", backend.backend},
             {"backend_info", std::move(backend_info)},
             {"backend_counters", std::move(backend_counters)}};
      // Every counter under its own name (daemon/engine_counters.h, transport/counters.h; the
      // transport's per-peer totals prefixed "transport_").
      for (const auto& c : kEngineCounters) j[c.name] = es.*c.field;
      for (const auto& c : transport::kTransportCounters) j[c.name] = ts.*c.field;
      for (const auto& c : transport::kPeerCounters) {
        j[std::string("transport_") + c.name] = ts.total.*c.field;
      }
      return j;
    });
  }
  if (cmd == AdminCmd::kJobs) {
    return hub.With([](TelemetryState& st) { return json{{"ok", true}, {"jobs", JobsJson(st)}}; });
  }
  if (cmd == AdminCmd::kPeers) {
    return hub.With([](TelemetryState& st) {
      return json{{"ok", true}, {"peers", PeersJson(st)}};
    });
  }
  if (cmd == AdminCmd::kQueues) {
    return hub.With([](TelemetryState& st) {
      json j = QueuesJson(st);
      j["ok"] = true;
      return j;
    });
  }
  if (cmd == AdminCmd::kBandwidth) {
    return hub.With([](TelemetryState& st) {
      json j = BandwidthJson(st);
      j["ok"] = true;
      return j;
    });
  }
  return Error(absl::StrCat("command '", std::string(AdminCmdName(cmd)), "' is not answered here"));
}

// ----------------------------------------------------------------------------- server ----

absl::StatusOr<std::unique_ptr<AdminServer>> AdminServer::Start(const AdminOptions& options,
                                                                TelemetryHub* hub) {
  auto server = std::unique_ptr<AdminServer>(new AdminServer(options, hub));
  if (!options.socket_path.empty()) {
    const std::string& path = options.socket_path;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof(addr.sun_path)) {
      return absl::InvalidArgumentError(absl::StrCat("--admin_socket '", path, "' is longer than ",
                                                     sizeof(addr.sun_path) - 1, " bytes"));
    }
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) {
        return absl::AlreadyExistsError(
            absl::StrCat("admin socket ", path, " exists and is not a socket"));
      }
      // A live daemon answers a connect: refuse to steal its socket. Otherwise it is stale.
      const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const bool live =
          probe >= 0 && ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
      if (probe >= 0) ::close(probe);
      if (live) {
        return absl::AlreadyExistsError(
            absl::StrCat("admin socket ", path, ": another gradlaned is serving it"));
      }
      ::unlink(path.c_str());
    }
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::chmod(path.c_str(), 0660) != 0 || ::listen(fd, 16) != 0) {
      const int e = errno;
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("admin socket ", path, ": ", std::strerror(e)));
    }
    server->listen_fd_ = fd;
  }
  AdminServer* s = server.get();
  server->thread_ = std::thread([s] { s->Run(); });
  return server;
}

AdminServer::~AdminServer() { Stop(); }

void AdminServer::Stop() {
  if (thread_.joinable()) {
    stop_.store(true, std::memory_order_release);
    thread_.join();
  }
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
    ::unlink(options_.socket_path.c_str());
  }
}

namespace {

struct Client {
  int fd = -1;
  std::string in;
  std::string out;
  size_t out_done = 0;
  TimeNs since = 0;
  bool tracing = false;  // waiting for the trace to finish
  bool closing = false;  // response queued: close once written
};

void Respond(Client& c, const json& j) {
  c.out = j.dump(-1, ' ', false, json::error_handler_t::replace);
  c.out.push_back('\n');
  c.out_done = 0;
  c.closing = true;
  c.tracing = false;
}

}  // namespace

void AdminServer::Run() {
  std::vector<Client> clients;
  std::vector<pollfd> fds;
  while (!stop_.load(std::memory_order_acquire)) {
    fds.clear();
    if (listen_fd_ >= 0) fds.push_back({listen_fd_, POLLIN, 0});
    for (const Client& c : clients) {
      short ev = 0;
      if (!c.closing) ev |= POLLIN;
      if (c.out_done < c.out.size()) ev |= POLLOUT;
      fds.push_back({c.fd, ev, 0});
    }
    (void)::poll(fds.data(), fds.size(), kPumpIntervalMs);
    const TimeNs now = SessionServer::MonotonicNow();
    // Keep the ring drained and check the armed trace.
    bool trace_done = false;
    hub_->With([&](TelemetryState& st) {
      trace_done = st.PollTrace(now) == TraceRecorder::State::kDone;
      return 0;
    });
    if (trace_done) {
      auto it =
          std::find_if(clients.begin(), clients.end(), [](const Client& c) { return c.tracing; });
      absl::StatusOr<std::string> trace =
          hub_->With([](TelemetryState& st) { return st.trace().Take(); });
      if (it != clients.end()) {
        if (!trace.ok()) {
          Respond(*it, Error(std::string(trace.status().message())));
        } else {
          // The trace is already JSON text: splice it in rather than parse it again.
          it->out = absl::StrCat("{\"ok\":true,\"trace\":", *trace, "}\n");
          it->out_done = 0;
          it->closing = true;
          it->tracing = false;
        }
      }
    }
    size_t k = 0;
    if (listen_fd_ >= 0) {
      if (fds[0].revents & POLLIN) {
        for (;;) {
          const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;
          if (static_cast<int>(clients.size()) >= options_.max_clients) {
            const char busy[] = "{\"ok\":false,\"error\":\"too many admin clients\"}\n";
            (void)::send(fd, busy, sizeof(busy) - 1, MSG_NOSIGNAL);
            ::close(fd);
            continue;
          }
          clients.push_back(Client{fd, {}, {}, 0, now, false, false});
        }
      }
      k = 1;
    }
    // fds[k + i] belongs to clients[i] for the clients that existed before this round.
    const size_t polled = fds.size() - k;
    for (size_t i = 0; i < clients.size(); ++i) {
      Client& c = clients[i];
      const short rev = i < polled ? fds[k + i].revents : 0;
      bool drop = false;
      if (rev & POLLIN) {
        char buf[1024];
        for (;;) {
          const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
          if (n > 0) {
            c.in.append(buf, static_cast<size_t>(n));
            if (c.in.size() > kMaxRequestBytes) break;
            continue;
          }
          if (n == 0 || (errno != EAGAIN && errno != EINTR)) drop = !c.tracing || n == 0;
          break;
        }
        const size_t nl = c.in.find('\n');
        if (!c.tracing && !c.closing) {
          if (nl != std::string::npos) {
            // Typed and checked without exceptions: a field of the wrong type is an error
            // answer, never an uncaught type_error (which used to abort the daemon).
            const absl::StatusOr<AdminRequest> req =
                ParseAdminRequest(std::string_view(c.in).substr(0, nl), AdminLimitsOf(options_));
            if (!req.ok()) {
              Respond(c, Error(std::string(req.status().message())));
            } else if (req->cmd == AdminCmd::kTrace) {
              const TraceRequest& t = req->trace;
              absl::Status s = hub_->With([&](TelemetryState& st) {
                return st.StartTrace(t.job, static_cast<int>(t.iterations),
                                     static_cast<size_t>(t.max_spans), now,
                                     now + static_cast<TimeNs>(t.timeout_s * 1e9));
              });
              if (s.ok()) {
                c.tracing = true;
              } else {
                Respond(c, Error(std::string(s.message())));
              }
            } else {
              Respond(c, AdminCommand(*hub_, options_, req->cmd));
            }
          } else if (c.in.size() > kMaxRequestBytes) {
            Respond(c, Error("request line too long"));
          }
        }
      }
      if (rev & (POLLERR | POLLHUP)) drop = true;
      if (!drop && c.out_done < c.out.size()) {
        const ssize_t n =
            ::send(c.fd, c.out.data() + c.out_done, c.out.size() - c.out_done, MSG_NOSIGNAL);
        if (n > 0) {
          c.out_done += static_cast<size_t>(n);
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
          drop = true;
        }
      }
      if (c.closing && c.out_done >= c.out.size()) drop = true;
      if (!c.tracing && !c.closing && now - c.since > kClientIdleTimeout) drop = true;
      if (drop) {
        if (c.tracing)
          hub_->With([](TelemetryState& st) {
            st.trace().Cancel();  // nobody is waiting for it any more
            return 0;
          });
        ::close(c.fd);
        c.fd = -1;
      }
    }
    clients.erase(std::remove_if(clients.begin(), clients.end(),
                                 [](const Client& c) { return c.fd < 0; }),
                  clients.end());
  }
  for (Client& c : clients) ::close(c.fd);
}

}  // namespace gradlane::daemon
