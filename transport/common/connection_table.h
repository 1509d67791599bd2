// transport/common/connection_table.h — the connection slots of a transport backend and the
// PeerHandles that name them.
//
// Every backend hands the engine a PeerHandle per connection and must make sure that a handle
// kept after its connection went away never reaches a later connection in the same slot: the
// engine may post to, disconnect or ask the stats of a handle at any time, and a stray frame or
// epoll event may still carry it. A handle is therefore the slot index plus the slot's
// generation, and the generation moves on each time the slot is freed.
//
// Life of a slot: Alloc() → in use (Lookup finds it) → Retire() → still found by Lookup, so
// the callbacks and events of the current round can see it and check the backend's own "dead"
// state → ReleaseRetired() (the backend calls it where no handle of the round is in flight, e.g.
// at the start and end of Progress_st) → free, its old handles resolve to nothing from then on.
//
// Guarantees:
//   - A handle is never kNoPeer, and a freed slot's handles never resolve again until its
//     generation wraps (65535 frees of that one slot).
//   - Storage is allocated once in Init (control path) and never moves, so a Conn may hold
//     atomics and the backend may keep pointers to it; Alloc, Retire, ReleaseRetired, Lookup
//     and HandleOf never allocate (the free and retired lists are reserved to capacity).
//   - Free slots are reused last-freed-first (slot 0 first on a fresh table), so the slots in
//     use stay below a high water mark near the number of live connections; ForEach scans only
//     up to it.
//   - The table does not reset a Conn: Alloc returns it as its last use left it (a backend may
//     keep buffers across uses) and the backend clears what it must.
// Thread rules: everything on the backend's engine thread, except LookupAnyThread (a metrics
// thread reading a Conn's atomics, e.g. PeerStatsOf): the generation is a relaxed atomic.
#ifndef GRADLANE_TRANSPORT_COMMON_CONNECTION_TABLE_H_
#define GRADLANE_TRANSPORT_COMMON_CONNECTION_TABLE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "transport/transport.h"

namespace gradlane::transport {

// PeerHandle layout: generation (1..0xFFFF) in the high 16 bits, slot index in the low 16.
inline constexpr uint32_t kHandleIndexBits = 16;
inline constexpr uint32_t kHandleIndexMask = (1u << kHandleIndexBits) - 1;
inline constexpr uint32_t kMaxGeneration = 0xFFFFu;
// At most 65535 slots: index 0xFFFF with generation 0xFFFF would spell kNoPeer.
inline constexpr uint32_t kMaxConnectionSlots = kHandleIndexMask;

constexpr PeerHandle MakePeerHandle(uint32_t index, uint32_t generation) {
  return (generation << kHandleIndexBits) | index;
}
constexpr uint32_t HandleIndex(PeerHandle h) { return h & kHandleIndexMask; }
constexpr uint32_t HandleGeneration(PeerHandle h) { return h >> kHandleIndexBits; }
// 1..0xFFFF and back to 1: never 0, so a handle is never 0 either.
constexpr uint32_t NextGeneration(uint32_t g) { return g % kMaxGeneration + 1; }

template <class Conn>
class ConnectionTable {
 public:
  // Sizes the table (control path: the only allocation). InvalidArgument outside
  // [1, kMaxConnectionSlots]; FailedPrecondition if called twice.
  absl::Status Init(uint32_t capacity) {
    if (capacity == 0 || capacity > kMaxConnectionSlots) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_connections must be in [1, ", kMaxConnectionSlots, "]"));
    }
    if (capacity_ != 0) return absl::FailedPreconditionError("connection table already sized");
    capacity_ = capacity;
    conns_ = std::make_unique<Conn[]>(capacity);
    generation_ = std::make_unique<std::atomic<uint32_t>[]>(capacity);
    state_.assign(capacity, SlotState::kFree);
    free_.reserve(capacity);
    retired_.reserve(capacity);
    for (uint32_t i = capacity; i-- > 0;) {
      generation_[i].store(1, std::memory_order_relaxed);
      free_.push_back(i);  // pop_back gives slot 0 first
    }
    return absl::OkStatus();
  }

