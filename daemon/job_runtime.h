// daemon/job_runtime.h — one job running on this daemon: its peers, its policy and its two
// roles, driven by the engine's loop (daemon/engine.h).
//
//   JobRuntime   lifecycle (set-up, failure, draining, release), the connections to its peers
//                (manifest exchange, redial, leave), the policy → transport step (dispatches,
//                credit, RTT/bandwidth estimate, the online tuner) and the routing of every
//                transport event of the job to the role it concerns.
//   WorkerRole   (daemon/worker_role.h) the client's posts: cut at partition boundaries, fed
//                to the policy as pushes, completed when every partition holds its result.
//   ShardRole    (daemon/shard_role.h) parameter-server mode: the partitions this rank owns,
//                the W contributions, the rank-ordered reduction, the pull responses.
//   RingRole     (daemon/ring_role.h) all-reduce mode: every partition's ring reduce-scatter
//                and all-gather with the neighbours.
// A transport event reaches its role in one step: the engine finds the job by cookie or wire
// id and calls e.g. job.OnRecvDone_st, which hands a push to shard().OnPushDone_st and a pull
// response to worker().OnResultPlaced_st.
//
// What a job needs of the engine that runs it is the JobHost interface: the transport, the
// options, the counters and telemetry, completing a client's post, and the engine's tables of
// jobs by wire id and outbound connections.
//
// Thread rules: everything here runs on the engine thread. Set-up allocates (control path); the
// data path (posts, dispatches, receives, reductions) only indexes what set-up sized.
#ifndef GRADLANE_DAEMON_JOB_RUNTIME_H_
#define GRADLANE_DAEMON_JOB_RUNTIME_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/arena_alias.h"
#include "daemon/engine_options.h"
#include "daemon/job.h"
#include "daemon/ring_role.h"
#include "daemon/session.h"
#include "daemon/shard_role.h"
#include "daemon/telemetry.h"
#include "daemon/worker_role.h"
#include "sched/bandwidth_estimator.h"
#include "sched/bo_tuner.h"
#include "sched/policy.h"
#include "sched/priority.h"
#include "transport/transport.h"

namespace gradlane::daemon {

class JobRuntime;

// The engine as a job sees it. Engine thread only.
class JobHost {
 public:
  virtual transport::Transport& transport_st() = 0;
  virtual const EngineOptions& options() const = 0;
  virtual EngineCounters& counters_st() = 0;
  // Null when the daemon records no telemetry.
  virtual Telemetry* telemetry_st() = 0;
  // Whether the transport hands payloads over in pieces (its capabilities, read once).
  virtual bool hands_over_pieces() const = 0;
  // Tells the client its post ended; nothing when its session is gone.
  virtual void CompletePost_st(const PostDescriptor& post, gl_status status) = 0;
  // The job failed: the engine stops routing peers to it by wire id and runs housekeeping
  // before the loop round ends (so its peers are refused at once, see JobRuntime::Fail_st).
  virtual void OnJobFailed_st(JobRuntime& job) = 0;
  // Outbound connections: events on `handle` belong to rank `rank` of `job`.
  virtual void TrackOutbound_st(transport::PeerHandle handle, const JobRuntime& job,
                                uint16_t rank) = 0;
  virtual void ForgetOutbound_st(transport::PeerHandle handle) = 0;
  // Drops a reference to a client arena's alias off the engine thread (the last one deregisters
  // it from the RDMA device and unmaps it: SessionServer::Retire).
  virtual void RetireArena_st(std::shared_ptr<ArenaAlias> alias) = 0;

 protected:
  ~JobHost() = default;
};

// Cookies: which job (slot + 12 bits of generation) a send or receive belongs to, and for
// sends the kind and the dispatch record. 12 bits of slot bound the jobs per daemon.
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
gl_status StatusFor(const absl::Status& why);
const char* StatusName(gl_status s);

class JobRuntime {
 public:
  JobRuntime(JobHost& host, uint32_t slot, uint32_t generation, uint64_t session_id);
  ~JobRuntime();
  JobRuntime(const JobRuntime&) = delete;
  JobRuntime& operator=(const JobRuntime&) = delete;

  // ---- lifecycle (control path) ----
  // Builds the plan (BuildJobPlan): tensors, partitions, shard map, identity. Allocates no
  // memory beyond it, so a duplicate job id is refused before anything is mapped.
  JobError Plan_st(const Session& session);
  // After Plan_st: the policy and the memory (arena alias, shard slab, manifests, each
  // registered with the transport). An error is to fail the job with.
  JobError SetUp_st(Session& session, sched::TimeNs now);
  // Once the engine routes the job's wire id here: registers the job with the transport and
  // dials every peer. An error is to fail the job with.
  JobError Start_st(sched::TimeNs now);
  // Answers every pending post with `status`, closes every connection of the job (both
  // directions: a peer waiting only on us learns of it) and drops the policy. Idempotent.
  void Fail_st(gl_status status, const std::string& reason);
  // Once per housekeeping tick: redials, the connect deadline, the estimate pushed to the
  // policy, and when the client has gone (`client_present` false) the drain and leave that
  // end the job, after which release_at() is set.
  void Housekeeping_st(sched::TimeNs now, bool client_present);
  // Stops accepting the job's peers (the transport's RemoveJob_st). Not inside a callback.
  void RemoveFromTransport_st();
  // Fails the job if it has not, then gives back its regions, its transport job and the arena
  // alias. The engine destroys the runtime next.
  void Release_st();
  // GPUDirect: registers the GPU memory the client attached to its tensors (parameter-server
  // jobs) and publishes each tensor's stage map. A refusal leaves that tensor staged.
  void AttachDeviceMemory_st(const Session& session);
  // Why iteration `iteration` can never complete once a rank has gone (`left_rank`; -1: this
  // rank's client if it left, else the first peer that said it leaves).
  std::string DepartureReason(int64_t iteration, int left_rank = -1) const;

