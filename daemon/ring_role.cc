#include "daemon/ring_role.h"

#include <algorithm>
#include <new>

#include "absl/strings/str_cat.h"
#include "daemon/job_runtime.h"
#include "daemon/ps/aggregator.h"

namespace gradlane::daemon {

using sched::TimeNs;
using transport::RecvTarget;

absl::Status RingRole::SetUp_st() {
  const JobPlan& plan = job_.plan();
  world_ = plan.world;
  rank_ = plan.rank;
  parts_.assign(plan.parts.size(), RingPart{});
  const size_t steps = world_ > 1 ? world_ - 1 : 0;
  slots_.assign(plan.parts.size() * steps, Slot{});
  gathered_.assign(plan.parts.size() * steps, Gathered{});
  staging_bytes_ = world_ > 1 ? plan.staging_bytes : 0;
  if (absl::Status s = SetUpFusion_st(); !s.ok()) return s;
  if (staging_bytes_ == 0) return absl::OkStatus();
  staging_.reset(new (std::nothrow) std::byte[staging_bytes_]);
  if (staging_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("job ", job_.id(), ": all-reduce staging of ", staging_bytes_, " bytes"));
  }
  // Registered on the engine thread (verbs: pinned here); why not ahead: JobRuntime::SetUp_st.
  auto region = job_.host().transport_st().RegisterRegion_st(staging_.get(), staging_bytes_);
  if (!region.ok()) return region.status();
  staging_region_ = *region;
  return absl::OkStatus();
}

void RingRole::Release_st() {
  for (transport::RegionId* r :
       {&staging_region_, &bucket_region_, &plan_out_region_, &plan_in_region_}) {
    if (*r != transport::kNoRegion) (void)job_.host().transport_st().UnregisterRegion_st(*r);
    *r = transport::kNoRegion;
  }
}

uint32_t RingRole::Left() const { return (rank_ + world_ - 1) % world_; }
uint32_t RingRole::Right() const { return (rank_ + 1) % world_; }

uint64_t RingRole::ESize(const Part& p) const {
  return sched::DTypeBytes(job_.plan().tensors[p.tensor].spec.dtype);
}

uint64_t RingRole::Elements(const Part& p) const { return p.length / ESize(p); }

void RingRole::Chunk(const Part& p, uint32_t c, uint64_t* begin, uint64_t* end) const {
  const uint64_t n = Elements(p), e = ESize(p);
  *begin = ChunkBegin(n, world_, c, e);
  *end = ChunkBegin(n, world_, c + 1, e);
}

uint32_t RingRole::ChunkOf(const Part& p, uint64_t offset) const {
  const uint64_t n = Elements(p);
  if (n == 0) return 0;
  // Chunk c is [floor(c·n/W), floor((c+1)·n/W)): the first c with floor((c+1)·n/W) > e, i.e.
  // (c+1)·n/W >= e+1, is ceil((e+1)·W/n) - 1.
  const uint64_t e = offset / ESize(p);
  return static_cast<uint32_t>(((e + 1) * world_ + n - 1) / n - 1);
}

uint32_t RingRole::ReceivedAtStep(uint32_t s) const {
  return (rank_ + 2 * world_ - 1 - s) % world_;
}

const RingRole::Bucket* RingRole::BucketOfPart(uint32_t part_index) const {
  const uint32_t client_parts = job_.plan().client_parts;
  return part_index < client_parts ? nullptr : &buckets_[part_index - client_parts];
}

std::byte* RingRole::Staging(uint32_t part_index, uint64_t offset_in_part) const {
  if (const Bucket* bk = BucketOfPart(part_index)) {
    return bucket_mem_.get() + bk->staging_offset + offset_in_part;
  }
  return staging_.get() + job_.plan().staging_offset[part_index] + offset_in_part;
}

void RingRole::StagingTarget(uint32_t part_index, uint64_t offset_in_part,
                             transport::RegionId* region, uint64_t* region_offset) const {
  if (const Bucket* bk = BucketOfPart(part_index)) {
    *region = bucket_region_;
    *region_offset = bk->staging_offset + offset_in_part;
    return;
  }
  *region = staging_region_;
  *region_offset = job_.plan().staging_offset[part_index] + offset_in_part;
}

