// gradlaned — the per-host gradlane daemon. Parses flags (and --flagfile), binds the client
// socket and the peer port, prints one ready line, runs the engine thread until SIGTERM/SIGINT,
// then fails pending posts, closes every session and exits 0. Any startup error is one line on
// stderr and exit code 1.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "daemon/config.h"
#include "daemon/engine.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/dpdk/dpdk_transport.h"
#include <type_traits>

namespace {

using Engine = gradlane::daemon::Engine<gradlane::transport::tcp::TcpTransport>;

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

// systemd Type=notify: READY=1 / STOPPING=1 to $NOTIFY_SOCKET when set (no libsystemd needed).
void Notify(const char* state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t n = std::strlen(path);
  if (n >= sizeof(addr.sun_path)) return;
  std::memcpy(addr.sun_path, path, n);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  (void)::sendto(fd, state, std::strlen(state), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr),
                 static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n));
  ::close(fd);
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
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) Die(absl::StrCat("unexpected argument '", rest[1], "'"));

  auto options = gradlane::daemon::OptionsFromFlags();
  if (!options.ok()) Die(std::string(options.status().message()));
  MakeParentDirs(options->sessions.socket_path);

  auto transport = gradlane::daemon::TransportFromFlags();
  if (!transport.ok()) Die(std::string(transport.status().message()));
  if (transport->name == "dpdk" && !transport->dpdk.ip.empty()) {
    options->transport.listen_address = transport->dpdk.ip;
  }
  auto serve = [&](auto engine) -> int {
    using EngineT = typename std::remove_reference_t<decltype(**engine)>;
    if (!engine.ok()) Die(std::string(engine.status().message()));

    std::string host = options->transport.listen_address;
    if (host.find(':') != std::string::npos) host = absl::StrCat("[", host, "]");
    std::printf("gradlaned ready socket=%s listen=%s:%u\n", (*engine)->socket_path().c_str(),
                host.c_str(), static_cast<unsigned>((*engine)->listen_port()));
    std::fflush(stdout);
    Notify("READY=1");

    std::atomic<bool> stop{false};
    EngineT* e = engine->get();
    std::thread engine_thread([e, &stop] { e->Run(stop); });

    int sig = 0;
    while (sigwait(&set, &sig) != 0) {
    }
    Notify("STOPPING=1");
    gradlane::daemon::LogLine(absl::StrCat("signal ", sig, ": shutting down"));
    stop.store(true, std::memory_order_release);
    engine_thread.join();  // Run() ends with Shutdown_st: posts failed, sessions closed, unmapped
    engine->reset();
    return 0;
  };
  if (transport->name == "dpdk") {
#ifdef GRADLANE_HAVE_DPDK
    const gradlane::transport::dpdk::DpdkOptions dpdk = transport->dpdk;
    return serve(gradlane::daemon::Engine<gradlane::transport::dpdk::DpdkTransport>::Create(
        *options, [&dpdk](const gradlane::transport::TransportOptions& o,
                          gradlane::transport::TransportHandler* h) {
          auto t = gradlane::transport::dpdk::DpdkTransport::Create(o, dpdk, h);
          if (t.ok()) gradlane::daemon::LogLine((*t)->Describe());
          return t;
        }));
#else
    Die("--transport=dpdk: this gradlaned was built without DPDK");
#endif
  }
  return serve(Engine::Create(
      *options, [](const gradlane::transport::TransportOptions& o,
                   gradlane::transport::TransportHandler* h) {
        return gradlane::transport::tcp::TcpTransport::Create(o, h);
      }));
}