  // ---- transport events, routed here by the engine ----
  void OnOutboundUp_st(uint16_t rank);
  void OnOutboundDown_st(uint16_t rank, const absl::Status& why, sched::TimeNs now);
  void OnInboundUp_st(uint16_t rank, transport::PeerHandle handle);
  void OnInboundDown_st(uint16_t rank, transport::PeerHandle handle, const absl::Status& why);
  // `rank`: the peer the send went to (-1: not an outbound connection of ours any more).
  void OnSendAcked_st(const transport::SendCompletion& send, int rank, sched::TimeNs now);
  void OnSendFailed_st(const transport::SendCompletion& send, const absl::Status& why);
  transport::RecvTarget ResolveRecv_st(const transport::PeerInfo& peer,
                                       const transport::FrameHeader& header);
  void OnRecvDone_st(const transport::PeerInfo& peer, const transport::FrameHeader& header,
                     sched::TimeNs now);

  // ---- scheduling (job_scheduling.cc) ----
  // Sends what the policy releases; returns the work done.
  int RunPolicy_st(sched::TimeNs now);
  // The client posted `bytes` of `iteration`: the online tuner (bytescheduler with autotune)
  // measures each trial's speed and takes a step at each new iteration.
  void TuneOnPost_st(int64_t iteration, uint64_t bytes, sched::TimeNs now);
  // A byte range became ready to send (a push from the worker, a pull response from the shard).
  void Ready_st(const sched::ReadyRange& range, sched::TimeNs now);

  // A virtual tensor (an all-reduce bucket) the policy must know before its ranges arrive.
  void RegisterWithPolicy_st(const sched::TensorSpec& spec) {
    if (policy_ != nullptr) policy_->RegisterTensor(spec);
  }
  // A control frame (not scheduled, not counted as data) on the connection to `rank`.
  // ResourceExhausted: its send queue is full, try again later.
  absl::Status SendControl_st(uint16_t rank, sched::SegmentKey key, transport::RegionId region,
                              uint64_t length);
  const sched::BandwidthEstimator& estimator() const { return estimator_; }
  // The per-message cost θ the job's policy plans with.
  sched::TimeNs per_message_ns() const { return policy_config_.per_message_overhead_ns; }

  // Fills the operator's view of the job (telemetry snapshot).
  void FillSnapshot_st(JobSnapshot& js, bool client_present);

  // ---- state ----
  uint32_t slot() const { return slot_; }
  uint32_t generation() const { return generation_; }
  uint64_t session_id() const { return session_id_; }
  uint64_t wire_id() const { return plan_.wire_id; }
  const std::string& id() const { return plan_.info.job_id; }
  uint16_t rank() const { return plan_.rank; }
  uint16_t world() const { return plan_.world; }
  bool failed() const { return failed_; }
  gl_status fail_status() const { return fail_status_; }
  // Set once the job ended or failed and its client is gone: the engine releases it then.
  sched::TimeNs release_at() const { return release_at_; }
  // A rank said it leaves, or this rank's client closed: no new round can complete.
  bool departing() const { return any_left_ || phase_ != Phase::kActive; }
  JobPlan& plan() { return plan_; }
  const JobPlan& plan() const { return plan_; }
  WorkerRole& worker() { return worker_; }
  ShardRole& shard() { return shard_; }
  RingRole& ring() { return ring_; }
  bool allreduce() const { return plan_.mode == GL_MODE_ALLREDUCE; }
  // Rank `rank` asked (kFlagDeviceResult on its pushes) for tensor `tensor`'s results by
  // rendezvous: they land in its client's GPU memory.
  bool DeviceResult(uint32_t rank, uint32_t tensor) const {
    const size_t i = size_t{rank} * plan_.tensors.size() + tensor;
    return i < device_results_.size() && device_results_[i] != 0;
  }
  JobHost& host() { return host_; }
  uint64_t Cookie(uint64_t flags, uint32_t dispatch) const {
    return MakeCookie(slot_, generation_, flags, dispatch);
  }
  TelemetryJob telemetry_tag() const { return {slot_, generation_}; }
  // Telemetry, or null when the daemon records none.
  Telemetry* telemetry() { return host_.telemetry_st(); }
  // Priorities learnt from the order gradients become ready (GL_PRIORITY_AUTO tensors).
  sched::AutoPriority& auto_priority() { return auto_priority_; }
  // The region of the client's arena alias (pushes leave from it, pull responses land in it).
  transport::RegionId arena_region() const { return arena_region_; }
  uint8_t* arena() const { return arena_; }

