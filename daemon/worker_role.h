// daemon/worker_role.h — a job's worker role: the local client's posts.
//
// A post (one tensor's byte range for one iteration) is cut at the job's partition boundaries.
// In an all-reduce job every partition, once whole, starts its ring round (daemon/ring_role.h).
// In a parameter-server job, pieces of partitions this rank's shard owns are contributed in place
// (the shard reads them from the client's arena, no copy); the others enter the job's policy as
// pushes to their shard. Pull responses are received straight into the client's arena. A post
// completes (GL_OK) once every partition it touches holds the reduced result, and fails with the
// job.
//
// Ownership: part of one JobRuntime, which owns the partitions (JobPlan::parts, whose worker
// fields this role keeps). Thread rules: engine thread only. No allocation once the post pool
// has reached the number of posts in flight.
#ifndef GRADLANE_DAEMON_WORKER_ROLE_H_
#define GRADLANE_DAEMON_WORKER_ROLE_H_

#include <cstdint>
#include <vector>

#include "daemon/job.h"
#include "daemon/session.h"
#include "sched/types.h"
#include "shm/abi.h"
#include "transport/transport.h"

namespace gradlane::daemon {

class JobRuntime;

class WorkerRole {
 public:
  explicit WorkerRole(JobRuntime& job) : job_(job) {}

  // Reserves the post pool (control path).
  void SetUp_st() { posts_.reserve(64); }
  // A client post; completes it at once when it cannot be served (bad tensor, range or
  // iteration, failed job).
  void OnPost_st(const PostDescriptor& post, sched::TimeNs now);
  // Where a pull response from shard `from_rank` lands; Reject() when it is not the one this
  // rank waits for.
  transport::RecvTarget ResolveResult_st(uint16_t from_rank, Part& part,
                                         const transport::FrameHeader& header, uint64_t cookie);
  // `bytes` of partition `part`'s result were placed in the client's arena.
  void OnResultPlaced_st(Part& part, uint64_t bytes);
  // The whole result of partition `part_index` is in the client's buffer (a pull response, or
  // the local shard's reduction): completes the posts that were waiting only for it.
  void PartResultReady_st(uint32_t part_index);
  // Answers every pending post with `status` (the job failed).
  void FailAll_st(gl_status status);

  // Posts not yet answered.
  uint64_t posts_pending() const { return posts_pending_; }
  uint64_t posts_completed() const { return posts_completed_; }
  uint64_t posts_failed() const { return posts_failed_; }

 private:
  // A client post being served.
  struct PostRecord {
    PostDescriptor post;
    uint32_t remaining = 0;  // partitions whose result is not in the arena yet
    bool live = false;
  };
  void Finish_st(uint32_t post_index, gl_status status);

  JobRuntime& job_;
  std::vector<PostRecord> posts_;
  std::vector<uint32_t> free_posts_;
  uint64_t posts_pending_ = 0;
  uint64_t posts_completed_ = 0;
  uint64_t posts_failed_ = 0;
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_WORKER_ROLE_H_
