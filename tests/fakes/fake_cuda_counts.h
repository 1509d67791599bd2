// tests/fakes/fake_cuda_counts.h — what the fake CUDA driver (fake_cuda.cc, loaded through
// GRADLANE_CUDA_LIBRARY) has done so far, for tests that check copies, exports and flushes.
//
// The struct mirrors gradlane_fake_cuda_counts_t field for field (the fake exports it with C
// linkage). Test-only; any thread (the fake locks).
#ifndef GRADLANE_TESTS_FAKES_FAKE_CUDA_COUNTS_H_
#define GRADLANE_TESTS_FAKES_FAKE_CUDA_COUNTS_H_

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>

namespace gradlane::fakes {

struct FakeCudaCounts {
  uint64_t copies_to_host, bytes_to_host, copies_to_device, bytes_to_device;
  uint64_t live_allocations, host_registered, dmabuf_exports, gpudirect_flushes;
};

// The fake's counts; false (and zeros) when GRADLANE_CUDA_LIBRARY does not name the fake or it
// is not loaded yet (load it first: LoadCudaDriver). FakeCounts() below for gtest tests.
inline bool ReadFakeCudaCounts(FakeCudaCounts* out) {
  *out = FakeCudaCounts{};
  const char* lib = std::getenv("GRADLANE_CUDA_LIBRARY");
  void* h = lib == nullptr ? nullptr : ::dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
  auto* fn =
      h == nullptr
          ? nullptr
          : reinterpret_cast<void (*)(FakeCudaCounts*)>(::dlsym(h, "gradlane_fake_cuda_counts"));
  if (fn != nullptr) fn(out);
  if (h != nullptr) ::dlclose(h);
  return fn != nullptr;
}

// The counts, as a test failure when they cannot be read.
inline FakeCudaCounts FakeCounts() {
  FakeCudaCounts out{};
  EXPECT_TRUE(ReadFakeCudaCounts(&out))
      << "GRADLANE_CUDA_LIBRARY must name the fake driver, loaded";
  return out;
}

}  // namespace gradlane::fakes

#endif  // GRADLANE_TESTS_FAKES_FAKE_CUDA_COUNTS_H_
