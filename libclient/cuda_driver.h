// libclient/cuda_driver.h — the CUDA driver API calls libgradlane makes for tensors that live in
// GPU memory, found at run time with dlopen.
//
// Why dlopen: no host ever needs a GPU driver to build, install or run libgradlane. A process
// that never registers a device tensor never loads the driver; one that does, on a host without
// a driver or a GPU, gets a clear error at registration (GL_E_DEVICE), never a crash.
//
// Which library: $GRADLANE_CUDA_LIBRARY if set (the tests point it at an in-memory fake driver,
// tests/fakes/fake_cuda.cc), else libcuda.so.1. A library that loads but is the toolkit's link
// stub, or whose cuInit fails, is refused with the driver's own words.
//
// Types: built against the toolkit's cuda.h where meson finds one (then every pointer below has
// exactly the type cuda.h declares, which the compiler checks), else against the few stand-ins
// below, whose values are the driver's stable ABI.
//
// Guarantees: LoadCudaDriver is thread-safe; a loaded driver is never unloaded (CUDA state
// outlives any one client), so the table it returns stays valid for the life of the process.
// The calls are the driver's own, with its thread rules (every one here is thread-safe).
#ifndef GRADLANE_LIBCLIENT_CUDA_DRIVER_H_
#define GRADLANE_LIBCLIENT_CUDA_DRIVER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

#if GRADLANE_HAVE_CUDA_H
#include <cuda.h>
#endif

namespace gradlane::client {

namespace cu {
#if GRADLANE_HAVE_CUDA_H
using Result = CUresult;
using DevicePtr = CUdeviceptr;
using Device = CUdevice;
using Context = CUcontext;
using Stream = CUstream;
using Event = CUevent;
using PointerAttribute = CUpointer_attribute;
using DeviceAttribute = CUdevice_attribute;
using RangeHandleType = CUmemRangeHandleType;
inline constexpr DeviceAttribute kDeviceDmaBufSupported = CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED;
inline constexpr RangeHandleType kRangeHandleDmaBufFd = CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD;
inline constexpr PointerAttribute kPointerDeviceOrdinal = CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
using FlushTarget = CUflushGPUDirectRDMAWritesTarget;
using FlushScope = CUflushGPUDirectRDMAWritesScope;
inline constexpr FlushTarget kFlushTargetCurrentContext =
    CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX;
inline constexpr FlushScope kFlushToOwner = CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER;
inline constexpr DeviceAttribute kDeviceRdmaFlushOptions =
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS;
inline constexpr DeviceAttribute kDeviceRdmaWritesOrdering =
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING;
inline constexpr int kFlushOptionHost = CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST;
inline constexpr int kWritesOrderingOwner = CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER;
inline constexpr Result kSuccess = CUDA_SUCCESS;
inline constexpr Result kErrorNotReady = CUDA_ERROR_NOT_READY;
inline constexpr Result kErrorInvalidValue = CUDA_ERROR_INVALID_VALUE;
inline constexpr PointerAttribute kPointerContext = CU_POINTER_ATTRIBUTE_CONTEXT;
inline constexpr PointerAttribute kPointerMemoryType = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
inline constexpr PointerAttribute kPointerRangeStart = CU_POINTER_ATTRIBUTE_RANGE_START_ADDR;
inline constexpr PointerAttribute kPointerRangeSize = CU_POINTER_ATTRIBUTE_RANGE_SIZE;
inline constexpr unsigned kMemoryTypeDevice = CU_MEMORYTYPE_DEVICE;
inline const Stream kStreamLegacy = CU_STREAM_LEGACY;
inline constexpr unsigned kStreamDefault = CU_STREAM_DEFAULT;
inline constexpr unsigned kStreamNonBlocking = CU_STREAM_NON_BLOCKING;
inline constexpr unsigned kEventDisableTiming = CU_EVENT_DISABLE_TIMING;
inline constexpr unsigned kMemHostRegisterPortable = CU_MEMHOSTREGISTER_PORTABLE;
#else
using Result = int;
using DevicePtr = unsigned long long;
using Device = int;
using Context = struct CUctx_st*;
using Stream = struct CUstream_st*;
using Event = struct CUevent_st*;
using PointerAttribute = int;
using DeviceAttribute = int;
using RangeHandleType = int;
inline constexpr DeviceAttribute kDeviceDmaBufSupported = 124;
inline constexpr RangeHandleType kRangeHandleDmaBufFd = 1;
inline constexpr PointerAttribute kPointerDeviceOrdinal = 9;
using FlushTarget = int;
using FlushScope = int;
inline constexpr FlushTarget kFlushTargetCurrentContext = 0;
inline constexpr FlushScope kFlushToOwner = 100;
inline constexpr DeviceAttribute kDeviceRdmaFlushOptions = 117;
inline constexpr DeviceAttribute kDeviceRdmaWritesOrdering = 118;
inline constexpr int kFlushOptionHost = 1;
inline constexpr int kWritesOrderingOwner = 100;
inline constexpr Result kSuccess = 0;
inline constexpr Result kErrorNotReady = 600;
inline constexpr Result kErrorInvalidValue = 1;
inline constexpr PointerAttribute kPointerContext = 1;
inline constexpr PointerAttribute kPointerMemoryType = 2;
inline constexpr PointerAttribute kPointerRangeStart = 11;
inline constexpr PointerAttribute kPointerRangeSize = 12;
inline constexpr unsigned kMemoryTypeDevice = 2;
inline const Stream kStreamLegacy = reinterpret_cast<Stream>(uintptr_t{1});
inline constexpr unsigned kStreamDefault = 0;
inline constexpr unsigned kStreamNonBlocking = 1;
inline constexpr unsigned kEventDisableTiming = 2;
inline constexpr unsigned kMemHostRegisterPortable = 1;
#endif
}  // namespace cu

// The driver's entry points (the versioned symbols cuda.h's macros name: cuMemAlloc is
// cuMemAlloc_v2, ...). Those after the first group are for tools and tests that allocate
// device memory themselves (gradlane-check --device=cuda); libgradlane does not call them.
struct CudaDriver {
  std::string library;  // what was loaded, for messages

