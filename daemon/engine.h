// daemon/engine.h — gradlaned's event loop: client sessions in, every job's policy and the
// transport out (docs/design.md §2, §4; docs/architecture.md walks a post through it).
//
// One Engine owns one SessionServer (client sessions), one transport (transport::Transport:
// TcpTransport or DpdkTransport in the daemon, FakeTransport in tests) and the table of jobs
// (daemon/job_runtime.h). It does three things:
//   loop       PollOnce_st: client rings and control, transport progress, housekeeping at its
//              interval, then each job's policy; Run sleeps on the clients' and the transport's
//              descriptors when idle.
//   job table  a job is created at its client's first post (JobRuntime::Plan_st/SetUp_st/Start_st),
//              found by session, by wire id (peers' frames) and by cookie (completions), and
//              released once it ended and its goodbyes left.
//   routing    every transport callback is handed to the job it belongs to, which hands it to
//              its worker or shard role; outbound connections are found by handle.
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
#include "daemon/engine_options.h"
#include "daemon/job_runtime.h"
#include "daemon/log.h"
#include "daemon/session.h"
#include "daemon/session_server.h"
#include "daemon/telemetry.h"
#include "transport/transport.h"

namespace gradlane::daemon {

class Engine final : public PostSink, public transport::TransportHandler, private JobHost {
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

  EngineStats Stats() const { return counters_.Snapshot(); }
  transport::Transport& transport() { return *transport_; }
  SessionServer& sessions() { return *server_; }

  // PostSink (engine thread, from inside the session server's poll).
  void OnPost_st(Session& session, const PostDescriptor& post) override;

  // TransportHandler (engine thread, from inside Progress_st / Disconnect_st): each finds the
  // job and hands the event to it.
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
  explicit Engine(const EngineOptions& options);

  // JobHost.
  transport::Transport& transport_st() override { return *transport_; }
  const EngineOptions& options() const override { return options_; }
  EngineCounters& counters_st() override { return counters_; }
  Telemetry* telemetry_st() override { return options_.telemetry; }
  bool hands_over_pieces() const override { return hands_over_pieces_; }
  void CompletePost_st(const PostDescriptor& post, gl_status status) override;
  void OnJobFailed_st(JobRuntime& job) override;
  void TrackOutbound_st(transport::PeerHandle handle, const JobRuntime& job,
                        uint16_t rank) override;
  void ForgetOutbound_st(transport::PeerHandle handle) override;
  void RetireArena_st(std::shared_ptr<ArenaAlias> alias) override {
    server_->Retire(std::move(alias));
  }

  // Idle: sleep until a client or peer event, or the idle tick.
  void Sleep_st();
  // A client's first post: a runtime for its job, set up and started (failed if it cannot be).
  // Null when the job table is full.
  JobRuntime* ActivateJob_st(Session& session, sched::TimeNs now);
  void ReleaseJob_st(JobRuntime& job);
  void Housekeeping_st(sched::TimeNs now);
  // Heartbeat, and the periodic snapshot for the operator tools (engine_telemetry.cc).
  void PublishTelemetry_st(sched::TimeNs now);

  JobRuntime* JobFromCookie(uint64_t cookie);
  JobRuntime* JobByWire(uint64_t wire_id);

  const EngineOptions options_;
  std::unique_ptr<SessionServer> server_;
  std::unique_ptr<transport::Transport> transport_;
  bool hands_over_pieces_ = false;  // transport_->capabilities(), read once
  uint16_t listen_port_ = 0;
  bool shut_down_ = false;
  int sleep_epoll_ = -1;  // client events + transport sockets, created on the first idle sleep

  std::vector<std::unique_ptr<JobRuntime>> jobs_;  // by slot; null = free
  std::vector<uint32_t> generations_;              // per slot, bumped on release
  absl::flat_hash_map<uint64_t, uint32_t> job_by_session_;
  absl::flat_hash_map<uint64_t, uint32_t> job_by_wire_;  // live (not failed) jobs only
  struct OutHandle {
    uint32_t slot;
    uint32_t generation;
    uint16_t rank;
  };
  absl::flat_hash_map<transport::PeerHandle, OutHandle> out_handles_;
  sched::TimeNs last_housekeeping_ = 0;
  bool housekeeping_due_ = false;  // a job failed: run housekeeping before the round ends
  EngineCounters counters_;
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_ENGINE_H_
