#include "daemon/telemetry.h"

#include <algorithm>

namespace gradlane::daemon {

const char* PriorityClassName(int cls) {
  static constexpr const char* kNames[kPriorityClasses] = {"0",    "1",     "2-3",   "4-7",
                                                           "8-15", "16-31", "32-63", "64+"};
  return cls >= 0 && cls < kPriorityClasses ? kNames[cls] : "?";
}

const char* PeerStateText(PeerStateName s) {
  switch (s) {
    case PeerStateName::kConnecting:
      return "connecting";
    case PeerStateName::kUp:
      return "up";
    case PeerStateName::kDown:
      return "down";
  }
  return "?";
}

EventRing::EventRing(size_t capacity)
    : mask_(std::bit_ceil(std::max<size_t>(capacity, 2)) - 1),
      slots_(new TelemetryEvent[mask_ + 1]()) {}  // () value-initializes: every page touched

size_t EventRing::Drain(std::vector<TelemetryEvent>& out, size_t max) {
  const uint64_t head = head_.load(std::memory_order_relaxed);
  const uint64_t tail = tail_.load(std::memory_order_acquire);
  const uint64_t n = std::min<uint64_t>(tail - head, max);
  for (uint64_t i = 0; i < n; ++i) out.push_back(slots_[(head + i) & mask_]);
  head_.store(head + n, std::memory_order_release);
  return static_cast<size_t>(n);
}

SnapshotExchange::SnapshotExchange() = default;

void SnapshotExchange::Publish_st() {
  const uint32_t old = middle_.exchange(back_ | kFresh, std::memory_order_acq_rel);
  back_ = old & 3u;
}

const EngineSnapshot& SnapshotExchange::Latest() {
  if ((middle_.load(std::memory_order_acquire) & kFresh) != 0) {
    const uint32_t old = middle_.exchange(front_, std::memory_order_acq_rel);
    front_ = old & 3u;
  }
  return buffers_[front_];
}

Telemetry::Telemetry(const TelemetryOptions& options)
    : options_(options), ring_(options.ring_events) {}

}  // namespace gradlane::daemon
