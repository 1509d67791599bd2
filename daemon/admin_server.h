// daemon/admin_server.h — gradlaned's admin socket, served by its own control thread (never the
// engine thread): the commands behind `gradlanectl`.
//
// Protocol (docs/operations.md): a client connects to the Unix socket (--admin_socket), writes
// one request line of JSON, `{"cmd": "status"}`, and reads one response line of JSON, `{"ok":
// true, ...}` or `{"ok": false, "error": "..."}`; then the server closes the connection.
// Commands: status, jobs, peers, queues, bandwidth, and trace (`{"cmd": "trace", "job": ID,
// "iterations": N, "timeout_s": S, "max_spans": M}`), whose answer comes once the N
// iterations were recorded (or the job ended, or the timeout passed) and carries the
// Chrome/Perfetto trace as the member "trace". Requests are parsed by ParseAdminRequest
// (daemon/admin_request.h: typed, never throws); malformed input, a field of the wrong type or
// out of range gets an error response naming the field; a silent client is disconnected.
//
// The control thread also keeps the engine's event ring drained (TelemetryHub::With every
// kPumpInterval) even when nobody asks, so histograms stay complete and the engine never finds
// the ring full in normal operation.
//
// Thread rules: Start/Stop from the main thread; everything else on the server's thread.
#ifndef GRADLANE_DAEMON_ADMIN_SERVER_H_
#define GRADLANE_DAEMON_ADMIN_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "daemon/admin_request.h"
#include "daemon/telemetry_hub.h"
#include "nlohmann/json.hpp"

namespace gradlane::daemon {

struct AdminOptions {
  // Unix socket path; empty: no socket (the thread still drains telemetry).
  std::string socket_path;
  std::string metrics_address;  // shown by `status`
  size_t max_trace_spans = 1 << 20;
  int max_clients = 16;
};

// The admin socket next to the client socket: ".../gradlaned.sock" -> ".../gradlaned.admin.sock"
// (any other name gets ".admin" appended).
std::string DefaultAdminSocket(const std::string& client_socket);

// Answers one request (every command but trace) from the hub. Exposed for tests.
nlohmann::json AdminCommand(TelemetryHub& hub, const AdminOptions& options, AdminCmd cmd);
// The same for a request not parsed yet (ParseAdminRequest's error becomes the answer).
nlohmann::json AdminCommand(TelemetryHub& hub, const AdminOptions& options,
                            const nlohmann::json& request);

// The request bounds the server applies (line length, trace limits).
AdminLimits AdminLimitsOf(const AdminOptions& options);

class AdminServer {
 public:
  // Binds the socket (a live daemon already on it is an error; a stale file is replaced) and
  // starts the control thread.
  static absl::StatusOr<std::unique_ptr<AdminServer>> Start(const AdminOptions& options,
                                                            TelemetryHub* hub);
  ~AdminServer();  // Stop()
  void Stop();     // joins the thread, removes the socket file

 private:
  AdminServer(const AdminOptions& options, TelemetryHub* hub) : options_(options), hub_(hub) {}
  void Run();

  AdminOptions options_;
  TelemetryHub* hub_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_ADMIN_SERVER_H_
