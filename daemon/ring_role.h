// daemon/ring_role.h — a job's all-reduce role: ring all-reduce (reduce-scatter, then
// all-gather) of every partition among the job's W ranks, the partition being the unit the
// policy preempts at.
//
// Rank r sends only to its right neighbour r+1 and receives only from its left one r-1 (mod W).
// Each partition's elements are cut into W chunks (chunk c: elements [c·n/W, (c+1)·n/W)).
//   Reduce-scatter, steps s = 0..W-2: rank r sends chunk r−s. Step 0 sends its own values
//     straight from the client's arena; a chunk received at step s lands in the partition's
//     staging area, the local values are added (received + own, in that order), and the sum
//     goes on as step s+1, from the staging area. After step W-2 rank r holds the final sum of
//     chunk r+1, written into the client's buffer (divided by W for a mean).
//   All-gather, steps t = 0..W-2: rank r sends final chunk r+1−t, received straight into the
//     client's buffer and forwarded from there.
// Each step's send is a ready range of the job's policy (reduce-scatter as a push, all-gather
// as a pull), with the tensor's priority: a more urgent tensor's ring steps overtake a less
// urgent one's between partitions, on every link of the ring, under the credit window.
//
// Exactness: chunk c is summed in the fixed order c, c+1, ..., c+W-1 (rank order rotated to
// start at c), whatever the arrival order, and every rank ends with the bytes the reducing
// rank computed. f16/bf16 partial sums travel in their own type (as in NCCL); each addition
// is done in f32 and rounded once.
//
// Why a staging slot per step is enough: the left neighbour can run at most one iteration
// ahead (it cannot finish iteration i without this rank's share of every chunk), and a slot's
// data for iteration i is always consumed before the left neighbour can finish i. A partition's
// result completes the client's post only once every send this rank made from its buffer was
// acknowledged, so the client never overwrites bytes still on their way out.
//
// Fusion (PACE §V, daemon/ring_fusion.cc; --allreduce_fusion=pace, off by default): a ring step
// costs a message on every link, so a tensor of a few bytes pays 2(W-1) per-message costs for
// nothing. From the job's third iteration on, small tensors may travel fused: rank 0 measures the
// ready time of every tensor (iteration 2), the forward pass's length (the iteration's period less
// its backward span) and the link (the job's bandwidth estimate, and the per-message cost θ),
// models an all-reduce of S bytes as g(S) = 2(W-1)·θ + 2(W-1)/W · S/B (the latency of a step is
// overlapped by the next all-reduce's, so it is no per-operation cost), and runs PACE's
// balanced fusion (sched/fusion.h: the max-min DP along the ready-order chain, each candidate
// scored by Horn's rule) over each run of consecutive single-partition tensors of one dtype.
// The tail L_i the scoring needs is the forward time still to run when tensor i is needed,
// taken as the measured forward length times the share of tensors after i in priority order.
// Rank 0 sends the plan to its right neighbour, which applies it and passes it on before it
// sends any data of that iteration; every rank holds that iteration's posts until the plan is
// there, so all ranks switch at the same iteration. A bucket is a virtual tensor with one
// partition after the client's: its members are gathered into a daemon buffer when the last
// one is posted, the bucket runs the ring like any partition, and the result is scattered back
// to the members. The plan depends on measured times, so two runs may fuse differently and
// their results differ in the last bits (within a run every rank still has the same bytes):
// --allreduce_fusion=off keeps results reproducible from run to run.
//
// Ownership: part of one JobRuntime; owns the staging area and the per-partition ring state.
// Thread rules: engine thread only; nothing allocates after SetUp_st except applying the fusion
// plan, once per job (control path).
#ifndef GRADLANE_DAEMON_RING_ROLE_H_
#define GRADLANE_DAEMON_RING_ROLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "daemon/job.h"
#include "sched/partitioner.h"
#include "sched/types.h"
#include "transport/transport.h"

namespace gradlane::daemon {

class JobRuntime;

class RingRole {
 public:
  explicit RingRole(JobRuntime& job) : job_(job) {}

  // Sizes the per-partition state and allocates and registers the staging area. Error: a
  // message for GL_E_NO_MEMORY.
  absl::Status SetUp_st();
  // Gives the staging area's region back to the transport (every send from it has ended).
  void Release_st();

  // The client posted part of partition `part_index` for its current iteration (WorkerRole
  // validated and counted it). Once the whole partition is posted its ring round starts (or its
  // bucket's, once every member is posted; or it waits for the fusion plan).
  void OnPosted_st(uint32_t part_index, sched::Priority priority, sched::TimeNs now);

