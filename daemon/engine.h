// daemon/engine.h — gradlaned's engine: client rings → per-job scheduling policy → transport,
// and the co-located parameter-server roles (docs/design.md §2, §4).
//
// One Engine owns one SessionServer (client sessions), one transport (transport::Transport:
// TcpTransport or DpdkTransport in the daemon, FakeTransport in tests) and every job of this
// daemon. Per job:
//   worker role  a client post is cut at the engine's partition boundaries; pieces this rank's
//                shard owns are contributed in place (no copy), the others are fed to the job's
//                policy as pushes to their shard. Pull responses are received straight into the
//                client's arena. A post completes (GL_OK) once every partition it touches holds
//                the reduced result.
//   shard role   pushes land in a per-job slab (one slot per rank per owned partition); when all
//                W contributions of a partition are in, they are reduced in rank order
//                (bit-reproducible, f16/bf16 summed in f32), the result is copied into the
//                local client's buffer and W-1 pull responses enter the same policy, by the
//                priority the pushes carried (P3 §4.2).
// The policy's credit returns when the peer acknowledges a whole Dispatch; the bandwidth/RTT
// estimator is fed by sends and acks and pushed into the policy every few milliseconds.
//
// Implementation by concern: engine.cc (loop, job lifecycle, transport callbacks),
// worker_role.cc, ps_role.cc, engine_sched.cc (policy → sends, credit, online tuning),
// engine_telemetry.cc (heartbeat and snapshots for gradlanectl and the metrics).
//
// Faults (each ends in error completions, never a hang or a crash):
//   - client death: the session server reclaims the session; the engine notices within one
//     control interval, fails and releases the job (its arena alias is unmapped only after the
//     transport has dropped every send from it) and closes every connection of the job, both
//     directions, so peers fail even if they were only waiting on this rank.
//   - clean end: a client that closes with nothing pending first lets its shard finish the pull
//     responses it owes, then sends a leave frame; peers do not count the disconnect as a fault,
//     but any later iteration fails with GL_E_DISCONNECTED naming the rank (DepartureReason).
//   - peer death or timeout: the transport fails pending sends and reports the peer down; the
//     job fails (GL_E_DISCONNECTED / GL_E_TIMEOUT) and disconnects its other peers.
//   - wrong token: the peer refuses the hello; the job fails with GL_E_PERMISSION.
//   - tensor lists that differ across ranks: the manifest check fails the job (GL_E_BAD_TENSOR).
//   - frames that do not fit the job (unknown tensor, wrong dtype, out of range, wrong round):
//     refused (the sender's send fails) and counted.
//
// Thread rules: Create, PollOnce_st, Run and Shutdown_st on the one engine thread (Create may
// run on another thread before the engine thread starts). Stats() from any thread.
// Data path (PollOnce_st in steady state) allocates nothing: post records, dispatch records
// and send-time rings are pooled and reach their working size in the first iterations.
#ifndef GRADLANE_DAEMON_ENGINE_H_
#define GRADLANE_DAEMON_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "daemon/job.h"
#include "daemon/ps/aggregator.h"
#include "daemon/session.h"
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

class Engine final : public PostSink, public transport::TransportHandler {
 public:
  using TransportFactory = std::function<absl::StatusOr<std::unique_ptr<transport::Transport>>(
      const transport::TransportOptions&, transport::TransportHandler*)>;

