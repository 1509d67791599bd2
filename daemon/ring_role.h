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
// Ownership: part of one JobRuntime; owns the staging area and the per-partition ring state.
// Thread rules: engine thread only; nothing allocates after SetUp_st.
#ifndef GRADLANE_DAEMON_RING_ROLE_H_
#define GRADLANE_DAEMON_RING_ROLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "daemon/job.h"
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
  // validated and counted it). Once the whole partition is posted its ring round starts.
  void OnPosted_st(uint32_t part_index, sched::Priority priority, sched::TimeNs now);
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
    return (uint64_t{c} * elems / world) * esize;
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
  // Chunk carried by reduce-scatter step s (sent by this rank) and received at step s.
  uint32_t SentAtStep(uint32_t s) const;
  uint32_t ReceivedAtStep(uint32_t s) const;
  Slot& SlotOf(uint32_t part_index, uint32_t step) {
    return slots_[size_t{part_index} * (world_ - 1) + step];
  }
  Gathered& GatheredOf(uint32_t part_index, uint32_t step) {
    return gathered_[size_t{part_index} * (world_ - 1) + step];
  }
  std::byte* Staging(uint32_t part_index, uint64_t offset_in_part) const;
  std::byte* Client(const Part& p, uint64_t offset_in_part) const;
  // Reduces every staged chunk of the current round that is complete, sends what follows.
  void Advance_st(uint32_t part_index, sched::TimeNs now);
  // Hands chunk `c` of the part to the policy towards the right neighbour.
  void Send_st(uint32_t part_index, uint32_t c, sched::Direction direction, sched::TimeNs now);
  void MaybeComplete_st(uint32_t part_index);

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
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_RING_ROLE_H_
