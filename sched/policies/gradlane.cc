#include "sched/policies/gradlane.h"

#include <algorithm>
#include <cmath>

#include "sched/partitioner.h"

namespace gradlane::sched {
namespace {

constexpr TimeNs kMinOverheadNs = kMicrosecond;  // θ = 0 would make every message free

// Bytes that `bytes_per_s` moves in `ns`, saturated at 2^60: an unbounded link (the simulator's
// "no network") gives products far beyond uint64_t, and converting those is undefined.
uint64_t BytesIn(double bytes_per_s, TimeNs ns) {
  const double bytes = bytes_per_s * static_cast<double>(std::max<TimeNs>(ns, 0)) / kSecond;
  return bytes >= 1e18 ? uint64_t{1} << 60 : static_cast<uint64_t>(bytes);
}

}  // namespace

TimeNs GradlaneMessageNs(TimeNs comm_per_iteration_ns, TimeNs per_message_ns, uint32_t peers) {
  const TimeNs theta = std::max(per_message_ns, kMinOverheadNs);
  const TimeNs n = std::max<TimeNs>(comm_per_iteration_ns, 0);
  const double tau = std::sqrt(static_cast<double>(n) * static_cast<double>(theta) /
                               (2.0 * (1.0 + std::max<uint32_t>(peers, 1))));
  return std::clamp(static_cast<TimeNs>(tau), theta, std::max(theta, n));
}

uint64_t GradlaneMessageBytes(double bytes_per_s, TimeNs message_ns) {
  const uint64_t b = BytesIn(bytes_per_s, message_ns);
  return std::max(b - b % kGradlaneSliceAlignBytes, kGradlaneMinMessageBytes);
}

uint64_t GradlaneChargeBytes(uint64_t bytes, double bytes_per_s, TimeNs per_message_ns) {
  return bytes + BytesIn(bytes_per_s, per_message_ns);
}

uint64_t GradlaneCreditBytes(double bytes_per_s, TimeNs rtt_min, uint64_t message_bytes,
                             TimeNs per_message_ns, uint32_t peers, uint64_t run_bytes) {
  const uint64_t bdp = BytesIn(bytes_per_s, rtt_min);
  const uint64_t p = std::max<uint32_t>(peers, 1);
  return bdp + 2 * (1 + p) * GradlaneChargeBytes(message_bytes, bytes_per_s, per_message_ns) +
         run_bytes / p * (p - 1);
}

uint64_t GradlaneSliceCount(uint64_t piece_bytes, uint64_t message_bytes) {
  const uint64_t message = std::max<uint64_t>(message_bytes, 1);
  return std::max<uint64_t>(1, piece_bytes / message +
                                   (piece_bytes % message >= message - message / 2));
}

uint64_t GradlaneSliceStart(uint64_t piece_bytes, uint64_t count, uint64_t k) {
  if (count == 0 || k >= count) return piece_bytes;
  const uint64_t exact = EvenSplitPoint(piece_bytes, count, k);
  return exact - exact % kGradlaneSliceAlignBytes;
}

uint32_t GradlaneSliceRound(uint32_t partition, uint64_t slice, uint32_t group) {
  const uint32_t g = std::max<uint32_t>(group, 1);
  return ((partition / g) << 16) | static_cast<uint32_t>(std::min<uint64_t>(slice, 0xffff));
}

uint64_t GradlaneTakeBlock(ReadyQueue& queue, uint64_t block_bytes,
                           std::vector<Segment>& passed_over, std::vector<Segment>& block) {
  passed_over.clear();
  block.push_back(queue.Pop());
  const uint16_t peer = block.back().peer;
  const int64_t iteration = block.back().iteration;
  uint64_t bytes = block.back().length;
  while (!queue.empty() && passed_over.size() < kGradlaneMaxPassedOver) {
    const Segment& next = queue.Top();
    // The queue orders by iteration first: what follows belongs to a later iteration, whose
    // bytes are accounted (and needed) separately.
    if (next.iteration != iteration) break;
    if (next.peer != peer) {
      passed_over.push_back(queue.Pop());
      continue;
    }
    // The peer's next slice in priority order: fused if it fits, else the block ends here
    // (fusing a later one would overtake it).
    if (bytes + next.length > block_bytes) break;
    bytes += next.length;
    block.push_back(queue.Pop());
  }
  for (const Segment& s : passed_over) queue.Push(s);
  passed_over.clear();
  return bytes;
}

GradlanePolicy::GradlanePolicy(uint64_t key_partition_bytes, uint64_t fixed_credit_bytes,
                               TimeNs overhead, double bandwidth, GradlaneVariant variant)
    : key_partition_bytes_(key_partition_bytes),
      fixed_credit_bytes_(fixed_credit_bytes),
      variant_(variant),
      overhead_(std::max(overhead, kMinOverheadNs)),
      bandwidth_(bandwidth) {
  peer_seen_.assign(size_t{1} << 16, false);
  passed_over_.reserve(kGradlaneMaxPassedOver);
  in_flight_.reserve(64);
  Resize();
}

std::unique_ptr<GradlanePolicy> GradlanePolicy::Create(const PolicyConfig& config,
                                                       GradlaneVariant variant) {
  const uint64_t key =
      config.partition_bytes != 0 ? config.partition_bytes : kGradlaneDefaultKeyPartitionBytes;
  return std::unique_ptr<GradlanePolicy>(
      new GradlanePolicy(key, config.credit_bytes, config.per_message_overhead_ns,
                         config.initial_bandwidth_bytes_per_s, variant));
}

void GradlanePolicy::Resize() {
  const TimeNs n =
      static_cast<TimeNs>(static_cast<double>(iteration_bytes_) / bandwidth_ * kSecond);
  message_bytes_ = GradlaneMessageBytes(bandwidth_, GradlaneMessageNs(n, overhead_, peers_));
  const TimeNs rtt = rtt_min_ == kNever ? 0 : rtt_min_;
  if (fixed_credit_bytes_ != 0) {
    capacity_ = fixed_credit_bytes_;
    return;
  }
  const uint64_t rule =
      GradlaneCreditBytes(bandwidth_, rtt, message_bytes_, overhead_, peers_, key_partition_bytes_);
  switch (variant_) {
    case GradlaneVariant::kHalfWindow:
      capacity_ = rule / 2;
      break;
    case GradlaneVariant::kDoubleWindow:
      capacity_ = rule > (uint64_t{1} << 61) ? rule : 2 * rule;
      break;
    case GradlaneVariant::kRules:
    case GradlaneVariant::kDoubleBlocks:
      capacity_ = rule;
      break;
  }
}

void GradlanePolicy::RegisterTensor(const TensorSpec& /*tensor*/) {}

void GradlanePolicy::CountBytes(const ReadyRange& range) {
  if (!has_iteration_ || range.iteration > iteration_) {
    if (has_iteration_) previous_bytes_ = range.iteration == iteration_ + 1 ? current_bytes_ : 0;
    has_iteration_ = true;
    iteration_ = range.iteration;
    current_bytes_ = 0;
  }
  if (range.iteration == iteration_) {
    current_bytes_ += range.length;
  } else if (range.iteration == iteration_ - 1) {
    previous_bytes_ += range.length;  // a late pull of the previous iteration
  }
  const uint64_t bytes = std::max(previous_bytes_, current_bytes_);
  // Re-derive δ only when N moved by more than 1/8: δ ∝ sqrt(N), so that is < 6% of δ.
  if (bytes > iteration_bytes_ + iteration_bytes_ / 8 || bytes < iteration_bytes_ / 2) {
    iteration_bytes_ = bytes;
    Resize();
  }
}

void GradlanePolicy::OnObservedReady(const ReadyRange& range, TimeNs /*now*/) {
  if (!peer_seen_[range.peer]) {
    peer_seen_[range.peer] = true;
    ++peers_;
    Resize();
  }
  CountBytes(range);
}

void GradlanePolicy::OnReady(const ReadyRange& range, TimeNs now) {
  OnObservedReady(range, now);
  if (queue_.empty()) ring_arrival_ = 0;
  const PartitionPlan plan =
      PartitionPlan::Make(range.tensor_bytes, range.dtype, key_partition_bytes_);
  const uint64_t message = message_bytes_;
  CutRange(plan, range, now, [&](const Segment& piece) {
    Segment s = piece;
    const uint64_t partition_start = piece.offset - piece.offset % plan.partition_bytes();
    const uint64_t partition_bytes =
        std::min(plan.partition_bytes(), range.tensor_bytes - partition_start);
    const uint64_t partition_slices = GradlaneSliceCount(partition_bytes, message);
    const uint32_t partition = KeyPartition(piece.key);
    const uint64_t count = GradlaneSliceCount(piece.length, message);
    // Slices are at least ¾ of a page (GradlaneSliceCount, kGradlaneMinMessageBytes), so no
    // two boundaries coincide and every slice below is non-empty.
    uint64_t begin = 0;
    for (uint64_t k = 0; k < count; ++k) {
      const uint64_t next = GradlaneSliceStart(piece.length, count, k + 1);
      s.offset = piece.offset + begin;
      s.length = next - begin;
      // The round is that of the partition's own slice under this slice's middle, so that the
      // pieces of one partition that arrive separately (a shard's pulls as ranges reduce) take
      // the rounds a whole partition's slices would.
      // (Slice j of the partition spans [j·bytes/slices, (j + 1)·bytes/slices): the one under
      // byte m is floor(m·slices / bytes).)
      const uint64_t middle = s.offset + s.length / 2 - partition_start;
      const uint64_t index = EvenSplitPoint(partition_slices, partition_bytes, middle);
      s.round = range.ring_hop ? ring_arrival_ : GradlaneSliceRound(partition, index, peers_ + 1);
      queue_.Push(s);
      begin = next;
    }
  });
  if (range.ring_hop) ++ring_arrival_;
}

bool GradlanePolicy::NextDispatch(TimeNs /*now*/, Dispatch& out) {
  out.segments.clear();
  out.bytes = 0;
  if (queue_.empty()) return false;
  if (!WindowAdmitsBlock()) return false;
  uint64_t room = variant_ == GradlaneVariant::kDoubleBlocks ? 2 * message_bytes_ : message_bytes_;
  if (in_use_ != 0) {
    const uint64_t free_charge = capacity_ - in_use_;
    const uint64_t theta_bytes = GradlaneChargeBytes(0, bandwidth_, overhead_);
    room = std::min(room, free_charge - theta_bytes);
  }
  room = std::max(room, queue_.Top().length);
  out.bytes = GradlaneTakeBlock(queue_, room, passed_over_, out.segments);
  const uint64_t charge = GradlaneChargeBytes(out.bytes, bandwidth_, overhead_);
  in_use_ += charge;
  bytes_in_flight_ += out.bytes;
  in_flight_.push_back({out.bytes, charge});
  return true;
}

void GradlanePolicy::OnAcked(uint64_t bytes, TimeNs /*now*/) {
  // Acks carry bytes, possibly several dispatches' summed, possibly out of order across peers:
  // the acked bytes retire in-flight dispatches oldest first, each returning its charge once
  // its bytes are covered. Bytes are conserved exactly; which θ comes back first may be off by
  // a few messages until the window drains, when everything is settled.
  acked_unmatched_ += bytes;
  bytes_in_flight_ -= std::min(bytes_in_flight_, bytes);
  while (in_flight_head_ < in_flight_.size() &&
         in_flight_[in_flight_head_].bytes <= acked_unmatched_) {
    acked_unmatched_ -= in_flight_[in_flight_head_].bytes;

    in_use_ -= std::min(in_use_, in_flight_[in_flight_head_].charge);
    ++in_flight_head_;
  }
  if (in_flight_head_ == in_flight_.size()) {
    in_flight_.clear();  // keeps capacity
    in_flight_head_ = 0;
    in_use_ = 0;
    acked_unmatched_ = 0;
    bytes_in_flight_ = 0;
  } else if (in_flight_head_ > in_flight_.size() / 2) {
    in_flight_.erase(in_flight_.begin(),
                     in_flight_.begin() + static_cast<std::ptrdiff_t>(in_flight_head_));
    in_flight_head_ = 0;
  }
}

bool GradlanePolicy::WindowAdmitsBlock() const {
  if (in_use_ == 0) return true;
  // The least this dispatch should carry: a whole message when that much is queued. Sending
  // what happens to fit instead would cut a backlog of small tensors into pieces the size of
  // each ack's refund, every one paying θ (shufflenet_v2 at 10 Gbit/s, W = 3, ρ = 1: 1.64x the
  // bound that way, 1.35x waiting for a whole message's room).
  const uint64_t want =
      std::max(queue_.Top().length, std::min(message_bytes_, queue_.queued_bytes()));
  const uint64_t charge = GradlaneChargeBytes(want, bandwidth_, overhead_);
  return charge <= capacity_ && in_use_ <= capacity_ - charge;
}

TimeNs GradlanePolicy::NextWakeup(TimeNs now) const {
  if (queue_.empty() || !WindowAdmitsBlock()) return kNever;
  return now;
}

void GradlanePolicy::OnLinkEstimate(double bytes_per_s, TimeNs rtt) {
  if (!(bytes_per_s > 0)) return;
  const TimeNs old_rtt_min = rtt_min_;
  // The floor is the smallest RTT of the job's life. Every sample carries serialization and the
  // queues (ours and the receivers'), so a floor restarted from one, after a time or on a 2x
  // swing of the rate estimate as the first version did, sized windows of tens of MB.
  rtt_min_ = std::min(rtt_min_, rtt);
  // The estimate jitters: re-derive only when B moved by more than 1/8 or the floor moved.
  const bool bandwidth_moved = bytes_per_s > bandwidth_ * 1.125 || bytes_per_s * 1.125 < bandwidth_;
  if (bandwidth_moved) bandwidth_ = bytes_per_s;
  if (bandwidth_moved || rtt_min_ != old_rtt_min) Resize();
}

}  // namespace gradlane::sched
