// daemon/engine_internal.h — pieces shared by the engine's implementation files (engine.cc,
// worker_role.cc, ps_role.cc, engine_sched.cc, engine_telemetry.cc): send/receive cookies,
// status mapping and the online tuner's state. Not for use
// outside daemon/.
#ifndef GRADLANE_DAEMON_ENGINE_INTERNAL_H_
#define GRADLANE_DAEMON_ENGINE_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "daemon/engine.h"
#include "sched/bo_tuner.h"

namespace gradlane::daemon {
namespace engine_internal {

using sched::TimeNs;

// Cookies: which job (slot + 12 bits of generation) a send or receive belongs to, and for
// sends the direction and the dispatch record. 12 bits of slot bound the jobs per daemon.
inline constexpr uint32_t kMaxJobs = 4096;
inline constexpr uint64_t kCookieLeave = 1ull << 37;
inline constexpr uint64_t kCookieManifest = 1ull << 38;
inline constexpr uint64_t kCookiePull = 1ull << 39;
inline constexpr uint32_t kNoDispatch = 0xFFFFFFFFu;

inline uint64_t MakeCookie(uint32_t slot, uint32_t generation, uint64_t flags, uint32_t dispatch) {
  return (uint64_t{slot} << 52) | (uint64_t{generation & 0xFFFu} << 40) | flags | dispatch;
}
inline uint32_t CookieSlot(uint64_t c) { return static_cast<uint32_t>(c >> 52); }
inline uint32_t CookieGeneration(uint64_t c) { return static_cast<uint32_t>((c >> 40) & 0xFFFu); }
inline uint32_t CookieDispatch(uint64_t c) { return static_cast<uint32_t>(c & 0xFFFFFFFFu); }

// How a transport failure reads to the client.
inline gl_status StatusFor(const absl::Status& why) {
  switch (why.code()) {
    case absl::StatusCode::kPermissionDenied: return GL_E_PERMISSION;
    case absl::StatusCode::kDeadlineExceeded: return GL_E_TIMEOUT;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition: return GL_E_PROTOCOL;
    default: return GL_E_DISCONNECTED;
  }
}

inline const char* StatusName(gl_status s) {
  static constexpr const char* kNames[GL_STATUS_COUNT] = {
      "ok", "invalid_argument", "bad_magic", "bad_version", "permission", "no_memory", "again",
      "timeout", "disconnected", "protocol", "bad_tensor", "bad_range", "bad_iteration",
      "bad_opcode", "bad_descriptor", "no_job", "already_exists", "ring_corrupt", "io",
      "internal"};
  return s >= 0 && s < GL_STATUS_COUNT ? kNames[s] : "unknown";
}

inline constexpr TimeNs kHousekeepingInterval = sched::kMillisecond;
// How long a released job's connections may linger to deliver their goodbye frames before the
// job is removed from the transport (which tears down whatever is still open).
inline constexpr TimeNs kReleaseLinger = 200 * sched::kMillisecond;
inline constexpr TimeNs kEstimateInterval = 10 * sched::kMillisecond;

}  // namespace engine_internal

// Online tuning of the bytescheduler credit window (ByteScheduler §4.3): one trial spans
// `autotune_iterations_per_trial` iterations; its speed is bytes posted per second of wall time.
struct Engine::Tuner {
  sched::BoTuner tuner;
  sched::TunerParams trial;
  int iterations = 0;
  sched::TimeNs started = 0;
  uint64_t bytes = 0;
  int64_t last_iteration = -1;
  bool pending_apply = false;
};


}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_ENGINE_INTERNAL_H_