  cu::Result (*GetErrorString)(cu::Result, const char**);
  cu::Result (*PointerGetAttribute)(void* data, cu::PointerAttribute, cu::DevicePtr);
  cu::Result (*CtxPushCurrent)(cu::Context);
  cu::Result (*CtxPopCurrent)(cu::Context*);
  cu::Result (*StreamCreate)(cu::Stream*, unsigned flags);
  cu::Result (*StreamDestroy)(cu::Stream);
  cu::Result (*StreamSynchronize)(cu::Stream);
  cu::Result (*EventCreate)(cu::Event*, unsigned flags);
  cu::Result (*EventDestroy)(cu::Event);
  cu::Result (*EventRecord)(cu::Event, cu::Stream);
  cu::Result (*EventQuery)(cu::Event);
  cu::Result (*EventSynchronize)(cu::Event);
  cu::Result (*StreamWaitEvent)(cu::Stream, cu::Event, unsigned flags);
  cu::Result (*MemcpyDtoHAsync)(void* dst, cu::DevicePtr src, size_t bytes, cu::Stream);
  cu::Result (*MemcpyHtoDAsync)(cu::DevicePtr dst, const void* src, size_t bytes, cu::Stream);
  cu::Result (*MemHostRegister)(void* p, size_t bytes, unsigned flags);
  cu::Result (*MemHostUnregister)(void* p);

  cu::Result (*DeviceGetCount)(int*);
  cu::Result (*DeviceGet)(cu::Device*, int ordinal);
  cu::Result (*DevicePrimaryCtxRetain)(cu::Context*, cu::Device);
  cu::Result (*DevicePrimaryCtxRelease)(cu::Device);
  cu::Result (*CtxSetCurrent)(cu::Context);
  cu::Result (*MemAlloc)(cu::DevicePtr*, size_t);
  cu::Result (*MemFree)(cu::DevicePtr);
  cu::Result (*MemcpyHtoD)(cu::DevicePtr dst, const void* src, size_t bytes);
  cu::Result (*MemcpyDtoH)(void* dst, cu::DevicePtr src, size_t bytes);
  cu::Result (*CtxSynchronize)();

  // GPUDirect (CUDA 11.7 and later drivers): null where the driver lacks them, and then every
  // device tensor is staged. cuMemGetHandleForAddressRange exports GPU memory as a dma-buf fd.
  cu::Result (*DeviceGetAttribute)(int* value, cu::DeviceAttribute, cu::Device) = nullptr;
  cu::Result (*MemGetHandleForAddressRange)(void* handle, cu::DevicePtr, size_t bytes,
                                            cu::RangeHandleType,
                                            unsigned long long flags) = nullptr;
  // Makes a NIC's writes into GPU memory visible to later work (CUDA 11.3+); null: not offered,
  // and the completion's order is relied on.
  cu::Result (*FlushGPUDirectRDMAWrites)(cu::FlushTarget, cu::FlushScope) = nullptr;

  // "CUDA error 700 (an illegal memory access was encountered)".
  std::string Describe(cu::Result r) const;
};

// Loads and initialises the driver (cuInit) once per process and library path; a failure is
// not remembered, so a later call tries again (a driver installed meanwhile, or another
// $GRADLANE_CUDA_LIBRARY in a test). FailedPrecondition names the library and why: not found, a
// symbol missing, the toolkit's link stub, or cuInit's error (no device, a driver older than the
// kernel module).
absl::StatusOr<const CudaDriver*> LoadCudaDriver();

}  // namespace gradlane::client

#endif  // GRADLANE_LIBCLIENT_CUDA_DRIVER_H_
