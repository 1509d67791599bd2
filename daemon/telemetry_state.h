// daemon/telemetry_state.h — the reader's side of the engine's telemetry (daemon/telemetry.h):
// folds events and snapshots into what the operator tools show — byte counters per peer,
// direction and priority class, queued bytes per class, histograms of queueing delay and segment
// latency, per-job iteration times, preemptions and Prophet blocks — and records traces.
//
// Definitions (docs/operations.md lists the metrics built from them):
//   queueing delay   dispatch time − the time the segment's bytes entered the policy
//   segment latency  acknowledgement time − send time (one segment, wire + peer placement)
//   iteration time   start-to-start: the first post of iteration k+1 − the first post of k
//   preemption       a segment dispatched while bytes that entered the policy strictly earlier
//                    were still queued (it overtook them: what priority scheduling is for)
//   block            a Dispatch of more than one segment (a Prophet gradient block)
//   trace            `Arm` a job and N iterations: from the next iteration that starts, every
//                    segment's queue [ready, dispatched] and wire [dispatched, acked] span, every
//                    shard round's aggregation span [first contribution, reduced], every post
//                    [posted, completed] and every iteration [first post, last completion]. The
//                    span buffer is allocated at Arm with a fixed capacity (spans past it are
//                    counted, not kept) and freed when the trace is taken.
//
// Nothing here reads a clock: times come with the events and the callers' `now`, so the logic is
// tested with made-up times. Thread-compatible, not thread-safe: its owner, the TelemetryHub
// (daemon/telemetry_hub.h), keeps it behind its mutex (TelemetryHub::With), for the admin server's
// and the metrics exposer's threads; never the engine thread.
#ifndef GRADLANE_DAEMON_TELEMETRY_STATE_H_
#define GRADLANE_DAEMON_TELEMETRY_STATE_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/telemetry.h"
#include "sched/types.h"

namespace gradlane::daemon {

// 10 µs .. 10 s: queueing delay and segment latency.
const std::vector<double>& DelayBuckets();
// 1 ms .. 120 s: iteration times.
const std::vector<double>& IterationBuckets();

// Fixed-bucket histogram of seconds (Prometheus semantics: `le` upper bounds, +Inf implied).
class Histogram {
 public:
  Histogram() : Histogram(&DelayBuckets()) {}
  explicit Histogram(const std::vector<double>* bounds);
  void Observe(double seconds);
  const std::vector<double>& bounds() const { return *bounds_; }
  // Per bucket (not cumulative); one more than bounds() (the +Inf bucket).
  const std::vector<uint64_t>& counts() const { return counts_; }
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  const std::vector<double>* bounds_;
  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  double sum_ = 0;
};

inline constexpr int kDirections = 2;  // sched::Direction: push, pull

// Bytes and segments by direction and priority class.
struct TrafficCounters {
  std::array<std::array<uint64_t, kPriorityClasses>, kDirections> bytes{};
  std::array<std::array<uint64_t, kPriorityClasses>, kDirections> segments{};
  void Add(int direction, int cls, uint64_t n) {
    bytes[direction][cls] += n;
    segments[direction][cls] += 1;
  }
  void Merge(const TrafficCounters& o);
  bool empty() const;
};

struct JobTelemetry {
  JobTelemetry();
  uint32_t slot = 0;
  uint32_t generation = 0;
  bool in_snapshot = false;  // seen in a snapshot at least once
  bool ended = false;        // gone from the snapshots (released)
  sched::TimeNs ended_at = 0;
  sched::TimeNs first_event = 0;
  std::string id;                           // from the snapshot; empty until seen
  std::string policy;                       // idem
  std::vector<std::string> peer_addresses;  // by rank
  // By peer rank.
  std::vector<TrafficCounters> sent;
  std::vector<TrafficCounters> received;
  uint64_t segments_sent = 0;
  uint64_t blocks = 0;
  uint64_t preemptions = 0;
  // Bytes that entered the policy and were not dispatched yet, by class, and by entry time
  // (for preemptions).
  std::array<int64_t, kPriorityClasses> queued_bytes{};
  std::map<sched::TimeNs, uint64_t> queued_by_ready;
  // Iterations.
  int64_t iteration = -1;  // latest iteration that started (first post seen)
  sched::TimeNs iteration_started = 0;
  double last_iteration_seconds = -1;
  Histogram iteration_seconds;
  uint64_t posts = 0;
  uint64_t posts_done = 0;

