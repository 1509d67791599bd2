// gradlanectl — the operator's view of a running gradlaned, over its admin socket
// (daemon/admin_server.h; protocol in docs/operations.md).
//
//   gradlanectl [--socket=PATH] [--json] [--timeout=SECONDS] COMMAND
//     status                  daemon, engine heartbeat, totals, the transport backend (verbs:
//                             device, RDMA counters, registrations)
//     counters                every counter with what it counts (daemon/engine_counters.h,
//                             transport/counters.h, the backend's own: verbs_counters.h, sysfs)
//     jobs                    jobs with iteration times
//     peers                   every job's peer daemons: state, bytes each way
//     queues                  queued bytes per priority class, credit, queueing delay
//     bandwidth               live bandwidth and RTT estimates, segment latency
//     trace JOB --iterations N [--out FILE] [--max_spans N]
//                             Chrome/Perfetto trace of the next N iterations of JOB
//                             (open in ui.perfetto.dev or chrome://tracing)
//
// Exit status: 0 ok; 1 the daemon is not running or answered an error (printed); 2 bad usage.
// The socket defaults to $GRADLANE_ADMIN_SOCKET, else /run/gradlane/gradlaned.admin.sock.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/engine_counters.h"
#include "nlohmann/json.hpp"
#include "transport/counters.h"

namespace {

using nlohmann::json;

constexpr const char* kDefaultSocket = "/run/gradlane/gradlaned.admin.sock";

void Usage() {
  std::fprintf(stderr,
               "usage: gradlanectl [--socket=PATH] [--json] [--timeout=SECONDS] COMMAND\n"
               "  status | counters | jobs | peers | queues | bandwidth\n"
               "  trace JOB --iterations N [--out FILE] [--max_spans N]\n"
               "socket: --socket, else $GRADLANE_ADMIN_SOCKET, else %s\n",
               kDefaultSocket);
}

[[noreturn]] void Fail(const std::string& msg) {
  std::fprintf(stderr, "gradlanectl: %s\n", msg.c_str());
  std::exit(1);
}

// The answer is parsed, not trusted: nlohmann's value(), get<>() and const operator[] throw or
// assert on a missing member or a wrong type, which would abort us with a core dump instead of
// an error line. Every read goes through these: a missing or mistyped member reads as null
// (printed "-"), never a crash.
const json& Member(const json& j, const char* k) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  const auto it = j.find(k);
  return it == j.end() ? kNull : *it;
}
int64_t Int(const json& j, const char* k, int64_t fallback) {
  const json& v = Member(j, k);
  if (v.is_number_integer())
    return v.get<int64_t>();  // (an unsigned above INT64_MAX wraps: a printout)
  return fallback;
}
// The array member `k`, or an empty array: loops over it then do nothing for a wrong type.
const json& Array(const json& j, const char* k) {
  static const json kEmpty = json::array();
  const json& v = Member(j, k);
  return v.is_array() ? v : kEmpty;
}

