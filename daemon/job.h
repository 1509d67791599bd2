// daemon/job.h — the data of one training job as this daemon sees it: its frozen tensor list
// with the partition plan and shard map every rank derives identically (JobPlan), and the
// records the job's runtime and roles keep (daemon/job_runtime.h): partitions, owned
// partitions, posts, peers, dispatches.
//
// Rules that make the ranks agree without negotiation (docs/daemon.md):
//   - One rank per daemon per job; a job is bound to the one client session that registered it.
//   - The tensor list is frozen at the job's first post on this daemon: every rank must have
//     registered the same tensors (name, bytes, dtype) in the same order before posting.
//     `Fingerprint` digests that list with W, the policy, --partition_bytes and the reduce op;
//     daemons exchange it in a manifest frame, the first frame on each connection, and a difference
//     fails the job with a message naming both values.
//   - Partition k of a tensor is PartitionPlan::Make(bytes, dtype, EnginePartitionBytes(...)),
//     cut finer where the shards would otherwise be unevenly loaded or a tensor would cross
//     fewer shards than there are (BalancedKeyBytes); the shard map is ps::ShardMap over those
//     keys. Both depend only on the frozen list and W.
//   - The mode (parameter servers or ring all-reduce) is part of the fingerprint and of the
//     manifest; an all-reduce job has no shard map (every rank reduces a chunk of every
//     partition, daemon/ring_role.h).
//
// Thread rules: everything here belongs to the engine thread. Building a plan allocates (control
// path); the data path only indexes the vectors built here.
#ifndef GRADLANE_DAEMON_JOB_H_
#define GRADLANE_DAEMON_JOB_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/ps/aggregator.h"
#include "daemon/ps/shard_map.h"
#include "daemon/session.h"
#include "sched/bandwidth_estimator.h"
#include "sched/partitioner.h"
#include "sched/policy.h"
#include "sched/priority.h"
#include "sched/types.h"
#include "shm/abi.h"
#include "transport/transport.h"

