#include "daemon/engine.h"

#include <malloc.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>
#include <time.h>

#include <cerrno>
#include <cstdio>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/engine_internal.h"

namespace gradlane::daemon {

using sched::TimeNs;
using transport::PeerHandle;
using transport::RecvTarget;
using namespace engine_internal;  // NOLINT: cookies and status helpers of this module

void LogLine(const std::string& line) {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  ::gmtime_r(&ts.tv_sec, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  std::fprintf(stderr, "%s.%03ld gradlaned: %s\n", stamp, ts.tv_nsec / 1000000, line.c_str());
}

Engine::Engine(const EngineOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options,
                                                             const TransportFactory& make) {
  if (options.default_policy.empty()) return absl::InvalidArgumentError("empty default policy");
  {
    sched::PolicyConfig pc;
    pc.name = options.default_policy;
    pc.partition_bytes = options.partition_bytes;
    pc.credit_bytes = options.credit_bytes;
    auto p = sched::MakePolicy(pc);
    if (!p.ok()) return p.status();
  }
  auto engine = std::unique_ptr<Engine>(new Engine(options));
  auto server = SessionServer::Create(options.sessions, engine.get());
  if (!server.ok()) {
    return absl::Status(server.status().code(),
                        absl::StrCat("client socket ", options.sessions.socket_path, ": ",
                                     server.status().message()));
  }
  engine->server_ = std::move(*server);
  transport::TransportOptions topt = options.transport;
  topt.max_regions = std::max<uint32_t>(topt.max_regions, 4 * kMaxJobs);
  auto t = make(topt, engine.get());
  if (!t.ok()) return t.status();
  engine->transport_ = std::move(*t);
  engine->hands_over_pieces_ = engine->transport_->capabilities().hands_over_pieces;
  auto port = engine->transport_->Listen_st();
  if (!port.ok()) {
    return absl::Status(port.status().code(),
                        absl::StrCat("peer port ", options.transport.listen_address, ":",
                                     options.transport.listen_port, ": ", port.status().message()));
  }
  engine->listen_port_ = *port;
  return engine;
}

Engine::~Engine() {
  Shutdown_st();
  if (sleep_epoll_ >= 0) ::close(sleep_epoll_);
}

EngineStats Engine::Stats() const {
  EngineStats s;
  s.jobs_active = counters_.jobs_active.Get();
  s.jobs_failed = counters_.jobs_failed.Get();
  s.jobs_released = counters_.jobs_released.Get();
  s.posts_completed = counters_.posts_completed.Get();
  s.posts_failed = counters_.posts_failed.Get();
  s.segments_sent = counters_.segments_sent.Get();
  s.segments_received = counters_.segments_received.Get();
  s.segments_rejected = counters_.segments_rejected.Get();
  s.rounds_reduced = counters_.rounds_reduced.Get();
  s.rounds_folded = counters_.rounds_folded.Get();
  s.manifest_mismatches = counters_.manifest_mismatches.Get();
  s.arena_aliases = counters_.arena_aliases.Get();
  s.tuner_trials = counters_.tuner_trials.Get();
  return s;
}

// ------------------------------------------------------------------------------ the loop ----

int Engine::PollOnce_st(TimeNs now) {
  if (shut_down_) return 0;
  int work = server_->PollOnce(now);
  work += transport_->Progress_st(now, 0);
  if (now - last_housekeeping_ >= kHousekeepingInterval || housekeeping_due_) {
    last_housekeeping_ = now;
    housekeeping_due_ = false;
    Housekeeping_st(now);
  }
  for (auto& j : jobs_) {
    if (j != nullptr && !j->failed && j->policy != nullptr) work += RunPolicy_st(*j, now);
  }
  return work;
}

void Engine::Run(const std::atomic<bool>& stop) {
  int idle = 0;
  while (!stop.load(std::memory_order_acquire)) {
    const TimeNs now = SessionServer::MonotonicNow();
    if (PollOnce_st(now) > 0) {
      idle = 0;
      continue;
    }
    if (++idle < options_.idle_spins) continue;
    Sleep_st();
  }
  Shutdown_st();
}

void Engine::Sleep_st() {
  int timeout_ms = options_.idle_wait_ms;
  if (const int transport_fd = transport_->capabilities().wait_fd; transport_fd >= 0) {
    // One epoll over both: a client's doorbell or a peer's bytes end the sleep at once, so an
    // idle daemon reacts to either in microseconds, not at the next tick. The tick
    // (idle_wait_ms) still bounds the sleep for timers: policy wake-ups, housekeeping.
    if (sleep_epoll_ < 0) {
      sleep_epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
      for (int fd : {server_->wait_fd(), transport_fd}) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = fd;
        if (sleep_epoll_ >= 0) (void)::epoll_ctl(sleep_epoll_, EPOLL_CTL_ADD, fd, &ev);
      }
    }
    if (sleep_epoll_ >= 0 && !transport_->HasDeferredWork_st()) {
      bool woke = false;
      if (server_->ArmForSleep(&timeout_ms)) {
        epoll_event events[2];
        woke = ::epoll_wait(sleep_epoll_, events, 2, timeout_ms) > 0;
      }
      server_->DisarmAfterSleep(woke);
      return;
    }
  }
  // Sleep on the transport alone; client posts are picked up on the next round, within
  // idle_wait_ms.
  transport_->Progress_st(SessionServer::MonotonicNow(), timeout_ms);
}

void Engine::Shutdown_st() {
  if (shut_down_) return;
  shut_down_ = true;
  if (transport_ == nullptr) {
    server_.reset();
    return;
  }
  for (auto& j : jobs_) {
    if (j != nullptr) FailJob_st(*j, GL_E_DISCONNECTED, "daemon shutting down");
  }
  // Let goodbyes leave.
  const TimeNs now = SessionServer::MonotonicNow();
  for (int i = 0; i < 3; ++i) transport_->Progress_st(now, 0);
  for (auto& j : jobs_) {
    if (j != nullptr) ReleaseJob_st(*j);
  }
  server_.reset();  // closes every session, unmaps every arena, unlinks the socket
}

void Engine::Housekeeping_st(TimeNs now) {
  if (options_.telemetry != nullptr) PublishTelemetry_st(now);
  for (auto& jp : jobs_) {
    if (jp == nullptr) continue;
    Job& job = *jp;
    if (job.release_at != 0) {
      if (now >= job.release_at) ReleaseJob_st(job);
      continue;
    }
    // Peers whose dial was refused (they had not registered the job yet) are redialed when due.
    auto redial_due = [&] {
      for (uint16_t r = 0; r < job.world; ++r) {
        JobPeer& p = job.peers[r];
        if (r == job.rank || p.retry_at == 0 || now < p.retry_at) continue;
        p.retry_at = 0;
        ConnectPeer_st(job, r, now);
        if (job.failed) break;
      }
    };
    if (server_->FindSession(job.session_id) == nullptr) {
      // A draining job still owes pull responses, which go out only once every peer is up: a
      // client that closes right after its last result (it owns the shard, so its result came
      // first) must not strand a peer this daemon has not reached yet.
      if (!job.failed && job.phase != Job::Phase::kLeaving) redial_due();
      if (!EndJob_st(job, now)) continue;  // still draining or leaving
      FailJob_st(job, GL_E_DISCONNECTED, absl::StrCat("job ", job.info.job_id,
                                                      ": client session closed"));
      // Not now: releasing removes the job from the transport, which would cut the goodbye
      // frames FailJob_st just queued. The connections linger briefly, then go.
      job.release_at = now + kReleaseLinger;
      continue;
    }
    if (job.failed) {
      // Stop accepting peers for it (outside any transport callback), so the same job id can be
      // registered again while this session lingers: a dialer meanwhile gets unknown_job and
      // redials. The price: a peer that dials after the failure learns of it only through its
      // connect deadline, not through the original reason.
      RemoveFromTransport_st(job);
      continue;
    }
    redial_due();
    if (job.failed) continue;
    // Both directions count: a peer whose dial into us was abandoned before its manifest came
    // (not a failure by itself) must have come back by the deadline.
    if ((!job.all_up || job.manifests_in + 1u < job.world) &&
        now - job.connect_started > options_.transport.connect_deadline) {
      FailJob_st(job, GL_E_TIMEOUT,
                 absl::StrCat("job ", job.info.job_id, ": peers not all up within the connect "
                              "deadline (", job.peers_up, " of ", job.world - 1, " dialed, ",
                              job.manifests_in, " dialed in)"));
      continue;
    }
    if (job.policy != nullptr && now - job.last_estimate_push >= kEstimateInterval) {
      job.last_estimate_push = now;
      if (auto bw = job.estimator.BytesPerSecond()) {
        job.policy->OnLinkEstimate(*bw, job.estimator.SmoothedRtt().value_or(0));
      }
    }
  }
}

// ---------------------------------------------------------------------- job lifecycle ----

bool Engine::EndJob_st(Job& job, TimeNs now) {
  if (job.failed || job.posts_pending > 0 || job.world == 1) return true;
  if (job.phase == Job::Phase::kActive) {
    job.phase = Job::Phase::kDraining;
    job.drain_deadline = now + std::max<TimeNs>(options_.transport.peer_timeout, sched::kSecond);
  }
  if (job.phase == Job::Phase::kDraining) {
    bool busy = job.policy != nullptr &&
                (job.policy->queued_segments() > 0 || job.policy->credit_in_use() > 0);
    for (const OwnedPart& o : job.owned) busy = busy || o.pulls_pending > 0;
    if (busy && now < job.drain_deadline) return false;
    for (const OwnedPart& o : job.owned) {
      if (!o.reduced) {
        // Peers contributed to a round this rank never will: they must fail, not wait.
        FailJob_st(job, GL_E_DISCONNECTED,
                   absl::StrCat("job ", job.info.job_id, ": client left in the middle of "
                                "iteration ", o.round));
        return true;
      }
    }
    job.phase = Job::Phase::kLeaving;
    for (uint16_t r = 0; r < job.world; ++r) {
      JobPeer& p = job.peers[r];
      if (r == job.rank || p.out == transport::kNoPeer || p.state != PeerState::kUp) continue;
      transport::SendSpec spec;
      spec.key = kLeaveKey;
      spec.length = kLeaveBytes;
      spec.region = job.manifest_region;
      spec.cookie = MakeCookie(job.slot, job.generation, kCookieLeave, kNoDispatch);
      if (transport_->PostSend_st(p.out, spec).ok()) ++job.leave_acks_pending;
    }
  }
  return job.leave_acks_pending == 0 || now >= job.drain_deadline;
}

Job* Engine::ActivateJob_st(Session& session, TimeNs now) {
  uint32_t slot = 0;
  while (slot < jobs_.size() && jobs_[slot] != nullptr) ++slot;
  if (slot >= kMaxJobs) return nullptr;
  if (slot == jobs_.size()) {
    jobs_.emplace_back();
    generations_.push_back(0);
  }
  jobs_[slot] = std::make_unique<Job>();
  Job& job = *jobs_[slot];
  job.slot = slot;
  job.generation = generations_[slot];
  job.session_id = session.id();
  job_by_session_[session.id()] = slot;
  counters_.jobs_active.Add_st(1);
  JobError err = SetUpJob_st(session, job, now);
  if (err.status != GL_OK) FailJob_st(job, err.status, err.message);
  return &job;
}

JobError Engine::SetUpJob_st(Session& session, Job& job, TimeNs now) {
  JobError err = BuildJobPlan(session, options_.default_policy, options_.partition_bytes,
                              options_.reduce, &job);
  if (err.status != GL_OK) return err;
  const std::string& id = job.info.job_id;
  if (job_by_wire_.contains(job.wire_id)) {
    return {GL_E_ALREADY_EXISTS,
            absl::StrCat("job ", id, " already has a rank on this daemon (one rank per daemon "
                         "per job)")};
  }
  job.policy_config.name = job.policy_name;
  job.policy_config.partition_bytes = options_.partition_bytes;
  job.policy_config.credit_bytes = options_.credit_bytes;
  auto policy = sched::MakePolicy(job.policy_config);
  if (!policy.ok()) {
    return {GL_E_INVALID_ARGUMENT, absl::StrCat("job ", id, ": ", policy.status().message())};
  }
  job.policy = std::move(*policy);
  for (JobTensor& t : job.tensors) {
    job.auto_priority.Register(t.spec.id);
    job.policy->RegisterTensor(t.spec);
  }
  // Our own mapping of the client's arena: it keeps the pages alive if the client dies while
  // the transport still reads or writes them; released in ReleaseJob_st.
  void* alias = ::mremap(session.arena_base(), 0, session.arena_bytes(), MREMAP_MAYMOVE);
  if (alias == MAP_FAILED) {
    return {GL_E_IO, absl::StrCat("job ", id, ": mapping the arena: ", std::strerror(errno))};
  }
  job.arena = static_cast<uint8_t*>(alias);
  job.arena_bytes = session.arena_bytes();
  counters_.arena_aliases.Add_st(1);
  auto region = transport_->RegisterRegion_st(job.arena, job.arena_bytes);
  if (!region.ok()) return {GL_E_NO_MEMORY, std::string(region.status().message())};
  job.arena_region = *region;
  if (job.slab_bytes > 0) {
    job.slab.reset(new (std::nothrow) std::byte[job.slab_bytes]);
    if (job.slab == nullptr) {
      return {GL_E_NO_MEMORY, absl::StrCat("job ", id, ": shard buffers of ", job.slab_bytes,
                                           " bytes")};
    }
    auto sr = transport_->RegisterRegion_st(job.slab.get(), job.slab_bytes);
    if (!sr.ok()) return {GL_E_NO_MEMORY, std::string(sr.status().message())};
    job.slab_region = *sr;
  }
  job.owned_got.assign(job.owned.size() * job.world, 0);
  job.owned_placed.assign(job.owned.size() * job.world, 0);
  job.manifest_in.assign(job.world, ManifestBody{});
  auto mo = transport_->RegisterRegion_st(&job.manifest_out, sizeof(job.manifest_out));
  if (!mo.ok()) return {GL_E_NO_MEMORY, std::string(mo.status().message())};
  job.manifest_region = *mo;
  auto mi = transport_->RegisterRegion_st(job.manifest_in.data(),
                                          job.manifest_in.size() * sizeof(ManifestBody));
  if (!mi.ok()) return {GL_E_NO_MEMORY, std::string(mi.status().message())};
  job.manifest_in_region = *mi;
  job.posts.reserve(64);
  job.dispatches.reserve(256);
  job.peers.assign(job.world, JobPeer{});
  job.connect_started = now;
  for (auto& other : jobs_) {
    if (other != nullptr && other->failed && other->wire_id == job.wire_id) {
      RemoveFromTransport_st(*other);  // a failed earlier run of this job id, still lingering
    }
  }
  if (job.world > 1) {
    transport::JobCredentials creds{job.wire_id, job.rank, job.world, job.info.auth_token};
    if (absl::Status s = transport_->AddJob_st(creds); !s.ok()) {
      return {GL_E_INVALID_ARGUMENT, absl::StrCat("job ", id, ": ", s.message())};
    }
    job.added_to_transport = true;
  }
  job_by_wire_[job.wire_id] = job.slot;
  for (uint16_t r = 0; r < job.world; ++r) {
    if (r == job.rank) continue;
    job.peers[r].address = job.info.peers[r];
    job.peers[r].send_times.assign(
        std::max<uint32_t>(16, options_.transport.max_pending_sends_per_peer * 2), 0);
    ConnectPeer_st(job, r, now);
    if (job.failed) return {job.fail_status, job.fail_reason};
  }
  if (options_.autotune && job.policy_name == "bytescheduler") {
    const uint64_t part = EnginePartitionBytes(job.policy_name, options_.partition_bytes,
                                               sched::DType::kF32);
    sched::TunerBounds b{part, part, std::max<uint64_t>(part / 2, 4), 32 * part};
    auto tuner = sched::BoTuner::Create(b, job.wire_id);
    if (tuner.ok()) {
      auto t = std::make_unique<Tuner>(Tuner{std::move(*tuner), {}, 0, now, 0, -1, false});
      tuners_[job.slot] = std::move(t);
    }
  }
  LogLine(absl::StrCat("job ", id, " rank ", job.rank, "/", job.world, " active: ",
                       job.tensors.size(), " tensors, ", job.total_bytes, " bytes, ",
                       job.parts.size(), " partitions (", job.owned.size(), " owned here), policy ",
                       job.policy_name));
  return {};
}

void Engine::ConnectPeer_st(Job& job, uint16_t rank, TimeNs now) {
  JobPeer& p = job.peers[rank];
  transport::JobCredentials creds{job.wire_id, job.rank, job.world, job.info.auth_token};
  auto h = transport_->Connect_st(creds, p.address, now);
  ++p.connect_attempts;
  if (!h.ok()) {
    FailJob_st(job, GL_E_INVALID_ARGUMENT,
               absl::StrCat("job ", job.info.job_id, ": peer rank ", rank, " (", p.address,
                            "): ", h.status().message()));
    return;
  }
  p.out = *h;
  p.state = PeerState::kConnecting;
  out_handles_[*h] = OutHandle{job.slot, job.generation, rank};
}

void Engine::FailJob_st(Job& job, gl_status status, const std::string& reason) {
  if (job.failed) return;
  job.failed = true;
  // Housekeeping stops accepting peers for it before this loop round ends (not up to a tick
  // later): a new run of the same job id, whose peers may dial within that millisecond, must
  // get unknown_job and redial, not a connection to this failed run that refuses its manifest.
  housekeeping_due_ = true;
  job.fail_status = status;
  job.fail_reason = reason;
  // A disconnect with nothing pending is how every job ends (its clients close); only a failure
  // that cost a post, or a configuration error, counts as a failed job.
  if (job.posts_pending > 0 || status != GL_E_DISCONNECTED) {
    counters_.jobs_failed.Add_st(1);
    LogLine(absl::StrCat("job failed (", StatusName(status), "): ", reason));
  } else {
    LogLine(absl::StrCat("job ended: ", reason));
  }
  if (auto it = job_by_wire_.find(job.wire_id); it != job_by_wire_.end() && it->second == job.slot) {
    job_by_wire_.erase(it);
  }
  for (uint32_t i = 0; i < job.posts.size(); ++i) {
    if (job.posts[i].live) FinishPost_st(job, i, status);
  }
  // Disconnect fails the pending sends (callbacks re-enter and find the job failed).
  const TimeNs now = SessionServer::MonotonicNow();
  for (JobPeer& p : job.peers) {
    if (p.in != transport::kNoPeer) {
      // Peers that wait on us (pull responses, contributions) learn of the failure here.
      const PeerHandle h = p.in;
      p.in = transport::kNoPeer;
      transport_->Disconnect_st(h, now);
    }
    if (p.out == transport::kNoPeer) continue;
    const PeerHandle h = p.out;
    p.out = transport::kNoPeer;
    p.state = PeerState::kDown;
    transport_->Disconnect_st(h, now);
    out_handles_.erase(h);
  }
  job.policy.reset();
}

std::string Engine::DepartureReason(const Job& job, int64_t iteration, int left_rank) const {
  if (left_rank >= 0) {
    return absl::StrCat("job ", job.info.job_id, ": rank ", left_rank, " left the job; iteration ",
                        iteration, " cannot be reduced without it");
  }
  if (job.phase != Job::Phase::kActive) {
    return absl::StrCat("job ", job.info.job_id, ": the client of rank ", job.rank,
                        " left the job; iteration ", iteration, " cannot be reduced without it");
  }
  for (uint16_t r = 0; r < job.world; ++r) {
    if (job.peers[r].left) {
      return absl::StrCat("job ", job.info.job_id, ": rank ", r, " left the job; iteration ",
                          iteration, " cannot be reduced without it");
    }
  }
  return absl::StrCat("job ", job.info.job_id, ": a rank left the job; iteration ", iteration,
                      " cannot be reduced without it");
}

void Engine::RemoveFromTransport_st(Job& job) {
  if (!job.added_to_transport) return;
  job.added_to_transport = false;
  (void)transport_->RemoveJob_st(job.wire_id);
}

void Engine::ReleaseJob_st(Job& job) {
  FailJob_st(job, GL_E_DISCONNECTED, "released");
  // Every send from these regions was failed by Disconnect_st, so they can go.
  for (transport::RegionId* r : {&job.arena_region, &job.slab_region, &job.manifest_region,
                                 &job.manifest_in_region}) {
    if (*r != transport::kNoRegion) (void)transport_->UnregisterRegion_st(*r);
    *r = transport::kNoRegion;
  }
  RemoveFromTransport_st(job);
  if (job.arena != nullptr) {
    ::munmap(job.arena, job.arena_bytes);
    job.arena = nullptr;
    counters_.arena_aliases.Add_st(static_cast<uint64_t>(-1));
  }
  job_by_session_.erase(job.session_id);
  tuners_.erase(job.slot);
  const uint32_t slot = job.slot;
  ++generations_[slot];
  counters_.jobs_active.Add_st(static_cast<uint64_t>(-1));
  counters_.jobs_released.Add_st(1);
  jobs_[slot].reset();
  // A job's bookkeeping was allocated from this thread's malloc arena; glibc keeps freed
  // chunks (and, after its mmap threshold has grown, whole buffers) for reuse, so without a
  // trim the daemon's heap keeps the high-water mark of every job mix it has served. Jobs end
  // rarely, and the data path allocates nothing, so returning the pages here costs the other
  // jobs one short pause (measured: 2 ms for a 40 MB heap with 10,000 free chunks, less for
  // the few MB a daemon's heap holds).
  ::malloc_trim(0);
}

Job* Engine::JobFromCookie(uint64_t cookie) {
  const uint32_t slot = CookieSlot(cookie);
  if (slot >= jobs_.size() || jobs_[slot] == nullptr) return nullptr;
  Job* j = jobs_[slot].get();
  return (j->generation & 0xFFFu) == CookieGeneration(cookie) ? j : nullptr;
}

Job* Engine::JobByWire(uint64_t wire_id) {
  auto it = job_by_wire_.find(wire_id);
  return it == job_by_wire_.end() ? nullptr : jobs_[it->second].get();
}

Part* Engine::PartAt(Job& job, uint32_t tensor_id, uint64_t offset) {
  if (tensor_id >= job.tensors.size()) return nullptr;
  const JobTensor& t = job.tensors[tensor_id];
  if (offset >= t.spec.bytes) return nullptr;
  return &job.parts[t.first_part + t.plan.PartitionOf(offset)];
}

void Engine::Complete_st(const PostDescriptor& post, gl_status status) {
  if (status == GL_OK) {
    counters_.posts_completed.Add_st(1);
  } else {
    counters_.posts_failed.Add_st(1);
  }
  Session* s = server_ != nullptr ? server_->FindSession(post.session_id) : nullptr;
  if (s == nullptr) return;  // the client is gone; nobody to tell
  (void)s->Complete(post, status);
  s->FlushCompletions();
}

// ------------------------------------------------------------------ transport callbacks ----

void Engine::OnPeerUp_st(const transport::PeerInfo& peer) {
  auto it = out_handles_.find(peer.handle);
  if (it == out_handles_.end()) {
    // Inbound: the peer sends on it, we only receive; remembered so a failing job can close it
    // (the peer may be waiting on us with nothing of its own in flight).
    Job* job = JobByWire(peer.job_id);
    if (job != nullptr && !job->failed && peer.rank < job->world && peer.rank != job->rank) {
      // Before its manifest arrives, a newer connection from the rank supersedes an older one:
      // the older was abandoned by the dialer mid-handshake (see OnPeerDown_st). Once the
      // manifest came, the connection that carried it stays the rank's; a later one is stale.
      JobPeer& p = job->peers[peer.rank];
      if (!p.manifest_ok || p.in == transport::kNoPeer) p.in = peer.handle;
    }
    return;
  }
  Job* job = jobs_[it->second.slot].get();
  if (job == nullptr || job->generation != it->second.generation || job->failed) return;
  JobPeer& p = job->peers[it->second.rank];
  p.state = PeerState::kUp;
  p.ever_up = true;
  ++job->peers_up;
  if (job->peers_up + 1u == job->world) job->all_up = true;
  // The manifest is the first frame on the connection, so the peer checks it before any data.
  transport::SendSpec spec;
  spec.key = kManifestKey;
  spec.length = kManifestBytes;
  spec.region = job->manifest_region;
  spec.cookie = MakeCookie(job->slot, job->generation, kCookieManifest, kNoDispatch);
  if (absl::Status s = transport_->PostSend_st(p.out, spec); !s.ok()) {
    FailJob_st(*job, StatusFor(s), absl::StrCat("job ", job->info.job_id, ": manifest to rank ",
                                                it->second.rank, ": ", s.message()));
  }
}

void Engine::OnPeerDown_st(const transport::PeerInfo& peer, const absl::Status& why) {
  const TimeNs now = SessionServer::MonotonicNow();
  if (auto it = out_handles_.find(peer.handle); it != out_handles_.end()) {
    const OutHandle oh = it->second;
    out_handles_.erase(it);
    Job* job = jobs_[oh.slot].get();
    if (job == nullptr || job->generation != oh.generation || job->failed) return;
    JobPeer& p = job->peers[oh.rank];
    const bool was_up = p.state == PeerState::kUp;
    p.out = transport::kNoPeer;
    p.state = PeerState::kDown;
    if (was_up) --job->peers_up;
    if (p.left) return;  // it said goodbye to the job first: not a failure
    if (!p.ever_up && absl::IsNotFound(why) &&
        now - job->connect_started < options_.transport.connect_deadline) {
      // The peer's client has not posted yet, so its daemon does not know the job: redial.
      const TimeNs backoff =
          std::min<TimeNs>(options_.transport.connect_max_backoff,
                           options_.transport.connect_initial_backoff << std::min(p.connect_attempts, 16));
      p.retry_at = now + backoff;
      return;
    }
    FailJob_st(*job, StatusFor(why),
               absl::StrCat("job ", job->info.job_id, ": peer rank ", oh.rank, " (", p.address,
                            ") down: ", why.message()));
    return;
  }
  // An inbound connection that had come up.
  Job* job = JobByWire(peer.job_id);
  if (job == nullptr || job->failed || peer.rank >= job->world || peer.rank == job->rank) return;
  JobPeer& p = job->peers[peer.rank];
  if (p.in != peer.handle) {
    // Not the rank's connection: one it abandoned mid-handshake (superseded by a later dial).
    return;
  }
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
  FailJob_st(*job, StatusFor(why),
             absl::StrCat("job ", job->info.job_id, ": connection from rank ", peer.rank,
                          " lost: ", why.message()));
}

void Engine::OnSendAcked_st(const transport::SendCompletion& send, TimeNs now) {
  Job* job = JobFromCookie(send.cookie);
  // A failed job has no policy and no rounds: a late ack has nothing left to update.
  if (job == nullptr || job->failed) return;
  auto it = out_handles_.find(send.peer);
  if (it != out_handles_.end()) {
    JobPeer& p = job->peers[it->second.rank];
    if ((send.cookie & (kCookieManifest | kCookieLeave)) == 0 && p.send_head < p.send_tail) {
      const TimeNs sent = p.send_times[p.send_head++ % p.send_times.size()];
      job->estimator.OnAck(send.length, sent, now);
      if (options_.telemetry != nullptr) {
        const uint8_t dir = static_cast<uint8_t>((send.cookie & kCookiePull) != 0
                                                     ? sched::Direction::kPull
                                                     : sched::Direction::kPush);
        options_.telemetry->Emit_st({EventType::kAcked, dir, it->second.rank, job->slot,
                                     job->generation, 0, send.key, send.iteration, send.offset,
                                     send.length, sent, now});
      }
    }
  }
  if ((send.cookie & kCookieManifest) != 0) return;
  if ((send.cookie & kCookieLeave) != 0) {
    if (job->leave_acks_pending > 0) --job->leave_acks_pending;
    return;
  }
  if ((send.cookie & kCookiePull) != 0) {
    if (Part* p = PartAt(*job, sched::KeyTensor(send.key), send.offset); p && p->owned >= 0) {
      OwnedPart& o = job->owned[p->owned];
      // Pull responses may be cut into several sends: count bytes.
      o.pulls_pending -= std::min(o.pulls_pending, send.length);
      if (o.pulls_pending == 0 && o.reduce_deferred) TryReduce_st(*job, o);
    }
  }
  ReturnDispatch_st(*job, CookieDispatch(send.cookie), now);
}

void Engine::OnSendFailed_st(const transport::SendCompletion& send, const absl::Status& why) {
  Job* job = JobFromCookie(send.cookie);
  if (job == nullptr || job->failed) return;
  if ((send.cookie & kCookieLeave) != 0) {
    if (job->leave_acks_pending > 0) --job->leave_acks_pending;
    return;
  }
  if (absl::IsFailedPrecondition(why) && job->any_left) {
    // Refused by a shard that knows a rank has left (it fails its job too): the departure is
    // the reason, not the protocol.
    FailJob_st(*job, GL_E_DISCONNECTED, DepartureReason(*job, send.iteration));
    return;
  }
  FailJob_st(*job, absl::IsFailedPrecondition(why) ? GL_E_PROTOCOL : StatusFor(why),
             absl::StrCat("job ", job->info.job_id, ": segment (tensor ",
                          sched::KeyTensor(send.key), ", offset ", send.offset,
                          ", iteration ", send.iteration, ") failed: ", why.message()));
}

RecvTarget Engine::ResolveRecv_st(const transport::PeerInfo& peer,
                                     const transport::FrameHeader& h) {
  Job* job = JobByWire(peer.job_id);
  const uint32_t r = peer.rank;
  auto reject = [&]() {
    counters_.segments_rejected.Add_st(1);
    if (job != nullptr) ++job->segments_rejected;
    return RecvTarget::Reject();
  };
  if (h.key == kLeaveKey && (job == nullptr || job->failed)) {
    // The job already ended here too (its client closed first): nothing to refuse.
    return RecvTarget::Reject();
  }
  if (job == nullptr || job->failed) {
    // The job has ended here (its client left, or it failed) and this connection outlived it:
    // a peer dialed in while the failure was being handled. A refused frame would read to the
    // sender as a protocol fault; closing the connection with a goodbye reads as what it is, a
    // disconnection (the transports send no ack once the handler has disconnected).
    transport_->Disconnect_st(peer.handle, SessionServer::MonotonicNow());
    return RecvTarget::Reject();
  }
  if (r >= job->world || r == job->rank) return reject();
  const uint64_t cookie = MakeCookie(job->slot, job->generation, 0, 0);
  const uint32_t tid = sched::KeyTensor(h.key);
  if (h.key == kLeaveKey) {
    if (h.length != kLeaveBytes || !job->peers[r].manifest_ok) return reject();
    return RecvTarget::Into(job->manifest_in_region, uint64_t{r} * kManifestBytes, cookie);
  }
  if (tid == kManifestTensorId) {
    if (h.key != kManifestKey || h.length != kManifestBytes || job->peers[r].manifest_ok) {
      return reject();
    }
    return RecvTarget::Into(job->manifest_in_region, uint64_t{r} * kManifestBytes, cookie);
  }
  if (!job->peers[r].manifest_ok || h.length == 0) return reject();
  Part* p = PartAt(*job, tid, h.offset);
  // The key names the partition too: frames are placed by offset, so the two must agree.
  if (p == nullptr || sched::KeyPartition(h.key) != p->index) return reject();
  const JobTensor& t = job->tensors[tid];
  if (h.dtype != static_cast<uint8_t>(t.spec.dtype) || h.length % sched::DTypeBytes(t.spec.dtype) != 0 ||
      h.offset % sched::DTypeBytes(t.spec.dtype) != 0 || h.offset + h.length > p->offset + p->length) {
    return reject();
  }
  if (h.direction == static_cast<uint8_t>(sched::Direction::kPush)) {
    if (p->owner != job->rank) return reject();
    OwnedPart& o = job->owned[p->owned];
    if (!ShardAccept_st(*job, o, r, h.iteration, h.length)) return reject();
    o.priority = std::min<sched::Priority>(o.priority, h.priority);
    const uint64_t slot_offset = o.slab_offset + uint64_t{r} * p->length + (h.offset - p->offset);
    // A backend that hands packets over gives every push to OnRecvPiece_st, which folds or
    // places each piece.
    if (hands_over_pieces_) return RecvTarget::Pieces(job->slab_region, slot_offset, cookie);
    return RecvTarget::Into(job->slab_region, slot_offset, cookie);
  }
  // A pull response: only from the partition's shard, for the round we wait for.
  if (p->owner != r || p->iteration != h.iteration || p->posted != p->length ||
      p->result_reserved + h.length > p->length) {
    return reject();
  }
  p->result_reserved += h.length;
  return RecvTarget::Into(job->arena_region, t.arena_offset + h.offset, cookie);
}

void Engine::OnRecvDone_st(const transport::PeerInfo& peer, const transport::FrameHeader& h,
                              const RecvTarget& target, TimeNs now) {
  Job* job = JobFromCookie(target.cookie);
  if (job == nullptr || job->failed) return;
  const uint32_t r = peer.rank;
  ++job->segments_received;
  counters_.segments_received.Add_st(1);
  const uint32_t tid = sched::KeyTensor(h.key);
  if (h.key == kLeaveKey) {
    job->peers[r].left = true;
    job->any_left = true;
    for (size_t k = 0; k < job->owned.size(); ++k) {
      const OwnedPart& o = job->owned[k];
      if (!o.reduced && job->owned_got[k * job->world + r] < job->parts[o.part].length) {
        FailJob_st(*job, GL_E_DISCONNECTED,
                   absl::StrCat("job ", job->info.job_id, ": rank ", r, " left the job without "
                                "contributing to iteration ", o.round));
        return;
      }
    }
    // A leaving shard first sends every result it owes (they travel ahead of this frame on the
    // same connection), so a partition of its that we posted and still wait for belongs to a
    // round it never took part in: waiting would only end in the client's timeout.
    for (const Part& p : job->parts) {
      if (p.owner == r && p.posted > 0 && p.result_got < p.length) {
        FailJob_st(*job, GL_E_DISCONNECTED,
                   DepartureReason(*job, p.iteration, static_cast<int>(r)));
        return;
      }
    }
    return;
  }
  if (tid == kManifestTensorId) {
    const ManifestBody& m = job->manifest_in[r];
    if (m.magic == kManifestMagic && m.fingerprint == job->fingerprint &&
        m.tensor_count == job->manifest_out.tensor_count && m.world_size == job->world) {
      job->peers[r].manifest_ok = true;
      ++job->manifests_in;
      // This connection is the rank's from now on (it may not be the latest to have come up).
      job->peers[r].in = peer.handle;
      return;
    }
    counters_.manifest_mismatches.Add_st(1);
    FailJob_st(*job, GL_E_BAD_TENSOR,
               absl::StrCat("job ", job->info.job_id, ": rank ", r, " registered ",
                            m.tensor_count, " tensors (", m.total_bytes, " bytes, W=",
                            m.world_size, ", fingerprint ", absl::Hex(m.fingerprint),
                            "), this rank ", job->manifest_out.tensor_count, " (",
                            job->total_bytes, " bytes, W=", job->world, ", fingerprint ",
                            absl::Hex(job->fingerprint),
                            "): every rank must register the same tensors (name, bytes, dtype) "
                            "in the same order, with the same policy and reduce op, before its "
                            "first post"));
    return;
  }
  Part* p = PartAt(*job, tid, h.offset);
  if (p == nullptr) return;
  if (options_.telemetry != nullptr) {
    options_.telemetry->Emit_st({EventType::kReceived, h.direction, static_cast<uint16_t>(r),
                                 job->slot, job->generation, h.priority, h.key, h.iteration,
                                 h.offset, h.length, 0, now});
  }
  if (h.direction == static_cast<uint8_t>(sched::Direction::kPush)) {
    // Frames of one peer are resolved and placed one after another, so when the bytes reserved
    // for rank r reach the partition's length, this frame was its last piece.
    if (p->owned >= 0 &&
        job->owned_got[static_cast<size_t>(p->owned) * job->world + r] == p->length) {
      ShardRankDone_st(*job, job->owned[p->owned]);
    }
    return;
  }
  p->result_got += h.length;
  if (p->result_got == p->length) PartResultReady_st(*job, static_cast<uint32_t>(p - job->parts.data()));
}


}  // namespace gradlane::daemon
