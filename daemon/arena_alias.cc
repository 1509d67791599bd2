#include "daemon/arena_alias.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradlane::daemon {

absl::StatusOr<std::shared_ptr<ArenaAlias>> ArenaAlias::Create(
    uint8_t* base, uint64_t bytes, transport::MemoryRegistrar* registrar) {
  // old_size 0: a new mapping of the same shared pages, not a move of the session's.
  void* alias = ::mremap(base, 0, bytes, MREMAP_MAYMOVE);
  if (alias == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mapping the arena: ", std::strerror(errno)));
  }
  std::shared_ptr<ArenaAlias> a(new ArenaAlias(static_cast<uint8_t*>(alias), bytes));
  if (registrar != nullptr) {
    if (absl::Status s = registrar->Pin(a->base_, bytes); !s.ok()) {
      // Short: the client reads this in a 128-byte hello reply; the device's text says the rest.
      return absl::Status(s.code(), absl::StrCat("arena: ", s.message()));
    }
    a->registrar_ = registrar;
  }
  return a;
}

ArenaAlias::~ArenaAlias() {
  // Deregistered before unmapped: no registration outlives the mapping it describes.
  if (registrar_ != nullptr) registrar_->Unpin(base_, bytes_);
  ::munmap(base_, bytes_);
}

}  // namespace gradlane::daemon
