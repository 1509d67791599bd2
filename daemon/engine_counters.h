// daemon/engine_counters.h — the list of the engine's counters, and nothing else: no
// dependencies, so gradlanectl can include it as well as the daemon.
#ifndef GRADLANE_DAEMON_ENGINE_COUNTERS_H_
#define GRADLANE_DAEMON_ENGINE_COUNTERS_H_

// Every engine counter, declared once: X(name, type, metric, label, help).
//   name    the field of EngineStats / EngineCounters, and the key in the admin socket's
//           status reply and in `gradlanectl counters`
//   type    Counter (only goes up) or Gauge
//   metric  the Prometheus family; counters that share one differ by `label` ("key=value")
//   help    what it counts (a family shared by several counters has its own help, in
//           daemon/metrics.cc)
// EngineStats and EngineCounters (daemon/engine_options.h), the Prometheus families
// (daemon/metrics.cc), the admin socket's status reply (daemon/admin_server.cc), the daemon's
// exit log line (daemon/main.cc) and `gradlanectl counters` are generated from this list.
#define GRADLANE_ENGINE_COUNTERS(X) \
  X(jobs_active, Gauge, "gradlane_jobs_active", "", "jobs this daemon serves now") \
  X(jobs_failed, Counter, "gradlane_jobs_failed_total", "", \
    "jobs that failed (a post was lost or a configuration error)") \
  X(jobs_released, Counter, "gradlane_jobs_released_total", "", \
    "jobs ended and released (arena alias unmapped, slot free)") \
  X(posts_completed, Counter, "gradlane_posts_total", "result=ok", \
    "client posts completed with their reduced result") \
  X(posts_failed, Counter, "gradlane_posts_total", "result=error", \
    "client posts completed with an error") \
  X(segments_sent, Counter, "gradlane_engine_segments_sent_total", "", \
    "segments the engine handed to the transport (pushes and pull responses)") \
  X(segments_received, Counter, "gradlane_engine_segments_received_total", "", \
    "segments from peers placed for a job (data, manifests, leave frames)") \
  X(segments_rejected, Counter, "gradlane_errors_total", "kind=segment_rejected", \
    "peer frames refused: they did not fit their job (tensor, dtype, range or round)") \
  X(rounds_reduced, Counter, "gradlane_rounds_reduced_total", "", \
    "shard rounds reduced (all W contributions of a partition summed)") \
  X(fusion_buckets, Counter, "gradlane_fusion_buckets_total", "", \
    "all-reduce ring buckets that small tensors were fused into (per job, once its plan applied)") \
  X(rounds_folded, Counter, "gradlane_rounds_folded_total", "", \
    "shard rounds whose last contribution was reduced packet by packet as it arrived " \
    "(kernel-bypass transports), of rounds_reduced") \
  X(manifest_mismatches, Counter, "gradlane_errors_total", "kind=manifest_mismatch", \
    "peers whose tensor list, W, policy or reduce op differed from this rank's") \
  X(arena_aliases, Gauge, "gradlane_arena_aliases", "", \
    "client arena aliases live jobs hold now (one per live job)") \
  X(tuner_trials, Counter, "gradlane_tuner_trials_total", "", \
    "credit windows measured by the online tuner (bytescheduler with --autotune)") \
  X(device_tensors, Counter, "gradlane_gpudirect_tensors_total", "result=registered", \
    "device tensors whose pushes were sent straight from GPU memory (a dma-buf the NIC reads)") \
  X(device_registrations_refused, Counter, "gradlane_gpudirect_tensors_total", "result=staged", \
    "device tensors whose GPU memory the transport could not register: staged instead")

#endif  // GRADLANE_DAEMON_ENGINE_COUNTERS_H_
