// RingRole's fusion of small tensors into ring buckets (PACE §V); see daemon/ring_role.h.
#include <algorithm>
#include <cstring>
#include <new>
#include <optional>

#include "absl/strings/str_cat.h"
#include "daemon/job_runtime.h"
#include "daemon/log.h"
#include "daemon/ring_role.h"
#include "sched/fusion.h"
#include "sched/pace.h"

namespace gradlane::daemon {

using sched::TimeNs;
using transport::RecvTarget;

absl::Status RingRole::SetUpFusion_st() {
  const JobPlan& plan = job_.plan();
  if (plan.fusion == 0 || world_ < 2) return absl::OkStatus();
  fusion_ = FusionState::kWaiting;
  bucket_of_tensor_.assign(plan.client_tensors, -1);
  ready_offset_.assign(plan.client_tensors, -1);
  prev_ready_offset_.assign(plan.client_tensors, -1);
  // The largest plan: every tensor a member, at most one bucket per two of them.
  const size_t max_bytes = sizeof(PlanHeader) + 8 * size_t{plan.client_tensors};
  plan_out_.assign(max_bytes, 0);
  plan_in_.assign(max_bytes, 0);
  transport::Transport& transport = job_.host().transport_st();
  auto out = transport.RegisterRegion_st(plan_out_.data(), plan_out_.size());
  if (!out.ok()) return out.status();
  plan_out_region_ = *out;
  auto in = transport.RegisterRegion_st(plan_in_.data(), plan_in_.size());
  if (!in.ok()) return in.status();
  plan_in_region_ = *in;
  return absl::OkStatus();
}

void RingRole::Observe_st(const Part& p, TimeNs now) {
  if (fusion_ == FusionState::kOff || p.tensor >= ready_offset_.size()) return;
  if (first_iteration_ < 0) first_iteration_ = p.iteration;
  if (p.iteration != measured_iteration_) {
    if (measured_iteration_ >= 0) {
      prev_ready_offset_ = ready_offset_;
      // The iteration's period less its backward span (its last gradient's ready offset): the
      // forward pass, with whatever it waited for results.
      const TimeNs backward = *std::max_element(ready_offset_.begin(), ready_offset_.end());
      forward_gap_ = std::max<TimeNs>(0, now - iteration_start_ - std::max<TimeNs>(0, backward));
    }
    measured_iteration_ = p.iteration;
    iteration_start_ = now;
    std::fill(ready_offset_.begin(), ready_offset_.end(), TimeNs{-1});
  }
  // A tensor is ready when its last partition is.
  ready_offset_[p.tensor] = std::max(ready_offset_[p.tensor], now - iteration_start_);
}

void RingRole::Hold(uint32_t part_index, sched::Priority priority) {
  for (const auto& [index, prio] : held_) {
    if (index == part_index) return;
  }
  held_.emplace_back(part_index, priority);
}

std::vector<std::vector<uint32_t>> RingRole::PlanBuckets() const {
  std::vector<std::vector<uint32_t>> out;
  const JobPlan& plan = job_.plan();
  const uint32_t n = plan.client_tensors;
  const sched::BandwidthEstimator& est = job_.estimator();
  const std::optional<double> bw = est.BytesPerSecond();
  const bool greedy = plan.fusion == static_cast<uint8_t>(EngineOptions::Fusion::kGreedy);
  if (n < 2 || (!greedy && (!bw || !(*bw > 0)))) return out;  // nothing measured to plan on
  // What one more all-reduce costs the link: a message per ring step, each paying the
  // per-message cost θ on the sender. The latency of a step is not a cost: the steps of
  // successive all-reduces overlap it (unlike PACE's launch overhead, which serialises).
  const double hops = 2.0 * (world_ - 1);
  sched::AllReduceCost cost;
  cost.fixed = static_cast<TimeNs>(hops * static_cast<double>(job_.per_message_ns()));
  cost.ns_per_byte = greedy ? 0 : hops / world_ * 1e9 / *bw;
  // PACE's L_i: the forward time left when tensor i is needed. The forward consumes the
  // tensors in priority order (0 first); its length is the measured gap between the last result
  // and the next iteration's first post.
  std::vector<uint32_t> by_priority(n);
  for (uint32_t t = 0; t < n; ++t) by_priority[t] = t;
  auto priority_of = [&](uint32_t t) {
    const JobTensor& jt = plan.tensors[t];
    return jt.auto_priority ? job_.auto_priority().PriorityOf(t) : jt.spec.priority;
  };
  std::stable_sort(by_priority.begin(), by_priority.end(),
                   [&](uint32_t a, uint32_t b) { return priority_of(a) < priority_of(b); });
  std::vector<TimeNs> tail(n);
  for (uint32_t k = 0; k < n; ++k) {
    tail[by_priority[k]] = static_cast<TimeNs>(static_cast<double>(forward_gap_) * (n - k) / n);
  }
  // The chain: tensors in the order they became ready last iteration.
  std::vector<uint32_t> chain;
  for (uint32_t t = 0; t < n; ++t) {
    if (prev_ready_offset_[t] >= 0) chain.push_back(t);
  }
  std::stable_sort(chain.begin(), chain.end(), [&](uint32_t a, uint32_t b) {
    return prev_ready_offset_[a] < prev_ready_offset_[b];
  });
  const EngineOptions& options = job_.host().options();
  auto cap = [&](sched::DType dtype) {
    return EnginePartitionBytes(plan.policy_name, options.partition_bytes, dtype);
  };
  auto eligible = [&](uint32_t t) {
    const JobTensor& jt = plan.tensors[t];
    return jt.plan.partition_count() == 1 && jt.spec.bytes <= cap(jt.spec.dtype);
  };
  // A group of sub[m] becomes buckets, split where one partition would overflow (keeping the
  // chain order); a bucket of one is no bucket.
  auto add_group = [&](const std::vector<int32_t>& group, const std::vector<uint32_t>& sub) {
    std::vector<uint32_t> bucket;
    uint64_t bytes = 0;
    for (int32_t m : group) {
      const uint32_t t = sub[static_cast<size_t>(m)];
      const uint64_t b = plan.tensors[t].spec.bytes;
      if (bytes + b > cap(plan.tensors[t].spec.dtype)) {
        if (bucket.size() >= 2) out.push_back(bucket);
        bucket.clear();
        bytes = 0;
      }
      bucket.push_back(t);
      bytes += b;
    }
    if (bucket.size() >= 2) out.push_back(bucket);
  };
  // A bucket holds one dtype and fits one partition: the chain of each dtype's small tensors
  // (in ready order, the others left out) is fused on its own.
  for (const sched::DType dtype : {sched::DType::kF32, sched::DType::kF16, sched::DType::kBF16}) {
    std::vector<uint32_t> sub;
    for (uint32_t t : chain) {
      if (eligible(t) && plan.tensors[t].spec.dtype == dtype) sub.push_back(t);
    }
    if (sub.size() < 2) continue;
    if (greedy) {
      std::vector<int32_t> all(sub.size());
      for (size_t k = 0; k < sub.size(); ++k) all[k] = static_cast<int32_t>(k);
      add_group(all, sub);
      continue;
    }
    sched::PaceInstance inst;
    for (uint32_t t : sub) {
      inst.tensor.push_back(static_cast<int32_t>(t));
      inst.jobs.push_back({prev_ready_offset_[t], cost.Time(plan.tensors[t].spec.bytes), tail[t]});
      inst.bytes.push_back(plan.tensors[t].spec.bytes);
      inst.compute_floor = std::max(inst.compute_floor, prev_ready_offset_[t]);
    }
    auto fused = sched::BalancedFusion(inst, cost);
    if (!fused.ok()) continue;
    // Alg. 1 keeps the fewest groups among equally good ones, but a bucket costs what the model
    // leaves out (its members wait for the last of them at partition granularity, not as a
    // fluid): fuse only when the model says it is strictly faster than not fusing.
    auto unfused = sched::HornSchedule(inst.jobs);
    if (!unfused.ok() ||
        fused->iteration_time >= std::max(unfused->objective, inst.compute_floor)) {
      continue;
    }
    for (const std::vector<int32_t>& group : fused->members) add_group(group, sub);
  }
  return out;
}

void RingRole::DecideFusion_st(TimeNs now) {
  if (fusion_ != FusionState::kWaiting) return;
  const std::vector<std::vector<uint32_t>> buckets = PlanBuckets();
  if (std::string err = ApplyPlan_st(buckets); !err.empty()) {
    job_.Fail_st(GL_E_INTERNAL, err);
    return;
  }
  // Encode what was applied.
  PlanHeader h{kPlanMagic, FusionIteration(), static_cast<uint32_t>(buckets_.size()), 0};
  uint8_t* w = plan_out_.data() + sizeof(PlanHeader);
  for (const Bucket& bk : buckets_) {
    const uint32_t count = static_cast<uint32_t>(bk.members.size());
    std::memcpy(w, &count, 4);
    w += 4;
    h.members += count;
  }
  for (const Bucket& bk : buckets_) {
    std::memcpy(w, bk.members.data(), 4 * bk.members.size());
    w += 4 * bk.members.size();
  }
  std::memcpy(plan_out_.data(), &h, sizeof(h));
  plan_out_bytes_ = static_cast<uint64_t>(w - plan_out_.data());
  SendPlan_st(now);
}

std::string RingRole::ApplyPlan_st(const std::vector<std::vector<uint32_t>>& buckets) {
  JobPlan& plan = job_.plan();
  const uint32_t n = plan.client_tensors;
  const std::string who = absl::StrCat("job ", job_.id(), ": fusion plan: ");
  std::vector<int32_t> bucket_of(n, -1);
  uint64_t total = 0;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const auto& members = buckets[b];
    if (members.size() < 2) return absl::StrCat(who, "bucket ", b, " has fewer than 2 members");
    const sched::DType dtype =
        members[0] < n ? plan.tensors[members[0]].spec.dtype : sched::DType::kF32;
    uint64_t bytes = 0;
    for (uint32_t t : members) {
      if (t >= n || bucket_of[t] >= 0) {
        return absl::StrCat(who, "tensor ", t, " unknown or in two buckets");
      }
      const JobTensor& jt = plan.tensors[t];
      if (jt.plan.partition_count() != 1 || jt.spec.dtype != dtype) {
        return absl::StrCat(who, "tensor ", jt.name, " cannot be fused (several partitions or ",
                            "another dtype)");
      }
      bucket_of[t] = static_cast<int32_t>(b);
      bytes += jt.spec.bytes;
    }
    if (bytes > kMaxEnginePartitionBytes) return absl::StrCat(who, "bucket ", b, " too large");
    total += bytes;
  }
  if (!buckets.empty()) {
    bucket_mem_.reset(new (std::nothrow) std::byte[2 * total]);
    if (bucket_mem_ == nullptr) return absl::StrCat(who, "no memory for ", 2 * total, " bytes");
    // On the engine thread: the buckets are planned here, mid-job (small tensors only, so
    // small); why daemon buffers are not registered ahead: JobRuntime::SetUp_st.
    auto region = job_.host().transport_st().RegisterRegion_st(bucket_mem_.get(), 2 * total);
    if (!region.ok()) return absl::StrCat(who, region.status().message());
    bucket_region_ = *region;
  }
  uint64_t offset = 0;
  uint32_t fused = 0;
  for (const auto& members : buckets) {
    Bucket bk;
    bk.members = members;
    for (uint32_t t : members) {
      bk.member_offset.push_back(bk.bytes);
      bk.bytes += plan.tensors[t].spec.bytes;
    }
    bk.gather_offset = offset;
    bk.staging_offset = offset + bk.bytes;
    offset += 2 * bk.bytes;
    // The virtual tensor and its one partition: appended after the client's (their vectors were
    // reserved for this, so no reference into them moves).
    JobTensor vt;
    vt.name = absl::StrCat("bucket#", buckets_.size());
    vt.spec.id = static_cast<uint32_t>(plan.tensors.size());
    vt.spec.bytes = bk.bytes;
    vt.spec.dtype = plan.tensors[members[0]].spec.dtype;
    vt.spec.priority = 0;
    vt.plan = sched::PartitionPlan::Make(bk.bytes, vt.spec.dtype, bk.bytes);
    vt.first_part = static_cast<uint32_t>(plan.parts.size());
    Part vp;
    vp.tensor = vt.spec.id;
    vp.length = bk.bytes;
    vp.owner = plan.rank;
    bk.part = vt.first_part;
    plan.parts.push_back(vp);
    job_.RegisterWithPolicy_st(vt.spec);
    plan.tensors.push_back(std::move(vt));
    for (uint32_t t : members) bucket_of_tensor_[t] = static_cast<int32_t>(buckets_.size());
    fused += static_cast<uint32_t>(members.size());
    buckets_.push_back(std::move(bk));
  }
  const size_t steps = world_ - 1;
  parts_.resize(plan.parts.size());
  slots_.resize(plan.parts.size() * steps);
  gathered_.resize(plan.parts.size() * steps);
  fusion_ = FusionState::kApplied;
  job_.host().counters_st().fusion_buckets.Add_st(buckets_.size());
  LogLine(absl::StrCat("job ", job_.id(), " rank ", rank_, ": from iteration ", FusionIteration(),
                       " ", fused, " of ", n, " tensors go fused in ", buckets_.size(),
                       " ring buckets (", total, " bytes)"));
  return {};
}

