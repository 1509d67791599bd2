// shm/ring.h — a single-producer single-consumer ring over shared memory (gl_ring_header +
// slots, see shm/abi.h), used for submissions (client -> daemon) and completions
// (daemon -> client).
//
// Guarantees:
// - One RingProducer and one RingConsumer per ring, each used by one thread at a time; they
//   may live in different processes. Neither allocates nor makes a system call.
// - The other side is not trusted. Each side keeps its own index in a private member and only
//   publishes it; the other side's index is read once into a local, checked against the
//   ring's capacity and monotonicity, and cached. An inconsistency is reported as kCorrupt
//   (never a crash, never a read outside the slots): the daemon then closes the session.
// - Ordering: the producer writes the payload, then the slot's sequence mark (release), then
//   its index (release). The consumer takes slot i only when the mark reads i + 1 (acquire),
//   so it never sees a half-written entry from a well-behaved producer; it reads the
//   producer's index only when a mark is missing, to tell "empty" from "corrupt". The consumer
//   frees slots by publishing its index (release) after copying the entry out.
// - The ring geometry (slots, where the slots are) comes from the creator's private state,
//   never from the shared header.
#ifndef GRADLANE_SHM_RING_H_
#define GRADLANE_SHM_RING_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "shm/abi.h"

namespace gradlane::shm {

static_assert(std::atomic_ref<uint64_t>::is_always_lock_free);
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free);
static_assert(std::atomic_ref<uint64_t>::required_alignment <= alignof(uint64_t));

template <typename T>
inline std::atomic_ref<T> Shared(T& field) {
  return std::atomic_ref<T>(field);
}

inline constexpr bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Bytes a ring of `slots` entries of type Entry occupies (header + slots).
template <typename Entry>
constexpr uint64_t RingBytes(uint32_t slots) {
  return sizeof(gl_ring_header) + uint64_t{slots} * sizeof(Entry);
}

// Writes the constant part of a header and zeroes indices, flag and sequence marks. Called by
// the creator (the daemon) before the memory is shared.
template <typename Entry>
void InitRing(gl_ring_header* header, Entry* slots, uint32_t n) {
  std::memset(header, 0, sizeof(*header));
  header->magic = GL_RING_MAGIC;
  header->slots = n;
  header->slot_size = sizeof(Entry);
  std::memset(slots, 0, sizeof(Entry) * n);
}

enum class RingResult { kOk, kEmpty, kFull, kCorrupt };

template <typename Entry>
class RingProducer {
  static_assert(sizeof(Entry) % GL_CACHE_LINE == 0, "one or more whole cache lines per slot");
  static_assert(std::is_trivially_copyable_v<Entry>);
  static_assert(offsetof(Entry, seq) == 0);

 public:
  RingProducer() = default;
  // `slots` must be a power of two (the caller validated the geometry it was told).
  // `start` is the producer's index when this object takes over (0 for a fresh ring).
  RingProducer(gl_ring_header* header, Entry* slots, uint32_t n, uint64_t start = 0)
      : header_(header), slots_(slots), mask_(n - 1), n_(n), tail_(start), cached_head_(start) {}

  // Copies `e` (its seq is overwritten) into the next slot and publishes it.
  // kFull: no free slot; kCorrupt: the consumer's index is inconsistent.
  RingResult TryPush(const Entry& e) {
    if (tail_ - cached_head_ >= n_) {
      const RingResult r = RefreshHead();
      if (r != RingResult::kOk) return r;
      if (tail_ - cached_head_ >= n_) return RingResult::kFull;
    }
    Entry* slot = &slots_[tail_ & mask_];
    // Payload first (everything after the mark), then the mark, then the index.
    std::memcpy(reinterpret_cast<char*>(slot) + sizeof(uint64_t),
                reinterpret_cast<const char*>(&e) + sizeof(uint64_t),
                sizeof(Entry) - sizeof(uint64_t));
    Shared(slot->seq).store(tail_ + 1, std::memory_order_release);
    ++tail_;
    Shared(header_->tail).store(tail_, std::memory_order_release);
    return RingResult::kOk;
  }

  // Free slots as far as this side knows after re-reading the consumer's index; kCorrupt
  // leaves `*free` untouched.
  RingResult FreeSlots(uint32_t* free) {
    const RingResult r = RefreshHead();
    if (r != RingResult::kOk) return r;
    *free = static_cast<uint32_t>(n_ - (tail_ - cached_head_));
    return RingResult::kOk;
  }

  // Free slots by the cached consumer index (no shared read): a lower bound.
  uint32_t CachedFreeSlots() const { return static_cast<uint32_t>(n_ - (tail_ - cached_head_)); }

