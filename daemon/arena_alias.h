// daemon/arena_alias.h — the daemon's own mapping of a client's arena, made when the session is
// set up, and the arena's registration with the transport's device.
//
// Why a second mapping: the engine reads and writes the arena for as long as a job's transport
// may (a peer's payload landing, a send's source), which can outlast the client and its
// session; the alias keeps the pages mapped for the daemon until every holder let go. Why at
// session set-up, on the session server's acceptor thread: registering a GiB arena with an RDMA
// device pins every page (tens to hundreds of milliseconds); done here, the engine thread's
// RegisterRegion_st of the alias is a lookup (transport::MemoryRegistrar).
//
// Ownership: shared (std::shared_ptr) by the session and each job that uses the arena; one
// registration serves them all. The last holder unpins (the device deregisters when no region
// still holds the range), then unmaps. The engine thread never drops the last reference
// itself: it hands its references to SessionServer::Retire, and the acceptor thread drops them,
// so deregistering a GiB is off the data path too.
// Thread rules: Create and destruction on any thread; base()/bytes() are fixed at creation.
#ifndef GRADLANE_DAEMON_ARENA_ALIAS_H_
#define GRADLANE_DAEMON_ARENA_ALIAS_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace gradlane::daemon {

class ArenaAlias {
 public:
  // Maps the shared mapping [base, base + bytes) a second time and, with a registrar, pins the
  // alias on the calling thread. Failure: Internal for the mapping, the registrar's status
  // (with the byte count and, for the pinned-memory limit, its name) for the registration;
  // nothing is left mapped or pinned.
  static absl::StatusOr<std::shared_ptr<ArenaAlias>> Create(uint8_t* base, uint64_t bytes,
                                                            transport::MemoryRegistrar* registrar);
  ~ArenaAlias();
  ArenaAlias(const ArenaAlias&) = delete;
  ArenaAlias& operator=(const ArenaAlias&) = delete;

  uint8_t* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  bool pinned() const { return registrar_ != nullptr; }

 private:
  ArenaAlias(uint8_t* base, uint64_t bytes) : base_(base), bytes_(bytes) {}
  uint8_t* const base_;
  const uint64_t bytes_;
  transport::MemoryRegistrar* registrar_ = nullptr;  // set once pinned
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_ARENA_ALIAS_H_
