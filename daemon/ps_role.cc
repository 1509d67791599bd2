// daemon/ps_role.cc — the engine's co-located parameter-server shard: rounds per owned partition,
// rank-ordered reduction once all W contributions are in, pull responses by priority.
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

template <class T>
bool Engine<T>::ShardAccept_st(Job& job, OwnedPart& o, uint32_t rank, int64_t iteration,
                               uint64_t length) {
  const Part& p = job.parts[o.part];
  uint64_t* got = &job.owned_got[static_cast<size_t>(&o - job.owned.data()) * job.world];
  if (o.round != iteration || o.reduced) {
    // A new round may start only after the previous one was reduced.
    if (iteration <= o.round || !o.reduced || job.any_left) return false;
    o.round = iteration;
    o.reduced = false;
    if (options_.telemetry != nullptr) {
      options_.telemetry->Emit_st({EventType::kRoundOpened, 0, 0, job.slot, job.generation, 0,
                                   sched::MakeKey(p.tensor, p.index), iteration, p.offset,
                                   p.length, 0, SessionServer::MonotonicNow()});
    }
    o.ranks_complete = 0;
    o.priority = std::numeric_limits<sched::Priority>::max();
    std::fill(got, got + job.world, 0);
  }
  if (got[rank] + length > p.length) return false;
  got[rank] += length;
  return true;
}

template <class T>
void Engine<T>::ShardRankDone_st(Job& job, OwnedPart& o) {
  if (++o.ranks_complete == job.world) TryReduce_st(job, o);
}

template <class T>
void Engine<T>::TryReduce_st(Job& job, OwnedPart& o) {
  if (o.pulls_pending > 0) {
    // The result slot still feeds pull responses of the previous round.
    o.reduce_deferred = true;
    return;
  }
  o.reduce_deferred = false;
  Part& p = job.parts[o.part];
  const JobTensor& t = job.tensors[p.tensor];
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

#define GRADLANE_INSTANTIATE(T) \
  template bool Engine<T>::ShardAccept_st(Job&, OwnedPart&, uint32_t, int64_t, uint64_t); \
  template void Engine<T>::ShardRankDone_st(Job&, OwnedPart&); \
  template void Engine<T>::TryReduce_st(Job&, OwnedPart&);
GRADLANE_ENGINE_FOR_EACH_TRANSPORT(GRADLANE_INSTANTIATE)
#undef GRADLANE_INSTANTIATE

}  // namespace gradlane::daemon
