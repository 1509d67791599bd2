// gradlaned — the per-host gradlane daemon. Parses flags (and --flagfile), binds the client
// socket and the peer port, starts the operator services (Prometheus endpoint, admin socket:
// daemon/ops.h), logs where they listen, prints one ready line, tells systemd READY=1, runs the
// engine thread until SIGTERM/SIGINT (pinging systemd's watchdog while the engine makes progress),
// then fails pending posts, closes every session and exits 0. Any startup error is one line on
// stderr and exit code 1.
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/config.h"
#include "daemon/engine.h"
#include "daemon/ops.h"
#include "transport/dpdk/dpdk_transport.h"
#include "transport/tcp/tcp_transport.h"
#ifdef GRADLANE_HAVE_VERBS
#include "transport/verbs/verbs_transport.h"
#endif

namespace {

using gradlane::daemon::Engine;
using TransportOrError = absl::StatusOr<std::unique_ptr<gradlane::transport::Transport>>;

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "gradlaned: error: %s\n", why.c_str());
  std::exit(1);
}

// mkdir -p of the socket's directory (e.g. /run/gradlane), best effort: Create reports what
// still fails.
void MakeParentDirs(const std::string& path) {
  for (size_t i = 1; i < path.size(); ++i) {
    if (path[i] != '/') continue;
    const std::string dir = path.substr(0, i);
    ::mkdir(dir.c_str(), 0755);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Signals are taken by sigwait in main; every thread inherits the mask. SIGPIPE never
  // matters (sockets use MSG_NOSIGNAL), but a stray write must not kill the daemon.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  absl::SetProgramUsageMessage(
      "gradlaned: the gradlane per-host transport daemon.\n"
      "  gradlaned [--socket=PATH] [--listen=HOST:PORT] [--flagfile=FILE] ...");
  // Abseil's --help lists only flags defined in a file named after the program (gradlaned.cc),
  // so it listed none: the daemon's flags are in daemon/config.cc and daemon/ops.cc. List
  // those; --helpfull still adds Abseil's own.
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "daemon/");
  };
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) Die(absl::StrCat("unexpected argument '", rest[1], "'"));

  auto options = gradlane::daemon::OptionsFromFlags();
  if (!options.ok()) Die(std::string(options.status().message()));
  MakeParentDirs(options->sessions.socket_path);
  auto ops_config = gradlane::daemon::OpsConfigFromFlags(options->sessions.socket_path);
  if (!ops_config.ok()) Die(std::string(ops_config.status().message()));
  // The engine's side of the operator telemetry; outlives the engine (declared first).
  gradlane::daemon::Telemetry telemetry;
  options->telemetry = &telemetry;

  auto transport = gradlane::daemon::TransportFromFlags();
  if (!transport.ok()) Die(std::string(transport.status().message()));
  // The ready line names the address peers dial: for DPDK, the port's own IPv4 address.
  if (transport->name == "dpdk" && !transport->dpdk.ip.empty()) {
    options->transport.listen_address = transport->dpdk.ip;
  }

  // The backend is chosen here; the rest is the same for every one.
  Engine::TransportFactory make_transport =
      [](const gradlane::transport::TransportOptions& o,
         gradlane::transport::TransportHandler* h) -> TransportOrError {
    return gradlane::transport::tcp::TcpTransport::Create(o, h);
  };
  if (transport->name == "dpdk") {
#ifdef GRADLANE_HAVE_DPDK
    make_transport =
        [dpdk = transport->dpdk](const gradlane::transport::TransportOptions& o,
                                 gradlane::transport::TransportHandler* h) -> TransportOrError {
      auto t = gradlane::transport::dpdk::DpdkTransport::Create(o, dpdk, h);
      if (t.ok()) gradlane::daemon::LogLine((*t)->Describe());
      return t;
    };
#else
    Die("--transport=dpdk: this gradlaned was built without DPDK (meson -Ddpdk=enabled, "
        "libdpdk-dev)");
#endif
  }
  if (transport->name == "verbs") {
#ifdef GRADLANE_HAVE_VERBS
    make_transport =
        [verbs = transport->verbs](const gradlane::transport::TransportOptions& o,
                                   gradlane::transport::TransportHandler* h) -> TransportOrError {
      auto t = gradlane::transport::verbs::VerbsTransport::Create(o, verbs, h);
      if (t.ok()) {
        gradlane::daemon::LogLine(absl::StrCat("verbs: device ", (*t)->device().name(), " port ",
                                               (*t)->device().port(), " GID index ",
                                               (*t)->device().gid_index()));
      }
      return t;
    };
#else
    Die("--transport=verbs: this gradlaned was built without rdma-core (meson -Dverbs=enabled, "
        "libibverbs-dev)");
#endif
  }
  {
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*options, make_transport);
    if (!engine.ok()) Die(std::string(engine.status().message()));
    Engine* e = engine->get();
    gradlane::daemon::HubSources sources;
    sources.telemetry = &telemetry;
    sources.engine_stats = [e] { return e->Stats(); };
    sources.transport_stats = [e] { return e->transport().Stats(); };
    sources.session_stats = [e] { return e->sessions().Stats(); };
    sources.backend = [e] { return e->transport().DescribeBackend(); };
    sources.version = GRADLANE_VERSION;
    auto ops = gradlane::daemon::OpsServices::Start(*ops_config, std::move(sources));
    if (!ops.ok()) {
      engine->reset();  // removes the client socket
      Die(std::string(ops.status().message()));
    }

    std::string host = options->transport.listen_address;
    if (host.find(':') != std::string::npos) host = absl::StrCat("[", host, "]");
    // Logged before the ready line (stdout keeps its one-line contract): a script that has
    // seen the ready line finds this in the log.
    gradlane::daemon::LogLine(absl::StrCat(
        "ops metrics=", (*ops)->metrics_endpoint().empty() ? "none" : (*ops)->metrics_endpoint(),
        " admin=", (*ops)->admin_socket().empty() ? "none" : (*ops)->admin_socket()));
    std::printf("gradlaned ready socket=%s listen=%s:%u\n", (*engine)->socket_path().c_str(),
                host.c_str(), static_cast<unsigned>((*engine)->listen_port()));
    std::fflush(stdout);
    gradlane::daemon::SystemdNotifier systemd;
    systemd.Ready(absl::StrCat("serving on port ", (*engine)->listen_port()));

    std::atomic<bool> stop{false};
    std::thread engine_thread([e, &stop] { e->Run(stop); });

    // Wait for a signal; meanwhile ping systemd's watchdog at half its interval, but only while
    // the engine's heartbeat (its housekeeping clock) has moved since the last ping: a stuck
    // engine loop stops the pings and systemd restarts the daemon.
    const gradlane::sched::TimeNs wd = systemd.watchdog_interval();
    const gradlane::sched::TimeNs tick =
        wd > 0 ? std::min<gradlane::sched::TimeNs>(wd / 2, gradlane::sched::kSecond)
               : gradlane::sched::kSecond;
    gradlane::sched::TimeNs last_beat = -1;
    int sig = 0;
    for (;;) {
      timespec ts{static_cast<time_t>(tick / gradlane::sched::kSecond),
                  static_cast<long>(tick % gradlane::sched::kSecond)};
      sig = sigtimedwait(&set, nullptr, &ts);
      if (sig > 0) break;
      if (wd > 0) {
        const gradlane::sched::TimeNs beat = telemetry.heartbeat();
        if (beat != last_beat) {
          last_beat = beat;
          systemd.PingWatchdog();
        }
      }
    }
    systemd.Stopping();
    gradlane::daemon::LogLine(absl::StrCat("signal ", sig, ": shutting down"));
    // The admin and metrics threads read the engine and its session server, which the engine's
    // shutdown destroys: they stop first (a scrape during shutdown used to read a freed
    // session server).
    ops->reset();
    stop.store(true, std::memory_order_release);
    engine_thread.join();  // Run() ends with Shutdown_st: posts failed, sessions closed, unmapped
    {
      // One line for the log (and the integration tests): what this run did.
      const gradlane::daemon::EngineStats es = e->Stats();
      std::string line = "engine stats:";
      for (const auto& c : gradlane::daemon::kEngineCounters) {
        absl::StrAppend(&line, " ", c.name, "=", es.*c.field);
      }
      gradlane::daemon::LogLine(line);
    }
    engine->reset();
    return 0;
  }
}
