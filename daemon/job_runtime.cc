#include "daemon/job_runtime.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "daemon/log.h"
#include "daemon/session_server.h"
#include "sched/policies/gradlane_selector.h"
#include "shm/ring.h"

namespace gradlane::daemon {

using sched::TimeNs;
using transport::PeerHandle;
using transport::RecvTarget;

namespace {
// How long a released job's connections may linger to deliver their goodbye frames before the
// job is removed from the transport (which tears down whatever is still open).
constexpr TimeNs kReleaseLinger = 200 * sched::kMillisecond;
constexpr TimeNs kEstimateInterval = 10 * sched::kMillisecond;
// Room for every schedule name (gradlane's candidates): schedule_ is reserved for it when the
// job starts, so following a switch never allocates on the engine thread.
constexpr size_t kScheduleNameBytes = 32;
static_assert(std::all_of(std::begin(sched::kGradlaneCandidates),
                          std::end(sched::kGradlaneCandidates),
                          [](std::string_view n) { return n.size() <= kScheduleNameBytes; }));
}  // namespace

gl_status StatusFor(const absl::Status& why) {
  switch (why.code()) {
    case absl::StatusCode::kPermissionDenied:
      return GL_E_PERMISSION;
    case absl::StatusCode::kDeadlineExceeded:
      return GL_E_TIMEOUT;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
      return GL_E_PROTOCOL;
    default:
      return GL_E_DISCONNECTED;
  }
}

const char* StatusName(gl_status s) {
  static constexpr const char* kNames[] = {"ok",
                                           "invalid_argument",
                                           "bad_magic",
                                           "bad_version",
                                           "permission",
                                           "no_memory",
                                           "again",
                                           "timeout",
                                           "disconnected",
                                           "protocol",
                                           "bad_tensor",
                                           "bad_range",
                                           "bad_iteration",
                                           "bad_opcode",
                                           "bad_descriptor",
                                           "no_job",
                                           "already_exists",
                                           "ring_corrupt",
                                           "io",
                                           "internal",
                                           "busy",
                                           "device"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == GL_STATUS_COUNT);
  return s >= 0 && s < GL_STATUS_COUNT ? kNames[s] : "unknown";
}

JobRuntime::JobRuntime(JobHost& host, uint32_t slot, uint32_t generation, uint64_t session_id)
    : host_(host),
      slot_(slot),
      generation_(generation),
      session_id_(session_id),
      worker_(*this),
      shard_(*this),
      ring_(*this) {}

JobRuntime::~JobRuntime() {
  // Without Release_st (a test, or a set-up that failed early) the alias reference is dropped
  // here; the session usually still holds the alias.
  if (arena_ != nullptr) host_.counters_st().arena_aliases.Sub_st(1);
}

// ---------------------------------------------------------------------------- lifecycle ----

JobError JobRuntime::Plan_st(const Session& session) {
  const EngineOptions& options = host_.options();
  return BuildJobPlan(session, options.default_policy, options.partition_bytes, options.reduce,
                      static_cast<uint8_t>(options.allreduce_fusion), &plan_);
}

JobError JobRuntime::SetUp_st(Session& session, TimeNs now) {
  const EngineOptions& options = host_.options();
  transport::Transport& transport = host_.transport_st();
  const std::string& id = plan_.info.job_id;
  policy_config_.name = plan_.policy_name;
  // The policy cuts with the keys' size, so its partitions are the shards' keys (the balance
  // rule may have made them finer than the policy's own default).
  policy_config_.partition_bytes =
      options.partition_bytes != 0 ? options.partition_bytes : plan_.balanced_key_bytes;
  policy_config_.credit_bytes = options.credit_bytes;
  auto policy = sched::MakePolicy(policy_config_);
  if (!policy.ok()) {
    return {GL_E_INVALID_ARGUMENT, absl::StrCat("job ", id, ": ", policy.status().message())};
  }
  policy_ = std::move(*policy);
  policy_->SetRank(plan_.rank);
  schedule_.reserve(kScheduleNameBytes);
  schedule_ = policy_->schedule();
  for (JobTensor& t : plan_.tensors) {
    auto_priority_.Register(t.spec.id);
    policy_->RegisterTensor(t.spec);
  }
  // The daemon's own mapping of the client's arena: it keeps the pages alive if the client dies
  // while the transport still reads or writes them. The session server made it (and registered
  // it with an RDMA device) when the session was set up, off this thread, so the region below
  // is a lookup; a session made without a server (tests) has none, and gets one here.
  alias_ = session.alias();
  if (alias_ == nullptr) {
    auto made = ArenaAlias::Create(session.arena_base(), session.arena_bytes(), nullptr);
    if (!made.ok()) return {GL_E_IO, absl::StrCat("job ", id, ": ", made.status().message())};
    alias_ = std::move(*made);
  }
  arena_ = alias_->base();
  arena_bytes_ = alias_->bytes();
  host_.counters_st().arena_aliases.Add_st(1);
  auto region = transport.RegisterRegion_st(arena_, arena_bytes_);
  if (!region.ok()) return {GL_E_NO_MEMORY, std::string(region.status().message())};
  arena_region_ = *region;
  // The daemon-owned buffers (the shard slab, the ring's staging; later the fusion buckets) are
  // still registered here, on the engine thread, though they are about the model's size: they
  // are sized by this job's plan, which exists only from its first post on (activation freezes
  // the tensor list), and that post arrives on this thread. Registering them elsewhere would
  // need the job to wait between activation and AddJob_st/dialing for another thread's
  // registration (a set-up phase the runtime does not have; posts would queue meanwhile) —
  // left for when a measurement on a real NIC says the pause matters (docs/verbs.md).
  if (absl::Status s = allreduce() ? ring_.SetUp_st()
                                   : shard_.SetUp_st(std::move(plan_.owned), plan_.slab_bytes);
      !s.ok()) {
    return {GL_E_NO_MEMORY, std::string(s.message())};
  }
  manifest_in_.assign(plan_.world, ManifestBody{});
  auto mo = transport.RegisterRegion_st(&plan_.manifest, sizeof(plan_.manifest));
  if (!mo.ok()) return {GL_E_NO_MEMORY, std::string(mo.status().message())};
  manifest_region_ = *mo;
  auto mi =
      transport.RegisterRegion_st(manifest_in_.data(), manifest_in_.size() * sizeof(ManifestBody));
  if (!mi.ok()) return {GL_E_NO_MEMORY, std::string(mi.status().message())};
  manifest_in_region_ = *mi;
  if (!allreduce()) AttachDeviceMemory_st(session);
  device_results_.assign(size_t{plan_.world} * plan_.tensors.size(), 0);
  worker_.SetUp_st();
  dispatches_.reserve(256);
  peers_.assign(plan_.world, JobPeer{});
  connect_started_ = now;
  return {};
}

JobError JobRuntime::Start_st(TimeNs now) {
  if (plan_.world > 1) {
    transport::JobCredentials creds{plan_.wire_id, plan_.rank, plan_.world, plan_.info.auth_token};
    if (absl::Status s = host_.transport_st().AddJob_st(creds); !s.ok()) {
      return {GL_E_INVALID_ARGUMENT, absl::StrCat("job ", id(), ": ", s.message())};
    }
    added_to_transport_ = true;
  }
  for (uint16_t r = 0; r < plan_.world; ++r) {
    if (r == plan_.rank) continue;
    peers_[r].address = plan_.info.peers[r];
    peers_[r].send_times.assign(
        std::max<uint32_t>(16, host_.options().transport.max_pending_sends_per_peer * 2), 0);
    ConnectPeer_st(r, now);
    if (failed_) return {fail_status_, fail_reason_};
  }
  const EngineOptions& options = host_.options();
  if (options.autotune && plan_.policy_name == "bytescheduler") {
    const uint64_t part =
        plan_.balanced_key_bytes != 0
            ? plan_.balanced_key_bytes
            : EnginePartitionBytes(plan_.policy_name, options.partition_bytes, sched::DType::kF32);
    sched::TunerBounds b{part, part, std::max<uint64_t>(part / 2, 4), 32 * part};
    auto tuner = sched::BoTuner::Create(b, plan_.wire_id);
    if (tuner.ok()) {
      tuner_ = std::make_unique<Tuner>(Tuner{std::move(*tuner), {}, 0, now, 0, -1, false});
    }
  }
  LogLine(absl::StrCat(
      "job ", id(), " rank ", plan_.rank, "/", plan_.world, " active: ", plan_.tensors.size(),
      " tensors, ", plan_.total_bytes, " bytes, ", plan_.parts.size(), " partitions",
      allreduce() ? std::string(", ring all-reduce")
                  : absl::StrCat(" (", shard_.owned().size(), " owned here)"),
      plan_.balanced_key_bytes != 0 ? absl::StrCat(", keys of ", plan_.balanced_key_bytes,
                                                   " bytes to balance and spread over the shards")
                                    : std::string(),
      ", policy ", plan_.policy_name));
  return {};
}

void JobRuntime::ConnectPeer_st(uint16_t rank, TimeNs now) {
  JobPeer& p = peers_[rank];
  transport::JobCredentials creds{plan_.wire_id, plan_.rank, plan_.world, plan_.info.auth_token};
  auto h = host_.transport_st().Connect_st(creds, p.address, now);
  ++p.connect_attempts;
  if (!h.ok()) {
    Fail_st(GL_E_INVALID_ARGUMENT, absl::StrCat("job ", id(), ": peer rank ", rank, " (", p.address,
                                                "): ", h.status().message()));
    return;
  }
  p.out = *h;
  p.state = PeerState::kConnecting;
  host_.TrackOutbound_st(*h, *this, rank);
}

void JobRuntime::Fail_st(gl_status status, const std::string& reason) {
  if (failed_) return;
  failed_ = true;
  fail_status_ = status;
  fail_reason_ = reason;
  // A disconnect with nothing pending is how every job ends (its clients close); only a failure
  // that cost a post, or a configuration error, counts as a failed job.
  if (worker_.posts_pending() > 0 || status != GL_E_DISCONNECTED) {
    host_.counters_st().jobs_failed.Add_st(1);
    LogLine(absl::StrCat("job failed (", StatusName(status), "): ", reason));
  } else {
    LogLine(absl::StrCat("job ended: ", reason));
  }
  host_.OnJobFailed_st(*this);
  worker_.FailAll_st(status);
  // Disconnect fails the pending sends (callbacks re-enter and find the job failed).
  const TimeNs now = SessionServer::MonotonicNow();
  transport::Transport& transport = host_.transport_st();
  for (JobPeer& p : peers_) {
    if (p.in != transport::kNoPeer) {
      // Peers that wait on us (pull responses, contributions) learn of the failure here.
      const PeerHandle h = p.in;
      p.in = transport::kNoPeer;
      transport.Disconnect_st(h, now);
    }
    if (p.out == transport::kNoPeer) continue;
    const PeerHandle h = p.out;
    p.out = transport::kNoPeer;
    p.state = PeerState::kDown;
    transport.Disconnect_st(h, now);
    host_.ForgetOutbound_st(h);
  }
  policy_.reset();
}

std::string JobRuntime::DepartureReason(int64_t iteration, int left_rank) const {
  const auto because = [&](const std::string& who) {
    return absl::StrCat("job ", id(), ": ", who, " left the job; iteration ", iteration,
                        " cannot be reduced without it");
  };
  if (left_rank >= 0) return because(absl::StrCat("rank ", left_rank));
  if (phase_ != Phase::kActive) return because(absl::StrCat("the client of rank ", plan_.rank));
  for (uint16_t r = 0; r < plan_.world; ++r) {
    if (!peers_.empty() && peers_[r].left) return because(absl::StrCat("rank ", r));
  }
  return because("a rank");
}

void JobRuntime::RemoveFromTransport_st() {
  if (!added_to_transport_) return;
  added_to_transport_ = false;
  (void)host_.transport_st().RemoveJob_st(plan_.wire_id);
}

void JobRuntime::AttachDeviceMemory_st(const Session& session) {
  transport::Transport& transport = host_.transport_st();
  uint32_t refused = 0;
  std::string first_refusal;
  // Tensors in one allocation (a framework's caching allocator holds hundreds in one segment)
  // arrive with the same range of the client's address space: one registration serves them
  // all. Within a session that range is the same memory, since every device tensor stays
  // allocated until the client closes.
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, absl::StatusOr<transport::RegionId>> by_range;
  for (const DeviceAttachment& a : session.device_attachments_st()) {
    if (a.tensor_id >= plan_.tensors.size()) continue;
    JobTensor& t = plan_.tensors[a.tensor_id];
    const uint32_t parts = t.plan.partition_count();
    if (parts > a.map_bits || a.stage_map_offset + StageMapBytes(a.map_bits) > arena_bytes_) {
      continue;  // cannot happen (a partition holds at least one element); staged if it did
    }
    auto [it, fresh] = by_range.try_emplace({a.device_address, a.dmabuf_bytes},
                                            absl::UnknownError("not registered yet"));
    if (fresh) {
      it->second =
          transport.RegisterDeviceRegion_st(a.dmabuf.get(), a.dmabuf_bytes, a.device_address);
      if (it->second.ok()) device_regions_.push_back(*it->second);
    }
    const absl::StatusOr<transport::RegionId>& region = it->second;
    if (!region.ok()) {
      // The client goes on staging every byte: slower, never wrong.
      host_.counters_st().device_registrations_refused.Add_st(1);
      if (refused++ == 0) {
        first_refusal = absl::StrCat("'", t.name, "': ", region.status().message());
      }
      continue;
    }
    t.device_region = *region;
    t.device_offset = a.dmabuf_offset;
    host_.counters_st().device_tensors.Add_st(1);
    // What the local shard reads with the CPU stays staged; the rest goes from GPU memory.
    auto* map = reinterpret_cast<gl_stage_map*>(arena_ + a.stage_map_offset);
    uint8_t* bits = arena_ + a.stage_map_offset + sizeof(gl_stage_map);
    std::memset(bits, 0, (a.map_bits + 7) / 8);
    for (uint32_t p = 0; p < parts; ++p) {
      if (plan_.parts[t.first_part + p].owner == plan_.rank) bits[p / 8] |= uint8_t(1u << (p % 8));
    }
    map->num_partitions = parts;
    map->partition_bytes = t.plan.partition_bytes();
    map->map_bits = a.map_bits;
    shm::Shared(map->ready).store(1, std::memory_order_release);
  }
  if (refused > 0) {  // one line per job, however many tensors (a device refuses them all alike)
    LogLine(absl::StrCat("job ", id(), ": ", refused,
                         " device tensor(s) staged through shared memory, the NIC refused their "
                         "GPU memory (first: ",
                         first_refusal, ")"));
  }
}

void JobRuntime::Release_st() {
  Fail_st(GL_E_DISCONNECTED, "released");
  // Every send from these regions was failed by Disconnect_st, so they can go.
  transport::Transport& transport = host_.transport_st();
  for (transport::RegionId* r : {&arena_region_, &manifest_region_, &manifest_in_region_}) {
    if (*r != transport::kNoRegion) (void)transport.UnregisterRegion_st(*r);
    *r = transport::kNoRegion;
  }
  for (JobTensor& t : plan_.tensors) t.device_region = transport::kNoRegion;
  for (transport::RegionId r : device_regions_) (void)transport.UnregisterRegion_st(r);
  device_regions_.clear();
  shard_.Release_st();
  ring_.Release_st();
  RemoveFromTransport_st();
  if (arena_ != nullptr) {
    arena_ = nullptr;
    host_.counters_st().arena_aliases.Sub_st(1);
  }
  // Unregistered above, so if this is the alias's last reference (the session closed first),
  // dropping it deregisters and unmaps the arena: the session server's thread does that.
  host_.RetireArena_st(std::move(alias_));
}

void JobRuntime::RedialDue_st(TimeNs now) {
  // Peers whose dial was refused (they had not registered the job yet) are redialed when due.
  for (uint16_t r = 0; r < plan_.world; ++r) {
    JobPeer& p = peers_[r];
    if (r == plan_.rank || p.retry_at == 0 || now < p.retry_at) continue;
    p.retry_at = 0;
    ConnectPeer_st(r, now);
    if (failed_) return;
  }
}

void JobRuntime::Housekeeping_st(TimeNs now, bool client_present) {
  if (release_at_ != 0) return;
  const EngineOptions& options = host_.options();
  if (!client_present) {
    // A draining job still owes pull responses, which go out only once every peer is up: a
    // client that closes right after its last result (it owns the shard, so its result came
    // first) must not strand a peer this daemon has not reached yet.
    if (!failed_ && phase_ != Phase::kLeaving) RedialDue_st(now);
    if (!End_st(now)) return;  // still draining or leaving
    Fail_st(GL_E_DISCONNECTED, absl::StrCat("job ", id(), ": client session closed"));
    // Not now: releasing removes the job from the transport, which would cut the goodbye
    // frames Fail_st just queued. The connections linger briefly, then go.
    release_at_ = now + kReleaseLinger;
    return;
  }
  if (failed_) {
    // Stop accepting peers for it (outside any transport callback), so the same job id can be
    // registered again while this session lingers: a dialer meanwhile gets unknown_job and
    // redials. The price: a peer that dials after the failure learns of it only through its
    // connect deadline, not through the original reason.
    RemoveFromTransport_st();
    return;
  }
  RedialDue_st(now);
  if (failed_) return;
  // Both directions count: a peer whose dial into us was abandoned before its manifest came
  // (not a failure by itself) must have come back by the deadline.
  if ((!all_up_ || manifests_in_ + 1u < plan_.world) &&
      now - connect_started_ > options.transport.connect_deadline) {
    Fail_st(GL_E_TIMEOUT,
            absl::StrCat("job ", id(), ": peers not all up within the connect deadline (",
                         peers_up_, " of ", plan_.world - 1, " dialed, ", manifests_in_,
                         " dialed in)"));
    return;
  }
  if (policy_ != nullptr && now - last_estimate_push_ >= kEstimateInterval) {
    last_estimate_push_ = now;
    if (auto bw = estimator_.BytesPerSecond()) {
      policy_->OnLinkEstimate(*bw, estimator_.SmoothedRtt().value_or(0));
    }
  }
}

bool JobRuntime::End_st(TimeNs now) {
  if (failed_ || worker_.posts_pending() > 0 || plan_.world == 1) return true;
  if (phase_ == Phase::kActive) {
    phase_ = Phase::kDraining;
    drain_deadline_ =
        now + std::max<TimeNs>(host_.options().transport.peer_timeout, sched::kSecond);
  }
  if (phase_ == Phase::kDraining) {
    const bool busy =
        (policy_ != nullptr && (policy_->queued_segments() > 0 || policy_->credit_in_use() > 0)) ||
        shard_.PullsPending();
    if (busy && now < drain_deadline_) return false;
    if (int64_t round; allreduce() ? ring_.HasOpenRound(&round) : shard_.HasOpenRound(&round)) {
      // Peers contributed to a round this rank never will: they must fail, not wait.
      Fail_st(GL_E_DISCONNECTED, absl::StrCat("job ", id(),
                                              ": client left in the middle of "
                                              "iteration ",
                                              round));
      return true;
    }
    phase_ = Phase::kLeaving;
    for (uint16_t r = 0; r < plan_.world; ++r) {
      JobPeer& p = peers_[r];
      if (r == plan_.rank || p.out == transport::kNoPeer || p.state != PeerState::kUp) continue;
      transport::SendSpec spec;
      spec.key = kLeaveKey;
      spec.length = kLeaveBytes;
      spec.region = manifest_region_;
      spec.cookie = Cookie(kCookieLeave, kNoDispatch);
      if (host_.transport_st().PostSend_st(p.out, spec).ok()) ++leave_acks_pending_;
    }
  }
  return leave_acks_pending_ == 0 || now >= drain_deadline_;
}

absl::Status JobRuntime::SendControl_st(uint16_t rank, sched::SegmentKey key,
                                        transport::RegionId region, uint64_t length) {
  if (rank >= peers_.size() || peers_[rank].out == transport::kNoPeer) {
    return absl::UnavailableError(absl::StrCat("no connection to rank ", rank));
  }
  transport::SendSpec spec;
  spec.key = key;
  spec.length = length;
  spec.region = region;
  // Acknowledged like the manifest: nothing to account.
  spec.cookie = Cookie(kCookieManifest, kNoDispatch);
  return host_.transport_st().PostSend_st(peers_[rank].out, spec);
}

// ------------------------------------------------------------------- transport events ----

void JobRuntime::OnOutboundUp_st(uint16_t rank) {
  if (failed_) return;
  JobPeer& p = peers_[rank];
  p.state = PeerState::kUp;
  p.ever_up = true;
  ++peers_up_;
  if (peers_up_ + 1u == plan_.world) all_up_ = true;
  // The manifest is the first frame on the connection, so the peer checks it before any data.
  transport::SendSpec spec;
  spec.key = kManifestKey;
  spec.length = kManifestBytes;
  spec.region = manifest_region_;
  spec.cookie = Cookie(kCookieManifest, kNoDispatch);
  if (absl::Status s = host_.transport_st().PostSend_st(p.out, spec); !s.ok()) {
    Fail_st(StatusFor(s),
            absl::StrCat("job ", id(), ": manifest to rank ", rank, ": ", s.message()));
  }
}

void JobRuntime::OnOutboundDown_st(uint16_t rank, const absl::Status& why, TimeNs now) {
  if (failed_) return;
  const transport::TransportOptions& topt = host_.options().transport;
  JobPeer& p = peers_[rank];
  const bool was_up = p.state == PeerState::kUp;
  p.out = transport::kNoPeer;
  p.state = PeerState::kDown;
  if (was_up) --peers_up_;
  if (p.left) return;  // it said goodbye to the job first: not a failure
  if (!p.ever_up && absl::IsNotFound(why) && now - connect_started_ < topt.connect_deadline) {
    // The peer's client has not posted yet, so its daemon does not know the job: redial.
    const TimeNs backoff = std::min<TimeNs>(
        topt.connect_max_backoff, topt.connect_initial_backoff << std::min(p.connect_attempts, 16));
    p.retry_at = now + backoff;
    return;
  }
  Fail_st(StatusFor(why), absl::StrCat("job ", id(), ": peer rank ", rank, " (", p.address,
                                       ") down: ", why.message()));
}

void JobRuntime::OnInboundUp_st(uint16_t rank, PeerHandle handle) {
  // Inbound: the peer sends on it, we only receive; remembered so a failing job can close it
  // (the peer may be waiting on us with nothing of its own in flight).
  if (failed_ || rank >= plan_.world || rank == plan_.rank) return;
  // Before its manifest arrives, a newer connection from the rank supersedes an older one:
  // the older was abandoned by the dialer mid-handshake (see OnInboundDown_st). Once the
  // manifest came, the connection that carried it stays the rank's; a later one is stale.
  JobPeer& p = peers_[rank];
  if (!p.manifest_ok || p.in == transport::kNoPeer) p.in = handle;
}

void JobRuntime::OnInboundDown_st(uint16_t rank, PeerHandle handle, const absl::Status& why) {
  if (failed_ || rank >= plan_.world || rank == plan_.rank) return;
  JobPeer& p = peers_[rank];
  // Not the rank's connection: one it abandoned mid-handshake (superseded by a later dial).
  if (p.in != handle) return;
  p.in = transport::kNoPeer;
  if (p.left) return;
  if (!p.manifest_ok) {
    // The dialer gave up on this attempt before the manifest came: typically its per-attempt
    // timeout (connect_attempt_timeout) ran out while this engine thread was busy activating
    // the job, so our kHelloOk reached a socket it had already closed. The dialer is redialing
    // (and fails its own job if it cannot within the connect deadline, which closes our
    // outbound connection to it); until then nothing of its can be waiting on us. Housekeeping
    // fails the job if no manifest from it arrives within the connect deadline.
    return;
  }
  // The peer's daemon closed its side of a job that was fully up.
  Fail_st(StatusFor(why),
          absl::StrCat("job ", id(), ": connection from rank ", rank, " lost: ", why.message()));
}

void JobRuntime::OnSendAcked_st(const transport::SendCompletion& send, int rank, TimeNs now) {
  // A failed job has no policy and no rounds: a late ack has nothing left to update.
  if (failed_) return;
  const bool control = (send.cookie & (kCookieManifest | kCookieLeave)) != 0;
  if (rank >= 0 && !control) {
    JobPeer& p = peers_[rank];
    if (p.send_head < p.send_tail) {
      const TimeNs sent = p.send_times[p.send_head++ % p.send_times.size()];
      estimator_.OnAck(send.length, sent, now);
      if (Telemetry* tm = telemetry()) {
        const sched::Direction dir =
            (send.cookie & kCookiePull) != 0 ? sched::Direction::kPull : sched::Direction::kPush;
        tm->Acked_st(telemetry_tag(), dir, static_cast<uint16_t>(rank),
                     {send.key, send.iteration, send.offset, send.length}, sent, now);
      }
    }
  }
  if ((send.cookie & kCookieManifest) != 0) return;
  if ((send.cookie & kCookieLeave) != 0) {
    if (leave_acks_pending_ > 0) --leave_acks_pending_;
    return;
  }
  if (allreduce()) {
    if (Part* p = plan_.PartAt(sched::KeyTensor(send.key), send.offset)) {
      ring_.OnSendAcked_st(*p, send.length);
    }
  } else if ((send.cookie & kCookiePull) != 0) {
    if (const Part* p = plan_.PartAt(sched::KeyTensor(send.key), send.offset)) {
      shard_.OnPullAcked_st(*p, send.length);
    }
  }
  ReturnDispatch_st(CookieDispatch(send.cookie), now);
}

void JobRuntime::OnSendFailed_st(const transport::SendCompletion& send, const absl::Status& why) {
  if (failed_) return;
  if ((send.cookie & kCookieLeave) != 0) {
    if (leave_acks_pending_ > 0) --leave_acks_pending_;
    return;
  }
  if (absl::IsFailedPrecondition(why) && any_left_) {
    // Refused by a shard that knows a rank has left (it fails its job too): the departure is
    // the reason, not the protocol.
    Fail_st(GL_E_DISCONNECTED, DepartureReason(send.iteration));
    return;
  }
  Fail_st(absl::IsFailedPrecondition(why) ? GL_E_PROTOCOL : StatusFor(why),
          absl::StrCat("job ", id(), ": segment (tensor ", sched::KeyTensor(send.key), ", offset ",
                       send.offset, ", iteration ", send.iteration, ") failed: ", why.message()));
}

RecvTarget JobRuntime::ResolveRecv_st(const transport::PeerInfo& peer,
                                      const transport::FrameHeader& h) {
  const uint32_t r = peer.rank;
  auto reject = [&]() {
    host_.counters_st().segments_rejected.Add_st(1);
    ++segments_rejected_;
    return RecvTarget::Reject();
  };
  if (r >= plan_.world || r == plan_.rank) return reject();
  const uint64_t cookie = Cookie(0, 0);
  const uint32_t tid = sched::KeyTensor(h.key);
  if (h.key == kLeaveKey) {
    if (h.length != kLeaveBytes || !peers_[r].manifest_ok) return reject();
    return RecvTarget::Into(manifest_in_region_, uint64_t{r} * kManifestBytes, cookie);
  }
  if (h.key == kFusionPlanKey) {
    if (!allreduce() || !peers_[r].manifest_ok) return reject();
    const RecvTarget target = ring_.ResolvePlan_st(static_cast<uint16_t>(r), h.length, cookie);
    return target.accept ? target : reject();
  }
  if (tid == kManifestTensorId) {
    if (h.key != kManifestKey || h.length != kManifestBytes || peers_[r].manifest_ok) {
      return reject();
    }
    return RecvTarget::Into(manifest_in_region_, uint64_t{r} * kManifestBytes, cookie);
  }
  if (!peers_[r].manifest_ok || h.length == 0) return reject();
  Part* p = plan_.PartAt(tid, h.offset);
  // The key names the partition too: frames are placed by offset, so the two must agree.
  if (p == nullptr || sched::KeyPartition(h.key) != p->index) return reject();
  const JobTensor& t = plan_.tensors[tid];
  const uint64_t esize = sched::DTypeBytes(t.spec.dtype);
  if (h.dtype != static_cast<uint8_t>(t.spec.dtype) || h.length % esize != 0 ||
      h.offset % esize != 0 || h.offset + h.length > p->offset + p->length) {
    return reject();
  }
  if (allreduce()) {
    const RecvTarget target = ring_.Resolve_st(static_cast<uint16_t>(r), *p, h, cookie);
    return target.accept ? target : reject();
  }
  if (h.direction == static_cast<uint8_t>(sched::Direction::kPush)) {
    if (p->owner != plan_.rank) return reject();
    OwnedPart& o = shard_.owned(p->owned);
    if (!shard_.Accept_st(o, r, h.iteration, h.length)) return reject();
    if ((h.flags & transport::kFlagDeviceResult) != 0) {
      device_results_[size_t{r} * plan_.tensors.size() + tid] = 1;
    }
    return shard_.PushTarget_st(o, r, h, cookie);
  }
  const RecvTarget target = worker_.ResolveResult_st(static_cast<uint16_t>(r), *p, h, cookie);
  return target.accept ? target : reject();
}

void JobRuntime::OnRecvDone_st(const transport::PeerInfo& peer, const transport::FrameHeader& h,
                               TimeNs now) {
  if (failed_) return;
  const uint32_t r = peer.rank;
  ++segments_received_;
  host_.counters_st().segments_received.Add_st(1);
  if (h.key == kLeaveKey) {
    OnLeave_st(static_cast<uint16_t>(r));
    return;
  }
  if (h.key == kFusionPlanKey) {
    ring_.OnPlanArrived_st(h.length, now);
    return;
  }
  if (sched::KeyTensor(h.key) == kManifestTensorId) {
    OnManifest_st(peer);
    return;
  }
  Part* p = plan_.PartAt(sched::KeyTensor(h.key), h.offset);
  if (p == nullptr) return;
  if (policy_ != nullptr) {
    policy_->OnPeerDecision(static_cast<uint8_t>(h.flags >> transport::kFlagScheduleShift), now);
  }
  if (Telemetry* tm = telemetry()) {
    tm->Received_st(telemetry_tag(), static_cast<sched::Direction>(h.direction),
                    static_cast<uint16_t>(r), h.priority, {h.key, h.iteration, h.offset, h.length},
                    now);
  }
  if (allreduce()) {
    ring_.OnPlaced_st(*p, h, now);
    return;
  }
  if (h.direction == static_cast<uint8_t>(sched::Direction::kPush)) {
    if (p->owned >= 0) shard_.OnPushDone_st(*p, r, h.length);
    return;
  }
  worker_.OnResultPlaced_st(*p, h.length);
}

void JobRuntime::OnLeave_st(uint16_t r) {
  peers_[r].left = true;
  any_left_ = true;
  if (allreduce()) {
    // Only the left neighbour sends to this rank. A round still waiting for its bytes can never
    // complete; any other round gets what it needs from ranks still here (a rank that leaves
    // without having finished a round is seen by its own right neighbour, whose failure then
    // reaches every rank through the ring's connections). Posts after the leave fail at once
    // (RingRole::OnPosted_st).
    if (int64_t round; r == ring_.left() && ring_.MissingFromLeft(&round)) {
      Fail_st(GL_E_DISCONNECTED, DepartureReason(round, static_cast<int>(r)));
    }
    return;
  }
  if (int64_t round; shard_.MissingFrom(r, &round)) {
    Fail_st(GL_E_DISCONNECTED, absl::StrCat("job ", id(), ": rank ", r,
                                            " left the job without "
                                            "contributing to iteration ",
                                            round));
    return;
  }
  // A leaving shard first sends every result it owes (they travel ahead of this frame on the
  // same connection), so a partition of its that we posted and still wait for belongs to a
  // round it never took part in: waiting would only end in the client's timeout.
  for (const Part& p : plan_.parts) {
    if (p.owner == r && p.posted > 0 && p.result_got < p.length) {
      Fail_st(GL_E_DISCONNECTED, DepartureReason(p.iteration, static_cast<int>(r)));
      return;
    }
  }
}

void JobRuntime::OnManifest_st(const transport::PeerInfo& peer) {
  const uint32_t r = peer.rank;
  const ManifestBody& m = manifest_in_[r];
  if (m.magic == kManifestMagic && m.fingerprint == plan_.fingerprint &&
      m.tensor_count == plan_.manifest.tensor_count && m.world_size == plan_.world &&
      m.mode == plan_.manifest.mode) {
    peers_[r].manifest_ok = true;
    ++manifests_in_;
    // This connection is the rank's from now on (it may not be the latest to have come up).
    peers_[r].in = peer.handle;
    return;
  }
  host_.counters_st().manifest_mismatches.Add_st(1);
  if (m.magic == kManifestMagic && m.mode != plan_.manifest.mode) {
    Fail_st(GL_E_BAD_TENSOR,
            absl::StrCat("job ", id(), ": rank ", r, " registered the job in mode ",
                         ModeName(static_cast<gl_job_mode>(m.mode)), ", this rank in mode ",
                         ModeName(plan_.mode), ": every rank of a job must choose the same mode"));
    return;
  }
  Fail_st(GL_E_BAD_TENSOR,
          absl::StrCat("job ", id(), ": rank ", r, " registered ", m.tensor_count, " tensors (",
                       m.total_bytes, " bytes, W=", m.world_size, ", fingerprint ",
                       absl::Hex(m.fingerprint), "), this rank ", plan_.manifest.tensor_count, " (",
                       plan_.total_bytes, " bytes, W=", plan_.world, ", fingerprint ",
                       absl::Hex(plan_.fingerprint),
                       "): every rank must register the same tensors (name, bytes, dtype) "
                       "in the same order, with the same policy, mode and reduce op, before its "
                       "first post"));
}

// ---------------------------------------------------------------------------- snapshot ----

void JobRuntime::FillSnapshot_st(JobSnapshot& js, bool client_present) {
  js.slot = slot_;
  js.generation = generation_;
  js.id = plan_.info.job_id;
  js.rank = plan_.rank;
  js.world = plan_.world;
  js.policy = plan_.policy_name;
  if (policy_ != nullptr) js.schedule.assign(policy_->schedule());  // reuses js's storage
  js.mode = ModeName(plan_.mode);
  if (failed_ && fail_status_ == GL_E_DISCONNECTED && worker_.posts_failed() == 0 &&
      !client_present) {
    js.phase = "ended";  // its client closed; not a failure
  } else if (failed_) {
    js.phase = "failed";
  } else if (phase_ == Phase::kDraining) {
    js.phase = "draining";
  } else if (phase_ == Phase::kLeaving) {
    js.phase = "leaving";
  } else if (!all_up_ && plan_.world > 1) {
    js.phase = "connecting";
  } else {
    js.phase = "active";
  }
  js.fail_reason = fail_reason_;
  js.tensors = plan_.client_tensors;
  js.total_bytes = plan_.total_bytes;
  js.partitions = plan_.client_parts;
  // The plan's table until set-up hands it to the shard (a job that failed before has none).
  js.owned_partitions = static_cast<uint32_t>(std::max(shard_.owned().size(), plan_.owned.size()));
  js.posts_pending = worker_.posts_pending();
  js.posts_completed = worker_.posts_completed();
  js.posts_failed = worker_.posts_failed();
  js.segments_sent = segments_sent_;
  js.segments_received = segments_received_;
  js.segments_rejected = segments_rejected_;
  js.rounds_reduced = allreduce() ? ring_.rounds_completed() : shard_.rounds_reduced();
  js.queued_segments = policy_ != nullptr ? policy_->queued_segments() : 0;
  js.credit_in_use = policy_ != nullptr ? policy_->credit_in_use() : 0;
  js.credit_window = policy_config_.credit_bytes;
  const sched::BandwidthEstimator& e = estimator_;
  js.bandwidth_bytes_per_s = e.BytesPerSecond().value_or(-1.0);
  js.srtt_ns = e.SmoothedRtt().value_or(-1);
  js.rttvar_ns = e.RttVariation().value_or(-1);
  js.min_rtt_ns = e.MinRtt().value_or(-1);
  js.bdp_bytes = e.BdpBytes();
  js.busy_ns = e.total_busy_time();
  js.acked_bytes = e.total_acked_bytes();
  js.outstanding_bytes = e.outstanding_bytes();
  js.peers_up = peers_up_;
  const transport::Transport& transport = host_.transport_st();
  uint32_t np = 0;
  for (uint16_t r = 0; r < peers_.size(); ++r) {
    if (r == plan_.rank) continue;
    const JobPeer& p = peers_[r];
    if (js.peers.size() <= np) js.peers.emplace_back();
    PeerSnapshot& ps = js.peers[np++];
    ps.rank = r;
    ps.address = p.address;
    ps.state = p.state == PeerState::kUp     ? PeerStateName::kUp
               : p.state == PeerState::kDown ? PeerStateName::kDown
                                             : PeerStateName::kConnecting;
    ps.manifest_ok = p.manifest_ok;
    ps.left = p.left;
    ps.connect_attempts = p.connect_attempts;
    transport::PeerStats out{}, in{};
    if (p.out != transport::kNoPeer) out = transport.PeerStatsOf(p.out);
    if (p.in != transport::kNoPeer) in = transport.PeerStatsOf(p.in);
    ps.bytes_sent = out.bytes_sent + in.bytes_sent;
    ps.bytes_received = out.bytes_received + in.bytes_received;
    ps.frames_sent = out.frames_sent + in.frames_sent;
    ps.frames_received = out.frames_received + in.frames_received;
    ps.sends_failed = out.sends_failed + in.sends_failed;
  }
  js.peer_count = np;
}

}  // namespace gradlane::daemon
