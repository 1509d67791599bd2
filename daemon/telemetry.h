// daemon/telemetry.h — the one path from the engine thread to the operator tools (Prometheus
// metrics, gradlanectl, traces): an event ring and a snapshot exchange, both written by the
// engine thread without ever blocking or allocating, read by the control thread.
//
//   events     the engine records what happens to each segment (ready, dispatched, acked,
//              received), each shard round (opened, reduced) and each client post (accepted,
//              completed) as a 64-byte record in a preallocated single-producer /
//              single-consumer ring. When the ring is full the event is dropped and counted:
//              the engine never waits for the reader. The reader (the admin server's control
//              thread, every few milliseconds) folds them into histograms, per-job iteration
//              times and, while a trace is armed, trace spans (daemon/telemetry_state.h).
//   snapshots  every kSnapshotInterval the engine copies the state operators ask about (jobs,
//              peers, queue depth, credit, bandwidth and RTT estimates) into an EngineSnapshot
//              and publishes it through a triple buffer: the writer always has a buffer of its
//              own, so it never waits; the reader takes the latest complete one. Snapshot
//              buffers are reused (strings and vectors keep their capacity), so publishing does
//              not allocate once the job table has reached its size.
//   heartbeat  the engine's clock at its last housekeeping round: systemd's watchdog is pinged
//              only while it advances (daemon/main.cc).
//
// Thread rules: `_st` methods on the engine thread only (the single producer); Drain, TakeSnapshot
// on one consumer thread at a time (the caller serializes them); counters from any thread.
#ifndef GRADLANE_DAEMON_TELEMETRY_H_
#define GRADLANE_DAEMON_TELEMETRY_H_

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sched/types.h"

namespace gradlane::daemon {

// Priority classes: a bounded label for metrics and queue listings. Class 0 is priority 0 (the
// most urgent tensor, the input layer's), class k >= 1 holds priorities [2^(k-1), 2^k), and
// class 7 everything from 64 on: fine where it matters (the first layers, which gate the next
// forward pass) and eight values at most.
inline constexpr int kPriorityClasses = 8;
inline constexpr int PriorityClass(sched::Priority p) {
  if (p <= 0) return 0;
  const int w = std::bit_width(static_cast<uint32_t>(p));
  return w < kPriorityClasses - 1 ? w : kPriorityClasses - 1;
}
// "0", "1", "2-3", "4-7", ..., "64+"  (the priorities a class holds, for labels).
const char* PriorityClassName(int cls);

enum class EventType : uint8_t {
  kReady = 1,         // a byte range entered the job's policy (push or pull response)
  kDispatched = 2,    // a segment went to the transport; t0 = when it entered the policy
  kAcked = 3,         // the peer acknowledged a segment; t0 = when it was sent
  kReceived = 4,      // a peer's segment was placed (push into the shard, pull into the client)
  kRoundOpened = 5,   // a shard round of a partition started (first contribution)
  kRoundReduced = 6,  // all W contributions summed, pull responses queued
  kPosted = 7,        // a client post was accepted
  kPostDone = 8,      // a client post completed (priority field = its gl_status)
  kBlock = 9,         // a Dispatch of more than one segment (key = segments, length = bytes)
};

// One event. `job_slot`/`job_generation` name the job as the engine's snapshots do.
struct TelemetryEvent {
  EventType type;           // 0
  uint8_t direction;        // 1  sched::Direction
  uint16_t peer;            // 2  the other rank (segments), 0 otherwise
  uint32_t job_slot;        // 4
  uint32_t job_generation;  // 8
  int32_t priority;         // 12 (kPostDone: the gl_status)
  uint64_t key;             // 16 segment key (posts: tensor id << 16)
  int64_t iteration;        // 24
  uint64_t offset;          // 32 within the tensor
  uint64_t length;          // 40
  int64_t t0;               // 48 start of the span this event ends (0: none)
  int64_t t1;               // 56 when it happened
};
static_assert(sizeof(TelemetryEvent) == 64, "one cache line per event");
static_assert(offsetof(TelemetryEvent, t1) == 56);

// Single-producer / single-consumer ring of events; capacity a power of two. Free-running
// indices on their own cache lines; Push never blocks (a full ring drops and counts). Its
// storage is written once at construction: the ring's pages are resident from the start, so
// the daemon's RSS at start-up is already what recording will hold (it does not creep up by a
// page every few dozen events until the ring has wrapped once), and Push never page-faults.
class EventRing {
 public:
  // `capacity` is rounded up to a power of two (at least 2).
  explicit EventRing(size_t capacity);

