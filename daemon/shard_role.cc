#include "daemon/shard_role.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>

#include "absl/strings/str_cat.h"
#include "daemon/job_runtime.h"
#include "daemon/ps/aggregator.h"
#include "daemon/session_server.h"

namespace gradlane::daemon {

using sched::TimeNs;
using transport::RecvTarget;

absl::Status ShardRole::SetUp_st(std::vector<OwnedPart> owned, uint64_t slab_bytes) {
  owned_ = std::move(owned);
  const size_t w = job_.world();
  got_.assign(owned_.size() * w, 0);
  placed_.assign(owned_.size() * w, 0);
  landed_.assign(owned_.size() * w, 0);
  slab_bytes_ = slab_bytes;
  if (slab_bytes_ == 0) return absl::OkStatus();
  slab_.reset(new (std::nothrow) std::byte[slab_bytes_]);
  if (slab_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("job ", job_.id(), ": shard buffers of ", slab_bytes_, " bytes"));
  }
  // Registered on the engine thread (verbs: pinned here); why not ahead: JobRuntime::SetUp_st.
  auto region = job_.host().transport_st().RegisterRegion_st(slab_.get(), slab_bytes_);
  if (!region.ok()) return region.status();
  slab_region_ = *region;
  return absl::OkStatus();
}

void ShardRole::Release_st() {
  if (slab_region_ != transport::kNoRegion) {
    (void)job_.host().transport_st().UnregisterRegion_st(slab_region_);
  }
  slab_region_ = transport::kNoRegion;
}

uint64_t& ShardRole::Got(const OwnedPart& o, uint32_t rank) {
  return got_[static_cast<size_t>(&o - owned_.data()) * job_.world() + rank];
}

uint64_t& ShardRole::Landed(const OwnedPart& o, uint32_t rank) {
  return landed_[static_cast<size_t>(&o - owned_.data()) * job_.world() + rank];
}

uint64_t& ShardRole::Placed(const OwnedPart& o, uint32_t rank) {
  return placed_[static_cast<size_t>(&o - owned_.data()) * job_.world() + rank];
}

std::byte* ShardRole::Slot(const OwnedPart& o, uint32_t rank, const Part& p) const {
  return slab_.get() + o.slab_offset + uint64_t{rank} * p.length;
}

uint64_t ShardRole::ResultOffset(const Part& p) const {
  return owned_[p.owned].slab_offset + uint64_t{job_.rank()} * p.length;
}

bool ShardRole::Accept_st(OwnedPart& o, uint32_t rank, int64_t iteration, uint64_t length) {
  const Part& p = job_.plan().parts[o.part];
  if (o.round != iteration || o.reduced) {
    // A new round may start only after the previous one was reduced.
    if (iteration <= o.round || !o.reduced) return false;
    if (job_.departing()) {
      // A rank is gone for good (its client closed after its last round): this round can never
      // be reduced. Every rank that goes on must hear that as a disconnection, naming who
      // left, not as a refused iteration or a refused frame.
      job_.Fail_st(GL_E_DISCONNECTED, job_.DepartureReason(iteration));
      return false;
    }
    o.round = iteration;
    o.reduced = false;
    if (Telemetry* tm = job_.telemetry()) {
      tm->RoundOpened_st(job_.telemetry_tag(),
                         {sched::MakeKey(p.tensor, p.index), iteration, p.offset, p.length},
                         SessionServer::MonotonicNow());
    }
    o.ranks_complete = 0;
    o.folding_rank = -1;
    o.priority = std::numeric_limits<sched::Priority>::max();
    for (uint32_t r = 0; r < job_.world(); ++r) {
      Got(o, r) = 0;
      Placed(o, r) = 0;
      Landed(o, r) = 0;
    }
  }
  uint64_t& got = Got(o, rank);
  if (got + length > p.length) return false;
  got += length;
  return true;
}

void ShardRole::OnContributed_st(OwnedPart& o, uint32_t rank, uint64_t bytes) {
  // Counted when the bytes are in place, not when their header was accepted: a transport may
  // accept a rank's next frame before the previous one has landed (verbs resolves every header
  // as it arrives and the payloads are written later).
  uint64_t& landed = Landed(o, rank);
  landed += bytes;
  if (landed != job_.plan().parts[o.part].length) return;
  if (++o.ranks_complete == job_.world()) TryReduce_st(o);
}

