#include "transport/verbs/registration_cache.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradlane::transport::verbs {

std::string RegistrationErrorText(uint64_t bytes, int err, std::optional<uint64_t> memlock_limit) {
  // The cause first: a client sees only the first 127 bytes of a refused hello's message.
  if (err == ENOMEM && memlock_limit.has_value()) {
    return absl::StrCat("RLIMIT_MEMLOCK is ", *memlock_limit, " bytes, too low to pin ", bytes,
                        " for RDMA (ibv_reg_mr: ", std::strerror(err),
                        "); raise it: LimitMEMLOCK=infinity in gradlaned's unit, "
                        "`ulimit -l unlimited`, or CAP_IPC_LOCK");
  }
  return absl::StrCat("ibv_reg_mr of ", bytes, " bytes: ", std::strerror(err));
}

absl::StatusOr<RegionKeys> RegistrationCache::Acquire(void* base, uint64_t bytes) {
  if (base == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("registration of an empty range");
  }
  const Key key{reinterpret_cast<uintptr_t>(base), bytes};
  {
    daemon::MutexLock lock(&mu_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      ++it->second.users;
      ++stats_.hits;
      return it->second.keys;
    }
  }
  // Not registered: the device work runs without the lock, so lookups elsewhere go on.
  absl::StatusOr<std::unique_ptr<MemoryRegistration>> made = register_(base, bytes);
  if (!made.ok()) {
    daemon::MutexLock lock(&mu_);
    ++stats_.failures;
    return made.status();
  }
  std::unique_ptr<MemoryRegistration> lost;  // a concurrent registration of the range won
  RegionKeys keys;
  {
    daemon::MutexLock lock(&mu_);
    ++stats_.registrations;
    auto [it, inserted] = entries_.try_emplace(key);
    Entry& e = it->second;
    if (inserted) {
      e.keys = RegionKeys{(*made)->lkey(), (*made)->rkey()};
      e.registration = std::move(*made);
      ++stats_.entries;
      stats_.bytes += bytes;
    } else {
      lost = std::move(*made);
      ++stats_.duplicates;
      ++stats_.deregistrations;
    }
    ++e.users;
    keys = e.keys;
  }
  return keys;  // `lost`, if any, is deregistered here, outside the lock
}

absl::Status RegistrationCache::Release(void* base, uint64_t bytes) {
  const Key key{reinterpret_cast<uintptr_t>(base), bytes};
  std::unique_ptr<MemoryRegistration> last;
  {
    daemon::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return absl::NotFoundError("release of a range not registered");
    if (--it->second.users > 0) return absl::OkStatus();
    // Out of the map before the device work: a later Acquire of the same range (new pages at
    // the same address, say) registers afresh instead of finding keys on their way out.
    last = std::move(it->second.registration);
    entries_.erase(it);
    --stats_.entries;
    stats_.bytes -= bytes;
    ++stats_.deregistrations;
  }
  last.reset();  // deregisters, outside the lock
  return absl::OkStatus();
}

RegistrationStats RegistrationCache::Stats() const {
  daemon::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace gradlane::transport::verbs
