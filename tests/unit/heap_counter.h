// tests/unit/heap_counter.h — replaces the global allocation functions with malloc-based
// counting ones, so a test can assert that a data path does not touch the heap.
//
// Include it in exactly one source file of a test binary: it defines the replaceable
// operators. Every non-aligned form is replaced (plain, array, nothrow, sized), so memory from
// any `new` — including the nothrow one std::stable_sort's temporary buffer uses — goes back
// through the matching `delete`; replacing only some of them is an alloc/dealloc mismatch that
// AddressSanitizer reports. The count covers every thread; read it before and after the code
// under test, with no other thread allocating meanwhile.
//
// Under a clang sanitizer (the ThreadSanitizer pass of deploy/test.sh) the operators cannot be
// replaced: clang links the sanitizer's runtime statically, whole, with its own operator
// new/delete, and two definitions do not link. There the count comes from the sanitizer's
// allocator hooks instead, which see every allocation (new and malloc alike) on every thread.
#ifndef GRADLANE_TESTS_UNIT_HEAP_COUNTER_H_
#define GRADLANE_TESTS_UNIT_HEAP_COUNTER_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

#if defined(__clang__)  // (g++ 12 has no __has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer) || \
    __has_feature(memory_sanitizer)
#define GRADLANE_HEAP_COUNTER_HOOKS 1
#include <sanitizer/allocator_interface.h>
#endif
#endif

namespace gradlane_test {

inline std::atomic<uint64_t> heap_allocations{0};

inline uint64_t HeapAllocations() { return heap_allocations.load(std::memory_order_relaxed); }

// noinline keeps GCC from pairing an inlined malloc with a sized delete and warning.
__attribute__((noinline)) inline void* CountedMalloc(std::size_t n) noexcept {
  heap_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}

inline void* CountedMallocOrDie(std::size_t n) noexcept {
  void* p = CountedMalloc(n);
  if (p == nullptr) std::abort();  // tests have no exceptions to throw bad_alloc into
  return p;
}

#ifdef GRADLANE_HEAP_COUNTER_HOOKS
inline void CountAllocationHook(const volatile void*, std::size_t) {
  heap_allocations.fetch_add(1, std::memory_order_relaxed);
}
inline void IgnoreFreeHook(const volatile void*) {}
inline const bool hooks_installed =
    __sanitizer_install_malloc_and_free_hooks(&CountAllocationHook, &IgnoreFreeHook) != 0;
#endif

}  // namespace gradlane_test

#ifndef GRADLANE_HEAP_COUNTER_HOOKS
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) { return gradlane_test::CountedMallocOrDie(n); }
void* operator new[](std::size_t n) { return gradlane_test::CountedMallocOrDie(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return gradlane_test::CountedMalloc(n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return gradlane_test::CountedMalloc(n);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
#pragma GCC diagnostic pop
#endif  // !GRADLANE_HEAP_COUNTER_HOOKS

#endif  // GRADLANE_TESTS_UNIT_HEAP_COUNTER_H_