int64_t NowMs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// One request line, one response line.
json Call(const std::string& path, const json& request, double timeout_s) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) Fail("socket path too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) Fail(std::string("socket: ") + std::strerror(errno));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int e = errno;
    if (e == ENOENT || e == ECONNREFUSED) {
      Fail("gradlaned is not running (nothing listens on " + path +
           "; is --admin_socket different, or the daemon stopped?)");
    }
    if (e == EACCES) Fail("permission denied on " + path + " (run as root or the daemon's group)");
    Fail("connect " + path + ": " + std::strerror(e));
  }
  const std::string line = request.dump() + "\n";
  size_t off = 0;
  while (off < line.size()) {
    const ssize_t n = ::send(fd, line.data() + off, line.size() - off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      Fail(std::string("send: ") + std::strerror(errno));
    }
    off += static_cast<size_t>(n);
  }
  std::string in;
  const int64_t deadline = NowMs() + static_cast<int64_t>(timeout_s * 1000);
  char buf[65536];
  for (;;) {
    const int64_t left = deadline - NowMs();
    if (left <= 0) Fail("no answer from gradlaned within the timeout");
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (r < 0 && errno != EINTR) Fail(std::string("poll: ") + std::strerror(errno));
    if (r <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      Fail(std::string("recv: ") + std::strerror(errno));
    }
    if (n == 0) break;
    in.append(buf, static_cast<size_t>(n));
    if (!in.empty() && in.back() == '\n') break;
  }
  ::close(fd);
  if (in.empty()) Fail("gradlaned closed the connection without an answer");
  json resp = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (resp.is_discarded() || !resp.is_object()) Fail("malformed answer from gradlaned");
  const json& ok = Member(resp, "ok");
  if (!ok.is_boolean()) Fail("malformed answer from gradlaned (no boolean \"ok\")");
  if (!ok.get<bool>()) {
    const json& error = Member(resp, "error");
    Fail(error.is_string() ? error.get<std::string>()
                           : "gradlaned answered an error without a reason");
  }
  return resp;
}

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(b) >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char out[32];
  std::snprintf(out, sizeof(out), u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return out;
}

std::string Secs(double s) {
  if (s < 0) return "-";
  char out[32];
  if (s < 1e-3) {
    std::snprintf(out, sizeof(out), "%.0f us", s * 1e6);
  } else if (s < 1) {
    std::snprintf(out, sizeof(out), "%.2f ms", s * 1e3);
  } else {
    std::snprintf(out, sizeof(out), "%.2f s", s);
  }
  return out;
}

std::string Rate(double bytes_per_s) {
  if (bytes_per_s < 0) return "-";
  char out[32];
  std::snprintf(out, sizeof(out), "%.2f Gbit/s", bytes_per_s * 8 / 1e9);
  return out;
}

std::string Str(const json& j, const char* k) {
  const json& v = Member(j, k);
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}
double Num(const json& j, const char* k) {
  const json& v = Member(j, k);
  return v.is_number() ? v.get<double>() : -1;
}

// A count, or "-" when the daemon did not say.
std::string Count(double v) {
  if (v < 0) return "-";
  char out[32];
  std::snprintf(out, sizeof(out), "%.0f", v);
  return out;
}

// The value of the backend counter `name` (the status reply's "backend_counters" rows), -1 when
// absent.
double BackendCounter(const json& r, const std::string& name) {
  for (const json& c : Array(r, "backend_counters")) {
    const json& n = Member(c, "name");
    if (n.is_string() && n.get<std::string>() == name) return Num(c, "value");
  }
  return -1;
}

// "backend verbs: device rxe0, port 1, GID index 1", then for verbs what its data path did.
void PrintBackend(const json& r) {
  const json& backend = Member(r, "backend");
  if (!backend.is_string() || backend.get<std::string>().empty()) return;
  std::string info;
  const json& bi = Member(r, "backend_info");
  for (const char* k : {"device", "port", "gid_index"}) {
    if (Member(bi, k).is_null()) continue;
    info += (info.empty() ? ": " : ", ") +
            (std::string(k) == "gid_index" ? std::string("GID index") : std::string(k)) + " " +
            Str(bi, k);
  }
  std::printf("backend        %s%s\n", backend.get<std::string>().c_str(), info.c_str());
  if (backend.get<std::string>() != "verbs") return;
  auto v = [&](const char* name) { return BackendCounter(r, std::string("verbs_") + name); };
  auto bytes = [](double b) { return b < 0 ? std::string("-") : Bytes(b); };
  std::printf("rdma sent      %s eager (%s), %s rendezvous (%s); %s credit stalls\n",
              Count(v("eager_sends")).c_str(), bytes(v("eager_bytes")).c_str(),
              Count(v("rendezvous_writes")).c_str(), bytes(v("rendezvous_bytes")).c_str(),
              Count(v("credit_stalls")).c_str());
  std::printf("rdma received  %s eager (%s), %s rendezvous (%s); %s refused\n",
              Count(v("eager_received")).c_str(), bytes(v("eager_recv_bytes")).c_str(),
              Count(v("rendezvous_received")).c_str(), bytes(v("rendezvous_recv_bytes")).c_str(),
              Count(v("segments_refused")).c_str());
  double errors = 0;
  for (const char* e : {"flushed_completions", "remote_access_errors", "rnr_errors",
                        "retry_exceeded_errors", "local_errors"}) {
    errors = v(e) < 0 || errors < 0 ? -1 : errors + v(e);
  }
  std::printf(
      "rdma           %s queue pairs, %s credits available; %s completions, %s errors (%s RNR); "
      "%s channel failures\n",
      Count(v("queue_pairs")).c_str(), Count(v("credits_available")).c_str(),
      Count(v("completions")).c_str(), Count(errors).c_str(), Count(v("rnr_errors")).c_str(),
      Count(v("channel_failures")).c_str());
  std::printf("registrations  %s regions, %s registered; %s failed\n",
              Count(v("registrations")).c_str(), bytes(v("registered_bytes")).c_str(),
              Count(v("registration_failures")).c_str());
}

