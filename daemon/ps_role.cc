// daemon/ps_role.cc — the engine's co-located parameter-server shard: rounds per owned partition,
// rank-ordered reduction once all W contributions are in (or piece by piece as the last one
// arrives, on transports that hand packets over), pull responses by priority.
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

// -------------------------------------------------------------------------- shard role ----

bool Engine::ShardAccept_st(Job& job, OwnedPart& o, uint32_t rank, int64_t iteration,
                               uint64_t length) {
  const Part& p = job.parts[o.part];
  uint64_t* got = &job.owned_got[static_cast<size_t>(&o - job.owned.data()) * job.world];
  if (o.round != iteration || o.reduced) {
    // A new round may start only after the previous one was reduced.
    if (iteration <= o.round || !o.reduced) return false;
    if (job.any_left || job.phase != Job::Phase::kActive) {
      // A rank is gone for good (its client closed after its last round): this round can never
      // be reduced. Every rank that goes on must hear that as a disconnection, naming who
      // left, not as a refused iteration or a refused frame.
      FailJob_st(job, GL_E_DISCONNECTED, DepartureReason(job, iteration));
      return false;
    }
    o.round = iteration;
    o.reduced = false;
    if (options_.telemetry != nullptr) {
      options_.telemetry->Emit_st({EventType::kRoundOpened, 0, 0, job.slot, job.generation, 0,
                                   sched::MakeKey(p.tensor, p.index), iteration, p.offset,
                                   p.length, 0, SessionServer::MonotonicNow()});
    }
    o.ranks_complete = 0;
    o.folding_rank = -1;
    o.priority = std::numeric_limits<sched::Priority>::max();
    std::fill(got, got + job.world, 0);
    uint64_t* placed = &job.owned_placed[static_cast<size_t>(&o - job.owned.data()) * job.world];
    std::fill(placed, placed + job.world, 0);
  }
  if (got[rank] + length > p.length) return false;
  got[rank] += length;
  return true;
}

void Engine::ShardRankDone_st(Job& job, OwnedPart& o) {
  if (++o.ranks_complete == job.world) TryReduce_st(job, o);
}

void Engine::TryReduce_st(Job& job, OwnedPart& o) {
  if (o.pulls_pending > 0) {
    // The result slot still feeds pull responses of the previous round.
    o.reduce_deferred = true;
    return;
  }
  o.reduce_deferred = false;
  Part& p = job.parts[o.part];
  const JobTensor& t = job.tensors[p.tensor];
  if (o.folding_rank >= 0) {
    // Every piece was reduced as it arrived (FoldRange_st): the result is in place.
    counters_.rounds_folded.Add_st(1);
  } else {
    const std::byte* contributions[ps::kMaxWorldSize];
    std::byte* slots = job.slab.get() + o.slab_offset;
    std::byte* local = reinterpret_cast<std::byte*>(job.arena + t.arena_offset + p.offset);
    for (uint32_t r = 0; r < job.world; ++r) {
      contributions[r] = r == job.rank ? local : slots + uint64_t{r} * p.length;
    }
    std::byte* out = slots + uint64_t{job.rank} * p.length;
    absl::Status s = ps::ReduceInRankOrder(
        t.spec.dtype, absl::MakeConstSpan(contributions, job.world), p.length, job.reduce, out);
    if (!s.ok()) {
      FailJob_st(job, GL_E_INTERNAL, absl::StrCat("job ", job.info.job_id, ": reduce: ", s.message()));
      return;
    }
    std::memcpy(local, out, p.length);
  }
  o.folding_rank = -1;
  o.reduced = true;
  ++job.rounds_reduced;
  counters_.rounds_reduced.Add_st(1);
  const sched::TimeNs now = SessionServer::MonotonicNow();
  if (options_.telemetry != nullptr) {
    options_.telemetry->Emit_st({EventType::kRoundReduced, 0, 0, job.slot, job.generation,
                                 o.priority, sched::MakeKey(p.tensor, p.index), o.round,
                                 p.offset, p.length, 0, now});
  }
  for (uint16_t r = 0; r < job.world; ++r) {
    if (r == job.rank) continue;
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
    job.policy->OnReady(rr, now);
    if (options_.telemetry != nullptr) {
      options_.telemetry->Emit_st({EventType::kReady, 1, r, job.slot, job.generation, o.priority,
                                   sched::MakeKey(p.tensor, p.index), o.round, p.offset,
                                   p.length, 0, now});
    }
  }
  o.pulls_pending = uint64_t{job.world - 1u} * p.length;
  // The local rank's result is in its buffer now.
  p.result_reserved = p.length;
  p.result_got = p.length;
  PartResultReady_st(job, o.part);
}

