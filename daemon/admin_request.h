// daemon/admin_request.h — the admin socket's request parser: one line of untrusted JSON from
// any local user allowed on the socket, turned into a typed AdminRequest.
//
// Why a parser of its own: nlohmann_json's convenience accessors (value(), get<>(), operator[])
// throw type_error on a field of the wrong type, and the daemon is built to terminate on an
// uncaught exception — `{"cmd":5}` used to abort gradlaned with every job it served. Everything
// here checks a value's type before reading it and never throws.
//
// Guarantees:
//   - ParseAdminRequest never throws and never aborts, whatever the bytes (fuzzed:
//     tests/fuzz/admin_request_fuzz.cc); every refusal is InvalidArgument whose message names
//     the field and what it must be, ready for `{"ok": false, "error": ...}`.
//   - Unknown members are ignored (a newer gradlanectl may send more); known members must have
//     their documented type and range.
//   - Pure functions: any thread.
#ifndef GRADLANE_DAEMON_ADMIN_REQUEST_H_
#define GRADLANE_DAEMON_ADMIN_REQUEST_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace gradlane::daemon {

enum class AdminCmd { kStatus, kJobs, kPeers, kQueues, kBandwidth, kTrace };

std::string_view AdminCmdName(AdminCmd cmd);

// Bounds on what a client may ask for.
struct AdminLimits {
  size_t max_request_bytes = 4096;     // one request line, without its newline
  uint64_t max_trace_spans = 1 << 20;  // trace.max_spans upper bound (and its default)
  int64_t max_trace_iterations = 10000;
  double max_trace_timeout_s = 600;
};

// `{"cmd": "trace", "job": ID, "iterations": N, "timeout_s": S, "max_spans": M}`; only job is
// required.
struct TraceRequest {
  std::string job;
  int64_t iterations = 1;  // 1..max_trace_iterations (a whole number)
  double timeout_s = 60;   // (0, max_trace_timeout_s]
  uint64_t max_spans = 0;  // 1..max_trace_spans; absent: max_trace_spans
};

struct AdminRequest {
  AdminCmd cmd = AdminCmd::kStatus;
  TraceRequest trace;  // cmd == kTrace only
};

// Parses one request line (without or with its trailing newline).
absl::StatusOr<AdminRequest> ParseAdminRequest(std::string_view line, const AdminLimits& limits);
// The same for an already parsed JSON value (a distinct name: a string literal converts to both).
absl::StatusOr<AdminRequest> AdminRequestFromJson(const nlohmann::json& request,
                                                  const AdminLimits& limits);

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_ADMIN_REQUEST_H_
