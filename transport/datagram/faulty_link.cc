#include "transport/datagram/faulty_link.h"

#include <cstring>

namespace gradlane::transport::datagram {

absl::Status FaultyLink::Validate(const FaultOptions& f) {
  for (double p : {f.drop_probability, f.reorder_probability, f.duplicate_probability}) {
    if (!(p >= 0 && p < 1))
      return absl::InvalidArgumentError("fault probabilities must be in [0, 1)");
  }
  if (f.drop_every == 1) return absl::InvalidArgumentError("drop_every=1 would drop everything");
  return absl::OkStatus();
}

FaultyLink::FaultyLink(DatagramLink* inner, const FaultOptions& faults, size_t max_held_head_bytes)
    : inner_(inner),
      faults_(faults),
      rng_(faults.seed * 0x9E3779B97F4A7C15ull + 1),
      held_head_(max_held_head_bytes) {}

double FaultyLink::NextRandom() {
  // splitmix64: deterministic per seed, so a fault pattern can be replayed.
  uint64_t z = (rng_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

bool FaultyLink::Send_st(const Ipv4Endpoint& to, std::span<const uint8_t> head,
                         std::span<const uint8_t> body) {
  const FaultOptions& f = faults_;
  // The order of the draws is part of the replay: a generator value per enabled fault, drop first.
  ++count_;
  if ((f.drop_every != 0 && count_ % f.drop_every == 0) ||
      (f.drop_probability > 0 && NextRandom() < f.drop_probability)) {
    drops_.Add_st(1);
    return true;  // "sent": the wire lost it
  }
  if (f.duplicate_probability > 0 && NextRandom() < f.duplicate_probability) {
    if (inner_->Send_st(to, head, body)) {
      duplicates_.Add_st(1);
      sent_.Add_st(1);
    }
  }
  if (!held_ && f.reorder_probability > 0 && head.size() <= held_head_.size() &&
      NextRandom() < f.reorder_probability) {
    held_ = true;
    held_to_ = to;
    std::memcpy(held_head_.data(), head.data(), head.size());
    held_head_bytes_ = head.size();
    held_body_ = body;
    reorders_.Add_st(1);
    return true;
  }
  if (!inner_->Send_st(to, head, body)) return false;
  sent_.Add_st(1);
  if (held_) ReleaseHeld_st();  // the held one goes after this: reordered
  return true;
}

void FaultyLink::ReleaseHeld_st() {
  if (!held_) return;
  held_ = false;
  if (inner_->Send_st(held_to_, std::span<const uint8_t>(held_head_.data(), held_head_bytes_),
                      held_body_)) {
    sent_.Add_st(1);
  }
}

FaultStats FaultyLink::Stats() const {
  return FaultStats{sent_.Get(), drops_.Get(), reorders_.Get(), duplicates_.Get()};
}

}  // namespace gradlane::transport::datagram
