// daemon/worker_role.cc — the engine's worker role: a client post cut at partition boundaries, local
// pieces contributed in place, remote ones fed to the policy as pushes; completion when every
// partition of the range holds the reduced result.
#include "daemon/engine.h"

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

// ------------------------------------------------------------------------- worker role ----

void Engine::OnPost(Session& session, const PostDescriptor& post) {
  const TimeNs now = SessionServer::MonotonicNow();
  Job* job = nullptr;
  if (auto it = job_by_session_.find(session.id()); it != job_by_session_.end()) {
    job = jobs_[it->second].get();
  } else {
    job = ActivateJob_st(session, now);
  }
  if (job == nullptr) {
    Complete_st(post, GL_E_NO_MEMORY);  // job table full
    return;
  }
  if (job->failed) {
    Complete_st(post, job->fail_status);
    return;
  }
  if (post.tensor_id >= job->tensors.size()) {
    // Registered after the job's first post: the shard map is frozen without it.
    Complete_st(post, GL_E_BAD_TENSOR);
    return;
  }
  JobTensor& t = job->tensors[post.tensor_id];
  const uint32_t first = t.first_part + t.plan.PartitionOf(post.offset);
  const uint32_t last = t.first_part + t.plan.PartitionOf(post.offset + post.length - 1);
  // Validate before touching any state: the range must not repeat bytes already posted for
  // this iteration, nor start an iteration while the previous one's result is still out.
  for (uint32_t i = first; i <= last; ++i) {
    const Part& p = job->parts[i];
    const uint64_t lo = std::max(post.offset, p.offset);
    const uint64_t hi = std::min(post.offset + post.length, p.offset + p.length);
    if (p.iteration == post.iteration) {
      if (p.posted + (hi - lo) > p.length) {
        Complete_st(post, GL_E_BAD_RANGE);
        return;
      }
    } else if (p.iteration > post.iteration ||
               (p.iteration >= 0 && p.posted > 0 && p.result_got < p.length)) {
      Complete_st(post, GL_E_BAD_ITERATION);
      return;
    }
  }
  // Auto priorities learn from the order gradients become ready.
  job->auto_priority.Observe(post.tensor_id, post.iteration);
  const sched::Priority prio =
      t.auto_priority ? job->auto_priority.PriorityOf(post.tensor_id) : t.spec.priority;

  uint32_t index;
  if (!job->free_posts.empty()) {
    index = job->free_posts.back();
    job->free_posts.pop_back();
  } else {
    index = static_cast<uint32_t>(job->posts.size());
    job->posts.emplace_back();
  }
  PostRecord& rec = job->posts[index];
  rec.post = post;
  rec.remaining = last - first + 1;
  rec.live = true;
  ++job->posts_pending;
  t.active_posts.push_back(index);
  if (options_.telemetry != nullptr) {
    options_.telemetry->Emit_st({EventType::kPosted, 0, 0, job->slot, job->generation, prio,
                                 sched::MakeKey(post.tensor_id, 0), post.iteration, post.offset,
                                 post.length, 0, now});
  }
  if (auto tit = tuners_.find(job->slot); tit != tuners_.end()) {
    tit->second->bytes += post.length;
    if (post.iteration > tit->second->last_iteration) {
      tit->second->last_iteration = post.iteration;
      TuneStep_st(*job, now);
    }
  }

  for (uint32_t i = first; i <= last && !job->failed; ++i) {
    Part& p = job->parts[i];
    if (p.iteration != post.iteration) {
      p.iteration = post.iteration;
      p.posted = 0;
      p.result_reserved = 0;
      p.result_got = 0;
    }
    const uint64_t lo = std::max(post.offset, p.offset);
    const uint64_t hi = std::min(post.offset + post.length, p.offset + p.length);
    p.posted += hi - lo;
    if (p.owner == job->rank) {
      OwnedPart& o = job->owned[p.owned];
      if (!ShardAccept_st(*job, o, job->rank, post.iteration, hi - lo)) {
        FailJob_st(*job, GL_E_BAD_ITERATION,
                   absl::StrCat("job ", job->info.job_id, ": tensor ", t.name, " iteration ",
                                post.iteration, " posted while the shard is in round ", o.round));
        return;
      }
      o.priority = std::min(o.priority, prio);
      if (job->owned_got[static_cast<size_t>(p.owned) * job->world + job->rank] == p.length) {
        ShardRankDone_st(*job, o);
      }
    } else {
      sched::ReadyRange r;
      r.tensor_id = post.tensor_id;
      r.priority = prio;
      r.dtype = t.spec.dtype;
      r.direction = sched::Direction::kPush;
      r.peer = p.owner;
      r.iteration = post.iteration;
      r.tensor_bytes = t.spec.bytes;
      r.offset = lo;
      r.length = hi - lo;
      job->policy->OnReady(r, now);
      if (options_.telemetry != nullptr) {
        options_.telemetry->Emit_st({EventType::kReady, 0, p.owner, job->slot, job->generation,
                                     prio, sched::MakeKey(p.tensor, p.index), post.iteration, lo,
                                     hi - lo, 0, now});
      }
    }
  }
}

void Engine::FinishPost_st(Job& job, uint32_t index, gl_status status) {
  PostRecord& rec = job.posts[index];
  if (!rec.live) return;
  rec.live = false;
  --job.posts_pending;
  if (rec.post.tensor_id < job.tensors.size()) {
    auto& active = job.tensors[rec.post.tensor_id].active_posts;
    auto it = std::find(active.begin(), active.end(), index);
    if (it != active.end()) {
      *it = active.back();
      active.pop_back();
    }
  }
  job.free_posts.push_back(index);
  if (status == GL_OK) ++job.posts_completed; else ++job.posts_failed;
  if (options_.telemetry != nullptr) {
    options_.telemetry->Emit_st({EventType::kPostDone, 0, 0, job.slot, job.generation,
                                 static_cast<int32_t>(status),
                                 sched::MakeKey(rec.post.tensor_id, 0), rec.post.iteration,
                                 rec.post.offset, rec.post.length, 0,
                                 SessionServer::MonotonicNow()});
  }
  Complete_st(rec.post, status);
}

void Engine::PartResultReady_st(Job& job, uint32_t part_index) {
  const Part& p = job.parts[part_index];
  auto& active = job.tensors[p.tensor].active_posts;
  // Iterate backwards: FinishPost_st swap-removes from `active`.
  for (size_t k = active.size(); k-- > 0;) {
    const uint32_t idx = active[k];
    PostRecord& rec = job.posts[idx];
    if (rec.post.iteration != p.iteration) continue;
    if (rec.post.offset >= p.offset + p.length || rec.post.offset + rec.post.length <= p.offset) {
      continue;
    }
    if (--rec.remaining == 0) FinishPost_st(job, idx, GL_OK);
  }
}


}  // namespace gradlane::daemon