void RingRole::SendPlan_st(TimeNs now) {
  // The plan goes round the ring once, from rank 0: rank W-1 does not send it back.
  if (Right() == 0) {
    plan_send_pending_ = false;
    ReleaseHeld_st(now);
    return;
  }
  absl::Status s = job_.SendControl_st(static_cast<uint16_t>(Right()), kFusionPlanKey,
                                       plan_out_region_, plan_out_bytes_);
  if (absl::IsResourceExhausted(s)) {
    plan_send_pending_ = true;  // FlushPlan_st tries again; posts stay held until it went
    return;
  }
  if (!s.ok()) {
    job_.Fail_st(StatusFor(s), absl::StrCat("job ", job_.id(), ": fusion plan to rank ", Right(),
                                            ": ", s.message()));
    return;
  }
  plan_send_pending_ = false;
  ReleaseHeld_st(now);
}

void RingRole::FlushPlan_st(TimeNs now) {
  if (plan_send_pending_ && !job_.failed()) SendPlan_st(now);
}

void RingRole::ReleaseHeld_st(TimeNs now) {
  std::vector<std::pair<uint32_t, sched::Priority>> held;
  held.swap(held_);
  for (const auto& [part_index, priority] : held) {
    if (job_.failed()) return;
    OnPosted_st(part_index, priority, now);
  }
}