  // ---- fusion (daemon/ring_fusion.cc) ----
  // Where the fusion plan from rank `from` lands; Reject() unless it is the left neighbour's
  // first plan of a job that fuses.
  transport::RecvTarget ResolvePlan_st(uint16_t from, uint64_t length, uint64_t cookie);
  // The plan arrived: checks and applies it, passes it on, releases the held posts.
  void OnPlanArrived_st(uint64_t length, sched::TimeNs now);
  // Sends the plan if the right neighbour's queue was full when it was first tried.
  void FlushPlan_st(sched::TimeNs now);
  // Where a ring frame from rank `from` lands; Reject() when it is not one this rank expects
  // (not from the left neighbour, a chunk that step never carries, a stale or far-ahead
  // iteration, more bytes than the chunk holds).
  transport::RecvTarget Resolve_st(uint16_t from, Part& part, const transport::FrameHeader& h,
                                   uint64_t cookie);
  // The frame Resolve_st accepted was placed.
  void OnPlaced_st(Part& part, const transport::FrameHeader& h, sched::TimeNs now);
  // Where the ring send `seg` of `part` leaves from.
  void SendSource(const Part& part, const sched::Segment& seg, transport::RegionId* region,
                  uint64_t* region_offset) const;
  // `bytes` sent from `part` were acknowledged.
  void OnSendAcked_st(Part& part, uint64_t bytes);

  // A round that cannot finish if this rank leaves now: one of its own in progress, or a
  // neighbour's contribution to a round it never posted. Sets `round`.
  bool HasOpenRound(int64_t* round) const;
  // Whether some round this rank posted is not complete yet (sets `round`).
  bool InProgress(int64_t* round) const;
  // The left neighbour left: whether a round this rank posted still waits for bytes from it
  // (which can then never come). It leaves only after its last round completed, which needs
  // every byte it owes this rank to have been acknowledged, so a round it took part in never
  // counts. Sets `round`.
  bool MissingFromLeft(int64_t* round) const;
  uint32_t left() const { return Left(); }
  uint64_t rounds_completed() const { return rounds_completed_; }

  // Chunk `c` of a partition of `elems` elements of `esize` bytes among `world` ranks: its
  // offset within the partition and its length, in bytes.
  static uint64_t ChunkBegin(uint64_t elems, uint32_t world, uint32_t c, uint64_t esize) {
    return sched::EvenSplitPoint(elems, world, c) * esize;
  }

 private:
  // The ring state of one partition for its current round (the iteration Part::iteration).
  struct RingPart {
    int64_t started = -1;        // the iteration whose ring round runs (whole partition posted)
    uint32_t finals = 0;         // chunks holding their final value in the client's buffer
    bool complete = true;        // the round finished and the post was told
    uint64_t sends_pending = 0;  // bytes sent from this partition not yet acknowledged
    sched::Priority priority = 0;
  };
  // A fused bucket: a virtual tensor (id plan.client_tensors + b) with one partition.
  struct Bucket {
    uint32_t part = 0;                    // its partition in JobPlan::parts
    std::vector<uint32_t> members;        // client tensor ids, in the plan's order
    std::vector<uint64_t> member_offset;  // where each member lies in the bucket
    uint64_t bytes = 0;
    uint64_t gather_offset = 0;   // in bucket_mem_: the members' values, then the result
    uint64_t staging_offset = 0;  // in bucket_mem_: reduce-scatter staging
    int64_t iteration = -1;       // the iteration being gathered
    uint32_t posted = 0;          // members wholly posted for it
    sched::Priority priority = 0;
  };
  enum class FusionState : uint8_t { kOff, kWaiting, kApplied };
  // Plan frame: this header, `buckets` member counts, then the member tensor ids (u32 each).
  struct PlanHeader {
    uint64_t magic;
    int64_t iteration;  // the first iteration that runs fused
    uint32_t buckets;
    uint32_t members;
  };
  static_assert(sizeof(PlanHeader) == 24 && offsetof(PlanHeader, buckets) == 16);
  static constexpr uint64_t kPlanMagic = 0x4E414C504E5546ull;  // "FUNPLAN"
  // The iteration (after the job's first) from which tensors may go fused: the one before it
  // is the first whose ready times are not those of a cold start.
  static constexpr int64_t kFusionAfterIterations = 2;

  // Reduce-scatter step s of a partition: the chunk the left neighbour sent, in staging.
  // `reserved` counts bytes of frames resolved into it, `placed` bytes that landed: a backend
  // that hands packets over resolves a frame at its first packet and places the rest later.
  struct Slot {
    int64_t iteration = -1;
    uint64_t reserved = 0;
    uint64_t placed = 0;
    bool reduced = false;
  };
  // All-gather step t of a partition this round, counted the same way.
  struct Gathered {
    uint64_t reserved = 0;
    uint64_t placed = 0;
  };