void PrintStatus(const json& r) {
  std::printf("gradlaned %s  pid %s  up %s\n", Str(r, "version").c_str(), Str(r, "pid").c_str(),
              Secs(Num(r, "uptime_seconds")).c_str());
  std::printf("peer port      %s\n", Str(r, "listen_port").c_str());
  const std::string m = Str(r, "metrics_address");
  std::printf("metrics        %s\n", m.empty() ? "off" : ("http://" + m + "/metrics").c_str());
  const double hb = Num(r, "engine_heartbeat_age_seconds");
  std::printf("engine         %s (last housekeeping %s ago)\n",
              hb >= 0 && hb < 1 ? "running" : "NOT RESPONDING", Secs(hb).c_str());
  std::string refused;
  uint64_t refused_total = 0;
  if (r.contains("client_connections_refused") && r["client_connections_refused"].is_object()) {
    for (const auto& [reason, n] : r["client_connections_refused"].items()) {
      if (!n.is_number_unsigned() || n.get<uint64_t>() == 0) continue;
      refused_total += n.get<uint64_t>();
      refused += (refused.empty() ? " (" : ", ") + reason + " " + std::to_string(n.get<uint64_t>());
    }
  }
  if (!refused.empty()) refused += ")";
  std::printf("clients        %s sessions; %llu connections refused%s\n",
              Str(r, "client_sessions").c_str(), static_cast<unsigned long long>(refused_total),
              refused.c_str());
  std::printf("jobs           %s active, %s failed\n", Str(r, "jobs_active").c_str(),
              Str(r, "jobs_failed").c_str());
  std::printf("posts          %s completed, %s failed\n", Str(r, "posts_completed").c_str(),
              Str(r, "posts_failed").c_str());
  std::printf(
      "segments       %s sent, %s received, %s rejected; %s rounds reduced (%s folded on "
      "arrival)\n",
      Str(r, "segments_sent").c_str(), Str(r, "segments_received").c_str(),
      Str(r, "segments_rejected").c_str(), Str(r, "rounds_reduced").c_str(),
      Str(r, "rounds_folded").c_str());
  std::printf("transport      %s sent, %s received; peers %s up, %s down; %s wire errors\n",
              Bytes(Num(r, "transport_bytes_sent")).c_str(),
              Bytes(Num(r, "transport_bytes_received")).c_str(), Str(r, "peers_up").c_str(),
              Str(r, "peers_down").c_str(), Str(r, "wire_errors").c_str());
  PrintBackend(r);
  if (r.contains("tracing") && r["tracing"].is_string() &&
      !r["tracing"].get<std::string>().empty()) {
    std::printf("trace          recording job %s\n", r["tracing"].get<std::string>().c_str());
  }
  std::printf("telemetry      %s events, %s dropped\n", Str(r, "telemetry_events").c_str(),
              Str(r, "telemetry_events_dropped").c_str());
}