  // Producer. False (and counted) when full.
  bool Push_st(const TelemetryEvent& e) {
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    if (tail - head_cache_ >= mask_ + 1) {
      head_cache_ = head_.load(std::memory_order_acquire);
      if (tail - head_cache_ >= mask_ + 1) {
        dropped_.store(dropped_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        return false;
      }
    }
    slots_[tail & mask_] = e;
    tail_.store(tail + 1, std::memory_order_release);
    return true;
  }

  // Consumer: pops up to `max` events into `out` (appended); returns how many.
  size_t Drain(std::vector<TelemetryEvent>& out, size_t max);

  size_t capacity() const { return mask_ + 1; }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  uint64_t mask_;
  std::unique_ptr<TelemetryEvent[]> slots_;
  alignas(64) std::atomic<uint64_t> tail_{0};
  uint64_t head_cache_ = 0;  // producer's copy of head_
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) std::atomic<uint64_t> dropped_{0};
};

// ------------------------------------------------------------------------- snapshots ----

enum class PeerStateName : uint8_t { kConnecting = 0, kUp = 1, kDown = 2 };
const char* PeerStateText(PeerStateName s);

struct PeerSnapshot {
  uint16_t rank = 0;
  std::string address;
  PeerStateName state = PeerStateName::kConnecting;
  bool manifest_ok = false;  // its connection into us carried a matching manifest
  bool left = false;
  int connect_attempts = 0;
  // Transport counters of our connection to it (sends) and of its connection to us (receives).
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t frames_sent = 0;
  uint64_t frames_received = 0;
  uint64_t sends_failed = 0;
};

struct JobSnapshot {
  uint32_t slot = 0;
  uint32_t generation = 0;
  std::string id;
  uint16_t rank = 0;
  uint16_t world = 0;
  std::string policy;
  std::string mode;      // "ps" or "allreduce"
  std::string schedule;  // what the policy runs now (Policy::schedule; gradlane: its choice)
  std::string phase;     // connecting | active | draining | leaving | ended | failed
  std::string fail_reason;
  uint32_t tensors = 0;
  uint64_t total_bytes = 0;
  uint32_t partitions = 0;
  uint32_t owned_partitions = 0;
  uint64_t posts_pending = 0;
  uint64_t posts_completed = 0;
  uint64_t posts_failed = 0;
  uint64_t segments_sent = 0;
  uint64_t segments_received = 0;
  uint64_t segments_rejected = 0;
  uint64_t rounds_reduced = 0;
  uint64_t queued_segments = 0;
  uint64_t credit_in_use = 0;
  uint64_t credit_window = 0;  // configured (0: the policy's default)
  // Estimator (bandwidth < 0 / rtt < 0: no sample yet).
  double bandwidth_bytes_per_s = -1;
  int64_t srtt_ns = -1;
  int64_t rttvar_ns = -1;
  int64_t min_rtt_ns = -1;
  uint64_t bdp_bytes = 0;
  int64_t busy_ns = 0;
  uint64_t acked_bytes = 0;
  uint64_t outstanding_bytes = 0;
  uint32_t peers_up = 0;
  uint32_t peer_count = 0;  // valid entries of `peers` (the vector only grows)
  std::vector<PeerSnapshot> peers;
};

struct EngineSnapshot {
  uint64_t sequence = 0;  // 0: nothing published yet
  sched::TimeNs taken_at = 0;
  uint16_t listen_port = 0;
  uint32_t job_count = 0;  // valid entries of `jobs` (the vector only grows)
  std::vector<JobSnapshot> jobs;
};

// Triple buffer: the writer fills `Back_st()`, then `Publish_st()` swaps it with the shared
// middle buffer; the reader's `Latest()` swaps the middle with its front buffer when a newer one
// was published. Neither side ever waits for the other.
class SnapshotExchange {
 public:
  SnapshotExchange();
  EngineSnapshot& Back_st() { return buffers_[back_]; }
  void Publish_st();
  // Consumer: the latest published snapshot (sequence 0 before the first); valid until the next
  // call.
  const EngineSnapshot& Latest();

 private:
  static constexpr uint32_t kFresh = 4;  // bit in middle_: published since the reader's last take
  EngineSnapshot buffers_[3];
  uint32_t back_ = 0;                // writer's
  std::atomic<uint32_t> middle_{1};  // index | kFresh
  uint32_t front_ = 2;               // reader's
};

// -------------------------------------------------------------------------- telemetry ----

struct TelemetryOptions {
  size_t ring_events = 1 << 16;  // 4 MiB: ~65k events between two drains of the control thread
  sched::TimeNs snapshot_interval = 50 * sched::kMillisecond;
};

// Which job an event belongs to (a job slot is reused once its generation moves on).
struct TelemetryJob {
  uint32_t slot = 0;
  uint32_t generation = 0;
};
// The byte range an event is about: a segment key (posts: the tensor's partition-0 key), the
// iteration, and the offset and length within the tensor.
struct SpanRef {
  uint64_t key = 0;
  int64_t iteration = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// What the engine holds: ring, snapshots, heartbeat. Created by main (or a test) and handed to
// the engine through EngineOptions::telemetry; it must outlive the engine.
class Telemetry {
 public:
  explicit Telemetry(const TelemetryOptions& options = {});

