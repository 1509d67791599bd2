#include "daemon/engine.h"

#include <malloc.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradlane::daemon {

using sched::TimeNs;
using transport::PeerHandle;
using transport::RecvTarget;

namespace {
constexpr TimeNs kHousekeepingInterval = sched::kMillisecond;
}  // namespace

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
  // From now on the acceptor thread registers each new session's arena with the device (verbs);
  // a client that connected in the moment before (the ready line is not printed yet) has its
  // arena registered by the engine when its job starts, as before.
  engine->server_->SetRegistrar(engine->transport_->registrar());
  engine->server_->SetDeviceMemory(engine->transport_->capabilities().device_memory);
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

// ------------------------------------------------------------------------------ the loop ----

int Engine::PollOnce_st(TimeNs now) {
  if (shut_down_) return 0;
  int work = server_->PollOnce_st(now);
  work += transport_->Progress_st(now, 0);
  if (now - last_housekeeping_ >= kHousekeepingInterval || housekeeping_due_) {
    last_housekeeping_ = now;
    housekeeping_due_ = false;
    Housekeeping_st(now);
  }
  for (auto& j : jobs_) {
    if (j != nullptr) work += j->RunPolicy_st(now);
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
      if (server_->ArmForSleep_st(&timeout_ms)) {
        epoll_event events[2];
        woke = ::epoll_wait(sleep_epoll_, events, 2, timeout_ms) > 0;
      }
      server_->DisarmAfterSleep_st(woke);
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
    if (j != nullptr) j->Fail_st(GL_E_DISCONNECTED, "daemon shutting down");
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
    JobRuntime& job = *jp;
    if (job.release_at() != 0) {
      if (now >= job.release_at()) ReleaseJob_st(job);
      continue;
    }
    job.Housekeeping_st(now, server_->FindSession_st(job.session_id()) != nullptr);
  }
}

// ---------------------------------------------------------------------------- job table ----

JobRuntime* Engine::ActivateJob_st(Session& session, TimeNs now) {
  session.MarkJobStarted_st();  // the job registers the session's GPU memory now, or never
  uint32_t slot = 0;
  while (slot < jobs_.size() && jobs_[slot] != nullptr) ++slot;
  if (slot >= kMaxJobs) return nullptr;
  if (slot == jobs_.size()) {
    jobs_.emplace_back();
    generations_.push_back(0);
  }
  jobs_[slot] = std::make_unique<JobRuntime>(static_cast<JobHost&>(*this), slot, generations_[slot],
                                             session.id());
  JobRuntime& job = *jobs_[slot];
  job_by_session_[session.id()] = slot;
  counters_.jobs_active.Add_st(1);
  JobError err = job.Plan_st(session);
  if (err.status == GL_OK && job_by_wire_.contains(job.wire_id())) {
    err = {GL_E_ALREADY_EXISTS, absl::StrCat("job ", job.id(),
                                             " already has a rank on this daemon (one rank per "
                                             "daemon per job)")};
  }
  if (err.status == GL_OK) err = job.SetUp_st(session, now);
  if (err.status == GL_OK) {
    for (auto& other : jobs_) {
      if (other != nullptr && other.get() != &job && other->failed() &&
          other->wire_id() == job.wire_id()) {
        other->RemoveFromTransport_st();  // a failed earlier run of this job id, still lingering
      }
    }
    job_by_wire_[job.wire_id()] = slot;
    err = job.Start_st(now);
  }
  if (err.status != GL_OK) job.Fail_st(err.status, err.message);
  return &job;
}