std::byte* RingRole::Client(const Part& p, uint64_t offset_in_part) const {
  const uint32_t part_index = static_cast<uint32_t>(&p - job_.plan().parts.data());
  if (const Bucket* bk = BucketOfPart(part_index)) {
    return bucket_mem_.get() + bk->gather_offset + offset_in_part;
  }
  const JobTensor& t = job_.plan().tensors[p.tensor];
  return reinterpret_cast<std::byte*>(job_.arena() + t.arena_offset + p.offset + offset_in_part);
}

void RingRole::ClientTarget(const Part& p, uint64_t offset_in_part, transport::RegionId* region,
                            uint64_t* region_offset) const {
  const uint32_t part_index = static_cast<uint32_t>(&p - job_.plan().parts.data());
  if (const Bucket* bk = BucketOfPart(part_index)) {
    *region = bucket_region_;
    *region_offset = bk->gather_offset + offset_in_part;
    return;
  }
  *region = job_.arena_region();
  *region_offset = job_.plan().tensors[p.tensor].arena_offset + p.offset + offset_in_part;
}

void RingRole::OnPosted_st(uint32_t part_index, sched::Priority priority, TimeNs now) {
  JobPlan& plan = job_.plan();
  Part& p = plan.parts[part_index];
  RingPart& rp = parts_[part_index];
  if (job_.departing()) {
    // A rank has gone for good: it cannot have finished an iteration this rank had not posted
    // all of (it needs this rank's share of every chunk), so this round can never complete.
    job_.Fail_st(GL_E_DISCONNECTED, job_.DepartureReason(p.iteration));
    return;
  }
  if (p.posted < p.length || rp.started == p.iteration) return;
  Observe_st(p, now);
  if (fusion_ == FusionState::kWaiting && p.iteration >= FusionIteration()) {
    // From this iteration on the tensors may go fused: rank 0 decides now, the others wait for
    // its plan, which reaches them ahead of any data of this iteration.
    if (rank_ == 0) DecideFusion_st(now);
    if (fusion_ == FusionState::kWaiting || plan_send_pending_) {
      Hold(part_index, priority);
      return;
    }
  }
  if (bucket_of_tensor_.size() > p.tensor && bucket_of_tensor_[p.tensor] >= 0) {
    MemberPosted_st(part_index, priority, now);
    return;
  }
  StartRound_st(part_index, priority, now);
}

void RingRole::StartRound_st(uint32_t part_index, sched::Priority priority, TimeNs now) {
  Part& p = job_.plan().parts[part_index];
  RingPart& rp = parts_[part_index];
  if (rp.started == p.iteration) return;
  rp.started = p.iteration;
  rp.finals = 0;
  rp.complete = false;
  rp.priority = priority;
  if (world_ == 1) {
    // Alone: the buffer already holds the sum (and the mean of one value).
    rp.finals = 1;
    MaybeComplete_st(part_index);
    return;
  }
  for (uint32_t t = 0; t + 1 < world_; ++t) {
    GatheredOf(part_index, t) = Gathered{};
    uint64_t b, e;
    // A chunk with no elements (a partition of fewer than W elements) is final at once and
    // never travels; every rank skips the same ones.
    Chunk(p, (rank_ + world_ - t) % world_, &b, &e);
    if (b == e) ++rp.finals;
    Chunk(p, ReceivedAtStep(t), &b, &e);
    if (b == e) SlotOf(part_index, t) = Slot{p.iteration, 0, 0, false};
  }
  Send_st(part_index, rank_, sched::Direction::kPush, now);
  Advance_st(part_index, now);
}

void RingRole::Send_st(uint32_t part_index, uint32_t c, sched::Direction direction, TimeNs now) {
  const JobPlan& plan = job_.plan();
  const Part& p = plan.parts[part_index];
  uint64_t b, e;
  Chunk(p, c, &b, &e);
  if (b == e) return;
  const JobTensor& t = plan.tensors[p.tensor];
  RingPart& rp = parts_[part_index];
  rp.sends_pending += e - b;
  sched::ReadyRange r;
  r.tensor_id = t.spec.id;
  r.priority = rp.priority;
  r.dtype = t.spec.dtype;
  r.direction = direction;
  r.peer = static_cast<uint16_t>(Right());
  r.iteration = p.iteration;
  r.tensor_bytes = t.spec.bytes;
  r.offset = p.offset + b;
  r.length = e - b;
  r.ring_hop = true;
  job_.Ready_st(r, now);
}