  // One emitter per event type: each says what it records, and no call site builds the
  // positional TelemetryEvent itself.
  void Posted_st(TelemetryJob job, sched::Priority priority, const SpanRef& post,
                 sched::TimeNs now) {
    Emit_st({EventType::kPosted, 0, 0, job.slot, job.generation, priority, post.key, post.iteration,
             post.offset, post.length, 0, now});
  }
  void PostDone_st(TelemetryJob job, int32_t gl_status, const SpanRef& post, sched::TimeNs now) {
    Emit_st({EventType::kPostDone, 0, 0, job.slot, job.generation, gl_status, post.key,
             post.iteration, post.offset, post.length, 0, now});
  }
  void Ready_st(TelemetryJob job, sched::Direction direction, uint16_t peer,
                sched::Priority priority, const SpanRef& range, sched::TimeNs now) {
    Emit_st({EventType::kReady, static_cast<uint8_t>(direction), peer, job.slot, job.generation,
             priority, range.key, range.iteration, range.offset, range.length, 0, now});
  }
  // A segment went to the transport; it entered the policy at s.ready_at.
  void Dispatched_st(TelemetryJob job, const sched::Segment& s, sched::TimeNs now) {
    Emit_st({EventType::kDispatched, static_cast<uint8_t>(s.direction), s.peer, job.slot,
             job.generation, s.priority, s.key, s.iteration, s.offset, s.length, s.ready_at, now});
  }
  void Acked_st(TelemetryJob job, sched::Direction direction, uint16_t peer, const SpanRef& seg,
                sched::TimeNs sent_at, sched::TimeNs now) {
    Emit_st({EventType::kAcked, static_cast<uint8_t>(direction), peer, job.slot, job.generation, 0,
             seg.key, seg.iteration, seg.offset, seg.length, sent_at, now});
  }
  void Received_st(TelemetryJob job, sched::Direction direction, uint16_t peer,
                   sched::Priority priority, const SpanRef& seg, sched::TimeNs now) {
    Emit_st({EventType::kReceived, static_cast<uint8_t>(direction), peer, job.slot, job.generation,
             priority, seg.key, seg.iteration, seg.offset, seg.length, 0, now});
  }
  void RoundOpened_st(TelemetryJob job, const SpanRef& part, sched::TimeNs now) {
    Emit_st({EventType::kRoundOpened, 0, 0, job.slot, job.generation, 0, part.key, part.iteration,
             part.offset, part.length, 0, now});
  }
  void RoundReduced_st(TelemetryJob job, sched::Priority priority, const SpanRef& part,
                       sched::TimeNs now) {
    Emit_st({EventType::kRoundReduced, 0, 0, job.slot, job.generation, priority, part.key,
             part.iteration, part.offset, part.length, 0, now});
  }
  // A Dispatch of more than one segment.
  void Block_st(TelemetryJob job, uint64_t segments, uint64_t bytes, sched::TimeNs now) {
    Emit_st({EventType::kBlock, 0, 0, job.slot, job.generation, 0, segments, 0, 0, bytes, 0, now});
  }
  // For tests that feed the reader hand-made events.
  void Emit_st(const TelemetryEvent& e) { (void)ring_.Push_st(e); }

  // Housekeeping tick: records the heartbeat; true when a snapshot is due (then the engine
  // fills SnapshotBack_st() and calls PublishSnapshot_st()).
  bool Tick_st(sched::TimeNs now) {
    heartbeat_.store(now, std::memory_order_relaxed);
    if (now - last_snapshot_ < options_.snapshot_interval) return false;
    last_snapshot_ = now;
    return true;
  }
  EngineSnapshot& SnapshotBack_st() { return snapshots_.Back_st(); }
  void PublishSnapshot_st() {
    snapshots_.Back_st().sequence = ++sequence_;
    snapshots_.Publish_st();
  }

  // Consumer side.
  EventRing& ring() { return ring_; }
  SnapshotExchange& snapshots() { return snapshots_; }
  // The engine clock at its last housekeeping round (0: never).
  sched::TimeNs heartbeat() const { return heartbeat_.load(std::memory_order_relaxed); }

 private:
  TelemetryOptions options_;
  EventRing ring_;
  SnapshotExchange snapshots_;
  sched::TimeNs last_snapshot_ = 0;
  uint64_t sequence_ = 0;
  std::atomic<sched::TimeNs> heartbeat_{0};
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_TELEMETRY_H_
