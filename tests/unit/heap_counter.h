// tests/unit/heap_counter.h — replaces the global allocation functions with malloc-based
// counting ones, so a test can assert that a data path does not touch the heap.
//
// Include it in exactly one source file of a test binary: it defines the replaceable
// operators. Every non-aligned form is replaced (plain, array, nothrow, sized), so memory from
// any `new` — including the nothrow one std::stable_sort's temporary buffer uses — goes back
// through the matching `delete`; replacing only some of them is an alloc/dealloc mismatch that
// AddressSanitizer reports. The count covers every thread; read it before and after the code
// under test, with no other thread allocating meanwhile.
#ifndef GRADLANE_TESTS_UNIT_HEAP_COUNTER_H_
#define GRADLANE_TESTS_UNIT_HEAP_COUNTER_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

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

}  // namespace gradlane_test

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

#endif  // GRADLANE_TESTS_UNIT_HEAP_COUNTER_H_
