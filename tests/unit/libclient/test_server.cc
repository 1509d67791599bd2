// A loopback session server for tests that run outside this process (the Python binding):
//   gradlane_test_server SOCKET_PATH
// Serves until stdin reaches EOF (the test closes its pipe) or SIGTERM; prints "ready" once
// the socket is listening.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "daemon/session_server.h"

namespace {
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SOCKET_PATH\n", argv[0]);
    return 2;
  }
  gradlane::daemon::SessionServerOptions o;
  o.socket_path = argv[1];
  o.loopback_complete = true;
  auto server = gradlane::daemon::SessionServer::Create(o);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  ::signal(SIGTERM, OnSignal);
  std::thread watch([] {
    pollfd p{0, POLLIN, 0};
    while (!g_stop.load()) {
      if (::poll(&p, 1, 50) > 0) {
        char buf[64];
        if (::read(0, buf, sizeof(buf)) <= 0) g_stop.store(true);
      }
    }
  });
  std::printf("ready\n");
  std::fflush(stdout);
  (*server)->Run_st(g_stop, 5);
  watch.join();
  return 0;
}