bool Engine::CanFold_st(const Job& job, const OwnedPart& o) const {
  // The sender is still sending, so it is not among the complete ranks: W - 1 complete ranks
  // are all the others, the local one included. (A deferred reduction implies all W are
  // complete, so it needs no test of its own.)
  return o.ranks_complete + 1 == job.world && o.pulls_pending == 0;
}

void Engine::FoldRange_st(Job& job, OwnedPart& o, uint32_t rank, uint64_t offset,
                             uint64_t bytes, const std::byte* src) {
  const Part& p = job.parts[o.part];
  const JobTensor& t = job.tensors[p.tensor];
  const std::byte* contributions[ps::kMaxWorldSize];
  std::byte* slots = job.slab.get() + o.slab_offset;
  std::byte* local = reinterpret_cast<std::byte*>(job.arena + t.arena_offset + p.offset) + offset;
  for (uint32_t r = 0; r < job.world; ++r) {
    contributions[r] = r == rank ? src : r == job.rank ? local : slots + uint64_t{r} * p.length + offset;
  }
  std::byte* out = slots + uint64_t{job.rank} * p.length + offset;
  // Cannot fail: the dtype was checked when the job was registered and `bytes` is a whole
  // number of elements.
  (void)ps::ReduceInRankOrder(t.spec.dtype, absl::MakeConstSpan(contributions, job.world), bytes,
                              job.reduce, out);
  // `out` was just written: this copy reads it from cache.
  std::memcpy(local, out, bytes);
}

void Engine::OnRecvPiece_st(const transport::PeerInfo& peer, const transport::FrameHeader& h,
                               const RecvTarget& target, uint64_t segment_offset,
                               std::span<const uint8_t> bytes) {
  Job* job = JobFromCookie(target.cookie);
  if (job == nullptr || job->failed) return;
  Part* p = PartAt(*job, sched::KeyTensor(h.key), h.offset);
  // ResolveRecv_st handed out this target for this header, so these hold; checked anyway
  // because a piece writes into the client's arena.
  if (p == nullptr || p->owned < 0 || peer.rank >= job->world) return;
  OwnedPart& o = job->owned[p->owned];
  const uint64_t esize = sched::DTypeBytes(job->tensors[p->tensor].spec.dtype);
  uint64_t off = (h.offset - p->offset) + segment_offset;
  if (bytes.size() > p->length || off > p->length - bytes.size()) return;
  std::byte* slot = job->slab.get() + o.slab_offset + uint64_t{peer.rank} * p->length;
  const auto* src = reinterpret_cast<const std::byte*>(bytes.data());
  uint64_t n = bytes.size();
  if (o.folding_rank != static_cast<int32_t>(peer.rank)) {
    uint64_t& placed = job->owned_placed[static_cast<size_t>(p->owned) * job->world + peer.rank];
    const bool in_order = placed == off;
    if (!in_order || !CanFold_st(*job, o)) {
      // Not (yet) foldable: place it, as a transport without pieces would have.
      std::memcpy(slot + off, src, n);
      placed = in_order ? off + n : Job::kNotContiguous;
      return;
    }
    // The others just became complete (typically: the local client posted while this rank's
    // push was streaming in). Everything it sent so far is the prefix [0, off) of its slot:
    // reduce its whole elements now and fold from here on (a split element's first bytes stay
    // in the slot for the code below).
    const uint64_t whole = off - off % esize;
    if (whole > 0) FoldRange_st(*job, o, peer.rank, 0, whole, slot);
    o.folding_rank = static_cast<int32_t>(peer.rank);
  }
  // A packet may end inside an element: its first bytes wait in the rank's slot, and the
  // element is reduced from there once the next piece completes it.
  if (off % esize != 0) {
    const uint64_t head = std::min(esize - off % esize, n);
    std::memcpy(slot + off, src, head);
    off += head;
    src += head;
    n -= head;
    if (off % esize == 0) FoldRange_st(*job, o, peer.rank, off - esize, esize, slot + off - esize);
  }
  const uint64_t whole = n - n % esize;
  if (whole > 0) FoldRange_st(*job, o, peer.rank, off, whole, src);
  if (n > whole) std::memcpy(slot + off + whole, src + whole, n - whole);
}


}  // namespace gradlane::daemon