 private:
  // Ending: the client closed with nothing pending. Draining: our shard still owes peers pull
  // responses. Leaving: leave frames sent, waiting for their acks.
  enum class Phase : uint8_t { kActive, kDraining, kLeaving };
  // Online tuning of the bytescheduler credit window (ByteScheduler §4.3): one trial spans
  // autotune_iterations_per_trial iterations; its speed is bytes posted per second.
  struct Tuner {
    sched::BoTuner tuner;
    sched::TunerParams trial;
    int iterations = 0;
    sched::TimeNs started = 0;
    uint64_t bytes = 0;
    int64_t last_iteration = -1;
    bool pending_apply = false;
  };

  void ConnectPeer_st(uint16_t rank, sched::TimeNs now);
  void RedialDue_st(sched::TimeNs now);
  // The client closed: drain what the shard owes peers, tell them we leave; true when done.
  bool End_st(sched::TimeNs now);
  void OnManifest_st(const transport::PeerInfo& peer);
  void OnLeave_st(uint16_t rank);
  // Posts segments [from, end) of dispatch_ (record d). False when it stopped: the job failed,
  // or a full peer queue left the rest blocked (blocked_dispatch_).
  bool SendDispatch_st(uint32_t d, size_t from, sched::TimeNs now);
  void ReturnDispatch_st(uint32_t d, sched::TimeNs now);
  void TuneStep_st(sched::TimeNs now);

  JobHost& host_;
  const uint32_t slot_;
  const uint32_t generation_;
  const uint64_t session_id_;
  JobPlan plan_;
  WorkerRole worker_;
  ShardRole shard_;
  RingRole ring_;
  bool added_to_transport_ = false;

  Phase phase_ = Phase::kActive;
  sched::TimeNs drain_deadline_ = 0;
  uint32_t leave_acks_pending_ = 0;
  bool any_left_ = false;

  // Failure: once set, every post is answered with fail_status_ and nothing is sent.
  bool failed_ = false;
  gl_status fail_status_ = GL_OK;
  std::string fail_reason_;
  // The client is gone and the job failed or ended: the engine releases it at this time, so
  // the goodbyes Disconnect_st queued get to leave first.
  sched::TimeNs release_at_ = 0;

  // Memory: an alias mapping of the client's arena (survives the client's death until we
  // release it; shared with the session, daemon/arena_alias.h) and the manifests. arena_ and
  // arena_bytes_ are the alias's, copied for the data path.
  std::shared_ptr<ArenaAlias> alias_;
  uint8_t* arena_ = nullptr;
  uint64_t arena_bytes_ = 0;
  transport::RegionId arena_region_ = transport::kNoRegion;
  // GPUDirect: the client's GPU memory registered for this job, one region per allocation
  // (JobTensor::device_region names them); unregistered at release.
  std::vector<transport::RegionId> device_regions_;
  // By rank × tensor: 1 once that rank's pushes carried kFlagDeviceResult (DeviceResult).
  std::vector<uint8_t> device_results_;
  std::vector<ManifestBody> manifest_in_;  // per rank
  transport::RegionId manifest_region_ = transport::kNoRegion;
  transport::RegionId manifest_in_region_ = transport::kNoRegion;

  // Scheduling.
  std::unique_ptr<sched::Policy> policy_;
  sched::PolicyConfig policy_config_;
  std::string schedule_;  // what policy_->schedule() said last (logged when it changes)
  int64_t schedule_iteration_ =
      std::numeric_limits<int64_t>::min();  // the latest iteration it was checked at
  sched::AutoPriority auto_priority_;
  sched::BandwidthEstimator estimator_;
  sched::Dispatch dispatch_;  // reused
  std::vector<DispatchRecord> dispatches_;
  std::vector<uint32_t> free_dispatches_;
  sched::TimeNs last_estimate_push_ = 0;
  // Back-pressure: a Dispatch the transport could not take whole (a peer's send queue was full)
  // keeps its unsent tail in dispatch_, from segment blocked_next_; it goes out before the
  // policy is asked for anything new, so send order and credit accounting hold.
  uint32_t blocked_dispatch_ = kNoDispatch;
  size_t blocked_next_ = 0;
  std::unique_ptr<Tuner> tuner_;

  // Peers by rank (entry rank() unused). Nothing is dispatched before every peer is up: the
  // job cannot progress without all of them, and a send to a peer that later turns out not to
  // know the job yet would fail.
  std::vector<JobPeer> peers_;
  uint32_t peers_up_ = 0;
  bool all_up_ = false;        // every peer was up at once (dispatch may start)
  uint32_t manifests_in_ = 0;  // peers whose manifest arrived and matched
  sched::TimeNs connect_started_ = 0;

  // Counters (snapshot, tests).
  uint64_t segments_sent_ = 0;
  uint64_t segments_received_ = 0;
  uint64_t segments_rejected_ = 0;
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_JOB_RUNTIME_H_
