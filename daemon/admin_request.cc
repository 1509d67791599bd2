#include "daemon/admin_request.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace gradlane::daemon {
namespace {

using nlohmann::json;

constexpr char kCommands[] = "status, jobs, peers, queues, bandwidth, trace";

// (This absl predates std::string_view in StrCat: the parameters are absl's.)
absl::Status Bad(absl::string_view field, absl::string_view want, const json& got) {
  // type_name() is noexcept; the value itself is not echoed (it may be long or binary-ish).
  return absl::InvalidArgumentError(
      absl::StrCat("\"", field, "\" must be ", want, " (got ", got.type_name(), ")"));
}

// A JSON number that is a whole number in [lo, hi]. Floats are accepted when integral (2.0), so
// a client that only has doubles (Python's json with arithmetic, jq) is not refused for style.
bool WholeInRange(const json& v, int64_t lo, uint64_t hi, uint64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (lo > 0 && u < static_cast<uint64_t>(lo)) return false;
    if (u > hi) return false;
    *out = u;
    return true;
  }
  if (v.is_number_integer()) {  // signed: negative, or small enough for int64
    const int64_t i = v.get<int64_t>();
    if (i < lo || i < 0 || static_cast<uint64_t>(i) > hi) return false;
    *out = static_cast<uint64_t>(i);
    return true;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // 2^64 is exactly representable; anything at or above it cannot be a uint64.
    if (!std::isfinite(d) || d != std::floor(d) || d < static_cast<double>(lo) || d < 0 ||
        d >= 18446744073709551616.0 || d > static_cast<double>(hi)) {
      return false;
    }
    const uint64_t u = static_cast<uint64_t>(d);
    if (u > hi || static_cast<int64_t>(u) < lo) return false;
    *out = u;
    return true;
  }
  return false;
}

}  // namespace

std::string_view AdminCmdName(AdminCmd cmd) {
  switch (cmd) {
    case AdminCmd::kStatus:
      return "status";
    case AdminCmd::kJobs:
      return "jobs";
    case AdminCmd::kPeers:
      return "peers";
    case AdminCmd::kQueues:
      return "queues";
    case AdminCmd::kBandwidth:
      return "bandwidth";
    case AdminCmd::kTrace:
      return "trace";
  }
  return "unknown";
}

absl::StatusOr<AdminRequest> ParseAdminRequest(std::string_view line, const AdminLimits& limits) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  if (line.size() > limits.max_request_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request line over ", limits.max_request_bytes, " bytes"));
  }
  // allow_exceptions=false: a syntax error, invalid UTF-8 or a number out of double's range
  // gives a discarded value instead of parse_error/out_of_range.
  const json req = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (req.is_discarded()) return absl::InvalidArgumentError("request is not valid JSON");
  return AdminRequestFromJson(req, limits);
}

absl::StatusOr<AdminRequest> AdminRequestFromJson(const json& req, const AdminLimits& limits) {
  if (!req.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request must be a JSON object with a string \"cmd\" (got ", req.type_name(), ")"));
  }
  // find() rather than value()/operator[]: neither throws nor inserts.
  const auto cmd_it = req.find("cmd");
  if (cmd_it == req.end()) return absl::InvalidArgumentError("request has no \"cmd\"");
  if (!cmd_it->is_string()) return Bad("cmd", "a string", *cmd_it);
  const std::string& cmd = cmd_it->get_ref<const std::string&>();
  AdminRequest r;
  if (cmd == "status") {
    r.cmd = AdminCmd::kStatus;
  } else if (cmd == "jobs") {
    r.cmd = AdminCmd::kJobs;
  } else if (cmd == "peers") {
    r.cmd = AdminCmd::kPeers;
  } else if (cmd == "queues") {
    r.cmd = AdminCmd::kQueues;
  } else if (cmd == "bandwidth") {
    r.cmd = AdminCmd::kBandwidth;
  } else if (cmd == "trace") {
    r.cmd = AdminCmd::kTrace;
  } else {
    // Bounded by the request line; dump() with replace never throws on odd bytes.
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown command ", cmd_it->dump(-1, ' ', false, json::error_handler_t::replace), " (",
        kCommands, ")"));
  }
  if (r.cmd != AdminCmd::kTrace) return r;

  TraceRequest& t = r.trace;
  const auto job = req.find("job");
  if (job == req.end()) return absl::InvalidArgumentError("trace: missing \"job\"");
  if (!job->is_string() || job->get_ref<const std::string&>().empty()) {
    return Bad("job", "a non-empty string", *job);
  }
  t.job = job->get_ref<const std::string&>();

  if (const auto it = req.find("iterations"); it != req.end()) {
    uint64_t n = 0;
    if (!WholeInRange(*it, 1, static_cast<uint64_t>(limits.max_trace_iterations), &n)) {
      return Bad("iterations", absl::StrCat("a whole number in 1..", limits.max_trace_iterations),
                 *it);
    }
    t.iterations = static_cast<int64_t>(n);
  }
  if (const auto it = req.find("timeout_s"); it != req.end()) {
    const double d = it->is_number() ? it->get<double>() : std::numeric_limits<double>::quiet_NaN();
    if (!(d > 0 && d <= limits.max_trace_timeout_s)) {
      return Bad("timeout_s",
                 absl::StrCat("a number of seconds in (0, ", limits.max_trace_timeout_s, "]"), *it);
    }
    t.timeout_s = d;
  }
  t.max_spans = limits.max_trace_spans;
  if (const auto it = req.find("max_spans"); it != req.end()) {
    uint64_t n = 0;
    if (!WholeInRange(*it, 1, limits.max_trace_spans, &n)) {
      return Bad("max_spans", absl::StrCat("a whole number in 1..", limits.max_trace_spans), *it);
    }
    t.max_spans = n;
  }
  return r;
}

}  // namespace gradlane::daemon