  // Binds the client socket, creates the transport and starts listening for peers. Errors
  // (busy socket or port, bad options) come back as a status, nothing is left behind.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options,
                                                        const TransportFactory& make_transport);
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  uint16_t listen_port() const { return listen_port_; }
  const std::string& socket_path() const { return options_.sessions.socket_path; }

  // One round of the loop: sessions (control at its interval, rings always), transport
  // progress, job housekeeping, every job's policy. Returns the work done (0 = idle).
  int PollOnce_st(sched::TimeNs now);
  // Loop until `stop`, sleeping briefly when idle; then Shutdown_st().
  void Run(const std::atomic<bool>& stop);
  // Fails every pending post (GL_E_DISCONNECTED), says goodbye to peers, closes every session
  // and unmaps every arena. Idempotent.
  void Shutdown_st();

  EngineStats Stats() const;
  transport::Transport& transport() { return *transport_; }
  SessionServer& sessions() { return *server_; }

  // PostSink (engine thread, from inside SessionServer::PollOnce).
  void OnPost(Session& session, const PostDescriptor& post) override;

  // TransportHandler (engine thread, from inside Progress_st / Disconnect_st).
  void OnPeerUp_st(const transport::PeerInfo& peer) override;
  void OnPeerDown_st(const transport::PeerInfo& peer, const absl::Status& why) override;
  void OnSendDone_st(const transport::SendCompletion&) override {}
  void OnSendAcked_st(const transport::SendCompletion& send, sched::TimeNs now) override;
  void OnSendFailed_st(const transport::SendCompletion& send, const absl::Status& why) override;
  transport::RecvTarget ResolveRecv_st(const transport::PeerInfo& peer,
                                       const transport::FrameHeader& header) override;
  void OnRecvPiece_st(const transport::PeerInfo& peer, const transport::FrameHeader& header,
                      const transport::RecvTarget& target, uint64_t segment_offset,
                      std::span<const uint8_t> bytes) override;
  void OnRecvDone_st(const transport::PeerInfo& peer, const transport::FrameHeader& header,
                     const transport::RecvTarget& target, sched::TimeNs now) override;

 private:
  struct Counters {
    transport::StatCounter jobs_active, jobs_failed, jobs_released, posts_completed, posts_failed,
        segments_sent, segments_received, segments_rejected, rounds_reduced, rounds_folded,
        manifest_mismatches,
        arena_aliases, tuner_trials;
  };
  struct Tuner;

  explicit Engine(const EngineOptions& options);

  // Idle: sleep until a client or peer event, or the idle tick.
  void Sleep_st();

  // Job lifecycle (control path).
  Job* ActivateJob_st(Session& session, sched::TimeNs now);
  JobError SetUpJob_st(Session& session, Job& job, sched::TimeNs now);
  void ConnectPeer_st(Job& job, uint16_t rank, sched::TimeNs now);
  // The client closed: drain what the shard owes peers, tell them we leave; true when done.
  bool EndJob_st(Job& job, sched::TimeNs now);
  void FailJob_st(Job& job, gl_status status, const std::string& reason);
  // Why iteration `iteration` can never complete once a rank has gone (`left_rank`; -1: this
  // rank's client if it left, else the first peer that said it leaves): the reason
  // GL_E_DISCONNECTED carries.
  std::string DepartureReason(const Job& job, int64_t iteration, int left_rank = -1) const;
  void ReleaseJob_st(Job& job);
  // Stops accepting peers of the job (TCP: RemoveJob_st). Never from inside a callback.
  void RemoveFromTransport_st(Job& job);
  void Housekeeping_st(sched::TimeNs now);
  // Heartbeat, and the periodic snapshot for the operator tools (engine_telemetry.cc).
  void PublishTelemetry_st(sched::TimeNs now);

  // Worker role.
  void FinishPost_st(Job& job, uint32_t post_index, gl_status status);
  void PartResultReady_st(Job& job, uint32_t part_index);
  // Shard role.
  bool ShardAccept_st(Job& job, OwnedPart& o, uint32_t rank, int64_t iteration, uint64_t length);
  void ShardRankDone_st(Job& job, OwnedPart& o);
  void TryReduce_st(Job& job, OwnedPart& o);
  // Whether rank `rank`'s pushes of this round can be folded in as they arrive: every other
  // contribution is complete and the result slot is free (see OwnedPart::folding_rank).
  bool CanFold_st(const Job& job, const OwnedPart& o) const;
  // result[off, off+bytes) = the rank-ordered reduction with rank `rank`'s values read from
  // `src`, written to the result slot and to the local arena, as TryReduce_st would.
  void FoldRange_st(Job& job, OwnedPart& o, uint32_t rank, uint64_t offset, uint64_t bytes,
                    const std::byte* src);
  // Scheduling.
  int RunPolicy_st(Job& job, sched::TimeNs now);
  // Posts segments [from, end) of job.dispatch (Dispatch record d). False when it stopped: the
  // job failed, or a full peer queue left the rest blocked (job.blocked_dispatch).
  bool SendDispatch_st(Job& job, uint32_t d, size_t from, sched::TimeNs now);
  void ReturnDispatch_st(Job& job, uint32_t dispatch, sched::TimeNs now);
  void TuneStep_st(Job& job, sched::TimeNs now);

  Job* JobFromCookie(uint64_t cookie);
  Job* JobByWire(uint64_t wire_id);
  Part* PartAt(Job& job, uint32_t tensor_id, uint64_t offset);
  void Complete_st(const PostDescriptor& post, gl_status status);

  const EngineOptions options_;
  std::unique_ptr<SessionServer> server_;
  std::unique_ptr<transport::Transport> transport_;
  bool hands_over_pieces_ = false;  // transport_->capabilities(), read once
  uint16_t listen_port_ = 0;
  bool shut_down_ = false;
  int sleep_epoll_ = -1;  // client events + transport sockets, created on the first idle sleep

  std::vector<std::unique_ptr<Job>> jobs_;  // by slot; null = free
  std::vector<uint32_t> generations_;       // per slot, bumped on release
  absl::flat_hash_map<uint64_t, uint32_t> job_by_session_;
  absl::flat_hash_map<uint64_t, uint32_t> job_by_wire_;  // live (not failed) jobs only
  struct OutHandle {
    uint32_t slot;
    uint32_t generation;
    uint16_t rank;
  };
  absl::flat_hash_map<transport::PeerHandle, OutHandle> out_handles_;
  absl::flat_hash_map<uint32_t, std::unique_ptr<Tuner>> tuners_;  // by job slot
  sched::TimeNs last_housekeeping_ = 0;
  bool housekeeping_due_ = false;  // a job failed: run housekeeping before the round ends
  Counters counters_;
};

// Logs one line to stderr with a timestamp: the daemon's only logger (no absl/log here).
void LogLine(const std::string& line);

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_ENGINE_H_