// Every counter the daemon declares (daemon/engine_counters.h, transport/counters.h), with
// what it counts.
void PrintCounters(const json& r) {
  struct Row {
    const char* key;
    const char* help;
  };
  static constexpr Row kRows[] = {
#define GRADLANE_CTL_ROW(name, type, metric, label, help) {#name, help},
#define GRADLANE_CTL_TOTAL_ROW(name, type, metric, label, help) {"transport_" #name, help},
      GRADLANE_ENGINE_COUNTERS(GRADLANE_CTL_ROW) GRADLANE_TRANSPORT_COUNTERS(GRADLANE_CTL_ROW)
          GRADLANE_PEER_COUNTERS(GRADLANE_CTL_TOTAL_ROW)
#undef GRADLANE_CTL_ROW
#undef GRADLANE_CTL_TOTAL_ROW
  };
  for (const Row& row : kRows) {
    std::printf("%-28s %12s  %s\n", row.key, Str(r, row.key).c_str(), row.help);
  }
  // The backend's own (verbs: the RDMA data path, registrations, the port's counters), each
  // with its help from the daemon: the port's counters are whatever the driver has.
  for (const json& c : Array(r, "backend_counters")) {
    std::printf("%-28s %12s  %s\n", Str(c, "name").c_str(), Str(c, "value").c_str(),
                Str(c, "help").c_str());
  }
}

void PrintJobs(const json& r) {
  const json& jobs = Array(r, "jobs");
  if (jobs.empty()) {
    std::printf("no jobs\n");
    return;
  }
  std::printf("%-20s %-9s %-13s %-9s %-10s %8s %10s %10s %10s %8s %8s\n", "JOB", "RANK", "POLICY",
              "MODE", "PHASE", "TENSORS", "BYTES", "ITERATION", "LAST IT", "MEAN IT", "PENDING");
  for (const json& j : jobs) {
    const std::string rank = Str(j, "rank") + "/" + Str(j, "world");
    std::printf("%-20s %-9s %-13s %-9s %-10s %8s %10s %10s %10s %8s %8s\n", Str(j, "job").c_str(),
                rank.c_str(), Str(j, "policy").c_str(), Str(j, "mode").c_str(),
                Str(j, "phase").c_str(), Str(j, "tensors").c_str(), Bytes(Num(j, "bytes")).c_str(),
                Str(j, "iteration").c_str(), Secs(Num(j, "last_iteration_seconds")).c_str(),
                Secs(Num(j, "mean_iteration_seconds")).c_str(), Str(j, "posts_pending").c_str());
    if (j.contains("fail_reason")) std::printf("    failed: %s\n", Str(j, "fail_reason").c_str());
  }
}

void PrintPeers(const json& r) {
  const json& peers = Array(r, "peers");
  if (peers.empty()) {
    std::printf("no peers\n");
    return;
  }
  std::printf("%-20s %4s %-24s %-10s %12s %12s %9s %9s %7s\n", "JOB", "RANK", "ADDRESS", "STATE",
              "SENT", "RECEIVED", "FRAMES TX", "FRAMES RX", "FAILED");
  for (const json& p : peers) {
    std::printf("%-20s %4s %-24s %-10s %12s %12s %9s %9s %7s\n", Str(p, "job").c_str(),
                Str(p, "rank").c_str(), Str(p, "address").c_str(), Str(p, "state").c_str(),
                Bytes(Num(p, "bytes_sent")).c_str(), Bytes(Num(p, "bytes_received")).c_str(),
                Str(p, "frames_sent").c_str(), Str(p, "frames_received").c_str(),
                Str(p, "sends_failed").c_str());
  }
}