RecvTarget RingRole::ResolvePlan_st(uint16_t from, uint64_t length, uint64_t cookie) {
  if (fusion_ != FusionState::kWaiting || plan_arrived_ || from != Left() ||
      length < sizeof(PlanHeader) || length > plan_in_.size()) {
    return RecvTarget::Reject();
  }
  plan_arrived_ = true;
  return RecvTarget::Into(plan_in_region_, 0, cookie);
}

void RingRole::OnPlanArrived_st(uint64_t length, TimeNs now) {
  const std::string who = absl::StrCat("job ", job_.id(), ": fusion plan from rank ", Left());
  PlanHeader h;
  std::memcpy(&h, plan_in_.data(), sizeof(h));
  if (h.magic != kPlanMagic || h.buckets > h.members ||
      length != sizeof(PlanHeader) + 4 * (uint64_t{h.buckets} + h.members)) {
    job_.Fail_st(GL_E_PROTOCOL, absl::StrCat(who, " is malformed"));
    return;
  }
  if (h.iteration != FusionIteration()) {
    job_.Fail_st(GL_E_PROTOCOL, absl::StrCat(who, " starts at iteration ", h.iteration,
                                             ", this rank expected ", FusionIteration(),
                                             " (did the ranks start at different iterations?)"));
    return;
  }
  std::vector<std::vector<uint32_t>> buckets(h.buckets);
  const uint8_t* counts = plan_in_.data() + sizeof(PlanHeader);
  const uint8_t* ids = counts + 4 * uint64_t{h.buckets};
  uint64_t next = 0;
  for (uint32_t b = 0; b < h.buckets; ++b) {
    uint32_t count;
    std::memcpy(&count, counts + 4 * b, 4);
    if (count > h.members - next) {
      job_.Fail_st(GL_E_PROTOCOL, absl::StrCat(who, " is malformed"));
      return;
    }
    buckets[b].resize(count);
    std::memcpy(buckets[b].data(), ids + 4 * next, 4 * uint64_t{count});
    next += count;
  }
  if (next != h.members) {
    job_.Fail_st(GL_E_PROTOCOL, absl::StrCat(who, " is malformed"));
    return;
  }
  if (std::string err = ApplyPlan_st(buckets); !err.empty()) {
    job_.Fail_st(GL_E_PROTOCOL, err);
    return;
  }
  // Passed on as it came, before any data of the fused iteration leaves this rank.
  std::memcpy(plan_out_.data(), plan_in_.data(), length);
  plan_out_bytes_ = length;
  SendPlan_st(now);
}