RecvTarget ShardRole::PushTarget_st(OwnedPart& o, uint32_t rank, const transport::FrameHeader& h,
                                    uint64_t cookie) {
  const Part& p = job_.plan().parts[o.part];
  o.priority = std::min<sched::Priority>(o.priority, h.priority);
  const uint64_t slot_offset = o.slab_offset + uint64_t{rank} * p.length + (h.offset - p.offset);
  // A backend that hands packets over gives every push to OnPushPiece_st, which folds or
  // places each piece.
  if (job_.host().hands_over_pieces()) return RecvTarget::Pieces(slab_region_, slot_offset, cookie);
  return RecvTarget::Into(slab_region_, slot_offset, cookie);
}

void ShardRole::OnPullAcked_st(const Part& p, uint64_t bytes) {
  if (p.owned < 0) return;
  OwnedPart& o = owned_[p.owned];
  // Pull responses may be cut into several sends: count bytes.
  o.pulls_pending -= std::min(o.pulls_pending, bytes);
  if (o.pulls_pending == 0 && o.reduce_deferred) TryReduce_st(o);
}

void ShardRole::TryReduce_st(OwnedPart& o) {
  if (o.pulls_pending > 0) {
    // The result slot still feeds pull responses of the previous round.
    o.reduce_deferred = true;
    return;
  }
  o.reduce_deferred = false;
  JobPlan& plan = job_.plan();
  Part& p = plan.parts[o.part];
  const JobTensor& t = plan.tensors[p.tensor];
  const uint32_t world = job_.world();
  if (o.folding_rank >= 0) {
    // Every piece was reduced as it arrived (FoldRange_st): the result is in place.
    job_.host().counters_st().rounds_folded.Add_st(1);
  } else {
    const std::byte* contributions[ps::kMaxWorldSize];
    std::byte* local = reinterpret_cast<std::byte*>(job_.arena() + t.arena_offset + p.offset);
    for (uint32_t r = 0; r < world; ++r) {
      contributions[r] = r == job_.rank() ? local : Slot(o, r, p);
    }
    std::byte* out = Slot(o, job_.rank(), p);
    absl::Status s = ps::ReduceInRankOrder(t.spec.dtype, absl::MakeConstSpan(contributions, world),
                                           p.length, plan.reduce, out);
    if (!s.ok()) {
      job_.Fail_st(GL_E_INTERNAL, absl::StrCat("job ", job_.id(), ": reduce: ", s.message()));
      return;
    }
    std::memcpy(local, out, p.length);
  }
  o.folding_rank = -1;
  o.reduced = true;
  ++rounds_reduced_;
  job_.host().counters_st().rounds_reduced.Add_st(1);
  const TimeNs now = SessionServer::MonotonicNow();
  if (Telemetry* tm = job_.telemetry()) {
    tm->RoundReduced_st(job_.telemetry_tag(), o.priority,
                        {sched::MakeKey(p.tensor, p.index), o.round, p.offset, p.length}, now);
  }
  for (uint16_t r = 0; r < world; ++r) {
    if (r == job_.rank()) continue;
    sched::ReadyRange rr;
    rr.tensor_id = t.spec.id;
    rr.priority = o.priority;
    rr.dtype = t.spec.dtype;
    rr.direction = sched::Direction::kPull;
    rr.peer = r;
    rr.iteration = o.round;
    rr.tensor_bytes = t.spec.bytes;
    rr.offset = p.offset;
    rr.length = p.length;
    job_.Ready_st(rr, now);
  }
  o.pulls_pending = uint64_t{world - 1u} * p.length;
  // The local rank's result is in its buffer now.
  p.result_reserved = p.length;
  p.result_got = p.length;
  job_.worker().PartResultReady_st(o.part);
}

bool ShardRole::CanFold(const OwnedPart& o) const {
  // The sender is still sending, so it is not among the complete ranks: W - 1 complete ranks
  // are all the others, the local one included. (A deferred reduction implies all W are
  // complete, so it needs no test of its own.)
  return o.ranks_complete + 1 == job_.world() && o.pulls_pending == 0;
}