void PrintQueues(const json& r) {
  for (const json& j : Array(r, "jobs")) {
    std::printf("job %s (%s, running %s): %s segments queued, credit %s in use (window %s)\n",
                Str(j, "job").c_str(), Str(j, "policy").c_str(), Str(j, "schedule").c_str(),
                Str(j, "queued_segments").c_str(), Bytes(Num(j, "credit_in_use_bytes")).c_str(),
                Num(j, "credit_window_bytes") > 0 ? Bytes(Num(j, "credit_window_bytes")).c_str()
                                                  : "policy default");
    std::printf("  %-8s %12s %12s\n", "CLASS", "QUEUED", "SENT");
    for (const json& c : Array(j, "classes")) {
      std::printf("  %-8s %12s %12s\n", Str(c, "priority_class").c_str(),
                  Bytes(Num(c, "queued_bytes")).c_str(), Bytes(Num(c, "sent_bytes")).c_str());
    }
  }
  std::printf("queueing delay by priority class (all jobs):\n");
  std::printf("  %-8s %10s %10s %10s %10s\n", "CLASS", "SEGMENTS", "MEAN", "P50<=", "P99<=");
  for (const json& c : Array(r, "queueing_delay")) {
    std::printf("  %-8s %10s %10s %10s %10s\n", Str(c, "priority_class").c_str(),
                Str(c, "segments").c_str(), Secs(Num(c, "mean_seconds")).c_str(),
                Secs(Num(c, "p50_seconds")).c_str(), Secs(Num(c, "p99_seconds")).c_str());
  }
}

void PrintBandwidth(const json& r) {
  std::printf("%-20s %14s %10s %10s %10s %10s %10s %12s\n", "JOB", "BANDWIDTH", "SRTT", "RTTVAR",
              "MIN RTT", "BDP", "BUSY", "ACKED");
  for (const json& j : Array(r, "jobs")) {
    std::printf("%-20s %14s %10s %10s %10s %10s %10s %12s\n", Str(j, "job").c_str(),
                Rate(Num(j, "bandwidth_bytes_per_second")).c_str(),
                Secs(Num(j, "srtt_seconds")).c_str(), Secs(Num(j, "rttvar_seconds")).c_str(),
                Secs(Num(j, "min_rtt_seconds")).c_str(), Bytes(Num(j, "bdp_bytes")).c_str(),
                Secs(Num(j, "busy_seconds")).c_str(), Bytes(Num(j, "acked_bytes")).c_str());
  }
  std::printf("segment latency (send to ack, all jobs):\n");
  for (const json& d : Array(r, "segment_latency")) {
    std::printf("  %-5s %10s segments  mean %10s  p99<= %s\n", Str(d, "direction").c_str(),
                Str(d, "segments").c_str(), Secs(Num(d, "mean_seconds")).c_str(),
                Secs(Num(d, "p99_seconds")).c_str());
  }
}