void RingRole::Advance_st(uint32_t part_index, TimeNs now) {
  JobPlan& plan = job_.plan();
  Part& p = plan.parts[part_index];
  RingPart& rp = parts_[part_index];
  if (rp.started != p.iteration || rp.complete || job_.failed()) return;
  const sched::DType dtype = plan.tensors[p.tensor].spec.dtype;
  for (uint32_t s = 0; s + 1 < world_; ++s) {
    Slot& slot = SlotOf(part_index, s);
    const uint32_t c = ReceivedAtStep(s);
    uint64_t b, e;
    Chunk(p, c, &b, &e);
    if (slot.iteration != p.iteration || slot.reduced || slot.placed != e - b) continue;
    slot.reduced = true;
    const bool last = s + 2 == world_;
    if (e > b) {
      // Received partial sum first, then this rank's values: chunk c is summed c, c+1, ...
      const std::byte* in[2] = {Staging(part_index, b), Client(p, b)};
      std::byte* out = last ? Client(p, b) : Staging(part_index, b);
      const uint32_t divide_by = last && plan.reduce == ps::ReduceOp::kMean ? world_ : 0;
      // Cannot fail: two inputs, a whole number of elements of a checked dtype.
      (void)ps::ReduceInOrder(dtype, absl::MakeConstSpan(in, 2), e - b, divide_by, out);
    }
    if (last) {
      ++rp.finals;
      Send_st(part_index, c, sched::Direction::kPull, now);  // all-gather step 0
    } else {
      Send_st(part_index, c, sched::Direction::kPush, now);  // reduce-scatter step s+1
    }
  }
  MaybeComplete_st(part_index);
}

RecvTarget RingRole::Resolve_st(uint16_t from, Part& p, const transport::FrameHeader& h,
                                uint64_t cookie) {
  if (world_ < 2 || from != Left()) return RecvTarget::Reject();
  const uint32_t part_index = static_cast<uint32_t>(&p - job_.plan().parts.data());
  const uint64_t off = h.offset - p.offset;
  const uint32_t c = ChunkOf(p, off);
  uint64_t b, e;
  Chunk(p, c, &b, &e);
  if (off + h.length > e) return RecvTarget::Reject();
  if (h.direction == static_cast<uint8_t>(sched::Direction::kPush)) {
    const uint32_t s = (rank_ + 2 * world_ - 1 - c) % world_;
    if (s + 1 >= world_) return RecvTarget::Reject();  // chunk r+... never comes at this step
    // The left neighbour is at this rank's iteration or one ahead, never behind.
    if (h.iteration < p.iteration || (p.iteration >= 0 && h.iteration > p.iteration + 1)) {
      return RecvTarget::Reject();
    }
    Slot& slot = SlotOf(part_index, s);
    if (slot.iteration != h.iteration) {
      // A new round of this step: the slot's previous one must have been consumed.
      if (slot.iteration > h.iteration || (slot.iteration >= 0 && !slot.reduced)) {
        return RecvTarget::Reject();
      }
      slot = Slot{h.iteration, 0, 0, false};
    }
    if (slot.reduced || slot.reserved + h.length > e - b) return RecvTarget::Reject();
    slot.reserved += h.length;
    transport::RegionId region;
    uint64_t region_offset;
    StagingTarget(part_index, off, &region, &region_offset);
    return RecvTarget::Into(region, region_offset, cookie);
  }
  // All-gather: only for the round this rank runs (its share is in every final chunk).
  const uint32_t t = (rank_ + world_ - c) % world_;
  const RingPart& rp = parts_[part_index];
  if (t + 1 >= world_ || rp.started != p.iteration || rp.complete || h.iteration != p.iteration) {
    return RecvTarget::Reject();
  }
  Gathered& g = GatheredOf(part_index, t);
  if (g.reserved + h.length > e - b) return RecvTarget::Reject();
  g.reserved += h.length;
  transport::RegionId region;
  uint64_t region_offset;
  ClientTarget(p, off, &region, &region_offset);
  return RecvTarget::Into(region, region_offset, cookie);
}