  uint64_t tail() const { return tail_; }
  uint32_t slots() const { return n_; }
  gl_ring_header* header() const { return header_; }

 private:
  RingResult RefreshHead() {
    const uint64_t h = Shared(header_->head).load(std::memory_order_acquire);
    // The consumer can neither free what was never published nor move backwards.
    if (h > tail_ || h < cached_head_) return RingResult::kCorrupt;
    cached_head_ = h;
    return RingResult::kOk;
  }

  gl_ring_header* header_ = nullptr;
  Entry* slots_ = nullptr;
  uint64_t mask_ = 0;
  uint64_t n_ = 0;
  uint64_t tail_ = 0;         // private truth; header_->tail is only a publication
  uint64_t cached_head_ = 0;  // last consumer index read (validated)
};

template <typename Entry>
class RingConsumer {
  static_assert(sizeof(Entry) % GL_CACHE_LINE == 0, "one or more whole cache lines per slot");
  static_assert(std::is_trivially_copyable_v<Entry>);
  static_assert(offsetof(Entry, seq) == 0);

 public:
  RingConsumer() = default;
  RingConsumer(gl_ring_header* header, Entry* slots, uint32_t n, uint64_t start = 0)
      : header_(header), slots_(slots), mask_(n - 1), n_(n), head_(start), cached_tail_(start) {}

  // Copies the next entry into `*out` and frees its slot.
  // kEmpty: nothing published; kCorrupt: the producer's index or a mark is inconsistent.
  RingResult TryPop(Entry* out) {
    const RingResult r = Peek(out);
    if (r == RingResult::kOk) {
      ++head_;
      Shared(header_->head).store(head_, std::memory_order_release);
    }
    return r;
  }

  // Like TryPop but publishes the consumer index only once for the whole batch.
  // Returns the number taken; `*result` is kOk, kEmpty (ran dry) or kCorrupt.
  uint32_t TryPopBatch(Entry* out, uint32_t max, RingResult* result) {
    uint32_t n = 0;
    RingResult r = RingResult::kOk;
    while (n < max) {
      r = Peek(&out[n]);
      if (r != RingResult::kOk) break;
      ++head_;
      ++n;
    }
    if (n > 0) Shared(header_->head).store(head_, std::memory_order_release);
    *result = (n == max) ? RingResult::kOk : r;
    return n;
  }

  // True when the next slot's mark says it is published. Used by the sleep protocol's
  // re-check after arming, so it must be a fresh read (it is: acquire load of the mark).
  bool HasEntry() const {
    const Entry* slot = &slots_[head_ & mask_];
    return Shared(const_cast<uint64_t&>(slot->seq)).load(std::memory_order_acquire) == head_ + 1;
  }

  uint64_t head() const { return head_; }
  uint32_t slots() const { return n_; }
  gl_ring_header* header() const { return header_; }

 private:
  RingResult Peek(Entry* out) {
    Entry* slot = &slots_[head_ & mask_];
    const uint64_t mark = Shared(slot->seq).load(std::memory_order_acquire);
    if (mark != head_ + 1) {
      // Not published yet — unless the producer's index says it was, which a well-behaved
      // producer cannot cause (mark is released before the index).
      if (head_ < cached_tail_) return RingResult::kCorrupt;
      const uint64_t t = Shared(header_->tail).load(std::memory_order_acquire);
      // The producer stores a mark before its index, so having taken entry head_ - 1 by its
      // mark we may still read the index one behind: head_ - 1 is honest, less is not.
      if (t + 1 < head_ || (t > head_ && t - head_ > n_)) return RingResult::kCorrupt;
      if (t <= head_) return RingResult::kEmpty;
      cached_tail_ = t;
      // The index moved past us: re-read the mark now that the index was acquired.
      if (Shared(slot->seq).load(std::memory_order_acquire) != head_ + 1) {
        return RingResult::kCorrupt;
      }
    }
    std::memcpy(out, slot, sizeof(Entry));
    out->seq = head_ + 1;  // the copy may have raced a hostile writer; keep the mark we checked
    if (head_ + 1 > cached_tail_) cached_tail_ = head_ + 1;
    return RingResult::kOk;
  }

  gl_ring_header* header_ = nullptr;
  Entry* slots_ = nullptr;
  uint64_t mask_ = 0;
  uint64_t n_ = 0;
  uint64_t head_ = 0;         // private truth
  uint64_t cached_tail_ = 0;  // producer index known to be reached (validated)
};

}  // namespace gradlane::shm

#endif  // GRADLANE_SHM_RING_H_