bool ParseNumber(const std::string& s, double* out) {
  char* end = nullptr;
  errno = 0;
  *out = std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size() && errno == 0 && std::isfinite(*out);
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket;
  if (const char* env = std::getenv("GRADLANE_ADMIN_SOCKET"); env != nullptr && env[0] != '\0') {
    socket = env;
  } else {
    socket = kDefaultSocket;
  }
  bool raw = false;
  double timeout_s = -1;
  std::string out_file;
  double iterations = 1;
  double max_spans = -1;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const std::string& name, std::string* v) {
      if (a == name) {
        if (i + 1 >= argc) {
          std::fprintf(stderr, "gradlanectl: %s needs a value\n", name.c_str());
          Usage();
          std::exit(2);
        }
        *v = argv[++i];
        return true;
      }
      if (a.rfind(name + "=", 0) == 0) {
        *v = a.substr(name.size() + 1);
        return true;
      }
      return false;
    };
    std::string v;
    if (a == "--json") {
      raw = true;
    } else if (a == "-h" || a == "--help") {
      Usage();
      return 0;
    } else if (value("--socket", &v)) {
      socket = v;
    } else if (value("--out", &v)) {
      out_file = v;
    } else if (value("--timeout", &v) || value("--iterations", &v) || value("--max_spans", &v)) {
      double d = 0;
      const std::string name = a.substr(0, a.find('='));
      if (!ParseNumber(v, &d) || d <= 0) {
        std::fprintf(stderr, "gradlanectl: %s wants a positive number, got '%s'\n", name.c_str(),
                     v.c_str());
        return 2;
      }
      if (name == "--timeout") timeout_s = d;
      if (name == "--iterations") {
        if (d != std::floor(d)) {
          std::fprintf(stderr, "gradlanectl: --iterations wants a whole number\n");
          return 2;
        }
        iterations = d;
      }
      if (name == "--max_spans") max_spans = std::floor(d);
    } else if (a.size() > 1 && a[0] == '-') {
      std::fprintf(stderr, "gradlanectl: unknown flag %s\n", a.c_str());
      Usage();
      return 2;
    } else {
      args.push_back(a);
    }
  }
  if (args.empty()) {
    Usage();
    return 2;
  }
  const std::string cmd = args[0];
  // `counters` is the status reply, listed counter by counter.
  json req = {{"cmd", cmd == "counters" ? std::string("status") : cmd}};
  if (cmd == "trace") {
    if (args.size() != 2) {
      std::fprintf(stderr, "gradlanectl: trace needs exactly one JOB\n");
      Usage();
      return 2;
    }
    req["job"] = args[1];
    req["iterations"] = static_cast<int64_t>(iterations);
    // The daemon waits for the iterations; its own deadline comes first so its answer (with a
    // reason) reaches us.
    const double daemon_timeout = timeout_s > 0 ? timeout_s : 60;
    req["timeout_s"] = daemon_timeout;
    if (max_spans > 0) req["max_spans"] = static_cast<int64_t>(max_spans);
    if (out_file.empty()) out_file = "gradlane-trace-" + args[1] + ".json";
    json r = Call(socket, req, daemon_timeout + 10);
    const json& t = Member(r, "trace");
    if (!t.is_object()) Fail("answer carries no trace");
    FILE* f = std::fopen(out_file.c_str(), "w");
    if (f == nullptr) Fail("cannot write " + out_file + ": " + std::strerror(errno));
    const std::string text = t.dump();
    if (std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0) {
      Fail("writing " + out_file + " failed");
    }
    const json& od = Member(t, "otherData");
    std::printf(
        "wrote %s: %zu trace events, %s spans (iterations %s..%s of job %s; %s)%s\n",
        out_file.c_str(), Array(t, "traceEvents").size(), Str(od, "spans").c_str(),
        Str(od, "first_iteration").c_str(),
        std::to_string(Int(od, "first_iteration", 0) + Int(od, "iterations", 1) - 1).c_str(),
        args[1].c_str(), Str(od, "end").c_str(),
        Int(od, "spans_dropped", 0) > 0 ? " — buffer full, some spans dropped" : "");
    return 0;
  }
  if (args.size() != 1 || (cmd != "status" && cmd != "counters" && cmd != "jobs" &&
                           cmd != "peers" && cmd != "queues" && cmd != "bandwidth")) {
    std::fprintf(stderr, "gradlanectl: unknown command '%s'\n", cmd.c_str());
    Usage();
    return 2;
  }
  json r = Call(socket, req, timeout_s > 0 ? timeout_s : 10);
  if (raw) {
    std::printf("%s\n", r.dump(2).c_str());
    return 0;
  }
  if (cmd == "status") PrintStatus(r);
  if (cmd == "counters") PrintCounters(r);
  if (cmd == "jobs") PrintJobs(r);
  if (cmd == "peers") PrintPeers(r);
  if (cmd == "queues") PrintQueues(r);
  if (cmd == "bandwidth") PrintBandwidth(r);
  return 0;
}