  uint32_t Left() const;
  uint32_t Right() const;
  uint64_t Elements(const Part& p) const;
  uint64_t ESize(const Part& p) const;
  // [begin, end) bytes within the partition.
  void Chunk(const Part& p, uint32_t c, uint64_t* begin, uint64_t* end) const;
  // The chunk holding byte `offset` of the partition.
  uint32_t ChunkOf(const Part& p, uint64_t offset) const;
  // The chunk received at reduce-scatter step s.
  uint32_t ReceivedAtStep(uint32_t s) const;
  Slot& SlotOf(uint32_t part_index, uint32_t step) {
    return slots_[size_t{part_index} * (world_ - 1) + step];
  }
  Gathered& GatheredOf(uint32_t part_index, uint32_t step) {
    return gathered_[size_t{part_index} * (world_ - 1) + step];
  }
  // The bucket a partition is (null for the client's partitions).
  const Bucket* BucketOfPart(uint32_t part_index) const;
  // A partition's staging area and its "client" bytes (the client's buffer, or for a bucket the
  // gather buffer), as pointers and as transport targets.
  std::byte* Staging(uint32_t part_index, uint64_t offset_in_part) const;
  void StagingTarget(uint32_t part_index, uint64_t offset_in_part, transport::RegionId* region,
                     uint64_t* region_offset) const;
  std::byte* Client(const Part& p, uint64_t offset_in_part) const;
  void ClientTarget(const Part& p, uint64_t offset_in_part, transport::RegionId* region,
                    uint64_t* region_offset) const;
  void StartRound_st(uint32_t part_index, sched::Priority priority, sched::TimeNs now);
  // Reduces every staged chunk of the current round that is complete, sends what follows.
  void Advance_st(uint32_t part_index, sched::TimeNs now);
  // Hands chunk `c` of the part to the policy towards the right neighbour.
  void Send_st(uint32_t part_index, uint32_t c, sched::Direction direction, sched::TimeNs now);
  void MaybeComplete_st(uint32_t part_index);

  // Fusion (daemon/ring_fusion.cc).
  absl::Status SetUpFusion_st();
  int64_t FusionIteration() const { return first_iteration_ + kFusionAfterIterations; }
  // Ready times of the client's tensors, per iteration (rank 0's input to the plan).
  void Observe_st(const Part& p, sched::TimeNs now);
  void Hold(uint32_t part_index, sched::Priority priority);
  // Rank 0: plans the buckets from what it measured, applies and sends the plan.
  void DecideFusion_st(sched::TimeNs now);
  std::vector<std::vector<uint32_t>> PlanBuckets() const;
  // Checks `buckets` and makes them the job's; an error message when they do not fit.
  std::string ApplyPlan_st(const std::vector<std::vector<uint32_t>>& buckets);
  void SendPlan_st(sched::TimeNs now);
  void ReleaseHeld_st(sched::TimeNs now);
  void MemberPosted_st(uint32_t part_index, sched::Priority priority, sched::TimeNs now);
  // The bucket's result is in its gather buffer: scattered to the members, their posts told.
  void BucketComplete_st(uint32_t part_index);

  JobRuntime& job_;
  uint32_t world_ = 1;
  uint32_t rank_ = 0;
  std::vector<RingPart> parts_;
  std::vector<Slot> slots_;         // parts × (W-1) reduce-scatter steps
  std::vector<Gathered> gathered_;  // parts × (W-1) all-gather steps
  std::unique_ptr<std::byte[]> staging_;
  uint64_t staging_bytes_ = 0;
  transport::RegionId staging_region_ = transport::kNoRegion;
  uint64_t rounds_completed_ = 0;

  // Fusion.
  FusionState fusion_ = FusionState::kOff;
  int64_t first_iteration_ = -1;
  std::vector<std::pair<uint32_t, sched::Priority>> held_;  // posted parts waiting for the plan
  std::vector<uint8_t> plan_out_, plan_in_;
  uint64_t plan_out_bytes_ = 0;
  transport::RegionId plan_out_region_ = transport::kNoRegion;
  transport::RegionId plan_in_region_ = transport::kNoRegion;
  bool plan_send_pending_ = false;
  bool plan_arrived_ = false;
  std::vector<Bucket> buckets_;
  std::vector<int32_t> bucket_of_tensor_;  // per client tensor: its bucket, or -1
  std::unique_ptr<std::byte[]> bucket_mem_;
  transport::RegionId bucket_region_ = transport::kNoRegion;
  // Measurements: the current iteration's ready offsets (from its first whole partition) and
  // the previous iteration's, and the previous iteration's forward length (period - backward).
  int64_t measured_iteration_ = -1;
  sched::TimeNs iteration_start_ = 0;
  std::vector<sched::TimeNs> ready_offset_, prev_ready_offset_;
  sched::TimeNs forward_gap_ = 0;
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_RING_ROLE_H_
