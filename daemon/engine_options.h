// daemon/engine_options.h — what the engine is configured with (from gradlaned's flags,
// daemon/config.h) and the counters it keeps (EngineStats, readable from any thread).
#ifndef GRADLANE_DAEMON_ENGINE_OPTIONS_H_
#define GRADLANE_DAEMON_ENGINE_OPTIONS_H_

#include <cstdint>
#include <string>

#include "daemon/ps/aggregator.h"
#include "daemon/session_server.h"
#include "daemon/telemetry.h"
#include "transport/transport.h"

namespace gradlane::daemon {

struct EngineOptions {
  SessionServerOptions sessions;
  transport::TransportOptions transport;
  std::string default_policy = "bytescheduler";
  uint64_t partition_bytes = 0;  // 0: each policy's default
  uint64_t credit_bytes = 0;     // 0: each policy's default
  ps::ReduceOp reduce = ps::ReduceOp::kSum;
  // bytescheduler only: tune the credit window online with the BO tuner (ByteScheduler §4.3).
  // The partition size stays fixed: changing it would change keys and shards on every rank.
  bool autotune = false;
  int autotune_iterations_per_trial = 5;
  // Busy-polling before the engine sleeps (in loop rounds), and the sleep granularity.
  int idle_spins = 200;
  // Operator telemetry (events + snapshots, daemon/telemetry.h); null: none. Outlives the engine.
  Telemetry* telemetry = nullptr;
  int idle_wait_ms = 1;
};

// Counters readable from any thread.
struct EngineStats {
  uint64_t jobs_active = 0;
  uint64_t jobs_failed = 0;
  uint64_t jobs_released = 0;
  uint64_t posts_completed = 0;
  uint64_t posts_failed = 0;
  uint64_t segments_sent = 0;
  uint64_t segments_received = 0;
  uint64_t segments_rejected = 0;  // frames that did not fit the job (counted, refused)
  uint64_t rounds_reduced = 0;
  uint64_t rounds_folded = 0;      // of those, reduced piece by piece as the last rank's bytes came in
  uint64_t manifest_mismatches = 0;
  uint64_t arena_aliases = 0;      // client arenas currently mapped by the engine
  uint64_t tuner_trials = 0;
};

// The counters behind EngineStats: written by the engine thread only, read by anyone.
struct EngineCounters {
  transport::StatCounter jobs_active, jobs_failed, jobs_released, posts_completed, posts_failed,
      segments_sent, segments_received, segments_rejected, rounds_reduced, rounds_folded,
      manifest_mismatches, arena_aliases, tuner_trials;
  EngineStats Snapshot() const {
    EngineStats s;
    s.jobs_active = jobs_active.Get();
    s.jobs_failed = jobs_failed.Get();
    s.jobs_released = jobs_released.Get();
    s.posts_completed = posts_completed.Get();
    s.posts_failed = posts_failed.Get();
    s.segments_sent = segments_sent.Get();
    s.segments_received = segments_received.Get();
    s.segments_rejected = segments_rejected.Get();
    s.rounds_reduced = rounds_reduced.Get();
    s.rounds_folded = rounds_folded.Get();
    s.manifest_mismatches = manifest_mismatches.Get();
    s.arena_aliases = arena_aliases.Get();
    s.tuner_trials = tuner_trials.Get();
    return s;
  }
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_ENGINE_OPTIONS_H_
