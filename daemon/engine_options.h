// daemon/engine_options.h — what the engine is configured with (from gradlaned's flags,
// daemon/config.h) and the counters it keeps (EngineStats, readable from any thread), declared
// once in GRADLANE_ENGINE_COUNTERS.
#ifndef GRADLANE_DAEMON_ENGINE_OPTIONS_H_
#define GRADLANE_DAEMON_ENGINE_OPTIONS_H_

#include <cstdint>
#include <string>

#include "daemon/engine_counters.h"
#include "daemon/ps/aggregator.h"
#include "daemon/session_server.h"
#include "daemon/telemetry.h"
#include "transport/transport.h"

namespace gradlane::daemon {

struct EngineOptions {
  SessionServerOptions sessions;
  transport::TransportOptions transport;
  std::string default_policy = "gradlane";
  uint64_t partition_bytes = 0;  // 0: each policy's default
  uint64_t credit_bytes = 0;     // 0: each policy's default
  ps::ReduceOp reduce = ps::ReduceOp::kSum;
  // All-reduce jobs: fuse small tensors into ring buckets by PACE's balanced fusion, decided
  // once by rank 0 from what it measured (daemon/ring_role.h). Every rank must agree (it is in
  // the job's fingerprint).
  enum class Fusion : uint8_t {
    kOff,     // every partition its own ring (the default: fusion has not paid off where measured)
    kPace,    // PACE's balanced fusion from the measured costs
    kGreedy,  // every run of small tensors fused up to one partition (a fusion buffer)
  };
  Fusion allreduce_fusion = Fusion::kOff;
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
#define GRADLANE_STATS_FIELD(name, type, metric, label, help) uint64_t name = 0;
  GRADLANE_ENGINE_COUNTERS(GRADLANE_STATS_FIELD)
#undef GRADLANE_STATS_FIELD
};

// The counters behind EngineStats: written by the engine thread only, read by anyone.
struct EngineCounters {
#define GRADLANE_COUNTER_FIELD(name, type, metric, label, help) transport::StatCounter name;
  GRADLANE_ENGINE_COUNTERS(GRADLANE_COUNTER_FIELD)
#undef GRADLANE_COUNTER_FIELD
  EngineStats Snapshot() const {
    EngineStats s;
#define GRADLANE_SNAPSHOT_FIELD(name, type, metric, label, help) s.name = name.Get();
    GRADLANE_ENGINE_COUNTERS(GRADLANE_SNAPSHOT_FIELD)
#undef GRADLANE_SNAPSHOT_FIELD
    return s;
  }
};

// The list as data (daemon/metrics.cc, daemon/admin_server.cc, daemon/main.cc).
using transport::CounterInfo;
using transport::CounterType;
inline constexpr CounterInfo<EngineStats> kEngineCounters[] = {
#define GRADLANE_COUNTER_INFO(name, type, metric, label, help) \
  {#name, CounterType::type, metric, label, help, &EngineStats::name},
    GRADLANE_ENGINE_COUNTERS(GRADLANE_COUNTER_INFO)
#undef GRADLANE_COUNTER_INFO
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_ENGINE_OPTIONS_H_
