// shm/arena.h — the per-session shared-memory arena: one sealed memfd mapped by the daemon and
// by its client, plus the daemon's private allocator for tensor buffers inside it.
//
// Guarantees:
// - Arena owns its mapping and fd (move-only; unmapped and closed on destruction).
// - Create() seals the memfd against shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW |
//   F_SEAL_SEAL) before anyone else sees it, so a client cannot truncate the file under the
//   daemon's mapping and turn its reads into SIGBUS.
// - Inside the arena only offsets are exchanged. At() bounds-checks an (offset, length) pair
//   with overflow-safe arithmetic and returns nullptr instead of a stray pointer.
// - ArenaAllocator keeps its free list in private (daemon) memory, never in the arena: a
//   client cannot corrupt it. Allocations are aligned to at least 64 bytes (a cache line).
//   Control path only (it allocates); not thread-safe.
#ifndef GRADLANE_SHM_ARENA_H_
#define GRADLANE_SHM_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shm/doorbell.h"

namespace gradlane::shm {

inline constexpr uint64_t kPageSize = 4096;

class Arena {
 public:
  Arena() = default;
  Arena(Arena&& o) noexcept;
  Arena& operator=(Arena&& o) noexcept;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena();

  // Creates a sealed memfd of `bytes` (rounded up to a page) and maps it read-write.
  static absl::StatusOr<Arena> Create(std::string_view name, uint64_t bytes);
  // Maps an arena received from the daemon. Fails unless the fd is exactly `bytes` long and
  // sealed against shrinking (so the mapping can never fault).
  static absl::StatusOr<Arena> Map(UniqueFd fd, uint64_t bytes);

  uint8_t* base() const { return base_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_.get(); }
  // Closes the fd, keeping the mapping (the daemon drops its copy once it is passed on).
  void CloseFd() { fd_.Reset(); }

  // Pointer to [offset, offset + length) if it lies inside the arena, else nullptr.
  void* At(uint64_t offset, uint64_t length) const {
    if (offset > size_ || length > size_ - offset) return nullptr;
    return base_ + offset;
  }

 private:
  Arena(UniqueFd fd, uint8_t* base, uint64_t size) : fd_(std::move(fd)), base_(base), size_(size) {}
  void Unmap();

  UniqueFd fd_;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
};

// First-fit allocator with coalescing over [begin, end) of an arena.
class ArenaAllocator {
 public:
  static constexpr uint64_t kMinAlignment = GL_CACHE_LINE;

  // `alignment` is raised to kMinAlignment and must be a power of two; `begin` is rounded up.
  ArenaAllocator(uint64_t begin, uint64_t end, uint64_t alignment = 256);

  // Offset of a fresh block of at least `bytes` (> 0). ResourceExhausted when nothing fits.
  absl::StatusOr<uint64_t> Allocate(uint64_t bytes);
  // Returns a block from Allocate(). NotFound for anything else (double free included).
  absl::Status Free(uint64_t offset);

  uint64_t bytes_in_use() const { return in_use_; }
  uint64_t capacity() const { return end_ - begin_; }
  size_t free_blocks() const { return free_.size(); }

 private:
  uint64_t begin_;
  uint64_t end_;
  uint64_t alignment_;
  uint64_t in_use_ = 0;
  std::map<uint64_t, uint64_t> free_;  // offset -> size, disjoint, coalesced
  std::map<uint64_t, uint64_t> used_;  // offset -> size
};

}  // namespace gradlane::shm

#endif  // GRADLANE_SHM_ARENA_H_
