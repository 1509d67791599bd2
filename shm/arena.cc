#include "shm/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradlane::shm {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

uint64_t RoundUp(uint64_t v, uint64_t align) { return (v + align - 1) & ~(align - 1); }

}  // namespace

Arena::Arena(Arena&& o) noexcept
    : fd_(std::move(o.fd_)),
      base_(std::exchange(o.base_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

Arena& Arena::operator=(Arena&& o) noexcept {
  if (this != &o) {
    Unmap();
    fd_ = std::move(o.fd_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

Arena::~Arena() { Unmap(); }

void Arena::Unmap() {
  if (base_ != nullptr) ::munmap(base_, size_);
  base_ = nullptr;
  size_ = 0;
}

absl::StatusOr<Arena> Arena::Create(std::string_view name, uint64_t bytes) {
  if (bytes == 0 || bytes > (uint64_t{1} << 46)) {
    return absl::InvalidArgumentError(absl::StrCat("arena size ", bytes, " out of range"));
  }
  bytes = RoundUp(bytes, kPageSize);
  const std::string n(name);
  UniqueFd fd(::memfd_create(n.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return Errno("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) return Errno("ftruncate");
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Errno("F_ADD_SEALS");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return Errno("mmap");
  return Arena(std::move(fd), static_cast<uint8_t*>(p), bytes);
}

absl::StatusOr<Arena> Arena::Map(UniqueFd fd, uint64_t bytes) {
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Errno("fstat");
  if (static_cast<uint64_t>(st.st_size) != bytes || bytes == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("arena fd is ", st.st_size, " bytes, expected ", bytes));
  }
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::FailedPreconditionError("arena fd is not sealed against shrinking");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return Errno("mmap");
  return Arena(std::move(fd), static_cast<uint8_t*>(p), bytes);
}

ArenaAllocator::ArenaAllocator(uint64_t begin, uint64_t end, uint64_t alignment) {
  alignment_ = alignment < kMinAlignment ? kMinAlignment : alignment;
  if ((alignment_ & (alignment_ - 1)) != 0) alignment_ = kMinAlignment;
  begin_ = RoundUp(begin, alignment_);
  end_ = end < begin_ ? begin_ : end;
  if (end_ > begin_) free_.emplace(begin_, end_ - begin_);
}

absl::StatusOr<uint64_t> ArenaAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0 || bytes > capacity()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot place ", bytes, " bytes in an arena region of ", capacity()));
  }
  const uint64_t need = RoundUp(bytes, alignment_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t off = it->first;
    const uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_.emplace(off + need, rest);
    used_.emplace(off, need);
    in_use_ += need;
    return off;
  }
  return absl::ResourceExhaustedError(absl::StrCat("arena full: ", bytes, " bytes wanted, ",
                                                   capacity() - in_use_, " free (fragmented)"));
}

absl::Status ArenaAllocator::Free(uint64_t offset) {
  auto u = used_.find(offset);
  if (u == used_.end()) return absl::NotFoundError(absl::StrCat("no block at ", offset));
  uint64_t off = u->first;
  uint64_t size = u->second;
  used_.erase(u);
  in_use_ -= size;
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(off, size);
  return absl::OkStatus();
}

}  // namespace gradlane::shm