  std::string PeerName(uint16_t rank) const;  // address, or "rank N" until known
};

// One finished (or cut-off) trace span.
struct TraceSpan {
  enum Kind : uint8_t { kSegment, kRound, kPost, kIteration } kind;
  uint8_t direction = 0;
  uint16_t peer = 0;
  int32_t priority = 0;
  uint64_t key = 0;
  int64_t iteration = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  sched::TimeNs t0 = 0, t1 = 0, t2 = 0;  // segment: ready, dispatched, acked; others: t0..t1
};

class TraceRecorder {
 public:
  enum class State { kIdle, kWaiting, kRecording, kDone };
  // Starts recording `iterations` iterations of the job (slot, generation) from the next one
  // that starts after `after_iteration`. `max_spans` bounds memory.
  void Arm(const std::string& job_id, uint32_t slot, uint32_t generation, uint16_t rank,
           int64_t after_iteration, int iterations, size_t max_spans, sched::TimeNs now,
           sched::TimeNs deadline);
  bool armed() const { return state_ == State::kWaiting || state_ == State::kRecording; }
  State state() const { return state_; }
  const std::string& job_id() const { return job_id_; }
  bool Matches(uint32_t slot, uint32_t generation) const {
    return armed() && slot == slot_ && generation == generation_;
  }
  void OnEvent(const TelemetryEvent& e);
  // Ends the trace when its iterations are complete and nothing is open, when the job ended,
  // or at the deadline. Returns the state after the check.
  State Poll(sched::TimeNs now, bool job_ended);
  // Chrome/Perfetto trace JSON of a finished trace, then back to idle (the buffer is freed).
  // FailedPrecondition when nothing was recorded (the job did not start a new iteration in
  // time) — with the reason.
  absl::StatusOr<std::string> Take();
  void Cancel();

  // For tests.
  const std::vector<TraceSpan>& spans() const { return spans_; }
  uint64_t spans_dropped() const { return dropped_; }
  uint64_t spans_open() const {
    return open_segments_.size() + open_rounds_.size() + open_posts_.size();
  }

 private:
  struct SegId {
    uint8_t direction;
    uint16_t peer;
    uint64_t key;
    int64_t iteration;
    uint64_t offset;
    bool operator==(const SegId&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const SegId& s) {
      return H::combine(std::move(h), s.direction, s.peer, s.key, s.iteration, s.offset);
    }
  };
  bool InWindow(int64_t iteration) const {
    return state_ == State::kRecording && iteration >= first_ && iteration < first_ + iterations_;
  }
  void Keep(const TraceSpan& s);
  void Finish(const char* why);

  State state_ = State::kIdle;
  std::string job_id_;
  uint32_t slot_ = 0, generation_ = 0;
  uint16_t rank_ = 0;
  int64_t after_ = -1;
  int64_t first_ = 0;
  int iterations_ = 0;
  size_t max_spans_ = 0;
  sched::TimeNs armed_at_ = 0, deadline_ = 0;
  bool next_started_ = false;  // the iteration after the window began: all its posts are in
  int64_t ready_pending_ = 0;  // window bytes that entered the policy, not yet dispatched
  std::string end_reason_;
  std::vector<TraceSpan> spans_;
  uint64_t dropped_ = 0;
  absl::flat_hash_map<SegId, TraceSpan> open_segments_;
  absl::flat_hash_map<SegId, TraceSpan> open_rounds_;
  absl::flat_hash_map<SegId, TraceSpan> open_posts_;
  // Per iteration: first post, last completion, posts outstanding.
  struct IterationSpan {
    sched::TimeNs first = 0, last = 0;
    int64_t outstanding = 0;
  };
  std::map<int64_t, IterationSpan> iteration_spans_;
};

class TelemetryState {
 public:
  explicit TelemetryState(sched::TimeNs job_retention = 300 * sched::kSecond);

  void OnSnapshot(const EngineSnapshot& snapshot, sched::TimeNs now);
  void OnEvent(const TelemetryEvent& e);

  // Traces (one at a time per daemon).
  absl::Status StartTrace(const std::string& job_id, int iterations, size_t max_spans,
                          sched::TimeNs now, sched::TimeNs deadline);
  TraceRecorder& trace() { return trace_; }
  // Polls the armed trace against the latest snapshot (job still there?).
  TraceRecorder::State PollTrace(sched::TimeNs now);

  // Read access (metrics, gradlanectl).
  const EngineSnapshot& snapshot() const { return snapshot_; }
  const std::map<std::pair<uint32_t, uint32_t>, JobTelemetry>& jobs() const { return jobs_; }
  const JobTelemetry* FindJob(uint32_t slot, uint32_t generation) const;
  const std::array<Histogram, kPriorityClasses>& queueing_delay() const { return queueing_delay_; }
  const std::array<Histogram, kDirections>& segment_latency() const { return segment_latency_; }
  // Daemon-wide, including jobs that ended: by peer address.
  std::map<std::string, TrafficCounters> SentByPeer() const;
  std::map<std::string, TrafficCounters> ReceivedByPeer() const;
  // Segments, dispatches, blocks and preemptions by policy name (ended jobs included).
  struct PolicyCounters {
    uint64_t segments = 0, blocks = 0, preemptions = 0;
  };
  std::map<std::string, PolicyCounters> ByPolicy() const;
  uint64_t events() const { return events_; }

 private:
  JobTelemetry& Job(uint32_t slot, uint32_t generation, sched::TimeNs t);
  void Retire(const JobTelemetry& j);

  sched::TimeNs retention_;
  EngineSnapshot snapshot_;
  std::map<std::pair<uint32_t, uint32_t>, JobTelemetry> jobs_;
  std::map<std::string, TrafficCounters> retired_sent_, retired_received_;
  std::map<std::string, PolicyCounters> retired_policy_;
  std::array<Histogram, kPriorityClasses> queueing_delay_;
  std::array<Histogram, kDirections> segment_latency_;
  TraceRecorder trace_;
  uint64_t events_ = 0;
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_TELEMETRY_STATE_H_