void RingRole::MemberPosted_st(uint32_t part_index, sched::Priority priority, TimeNs now) {
  JobPlan& plan = job_.plan();
  Part& p = plan.parts[part_index];
  RingPart& rp = parts_[part_index];
  if (rp.started == p.iteration) return;
  rp.started = p.iteration;
  rp.complete = false;
  Bucket& bk = buckets_[static_cast<size_t>(bucket_of_tensor_[p.tensor])];
  if (bk.iteration != p.iteration) {
    bk.iteration = p.iteration;
    bk.posted = 0;
    bk.priority = priority;
  }
  bk.priority = std::min(bk.priority, priority);
  if (++bk.posted < bk.members.size()) return;
  // Every member is in: gather them and run the bucket's ring.
  for (size_t k = 0; k < bk.members.size(); ++k) {
    const JobTensor& t = plan.tensors[bk.members[k]];
    std::memcpy(bucket_mem_.get() + bk.gather_offset + bk.member_offset[k],
                job_.arena() + t.arena_offset, t.spec.bytes);
  }
  Part& vp = plan.parts[bk.part];
  vp.iteration = p.iteration;
  vp.posted = vp.length;
  StartRound_st(bk.part, bk.priority, now);
}

void RingRole::BucketComplete_st(uint32_t part_index) {
  JobPlan& plan = job_.plan();
  const Bucket& bk = buckets_[part_index - plan.client_parts];
  for (size_t k = 0; k < bk.members.size(); ++k) {
    const JobTensor& t = plan.tensors[bk.members[k]];
    std::memcpy(job_.arena() + t.arena_offset,
                bucket_mem_.get() + bk.gather_offset + bk.member_offset[k], t.spec.bytes);
  }
  for (uint32_t member : bk.members) {
    const uint32_t mp = plan.tensors[member].first_part;
    Part& p = plan.parts[mp];
    parts_[mp].complete = true;
    p.result_reserved = p.length;
    p.result_got = p.length;
    job_.worker().PartResultReady_st(mp);
  }
}

}  // namespace gradlane::daemon
