// daemon/shard_role.h — a job's co-located parameter-server shard: the partitions this rank
// owns.
//
// Per owned partition, one round per iteration: every rank's push lands in its slot of the
// shard slab (W slots of the partition's length; the local rank's contribution is read from
// the client's arena, and its slot holds the result). When all W are in they are reduced in
// rank order (bit-reproducible whatever the arrival order; f16/bf16 summed in f32), the result
// is copied into the local client's buffer and W-1 pull responses enter the job's policy by
// the priority the pushes carried (P3 §4.2). On a transport that hands packets over, the last
// rank's push is folded into the result piece by piece as it arrives, so the reduction is
// done when its last byte lands. A new round of a partition starts only after the previous
// one's pull responses were acknowledged.
//
// Ownership: part of one JobRuntime; owns the slab and the owned-partition table.
// Thread rules: engine thread only; nothing allocates after SetUp_st.
#ifndef GRADLANE_DAEMON_SHARD_ROLE_H_
#define GRADLANE_DAEMON_SHARD_ROLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "daemon/job.h"
#include "sched/types.h"
#include "transport/transport.h"

namespace gradlane::daemon {

class JobRuntime;

class ShardRole {
 public:
  explicit ShardRole(JobRuntime& job) : job_(job) {}

  // Takes the owned-partition table from the plan and allocates and registers the slab.
  // Error: a message for GL_E_NO_MEMORY.
  absl::Status SetUp_st(std::vector<OwnedPart> owned, uint64_t slab_bytes);
  // Gives the slab's region back to the transport (every send from it has ended).
  void Release_st();

  // `length` bytes of rank `rank`'s contribution for `iteration` are coming (a push header, or
  // the local client's post). Opens the round when it is the first; false when it does not
  // fit the round (the frame is refused, or the post fails the job).
  bool Accept_st(OwnedPart& o, uint32_t rank, int64_t iteration, uint64_t length);
  // `bytes` more of rank `rank`'s contribution to `o` are in place: reduces when all W are
  // complete.
  void OnContributed_st(OwnedPart& o, uint32_t rank, uint64_t bytes);
  // Where a push from `rank` lands (Accept_st has taken it).
  transport::RecvTarget PushTarget_st(OwnedPart& o, uint32_t rank,
                                      const transport::FrameHeader& header, uint64_t cookie);
  // A push's payload in pieces (transports that hand packets over): folds or places each.
  void OnPushPiece_st(uint32_t rank, const transport::FrameHeader& header, uint64_t segment_offset,
                      std::span<const uint8_t> bytes);
  // A push of `bytes` from `rank` was placed whole.
  void OnPushDone_st(Part& part, uint32_t rank, uint64_t bytes) {
    OnContributed_st(owned_[part.owned], rank, bytes);
  }
  // `bytes` of the pull responses of `part` were acknowledged: the result slot may be reused.
  void OnPullAcked_st(const Part& part, uint64_t bytes);
  // Where the pull responses of `part` are sent from.
  transport::RegionId slab_region() const { return slab_region_; }
  uint64_t ResultOffset(const Part& part) const;

  // Whether some round is open (contributions in, not reduced): leaving now strands peers.
  // Sets `round` to the first such round.
  bool HasOpenRound(int64_t* round) const;
  // Pull responses not yet acknowledged.
  bool PullsPending() const;
  // Rank `rank` left: true when it had not finished contributing to an open round (which can
  // then never be reduced); sets `round`.
  bool MissingFrom(uint32_t rank, int64_t* round) const;
  const std::vector<OwnedPart>& owned() const { return owned_; }
  OwnedPart& owned(int32_t index) { return owned_[static_cast<size_t>(index)]; }
  uint64_t rounds_reduced() const { return rounds_reduced_; }

 private:
  // Bytes of rank r's push this round, and how much of it is contiguous in its slot.
  uint64_t& Got(const OwnedPart& o, uint32_t rank);
  uint64_t& Placed(const OwnedPart& o, uint32_t rank);
  // Bytes of rank r's contribution this round that are in place (OnContributed_st).
  uint64_t& Landed(const OwnedPart& o, uint32_t rank);
  void TryReduce_st(OwnedPart& o);
  // Whether the rank now sending can be folded in as it arrives: every other contribution is
  // complete and the result slot is free (see OwnedPart::folding_rank).
  bool CanFold(const OwnedPart& o) const;
  // result[off, off+bytes) = the rank-ordered reduction with rank `rank`'s values read from
  // `src`, written to the result slot and to the local arena, as TryReduce_st would.
  void FoldRange_st(OwnedPart& o, uint32_t rank, uint64_t offset, uint64_t bytes,
                    const std::byte* src);
  std::byte* Slot(const OwnedPart& o, uint32_t rank, const Part& p) const;

  JobRuntime& job_;
  std::vector<OwnedPart> owned_;
  // owned_.size() x W: bytes of each rank's push this round, and the length of the prefix of
  // it that is in its slot while it arrives in order (kNotContiguous once a piece lands
  // elsewhere): what folding must catch up on when it starts mid-stream.
  std::vector<uint64_t> got_;
  std::vector<uint64_t> placed_;
  std::vector<uint64_t> landed_;
  static constexpr uint64_t kNotContiguous = ~uint64_t{0};
  std::unique_ptr<std::byte[]> slab_;
  uint64_t slab_bytes_ = 0;
  transport::RegionId slab_region_ = transport::kNoRegion;
  uint64_t rounds_reduced_ = 0;
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_SHARD_ROLE_H_
