#include "daemon/worker_role.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/job_runtime.h"
#include "daemon/session_server.h"

namespace gradlane::daemon {

using sched::TimeNs;
using transport::RecvTarget;

void WorkerRole::OnPost_st(const PostDescriptor& post, TimeNs now) {
  JobHost& host = job_.host();
  if (job_.failed()) {
    host.CompletePost_st(post, job_.fail_status());
    return;
  }
  JobPlan& plan = job_.plan();
  if (post.tensor_id >= plan.client_tensors) {
    // Registered after the job's first post: the shard map is frozen without it.
    host.CompletePost_st(post, GL_E_BAD_TENSOR);
    return;
  }
  JobTensor& t = plan.tensors[post.tensor_id];
  const uint32_t first = t.first_part + t.plan.PartitionOf(post.offset);
  const uint32_t last = t.first_part + t.plan.PartitionOf(post.offset + post.length - 1);
  // Validate before touching any state: the range must not repeat bytes already posted for
  // this iteration, nor start an iteration while the previous one's result is still out.
  for (uint32_t i = first; i <= last; ++i) {
    const Part& p = plan.parts[i];
    const uint64_t lo = std::max(post.offset, p.offset);
    const uint64_t hi = std::min(post.offset + post.length, p.offset + p.length);
    if (p.iteration == post.iteration) {
      if (p.posted + (hi - lo) > p.length) {
        host.CompletePost_st(post, GL_E_BAD_RANGE);
        return;
      }
    } else if (p.iteration > post.iteration ||
               (p.iteration >= 0 && p.posted > 0 && p.result_got < p.length)) {
      host.CompletePost_st(post, GL_E_BAD_ITERATION);
      return;
    }
  }
  // Auto priorities learn from the order gradients become ready.
  job_.auto_priority().Observe(post.tensor_id, post.iteration);
  const sched::Priority prio =
      t.auto_priority ? job_.auto_priority().PriorityOf(post.tensor_id) : t.spec.priority;
  uint32_t index;
  if (!free_posts_.empty()) {
    index = free_posts_.back();
    free_posts_.pop_back();
  } else {
    index = static_cast<uint32_t>(posts_.size());
    posts_.emplace_back();
  }
  PostRecord& rec = posts_[index];
  rec.post = post;
  rec.remaining = last - first + 1;
  rec.live = true;
  ++posts_pending_;
  t.active_posts.push_back(index);
  if (Telemetry* tm = job_.telemetry()) {
    tm->Posted_st(job_.telemetry_tag(), prio,
                  {sched::MakeKey(post.tensor_id, 0), post.iteration, post.offset, post.length},
                  now);
  }
  job_.TuneOnPost_st(post.iteration, post.length, now);
  for (uint32_t i = first; i <= last && !job_.failed(); ++i) {
    Part& p = plan.parts[i];
    if (p.iteration != post.iteration) {
      p.iteration = post.iteration;
      p.posted = 0;
      p.result_reserved = 0;
      p.result_got = 0;
    }
    const uint64_t lo = std::max(post.offset, p.offset);
    const uint64_t hi = std::min(post.offset + post.length, p.offset + p.length);
    p.posted += hi - lo;
    if (plan.mode == GL_MODE_ALLREDUCE) {
      job_.ring().OnPosted_st(i, prio, now);
    } else if (p.owner == job_.rank()) {
      ShardRole& shard = job_.shard();
      OwnedPart& o = shard.owned(p.owned);
      if (!shard.Accept_st(o, job_.rank(), post.iteration, hi - lo)) {
        job_.Fail_st(GL_E_BAD_ITERATION,
                     absl::StrCat("job ", job_.id(), ": tensor ", t.name, " iteration ",
                                  post.iteration, " posted while the shard is in round ", o.round));
        return;
      }
      o.priority = std::min(o.priority, prio);
      shard.OnContributed_st(o, job_.rank(), hi - lo);
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
      job_.Ready_st(r, now);
    }
  }
}

RecvTarget WorkerRole::ResolveResult_st(uint16_t from_rank, Part& p,
                                        const transport::FrameHeader& h, uint64_t cookie) {
  // Only from the partition's shard, for the round we wait for.
  if (p.owner != from_rank || p.iteration != h.iteration || p.posted != p.length ||
      p.result_reserved + h.length > p.length) {
    return RecvTarget::Reject();
  }
  p.result_reserved += h.length;
  const JobTensor& t = job_.plan().tensors[p.tensor];
  // GPUDirect: another shard's result goes straight into GPU memory (our pushes asked for it
  // by rendezvous); the client copies back only the partitions the local shard reduced.
  if (t.device_region != transport::kNoRegion) {
    return RecvTarget::Into(t.device_region, t.device_offset + h.offset, cookie);
  }
  return RecvTarget::Into(job_.arena_region(), t.arena_offset + h.offset, cookie);
}

void WorkerRole::OnResultPlaced_st(Part& p, uint64_t bytes) {
  p.result_got += bytes;
  if (p.result_got == p.length) {
    PartResultReady_st(static_cast<uint32_t>(&p - job_.plan().parts.data()));
  }
}

void WorkerRole::PartResultReady_st(uint32_t part_index) {
  JobPlan& plan = job_.plan();
  const Part& p = plan.parts[part_index];
  auto& active = plan.tensors[p.tensor].active_posts;
  // Iterate backwards: Finish_st swap-removes from `active`.
  for (size_t k = active.size(); k-- > 0;) {
    const uint32_t idx = active[k];
    PostRecord& rec = posts_[idx];
    if (rec.post.iteration != p.iteration) continue;
    if (rec.post.offset >= p.offset + p.length || rec.post.offset + rec.post.length <= p.offset) {
      continue;
    }
    if (--rec.remaining == 0) Finish_st(idx, GL_OK);
  }
}

void WorkerRole::FailAll_st(gl_status status) {
  for (uint32_t i = 0; i < posts_.size(); ++i) {
    if (posts_[i].live) Finish_st(i, status);
  }
}

void WorkerRole::Finish_st(uint32_t index, gl_status status) {
  PostRecord& rec = posts_[index];
  if (!rec.live) return;
  rec.live = false;
  --posts_pending_;
  JobPlan& plan = job_.plan();
  if (rec.post.tensor_id < plan.tensors.size()) {
    auto& active = plan.tensors[rec.post.tensor_id].active_posts;
    auto it = std::find(active.begin(), active.end(), index);
    if (it != active.end()) {
      *it = active.back();
      active.pop_back();
    }
  }
  free_posts_.push_back(index);
  if (status == GL_OK) {
    ++posts_completed_;
  } else {
    ++posts_failed_;
  }
  if (Telemetry* tm = job_.telemetry()) {
    tm->PostDone_st(job_.telemetry_tag(), static_cast<int32_t>(status),
                    {sched::MakeKey(rec.post.tensor_id, 0), rec.post.iteration, rec.post.offset,
                     rec.post.length},
                    SessionServer::MonotonicNow());
  }
  job_.host().CompletePost_st(rec.post, status);
}

}  // namespace gradlane::daemon