  uint32_t capacity() const { return capacity_; }
  // Slots [0, high_water()) have been in use at least once.
  uint32_t high_water() const { return high_water_; }
  uint32_t in_use() const { return capacity_ - static_cast<uint32_t>(free_.size()); }

  // A free slot, now in use; nullptr when every slot is taken.
  Conn* Alloc() {
    if (free_.empty()) return nullptr;
    const uint32_t idx = free_.back();
    free_.pop_back();
    state_[idx] = SlotState::kLive;
    high_water_ = std::max(high_water_, idx + 1);
    return &conns_[idx];
  }

  // The connection is dead; it is freed by the next ReleaseRetired. Idempotent.
  void Retire(Conn& c) {
    const uint32_t idx = IndexOf(c);
    if (state_[idx] != SlotState::kLive) return;
    state_[idx] = SlotState::kRetired;
    retired_.push_back(idx);
  }
  bool retired(const Conn& c) const { return state_[IndexOf(c)] == SlotState::kRetired; }

  // Frees every retired slot, oldest retirement first: `on_release(conn)` runs while its handle
  // still resolves (to drop buffers, reset state), then the generation moves on.
  template <class OnRelease>
  void ReleaseRetired(OnRelease&& on_release) {
    for (const uint32_t idx : retired_) {
      on_release(conns_[idx]);
      generation_[idx].store(NextGeneration(generation_[idx].load(std::memory_order_relaxed)),
                             std::memory_order_relaxed);
      state_[idx] = SlotState::kFree;
      free_.push_back(idx);
    }
    retired_.clear();
  }
  void ReleaseRetired() {
    ReleaseRetired([](Conn&) {});
  }

  // The slot `h` names if it is in use (live or retired) in that generation; else nullptr.
  Conn* Lookup(PeerHandle h) {
    const uint32_t idx = HandleIndex(h);
    if (idx >= capacity_ || state_[idx] == SlotState::kFree ||
        generation_[idx].load(std::memory_order_relaxed) != HandleGeneration(h)) {
      return nullptr;
    }
    return &conns_[idx];
  }
  const Conn* Lookup(PeerHandle h) const { return const_cast<ConnectionTable*>(this)->Lookup(h); }

  // Any thread: the slot whose generation matches `h` (the in-use flag is not read: it is the
  // engine thread's). A slot recycled between this check and the caller's reads yields the new
  // connection's values, so read only what is valid for any use of the slot (atomics).
  const Conn* LookupAnyThread(PeerHandle h) const {
    const uint32_t idx = HandleIndex(h);
    if (idx >= capacity_ ||
        generation_[idx].load(std::memory_order_relaxed) != HandleGeneration(h)) {
      return nullptr;
    }
    return &conns_[idx];
  }

  PeerHandle HandleOf(const Conn& c) const {
    const uint32_t idx = IndexOf(c);
    return MakePeerHandle(idx, generation_[idx].load(std::memory_order_relaxed));
  }
  uint32_t IndexOf(const Conn& c) const { return static_cast<uint32_t>(&c - conns_.get()); }
  Conn& at(uint32_t index) { return conns_[index]; }

  // Calls f(conn) for every slot in use (live or retired), by index. f may Alloc (a new slot
  // may or may not be visited) and Retire; slots are not freed during the walk.
  template <class F>
  void ForEach(F&& f) {
    for (uint32_t i = 0; i < high_water_; ++i) {
      if (state_[i] != SlotState::kFree) f(conns_[i]);
    }
  }

 private:
  enum class SlotState : uint8_t { kFree, kLive, kRetired };

  uint32_t capacity_ = 0;
  uint32_t high_water_ = 0;
  std::unique_ptr<Conn[]> conns_;
  // Atomic only so LookupAnyThread can check a handle without a data race.
  std::unique_ptr<std::atomic<uint32_t>[]> generation_;
  std::vector<SlotState> state_;
  std::vector<uint32_t> free_;
  std::vector<uint32_t> retired_;
};

}  // namespace gradlane::transport

#endif  // GRADLANE_TRANSPORT_COMMON_CONNECTION_TABLE_H_