void RingRole::OnPlaced_st(Part& p, const transport::FrameHeader& h, TimeNs now) {
  const uint32_t part_index = static_cast<uint32_t>(&p - job_.plan().parts.data());
  const uint32_t c = ChunkOf(p, h.offset - p.offset);
  if (h.direction == static_cast<uint8_t>(sched::Direction::kPush)) {
    const uint32_t s = (rank_ + 2 * world_ - 1 - c) % world_;
    Slot& slot = SlotOf(part_index, s);
    // Resolve_st opened the slot for this frame's iteration; a later iteration cannot have
    // reopened it before this frame's bytes were placed (the slot was not reduced).
    if (slot.iteration != h.iteration) return;
    slot.placed += h.length;
    Advance_st(part_index, now);
    return;
  }
  const uint32_t t = (rank_ + world_ - c) % world_;
  uint64_t b, e;
  Chunk(p, c, &b, &e);
  RingPart& rp = parts_[part_index];
  Gathered& g = GatheredOf(part_index, t);
  g.placed += h.length;
  if (g.placed != e - b) return;
  ++rp.finals;
  if (t + 2 < world_) Send_st(part_index, c, sched::Direction::kPull, now);  // forward it
  MaybeComplete_st(part_index);
}

void RingRole::SendSource(const Part& p, const sched::Segment& seg, transport::RegionId* region,
                          uint64_t* region_offset) const {
  const uint32_t part_index = static_cast<uint32_t>(&p - job_.plan().parts.data());
  const uint64_t off = seg.offset - p.offset;
  if (seg.direction == sched::Direction::kPush && ChunkOf(p, off) != rank_) {
    StagingTarget(part_index, off, region, region_offset);
    return;
  }
  ClientTarget(p, off, region, region_offset);
}

void RingRole::OnSendAcked_st(Part& p, uint64_t bytes) {
  const uint32_t part_index = static_cast<uint32_t>(&p - job_.plan().parts.data());
  RingPart& rp = parts_[part_index];
  rp.sends_pending -= std::min(rp.sends_pending, bytes);
  MaybeComplete_st(part_index);
}

void RingRole::MaybeComplete_st(uint32_t part_index) {
  JobPlan& plan = job_.plan();
  Part& p = plan.parts[part_index];
  RingPart& rp = parts_[part_index];
  if (rp.complete || rp.started != p.iteration || rp.finals < world_ || rp.sends_pending > 0) {
    return;
  }
  rp.complete = true;
  ++rounds_completed_;
  job_.host().counters_st().rounds_reduced.Add_st(1);
  if (BucketOfPart(part_index) != nullptr) {
    BucketComplete_st(part_index);
    return;
  }
  p.result_reserved = p.length;
  p.result_got = p.length;
  job_.worker().PartResultReady_st(part_index);
}

bool RingRole::InProgress(int64_t* round) const {
  const JobPlan& plan = job_.plan();
  for (size_t i = 0; i < parts_.size(); ++i) {
    const Part& p = plan.parts[i];
    if (p.iteration >= 0 && p.posted > 0 &&
        !(parts_[i].started == p.iteration && parts_[i].complete)) {
      *round = p.iteration;
      return true;
    }
  }
  return false;
}

bool RingRole::MissingFromLeft(int64_t* round) const {
  const JobPlan& plan = job_.plan();
  for (uint32_t i = 0; i < parts_.size(); ++i) {
    const Part& p = plan.parts[i];
    const RingPart& rp = parts_[i];
    if (p.iteration < 0 || p.posted == 0 || (rp.started == p.iteration && rp.complete)) continue;
    // A fused tensor's bytes come through its bucket's partition.
    if (bucket_of_tensor_.size() > p.tensor && bucket_of_tensor_[p.tensor] >= 0) continue;
    *round = p.iteration;
    if (p.posted < p.length) return true;
    for (uint32_t s = 0; s + 1 < world_; ++s) {
      uint64_t b, e;
      Chunk(p, ReceivedAtStep(s), &b, &e);
      const Slot& slot = slots_[size_t{i} * (world_ - 1) + s];
      if (e > b && (slot.iteration < p.iteration ||
                    (slot.iteration == p.iteration && slot.placed < e - b))) {
        return true;
      }
      Chunk(p, (rank_ + world_ - s) % world_, &b, &e);
      if (gathered_[size_t{i} * (world_ - 1) + s].placed < e - b) return true;
    }
  }
  return false;
}

bool RingRole::HasOpenRound(int64_t* round) const {
  if (InProgress(round)) return true;
  const JobPlan& plan = job_.plan();
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    const Part& p = plan.parts[i / (world_ - 1)];
    if (s.iteration > p.iteration) {
      *round = s.iteration;
      return true;
    }
  }
  return false;
}

}  // namespace gradlane::daemon