namespace gradlane::daemon {

// The manifest: the first data frame a daemon sends on each of its connections of a job. It
// travels as a kData frame whose key names the reserved tensor id below (no real tensor can
// have it: session tensor ids are dense and bounded by the arena).
inline constexpr uint32_t kManifestTensorId = 0xFFFFFFFFu;
inline constexpr sched::SegmentKey kManifestKey = sched::MakeKey(kManifestTensorId, 0);
// Sent by a rank whose client closed cleanly, once its shard has sent every pull response: the
// peers then take the coming connection loss as a departure, not a crash.
inline constexpr sched::SegmentKey kLeaveKey = sched::MakeKey(kManifestTensorId, 1);
inline constexpr uint64_t kLeaveBytes = 8;
// All-reduce with fusion: rank 0's fusion plan, passed round the ring (daemon/ring_role.h).
inline constexpr sched::SegmentKey kFusionPlanKey = sched::MakeKey(kManifestTensorId, 2);
inline constexpr uint64_t kManifestMagic = 0x54534E414D4C47ull;  // "GLMANST"

struct ManifestBody {
  uint64_t magic;         // 0  kManifestMagic
  uint64_t fingerprint;   // 8  Fingerprint() of the sender's frozen job
  uint32_t tensor_count;  // 16
  uint16_t world_size;    // 20
  // 22 gl_job_mode. A daemon from before all-reduce read bytes 20..23 as one uint32 world size:
  // a ps job (mode 0) reads the same there, an all-reduce job as a different W (a mismatch).
  uint16_t mode;
  uint64_t total_bytes;  // 24 sum of tensor bytes (for the error message)
};
inline constexpr size_t kManifestBytes = 32;
static_assert(sizeof(ManifestBody) == kManifestBytes);
static_assert(offsetof(ManifestBody, tensor_count) == 16 && offsetof(ManifestBody, mode) == 22 &&
              offsetof(ManifestBody, total_bytes) == 24);

// The partition size the engine cuts every posted range with: the policy's own δ, so a policy
// never cuts a range further (a policy with a coarser plan still never crosses one of ours),
// capped so one segment stays far below the transport's largest frame. Depends only on the
// policy name, --partition_bytes (part of the fingerprint) and the dtype.
inline constexpr uint64_t kMaxEnginePartitionBytes = 64ull << 20;
uint64_t EnginePartitionBytes(const std::string& policy, uint64_t configured, sched::DType dtype);

struct JobPlan;
// Parameter-server jobs: the key size that spreads the job's bytes evenly over its W shards and
// every tensor over all of them (sched::BalancedShardUnit from the policy's partition size: a
// tensor that is one key is pushed into one downlink), when that is finer than the
// policy's partitions; 0 otherwise, and always 0 for fifo (whole tensors), all-reduce, W = 1
// and a configured --partition_bytes. Reads plan.mode, world and policy_name.
uint64_t BalancedKeyBytes(const std::vector<TensorInfo>& tensors, const JobPlan& plan,
                          uint64_t configured_partition_bytes);

// FNV-1a of the job id string: the 64-bit id the wire protocol carries.
uint64_t WireJobId(const std::string& job_id);

// A frozen tensor with the engine's plan.
struct JobTensor {
  std::string name;
  sched::TensorSpec spec;  // id, bytes, dtype, priority (resolved: never GL_PRIORITY_AUTO)
  bool auto_priority = false;
  uint64_t arena_offset = 0;  // in the session's arena
  sched::PartitionPlan plan = sched::PartitionPlan::Make(1, sched::DType::kF32, 0);
  uint32_t first_part = 0;  // index of partition 0 in JobPlan::parts
  // GPUDirect (a parameter-server job's tensor whose GPU memory the client attached and the
  // transport registered): pushes to other shards are sent from this region, at
  // device_offset + the byte's offset in the tensor; kNoRegion: from the arena.
  transport::RegionId device_region = transport::kNoRegion;
  uint64_t device_offset = 0;
  // Posts of this tensor waiting for results (indices into WorkerRole's posts); usually one.
  std::vector<uint32_t> active_posts;
};

// One partition of one tensor: worker view, and (when owned here) an index to the shard view.
struct Part {
  uint32_t tensor = 0;
  uint32_t index = 0;
  uint64_t offset = 0;  // within the tensor
  uint64_t length = 0;
  uint16_t owner = 0;  // shard rank
  int32_t owned = -1;  // index into the ShardRole's owned parts when owner == local rank
  // Worker: the iteration whose result we wait for, bytes of it posted locally, bytes of the
  // result claimed by arriving frame headers (bounds the next header) and bytes actually
  // placed. Only placed bytes complete a post or let the next iteration start: between a
  // header and its payload the client must not be able to move the part to another iteration.
  int64_t iteration = -1;
  uint64_t posted = 0;
  uint64_t result_reserved = 0;
  uint64_t result_got = 0;
};

// Shard state of one owned partition. The slab holds W slots of `length` bytes: slot r (r !=
// local rank) receives rank r's push; the local rank's slot holds the reduced result, from which
// pull responses are sent. The local contribution is read straight from the client's arena.
struct OwnedPart {
  uint32_t part = 0;
  uint64_t slab_offset = 0;  // of slot 0
  int64_t round = -1;        // iteration being collected (or last reduced)
  bool reduced = true;       // round finished (no round open)
  uint32_t ranks_complete = 0;
  uint64_t pulls_pending = 0;  // bytes of pull sends from the result slot not yet acked
  bool reduce_deferred = false;
  // The rank whose pushes this round are folded into the result piece by piece as they arrive
  // (a backend whose capabilities hand over pieces), -1 if none. Chosen at the first of its pieces
  // that arrives, in order, once every other contribution is complete and no pull still reads the
  // result slot: what it placed before is reduced from its slot then, each later piece at once,
  // so the end-of-round reduction is already done when its last byte lands.
  int32_t folding_rank = -1;
  sched::Priority priority = 0;
};

enum class PeerState : uint8_t { kConnecting, kUp, kDown };

struct JobPeer {
  std::string address;
  transport::PeerHandle out = transport::kNoPeer;  // our dialed connection: all our sends
  // The connection it dialed (its sends): the latest inbound one to come up until its manifest
  // arrives, then the one that carried the manifest. Only that one failing fails the job.
  transport::PeerHandle in = transport::kNoPeer;
  PeerState state = PeerState::kConnecting;
  bool ever_up = false;      // the outbound connection came up once
  bool manifest_ok = false;  // its manifest arrived and matched ours
  bool left = false;         // its client closed cleanly after its last iteration
  int connect_attempts = 0;
  sched::TimeNs retry_at = 0;  // > 0: redial at this time (peer did not know the job yet)
  // Send times of unacknowledged frames, in send order (acks come back in that order), for the
  // RTT estimator. Ring of `send_times.size()` entries.
  std::vector<sched::TimeNs> send_times;
  uint64_t send_head = 0, send_tail = 0;
};

// One in-flight Dispatch: credit returns once all its segments are acked or failed.
struct DispatchRecord {
  uint64_t bytes = 0;
  uint32_t remaining = 0;
};

// What every rank derives identically from the frozen tensor list (BuildJobPlan): identity,
// tensors, partitions and the shard map. `parts` also carries the worker's per-partition state
// and `owned` the shard's table; JobRuntime moves each to the role that runs it.
struct JobPlan {
  JobInfo info;
  uint64_t wire_id = 0;
  uint16_t rank = 0;
  uint16_t world = 1;
  std::string policy_name;
  gl_job_mode mode = GL_MODE_PS;
  // All-reduce: how small tensors may be fused into ring buckets (EngineOptions::Fusion as a
  // number; 0: never).
  uint8_t fusion = 0;
  ps::ReduceOp reduce = ps::ReduceOp::kSum;
  // The tensors and partitions the client registered; an all-reduce job's fusion appends one
  // virtual tensor with one partition per bucket after them (daemon/ring_role.h).
  uint32_t client_tensors = 0;
  uint32_t client_parts = 0;
  std::vector<JobTensor> tensors;
  std::vector<Part> parts;
  std::vector<OwnedPart> owned;  // ps: partitions this rank's shard owns, in part order
  uint64_t slab_bytes = 0;       // ps: W slots of every owned partition
  // All-reduce: where each partition's reduce-scatter chunks are staged (one partition's length
  // each, in part order), and their sum.
  std::vector<uint64_t> staging_offset;
  uint64_t staging_bytes = 0;
  uint64_t fingerprint = 0;
  uint64_t total_bytes = 0;
  // ps: the key size the balance rule chose (sched/shard_balance.h) when it is finer than the
  // policy's partitions; 0 when the policy's partitions were kept.
  uint64_t balanced_key_bytes = 0;
  std::unique_ptr<ps::ShardMap> shard_map;
  ManifestBody manifest{};  // what this rank sends its peers

  // The partition holding byte `offset` of tensor `tensor_id`; null when out of range.
  Part* PartAt(uint32_t tensor_id, uint64_t offset);
};

// The fingerprint of a frozen tensor list plus the knobs every rank must share (W, policy,
// the configured partition size, the reduce op).
uint64_t Fingerprint(const std::vector<TensorInfo>& tensors, uint32_t world_size,
                     const std::string& policy, uint64_t partition_bytes, ps::ReduceOp reduce,
                     gl_job_mode mode = GL_MODE_PS, uint8_t fusion = 0,
                     uint64_t balanced_key_bytes = 0);
const char* ModeName(gl_job_mode mode);

// Validates what the client registered and builds the frozen tensors, parts, shard map and the
// owned-part table. Errors carry the gl_status to complete posts with and a readable message.
struct JobError {
  gl_status status = GL_OK;
  std::string message;
};
// `fusion`: how an all-reduce job fuses small tensors (EngineOptions::Fusion as a number).
JobError BuildJobPlan(const Session& session, const std::string& default_policy,
                      uint64_t partition_bytes, ps::ReduceOp reduce, uint8_t fusion, JobPlan* plan);

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_JOB_H_
