// libclient/cuda_driver.cc — dlopen of the CUDA driver (cuda_driver.h says why).
#include "libclient/cuda_driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gradlane::client {
namespace {

// cuInit's result when the library is the toolkit's stub (lib/stubs/libcuda.so), which links
// but drives no GPU.
constexpr int kErrorStubLibrary = 34;

template <typename Fn>
bool Bind(void* lib, const char* symbol, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(::dlsym(lib, symbol));
  if (*out == nullptr && missing->empty()) *missing = symbol;
  return *out != nullptr;
}

// With cuda.h, each pointer must have the very type of the symbol cuda.h declares (its macros
// map the plain names to the versioned ones we bind).
#if GRADLANE_HAVE_CUDA_H
#define GRADLANE_CHECK_CUDA_TYPE(member, api) \
  static_assert(std::is_same_v<decltype(CudaDriver::member), decltype(&api)>, #api);
GRADLANE_CHECK_CUDA_TYPE(GetErrorString, cuGetErrorString)
GRADLANE_CHECK_CUDA_TYPE(PointerGetAttribute, cuPointerGetAttribute)
GRADLANE_CHECK_CUDA_TYPE(CtxPushCurrent, cuCtxPushCurrent)
GRADLANE_CHECK_CUDA_TYPE(CtxPopCurrent, cuCtxPopCurrent)
GRADLANE_CHECK_CUDA_TYPE(StreamCreate, cuStreamCreate)
GRADLANE_CHECK_CUDA_TYPE(StreamDestroy, cuStreamDestroy)
GRADLANE_CHECK_CUDA_TYPE(StreamSynchronize, cuStreamSynchronize)
GRADLANE_CHECK_CUDA_TYPE(EventCreate, cuEventCreate)
GRADLANE_CHECK_CUDA_TYPE(EventDestroy, cuEventDestroy)
GRADLANE_CHECK_CUDA_TYPE(EventRecord, cuEventRecord)
GRADLANE_CHECK_CUDA_TYPE(EventQuery, cuEventQuery)
GRADLANE_CHECK_CUDA_TYPE(EventSynchronize, cuEventSynchronize)
GRADLANE_CHECK_CUDA_TYPE(StreamWaitEvent, cuStreamWaitEvent)
GRADLANE_CHECK_CUDA_TYPE(MemcpyDtoHAsync, cuMemcpyDtoHAsync_v2)
GRADLANE_CHECK_CUDA_TYPE(MemcpyHtoDAsync, cuMemcpyHtoDAsync_v2)
GRADLANE_CHECK_CUDA_TYPE(MemHostRegister, cuMemHostRegister)
GRADLANE_CHECK_CUDA_TYPE(MemHostUnregister, cuMemHostUnregister)
GRADLANE_CHECK_CUDA_TYPE(DeviceGetCount, cuDeviceGetCount)
GRADLANE_CHECK_CUDA_TYPE(DeviceGet, cuDeviceGet)
GRADLANE_CHECK_CUDA_TYPE(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain)
GRADLANE_CHECK_CUDA_TYPE(DevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease)
GRADLANE_CHECK_CUDA_TYPE(CtxSetCurrent, cuCtxSetCurrent)
GRADLANE_CHECK_CUDA_TYPE(MemAlloc, cuMemAlloc)
GRADLANE_CHECK_CUDA_TYPE(MemFree, cuMemFree)
GRADLANE_CHECK_CUDA_TYPE(MemcpyHtoD, cuMemcpyHtoD_v2)
GRADLANE_CHECK_CUDA_TYPE(MemcpyDtoH, cuMemcpyDtoH_v2)
GRADLANE_CHECK_CUDA_TYPE(CtxSynchronize, cuCtxSynchronize)
GRADLANE_CHECK_CUDA_TYPE(DeviceGetAttribute, cuDeviceGetAttribute)
GRADLANE_CHECK_CUDA_TYPE(MemGetHandleForAddressRange, cuMemGetHandleForAddressRange)
GRADLANE_CHECK_CUDA_TYPE(FlushGPUDirectRDMAWrites, cuFlushGPUDirectRDMAWrites)
#undef GRADLANE_CHECK_CUDA_TYPE
#endif

absl::StatusOr<const CudaDriver*> Load(const std::string& path) {
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA driver: cannot load ", path, " (", why ? why : "unknown",
                     "); a GPU tensor needs the NVIDIA driver installed"));
  }
  auto d = std::make_unique<CudaDriver>();
  d->library = path;
  cu::Result (*init)(unsigned) = nullptr;
  std::string missing;
  Bind(lib, "cuInit", &init, &missing);
  Bind(lib, "cuGetErrorString", &d->GetErrorString, &missing);
  Bind(lib, "cuPointerGetAttribute", &d->PointerGetAttribute, &missing);
  Bind(lib, "cuCtxPushCurrent_v2", &d->CtxPushCurrent, &missing);
  Bind(lib, "cuCtxPopCurrent_v2", &d->CtxPopCurrent, &missing);
  Bind(lib, "cuStreamCreate", &d->StreamCreate, &missing);
  Bind(lib, "cuStreamDestroy_v2", &d->StreamDestroy, &missing);
  Bind(lib, "cuStreamSynchronize", &d->StreamSynchronize, &missing);
  Bind(lib, "cuEventCreate", &d->EventCreate, &missing);
  Bind(lib, "cuEventDestroy_v2", &d->EventDestroy, &missing);
  Bind(lib, "cuEventRecord", &d->EventRecord, &missing);
  Bind(lib, "cuEventQuery", &d->EventQuery, &missing);
  Bind(lib, "cuEventSynchronize", &d->EventSynchronize, &missing);
  Bind(lib, "cuStreamWaitEvent", &d->StreamWaitEvent, &missing);
  Bind(lib, "cuMemcpyDtoHAsync_v2", &d->MemcpyDtoHAsync, &missing);
  Bind(lib, "cuMemcpyHtoDAsync_v2", &d->MemcpyHtoDAsync, &missing);
  Bind(lib, "cuMemHostRegister_v2", &d->MemHostRegister, &missing);
  Bind(lib, "cuMemHostUnregister", &d->MemHostUnregister, &missing);
  Bind(lib, "cuDeviceGetCount", &d->DeviceGetCount, &missing);
  Bind(lib, "cuDeviceGet", &d->DeviceGet, &missing);
  Bind(lib, "cuDevicePrimaryCtxRetain", &d->DevicePrimaryCtxRetain, &missing);
  Bind(lib, "cuDevicePrimaryCtxRelease_v2", &d->DevicePrimaryCtxRelease, &missing);
  Bind(lib, "cuCtxSetCurrent", &d->CtxSetCurrent, &missing);
  Bind(lib, "cuMemAlloc_v2", &d->MemAlloc, &missing);
  Bind(lib, "cuMemFree_v2", &d->MemFree, &missing);
  Bind(lib, "cuMemcpyHtoD_v2", &d->MemcpyHtoD, &missing);
  Bind(lib, "cuMemcpyDtoH_v2", &d->MemcpyDtoH, &missing);
  Bind(lib, "cuCtxSynchronize", &d->CtxSynchronize, &missing);
  if (missing.empty()) {  // optional: without them, device tensors are staged
    std::string optional;
    if (!Bind(lib, "cuDeviceGetAttribute", &d->DeviceGetAttribute, &optional) ||
        !Bind(lib, "cuMemGetHandleForAddressRange", &d->MemGetHandleForAddressRange, &optional)) {
      d->DeviceGetAttribute = nullptr;
      d->MemGetHandleForAddressRange = nullptr;
    }
    std::string none;
    Bind(lib, "cuFlushGPUDirectRDMAWrites", &d->FlushGPUDirectRDMAWrites, &none);
  }
  if (!missing.empty()) {
    ::dlclose(lib);
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a usable CUDA driver: it has no ", missing));
  }
  const cu::Result r = init(0);
  if (r != cu::kSuccess) {
    std::string why = d->Describe(r);
    ::dlclose(lib);
    if (static_cast<int>(r) == kErrorStubLibrary) {
      return absl::FailedPreconditionError(
          absl::StrCat(path,
                       " is the CUDA toolkit's link stub, not a driver: a GPU tensor needs "
                       "the NVIDIA driver's libcuda.so.1"));
    }
    return absl::FailedPreconditionError(absl::StrCat("cuInit failed (", path, "): ", why));
  }
  // Never unloaded: device memory, streams and contexts made through it outlive any client.
  return d.release();
}

}  // namespace

std::string CudaDriver::Describe(cu::Result r) const {
  const char* text = nullptr;
  if (GetErrorString == nullptr || GetErrorString(r, &text) != cu::kSuccess || text == nullptr) {
    text = "no description";
  }
  return absl::StrCat("CUDA error ", static_cast<int>(r), " (", text, ")");
}

absl::StatusOr<const CudaDriver*> LoadCudaDriver() {
  // By library path: a test may point $GRADLANE_CUDA_LIBRARY elsewhere between clients.
  static std::mutex mu;
  static auto* loaded = new std::map<std::string, const CudaDriver*>();  // never freed, as above
  const char* env = std::getenv("GRADLANE_CUDA_LIBRARY");
  const std::string path = env != nullptr && *env != '\0' ? env : "libcuda.so.1";
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = loaded->find(path); it != loaded->end()) return it->second;
  auto d = Load(path);
  if (!d.ok()) return d.status();
  loaded->emplace(path, *d);
  return *d;
}

}  // namespace gradlane::client
