// transport/verbs/registration_cache.h — the verbs backend's memory registrations, shared by
// range and counted, so that memory can be registered with the device on one thread (the
// session server's, when a client's arena is set up) and found by the engine thread's
// RegisterRegion_st with a lookup instead of a second registration.
//
// Why: registering memory pins every page of it and builds the device's translation table;
// for a client arena of a GiB that takes tens to hundreds of milliseconds, and on the engine
// thread it would stall every other job's data path that long. Pure logic: the device is behind
// a function, so the tests run it on the in-memory NIC (tests/fakes/fake_verbs.h).
//
// Guarantees:
// - A registration is keyed by its exact range (base, bytes). Acquire of a range that is
//   registered counts one more user and returns its keys without device work; Release counts
//   one less, and the last one deregisters. Each Acquire that succeeded must be matched by one
//   Release of the same range, before the memory is unmapped or freed: a cached registration
//   of a range whose pages were replaced would hand out keys to the old pages.
// - Device work (register, deregister) runs on the calling thread, outside the lock: a lookup
//   on the engine thread never waits for another thread's registration. Two threads that
//   register the same new range at once both call the device; the second to finish finds the
//   first's entry, uses it and deregisters its own (counted in `duplicates`). The daemon never
//   does that (an arena reaches the engine only after its registration finished).
// - Deregistration happens when the last user releases, on that user's thread, so memory is
//   deregistered only after every holder has said it is done with it (the engine releases a
//   region only once no send from it is pending and its job's connections are closed).
// - Failure: Acquire returns the device's status unchanged (IbvDevice names RLIMIT_MEMLOCK when
//   the pinned-memory limit is what refused it); nothing is cached.
// Thread rules: every method, from any thread (one Mutex, daemon/mutex.h, held only for map
// operations).
#ifndef GRADLANE_TRANSPORT_VERBS_REGISTRATION_CACHE_H_
#define GRADLANE_TRANSPORT_VERBS_REGISTRATION_CACHE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/mutex.h"

namespace gradlane::transport::verbs {

// One registration with the device; destroying it deregisters the memory.
class MemoryRegistration {
 public:
  virtual ~MemoryRegistration() = default;
  virtual uint32_t lkey() const = 0;
  virtual uint32_t rkey() const = 0;
};

// The keys of registered memory: lkey for local gather/scatter elements, rkey for a peer's
// RDMA write.
struct RegionKeys {
  uint32_t lkey = 0;
  uint32_t rkey = 0;
};

struct RegistrationStats {
  uint64_t registrations = 0;    // device registrations made (successful)
  uint64_t hits = 0;             // Acquires answered from an existing registration
  uint64_t deregistrations = 0;  // device deregistrations (last user gone, or a duplicate)
  uint64_t failures = 0;         // device registrations refused
  uint64_t duplicates = 0;       // registrations lost to a concurrent one of the same range
  uint64_t entries = 0;          // ranges registered now
  uint64_t bytes = 0;            // bytes registered now
};

// The error text of a device registration of `bytes` that failed with errno `err`. The kernel
// pins registered memory and counts it against RLIMIT_MEMLOCK (unless the process has
// CAP_IPC_LOCK); a refusal for that reason is ENOMEM, so with a finite `memlock_limit` the text
// starts with the limit and its value, then how to raise it: that is what an operator must
// change, and the start is what fits a client's 128-byte error message.
// `memlock_limit`: nullopt when unlimited or unknown.
std::string RegistrationErrorText(uint64_t bytes, int err, std::optional<uint64_t> memlock_limit);

class RegistrationCache {
 public:
  // Registers [base, base + bytes) with the device for local and remote write.
  using RegisterFn = std::function<absl::StatusOr<std::unique_ptr<MemoryRegistration>>(
      void* base, uint64_t bytes)>;
  explicit RegistrationCache(RegisterFn register_fn) : register_(std::move(register_fn)) {}
  // Deregisters whatever is still registered (an owner that forgot a Release).
  ~RegistrationCache() = default;
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;

  // The range's keys, registering it first if it is not registered; one more user either way.
  // InvalidArgument for a null base or zero bytes (nothing to register).
  absl::StatusOr<RegionKeys> Acquire(void* base, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // One user less; the last deregisters (on this thread). NotFound for a range not acquired.
  absl::Status Release(void* base, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  RegistrationStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Key {
    uintptr_t base;
    uint64_t bytes;
    bool operator==(const Key&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.base, k.bytes);
    }
  };
  struct Entry {
    std::unique_ptr<MemoryRegistration> registration;
    RegionKeys keys;
    uint64_t users = 0;
  };

  const RegisterFn register_;
  mutable daemon::Mutex mu_;
  absl::flat_hash_map<Key, Entry> entries_ ABSL_GUARDED_BY(mu_);
  RegistrationStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradlane::transport::verbs

#endif  // GRADLANE_TRANSPORT_VERBS_REGISTRATION_CACHE_H_