void ShardRole::FoldRange_st(OwnedPart& o, uint32_t rank, uint64_t offset, uint64_t bytes,
                             const std::byte* src) {
  JobPlan& plan = job_.plan();
  const Part& p = plan.parts[o.part];
  const JobTensor& t = plan.tensors[p.tensor];
  const std::byte* contributions[ps::kMaxWorldSize];
  std::byte* local =
      reinterpret_cast<std::byte*>(job_.arena() + t.arena_offset + p.offset) + offset;
  for (uint32_t r = 0; r < job_.world(); ++r) {
    contributions[r] = r == rank ? src : r == job_.rank() ? local : Slot(o, r, p) + offset;
  }
  std::byte* out = Slot(o, job_.rank(), p) + offset;
  // Cannot fail: the dtype was checked when the job was registered and `bytes` is a whole
  // number of elements.
  (void)ps::ReduceInRankOrder(t.spec.dtype, absl::MakeConstSpan(contributions, job_.world()), bytes,
                              plan.reduce, out);
  // `out` was just written: this copy reads it from cache.
  std::memcpy(local, out, bytes);
}

void ShardRole::OnPushPiece_st(uint32_t rank, const transport::FrameHeader& h,
                               uint64_t segment_offset, std::span<const uint8_t> bytes) {
  JobPlan& plan = job_.plan();
  Part* p = plan.PartAt(sched::KeyTensor(h.key), h.offset);
  // ResolveRecv_st handed out this target for this header, so these hold; checked anyway
  // because a piece writes into the client's arena.
  if (p == nullptr || p->owned < 0 || rank >= job_.world()) return;
  OwnedPart& o = owned_[p->owned];
  const uint64_t esize = sched::DTypeBytes(plan.tensors[p->tensor].spec.dtype);
  uint64_t off = (h.offset - p->offset) + segment_offset;
  if (bytes.size() > p->length || off > p->length - bytes.size()) return;
  std::byte* slot = Slot(o, rank, *p);
  const auto* src = reinterpret_cast<const std::byte*>(bytes.data());
  uint64_t n = bytes.size();
  if (o.folding_rank != static_cast<int32_t>(rank)) {
    uint64_t& placed = Placed(o, rank);
    const bool in_order = placed == off;
    if (!in_order || !CanFold(o)) {
      // Not (yet) foldable: place it, as a transport without pieces would have.
      std::memcpy(slot + off, src, n);
      placed = in_order ? off + n : kNotContiguous;
      return;
    }
    // The others just became complete (typically: the local client posted while this rank's
    // push was streaming in). Everything it sent so far is the prefix [0, off) of its slot:
    // reduce its whole elements now and fold from here on (a split element's first bytes stay
    // in the slot for the code below).
    const uint64_t whole = off - off % esize;
    if (whole > 0) FoldRange_st(o, rank, 0, whole, slot);
    o.folding_rank = static_cast<int32_t>(rank);
  }
  // A packet may end inside an element: its first bytes wait in the rank's slot, and the
  // element is reduced from there once the next piece completes it.
  if (off % esize != 0) {
    const uint64_t head = std::min(esize - off % esize, n);
    std::memcpy(slot + off, src, head);
    off += head;
    src += head;
    n -= head;
    if (off % esize == 0) FoldRange_st(o, rank, off - esize, esize, slot + off - esize);
  }
  const uint64_t whole = n - n % esize;
  if (whole > 0) FoldRange_st(o, rank, off, whole, src);
  if (n > whole) std::memcpy(slot + off + whole, src + whole, n - whole);
}

bool ShardRole::HasOpenRound(int64_t* round) const {
  for (const OwnedPart& o : owned_) {
    if (!o.reduced) {
      *round = o.round;
      return true;
    }
  }
  return false;
}

bool ShardRole::PullsPending() const {
  for (const OwnedPart& o : owned_) {
    if (o.pulls_pending > 0) return true;
  }
  return false;
}

bool ShardRole::MissingFrom(uint32_t rank, int64_t* round) const {
  const JobPlan& plan = job_.plan();
  for (size_t k = 0; k < owned_.size(); ++k) {
    const OwnedPart& o = owned_[k];
    if (!o.reduced && got_[k * job_.world() + rank] < plan.parts[o.part].length) {
      *round = o.round;
      return true;
    }
  }
  return false;
}

}  // namespace gradlane::daemon