void Engine::ReleaseJob_st(JobRuntime& job) {
  job.Release_st();
  job_by_session_.erase(job.session_id());
  const uint32_t slot = job.slot();
  ++generations_[slot];
  counters_.jobs_active.Sub_st(1);
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

void Engine::OnJobFailed_st(JobRuntime& job) {
  // Housekeeping stops accepting peers for it before this loop round ends (not up to a tick
  // later): a new run of the same job id, whose peers may dial within that millisecond, must
  // get unknown_job and redial, not a connection to this failed run that refuses its manifest.
  housekeeping_due_ = true;
  if (auto it = job_by_wire_.find(job.wire_id());
      it != job_by_wire_.end() && it->second == job.slot()) {
    job_by_wire_.erase(it);
  }
}

void Engine::TrackOutbound_st(PeerHandle handle, const JobRuntime& job, uint16_t rank) {
  out_handles_[handle] = OutHandle{job.slot(), job.generation(), rank};
}

void Engine::ForgetOutbound_st(PeerHandle handle) { out_handles_.erase(handle); }

JobRuntime* Engine::JobFromCookie(uint64_t cookie) {
  const uint32_t slot = CookieSlot(cookie);
  if (slot >= jobs_.size() || jobs_[slot] == nullptr) return nullptr;
  JobRuntime* j = jobs_[slot].get();
  return (j->generation() & 0xFFFu) == CookieGeneration(cookie) ? j : nullptr;
}

JobRuntime* Engine::JobByWire(uint64_t wire_id) {
  auto it = job_by_wire_.find(wire_id);
  return it == job_by_wire_.end() ? nullptr : jobs_[it->second].get();
}

void Engine::CompletePost_st(const PostDescriptor& post, gl_status status) {
  if (status == GL_OK) {
    counters_.posts_completed.Add_st(1);
  } else {
    counters_.posts_failed.Add_st(1);
  }
  Session* s = server_ != nullptr ? server_->FindSession_st(post.session_id) : nullptr;
  if (s == nullptr) return;  // the client is gone; nobody to tell
  (void)s->Complete_st(post, status);
  s->FlushCompletions_st();
}

void Engine::OnPost_st(Session& session, const PostDescriptor& post) {
  JobRuntime* job = nullptr;
  const TimeNs now = SessionServer::MonotonicNow();
  if (auto it = job_by_session_.find(session.id()); it != job_by_session_.end()) {
    job = jobs_[it->second].get();
  } else {
    job = ActivateJob_st(session, now);
  }
  if (job == nullptr) {
    CompletePost_st(post, GL_E_NO_MEMORY);  // job table full
    return;
  }
  job->worker().OnPost_st(post, now);
}

// ------------------------------------------------------------------ transport callbacks ----

void Engine::OnPeerUp_st(const transport::PeerInfo& peer) {
  auto it = out_handles_.find(peer.handle);
  if (it == out_handles_.end()) {
    if (JobRuntime* job = JobByWire(peer.job_id)) job->OnInboundUp_st(peer.rank, peer.handle);
    return;
  }
  JobRuntime* job = jobs_[it->second.slot].get();
  if (job == nullptr || job->generation() != it->second.generation) return;
  job->OnOutboundUp_st(it->second.rank);
}

void Engine::OnPeerDown_st(const transport::PeerInfo& peer, const absl::Status& why) {
  if (auto it = out_handles_.find(peer.handle); it != out_handles_.end()) {
    const OutHandle oh = it->second;
    out_handles_.erase(it);
    JobRuntime* job = jobs_[oh.slot].get();
    if (job == nullptr || job->generation() != oh.generation) return;
    job->OnOutboundDown_st(oh.rank, why, SessionServer::MonotonicNow());
    return;
  }
  // An inbound connection that had come up.
  if (JobRuntime* job = JobByWire(peer.job_id)) job->OnInboundDown_st(peer.rank, peer.handle, why);
}

void Engine::OnSendAcked_st(const transport::SendCompletion& send, TimeNs now) {
  JobRuntime* job = JobFromCookie(send.cookie);
  if (job == nullptr) return;
  auto it = out_handles_.find(send.peer);
  job->OnSendAcked_st(send, it != out_handles_.end() ? it->second.rank : -1, now);
}

void Engine::OnSendFailed_st(const transport::SendCompletion& send, const absl::Status& why) {
  if (JobRuntime* job = JobFromCookie(send.cookie)) job->OnSendFailed_st(send, why);
}

RecvTarget Engine::ResolveRecv_st(const transport::PeerInfo& peer,
                                  const transport::FrameHeader& h) {
  JobRuntime* job = JobByWire(peer.job_id);
  if (job != nullptr && !job->failed()) return job->ResolveRecv_st(peer, h);
  if (h.key == kLeaveKey) {
    // The job already ended here too (its client closed first): nothing to refuse.
    return RecvTarget::Reject();
  }
  // The job has ended here (its client left, or it failed) and this connection outlived it:
  // a peer dialed in while the failure was being handled. A refused frame would read to the
  // sender as a protocol fault; closing the connection with a goodbye reads as what it is, a
  // disconnection (the transports send no ack once the handler has disconnected).
  transport_->Disconnect_st(peer.handle, SessionServer::MonotonicNow());
  return RecvTarget::Reject();
}

void Engine::OnRecvPiece_st(const transport::PeerInfo& peer, const transport::FrameHeader& h,
                            const RecvTarget& target, uint64_t segment_offset,
                            std::span<const uint8_t> bytes) {
  JobRuntime* job = JobFromCookie(target.cookie);
  if (job == nullptr || job->failed()) return;
  job->shard().OnPushPiece_st(peer.rank, h, segment_offset, bytes);
}

void Engine::OnRecvDone_st(const transport::PeerInfo& peer, const transport::FrameHeader& h,
                           const RecvTarget& target, TimeNs now) {
  if (JobRuntime* job = JobFromCookie(target.cookie)) job->OnRecvDone_st(peer, h, now);
}

}  // namespace gradlane::daemon
