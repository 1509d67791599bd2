// daemon/mutex.h — a std::mutex that clang's thread-safety analysis understands: Mutex is a
// capability, MutexLock its scoped holder (Abseil's annotation macros, absl/base/
// thread_annotations.h), so data declared ABSL_GUARDED_BY(mu_) and functions declared
// ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) / ABSL_LOCKS_EXCLUDED(mu_) are checked at compile time by
// -Wthread-safety (the clang ThreadSanitizer pass of deploy/test.sh, which makes them errors).
//
// Why not absl::Mutex, which carries the same annotations: Debian's libabsl is built without
// ThreadSanitizer, so TSan does not see absl::Mutex order anything (its lock is a futex behind
// uninstrumented atomics) and reports every access to the data it guards as a race. std::mutex
// is pthread_mutex_t, which TSan intercepts; libstdc++'s std::mutex just has no annotations.
// Same behaviour and cost as std::mutex; not recursive; no reader mode.
#ifndef GRADLANE_DAEMON_MUTEX_H_
#define GRADLANE_DAEMON_MUTEX_H_

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace gradlane::daemon {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

// Holds `*mu` for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_MUTEX_H_
