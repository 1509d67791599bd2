// Fuzz target: the admin socket's request parser (daemon/admin_request.h). Any bytes a local
// user can write to the admin socket as one line; the parser must answer every one with a
// request within the limits or an InvalidArgument, never throw or abort.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "daemon/admin_request.h"

using gradlane::daemon::AdminCmd;
using gradlane::daemon::AdminLimits;
using gradlane::daemon::ParseAdminRequest;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  AdminLimits limits;
  limits.max_trace_spans = 100000;
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  auto r = ParseAdminRequest(line, limits);
  if (!r.ok()) {
    if (!absl::IsInvalidArgument(r.status()) || r.status().message().empty()) std::abort();
    return 0;
  }
  if (r->cmd == AdminCmd::kTrace) {
    const auto& t = r->trace;
    if (t.job.empty() || t.iterations < 1 || t.iterations > limits.max_trace_iterations ||
        !(t.timeout_s > 0 && t.timeout_s <= limits.max_trace_timeout_s) || t.max_spans < 1 ||
        t.max_spans > limits.max_trace_spans) {
      std::abort();  // accepted something out of range
    }
  }
  return 0;
}
