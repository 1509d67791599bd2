// tests/fakes/fake_cuda.cc — an in-memory CUDA driver (libgradlane_fake_cuda.so) for the tests
// of GPU tensors on machines without a GPU: libgradlane loads it through
// GRADLANE_CUDA_LIBRARY exactly as it loads libcuda.so.1.
//
// What it models, and why:
// - Device memory is not host memory: a device pointer lies in an address range reserved with
//   no access, and the bytes live elsewhere. Code that touches a device pointer as if it were a
//   host one faults at once instead of passing by luck.
// - Asynchronous copies are asynchronous: a copy on a stream happens only when the stream is
//   synchronized or an event recorded after it is waited for — and the first cuEventQuery of an
//   event says "not ready". Code that reads a copy's destination before waiting for it sees
//   stale bytes and fails its bit-exact check.
// - cuMemcpyHtoD from pageable memory returns once it has read the source, before the device
//   bytes land (CUDA documents that the last of them may still be in flight; on an H100 a copy
//   on a non-blocking stream read the last 2 bytes of a 4 MiB + 2 copy stale). Stricter than
//   the driver we measured, a blocking stream's ordering does not cover them here. They land
//   at cuStreamSynchronize of the legacy stream (0 or CU_STREAM_LEGACY), cuCtxSynchronize,
//   cuMemcpyDtoH or cuMemFree. Work queued on the legacy stream itself (event records) is
//   waited for by blocking streams, and an event recorded on stream 0 covers the pageable
//   copies issued before it. Not modelled: the legacy stream waiting for blocking streams' work
//   (no caller relies on it). A non-blocking stream waits for neither: its copy runs
//   first and they land just after it, so code that copies a just-written tensor on one reads
//   stale bytes, and its copy back is overwritten.
// - Faults on request, read by cuInit: GRADLANE_FAKE_CUDA_FAIL_COPY=N makes the Nth asynchronous
//   copy after it (1-based, both directions) fail with CUDA error 700;
//   GRADLANE_FAKE_CUDA_NO_DEVICE=1 makes cuInit say there is no device;
//   GRADLANE_FAKE_CUDA_NO_DMABUF=1 makes the device say it has no dma-buf support;
//   GRADLANE_FAKE_CUDA_NO_RDMA_FLUSH=1 (read at each attribute query, not at cuInit) that it
//   cannot flush a NIC's writes (it never orders them itself).
// - GPUDirect: every allocation's bytes are a memfd, page-aligned (as the driver's granularity
//   is), and cuMemGetHandleForAddressRange exports an allocation's pages as that memfd, the
//   "dma-buf" the fake transport maps and reads as a NIC would.
// Only the calls libgradlane and its tools use exist; each is thread-safe (one mutex).
// gradlane_fake_cuda_counts() lets a test see what happened.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

namespace {

using Result = int;
using DevicePtr = unsigned long long;

constexpr Result kSuccess = 0;
constexpr Result kInvalidValue = 1;
constexpr Result kNotInitialized = 3;
constexpr Result kNoDevice = 100;
constexpr Result kInvalidHandle = 400;
constexpr Result kNotReady = 600;
constexpr Result kIllegalAddress = 700;

constexpr int kAttrContext = 1;
constexpr int kAttrMemoryType = 2;
constexpr int kAttrDeviceOrdinal = 9;
constexpr int kAttrRangeStart = 11;
constexpr int kDeviceAttrDmaBufSupported = 124;
constexpr int kDeviceAttrRdmaFlushOptions = 117;
constexpr int kDeviceAttrRdmaWritesOrdering = 118;
constexpr int kRangeHandleDmaBufFd = 1;
constexpr Result kNotSupported = 801;
constexpr int kAttrRangeSize = 12;
constexpr unsigned kMemoryTypeDevice = 2;
constexpr unsigned kStreamNonBlocking = 1;

// 16 GiB of address space, reserved without access or backing.
constexpr uint64_t kDeviceSpace = uint64_t{16} << 30;
constexpr uint64_t kAlign = 4096;  // whole pages: each allocation is a memfd of its own

struct Event;
struct Op {
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  size_t bytes = 0;
  Event* marks = nullptr;         // an event's record point instead of a copy
  std::vector<std::byte> source;  // the source as read at the call (legacy-stream copies)
};
struct Stream {
  std::deque<Op> ops;
  bool blocking = true;  // ordered after the legacy default stream
};
struct Event {
  Stream* stream = nullptr;  // where it waits to be reached; null once reached
  bool queried = false;
};
struct Context {
  int device = 0;
};

struct State {
  std::mutex mu;
  bool initialised = false;
  std::byte* space = nullptr;
  uint64_t next = 0;
  struct Alloc {
    uint64_t bytes;
    std::byte* data;  // a shared mapping of `fd`, `mapped` bytes (whole pages)
    int fd;
    uint64_t mapped;
  };
  bool dmabuf = true;
  uint64_t dmabuf_exports = 0, gpudirect_flushes = 0;
  std::map<DevicePtr, Alloc> allocs;
  Context context;
  uint64_t copies_to_host = 0, copies_to_device = 0, bytes_to_host = 0, bytes_to_device = 0;
  uint64_t async_copies = 0, fail_copy_at = 0;
  uint64_t host_registered = 0;
  Stream legacy;                 // the legacy default stream (stream 0)
  Stream pageable;               // cuMemcpyHtoD copies not landed yet
  std::vector<Stream*> streams;  // every live stream, for cuCtxSynchronize
};
State& S() {
  static State* s = new State();  // never destroyed: the library may be used during exit
  return *s;
}

// The host bytes behind [p, p + n), or null when the range is not inside one allocation.
std::byte* Translate(State& s, DevicePtr p, uint64_t n) {
  auto it = s.allocs.upper_bound(p);
  if (it == s.allocs.begin()) return nullptr;
  --it;
  const uint64_t off = p - it->first;
  if (off > it->second.bytes || n > it->second.bytes - off) return nullptr;
  return it->second.data + off;
}

void RunUntil(Stream* st, const Event* until);

// What a copy on `st` did not wait for lands just after it (the race lost by the code that
// did not wait): pageable cuMemcpyHtoD copies, and for a non-blocking stream the legacy
// stream's work.
void LandWhatItDidNotWaitFor(const Stream* st);

void RunUntil(Stream* st, const Event* until) {
  while (!st->ops.empty()) {
    Op op = std::move(st->ops.front());
    st->ops.pop_front();
    if (op.marks != nullptr) {
      op.marks->stream = nullptr;
      if (op.marks == until) return;
    } else {
      if (op.bytes > 0)
        std::memcpy(op.dst, op.source.empty() ? op.src : op.source.data(), op.bytes);
      LandWhatItDidNotWaitFor(st);
    }
  }
}

void LandWhatItDidNotWaitFor(const Stream* st) {
  if (st == &S().legacy || st == &S().pageable) return;
  RunUntil(&S().pageable, nullptr);
  if (!st->blocking) RunUntil(&S().legacy, nullptr);
}

// Stream 0 and CU_STREAM_LEGACY name the legacy default stream.
Stream* Resolve(Stream* st) {
  return st == nullptr || reinterpret_cast<uintptr_t>(st) == 1 ? &S().legacy : st;
}

// What must happen before new work on `st` (or on the legacy stream itself: st == null) starts.
void OrderAfterLegacy(State& s, const Stream* st) {
  if (st == nullptr || st->blocking) RunUntil(&s.legacy, nullptr);
}

void SynchronizeAll(State& s) {
  RunUntil(&s.pageable, nullptr);
  RunUntil(&s.legacy, nullptr);
  for (Stream* st : s.streams) RunUntil(st, nullptr);
}

Result Enqueue(State& s, Stream* st, std::byte* dst, const std::byte* src, size_t n) {
  st = Resolve(st);
  if (++s.async_copies == s.fail_copy_at) return kIllegalAddress;
  OrderAfterLegacy(s, st);
  st->ops.push_back(Op{dst, src, n, nullptr});
  return kSuccess;
}

}  // namespace

extern "C" {

Result cuInit(unsigned flags) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (flags != 0) return kInvalidValue;
  if (const char* e = std::getenv("GRADLANE_FAKE_CUDA_NO_DEVICE"); e != nullptr && *e == '1') {
    return kNoDevice;
  }
  // Counted from this cuInit on (a test loads the fake again under another name to arm it).
  s.fail_copy_at = 0;
  if (const char* e = std::getenv("GRADLANE_FAKE_CUDA_FAIL_COPY"); e != nullptr && *e != '\0') {
    s.fail_copy_at = s.async_copies + std::strtoull(e, nullptr, 10);
  }
  if (s.space == nullptr) {
    void* p = ::mmap(nullptr, kDeviceSpace, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    if (p == MAP_FAILED) return kNoDevice;
    s.space = static_cast<std::byte*>(p);
  }
  s.dmabuf = true;
  if (const char* e = std::getenv("GRADLANE_FAKE_CUDA_NO_DMABUF"); e != nullptr && *e == '1') {
    s.dmabuf = false;
  }
  s.initialised = true;
  return kSuccess;
}

Result cuDeviceGetAttribute(int* value, int attribute, int dev) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (value == nullptr || dev != 0) return kInvalidValue;
  switch (attribute) {
    case kDeviceAttrDmaBufSupported:
      *value = s.dmabuf ? 1 : 0;
      return kSuccess;
    case kDeviceAttrRdmaFlushOptions: {  // cuFlushGPUDirectRDMAWrites offered (the HOST bit)
      const char* e = std::getenv("GRADLANE_FAKE_CUDA_NO_RDMA_FLUSH");  // read per query
      *value = e != nullptr && *e == '1' ? 0 : 1;
      return kSuccess;
    }
    case kDeviceAttrRdmaWritesOrdering:  // none: a NIC's writes need that flush
      *value = 0;
      return kSuccess;
    default:
      return kInvalidValue;
  }
}

// Nothing to flush (the "NIC" writes the memfd the allocation is): counted.
Result cuFlushGPUDirectRDMAWrites(int target, int scope) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (target != 0 || (scope != 100 && scope != 200)) return kInvalidValue;
  ++s.gpudirect_flushes;
  return kSuccess;
}

// Exports whole allocations only (what libgradlane asks for: the pages of one allocation).
Result cuMemGetHandleForAddressRange(void* handle, DevicePtr p, size_t bytes, int type,
                                     unsigned long long flags) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (!s.dmabuf) return kNotSupported;
  if (handle == nullptr || type != kRangeHandleDmaBufFd || flags != 0) return kInvalidValue;
  if (p % 4096 != 0 || bytes % 4096 != 0) return kInvalidValue;  // the driver's page rule
  auto it = s.allocs.find(p);
  if (it == s.allocs.end() || bytes != it->second.mapped) return kInvalidValue;
  const int fd = ::fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return kInvalidValue;
  *static_cast<int*>(handle) = fd;
  ++s.dmabuf_exports;
  return kSuccess;
}

Result cuGetErrorString(Result r, const char** text) {
  if (text == nullptr) return kInvalidValue;
  switch (r) {
    case kSuccess:
      *text = "no error";
      break;
    case kInvalidValue:
      *text = "invalid argument";
      break;
    case kNotInitialized:
      *text = "initialization error";
      break;
    case kNoDevice:
      *text = "no CUDA-capable device is detected";
      break;
    case kInvalidHandle:
      *text = "invalid resource handle";
      break;
    case kNotReady:
      *text = "device not ready";
      break;
    case kIllegalAddress:
      *text = "an illegal memory access was encountered";
      break;
    default:
      *text = "unknown error";
      return kInvalidValue;
  }
  return kSuccess;
}

Result cuDeviceGetCount(int* n) {
  if (n == nullptr) return kInvalidValue;
  *n = 1;
  return kSuccess;
}

Result cuDeviceGet(int* dev, int ordinal) {
  if (dev == nullptr || ordinal != 0) return kInvalidValue;
  *dev = 0;
  return kSuccess;
}

Result cuDevicePrimaryCtxRetain(Context** ctx, int dev) {
  if (ctx == nullptr || dev != 0) return kInvalidValue;
  *ctx = &S().context;
  return kSuccess;
}
Result cuDevicePrimaryCtxRelease_v2(int dev) { return dev == 0 ? kSuccess : kInvalidValue; }
Result cuCtxSetCurrent(Context*) { return kSuccess; }
Result cuCtxPushCurrent_v2(Context* ctx) { return ctx == nullptr ? kInvalidHandle : kSuccess; }
Result cuCtxPopCurrent_v2(Context** ctx) {
  if (ctx != nullptr) *ctx = &S().context;
  return kSuccess;
}

Result cuMemAlloc_v2(DevicePtr* out, size_t bytes) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (!s.initialised) return kNotInitialized;
  if (out == nullptr || bytes == 0) return kInvalidValue;
  const uint64_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  if (rounded > kDeviceSpace - s.next) return kInvalidValue;
  const DevicePtr p = reinterpret_cast<DevicePtr>(s.space + s.next);
  const int fd = ::memfd_create("fake-cuda", MFD_CLOEXEC);
  if (fd < 0) return kInvalidValue;
  void* data = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(rounded)) == 0) {
    data = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (data == MAP_FAILED) {
    ::close(fd);
    return kInvalidValue;
  }
  s.next += rounded;  // never reused: a stale pointer never aliases a newer allocation
  s.allocs.emplace(p, State::Alloc{bytes, static_cast<std::byte*>(data), fd, rounded});
  *out = p;
  return kSuccess;
}

Result cuMemFree_v2(DevicePtr p) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  SynchronizeAll(s);  // as the driver's cuMemFree does; no queued copy may outlive its memory
  auto it = s.allocs.find(p);
  if (it == s.allocs.end()) return kInvalidValue;
  // An exported dma-buf keeps the pages (its fd is another reference), as the driver's does.
  ::munmap(it->second.data, it->second.mapped);
  ::close(it->second.fd);
  s.allocs.erase(it);
  return kSuccess;
}

Result cuPointerGetAttribute(void* data, int attribute, DevicePtr p) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (data == nullptr) return kInvalidValue;
  auto it = s.allocs.upper_bound(p);
  if (it == s.allocs.begin()) return kInvalidValue;
  --it;
  if (p - it->first >= it->second.bytes) return kInvalidValue;
  switch (attribute) {
    case kAttrContext:
      *static_cast<Context**>(data) = &s.context;
      return kSuccess;
    case kAttrMemoryType:
      *static_cast<unsigned*>(data) = kMemoryTypeDevice;
      return kSuccess;
    case kAttrRangeStart:
      *static_cast<DevicePtr*>(data) = it->first;
      return kSuccess;
    case kAttrDeviceOrdinal:
      *static_cast<int*>(data) = 0;
      return kSuccess;
    case kAttrRangeSize:
      *static_cast<size_t*>(data) = it->second.bytes;
      return kSuccess;
    default:
      return kInvalidValue;
  }
}

Result cuMemHostRegister_v2(void* p, size_t bytes, unsigned) {
  if (p == nullptr || bytes == 0) return kInvalidValue;
  std::lock_guard<std::mutex> l(S().mu);
  ++S().host_registered;
  return kSuccess;
}
Result cuMemHostUnregister(void* p) {
  if (p == nullptr) return kInvalidValue;
  std::lock_guard<std::mutex> l(S().mu);
  if (S().host_registered == 0) return kInvalidValue;
  --S().host_registered;
  return kSuccess;
}

Result cuStreamCreate(Stream** st, unsigned flags) {
  if (st == nullptr || (flags & ~kStreamNonBlocking) != 0) return kInvalidValue;
  std::lock_guard<std::mutex> l(S().mu);
  *st = new Stream();
  (*st)->blocking = (flags & kStreamNonBlocking) == 0;
  S().streams.push_back(*st);
  return kSuccess;
}
Result cuCtxSynchronize() {
  std::lock_guard<std::mutex> l(S().mu);
  SynchronizeAll(S());
  return kSuccess;
}
Result cuStreamSynchronize(Stream* st) {
  std::lock_guard<std::mutex> l(S().mu);
  st = Resolve(st);
  if (st == &S().legacy) RunUntil(&S().pageable, nullptr);
  RunUntil(st, nullptr);
  return kSuccess;
}
Result cuStreamDestroy_v2(Stream* st) {
  std::lock_guard<std::mutex> l(S().mu);
  if (Resolve(st) == &S().legacy) return kInvalidHandle;  // not a stream of the caller's
  RunUntil(st, nullptr);  // the driver finishes queued work after a destroy
  auto& all = S().streams;
  all.erase(std::remove(all.begin(), all.end(), st), all.end());
  delete st;
  return kSuccess;
}

Result cuEventCreate(Event** ev, unsigned) {
  if (ev == nullptr) return kInvalidValue;
  *ev = new Event();
  return kSuccess;
}
Result cuEventDestroy_v2(Event* ev) {
  if (ev == nullptr) return kInvalidHandle;
  std::lock_guard<std::mutex> l(S().mu);
  if (ev->stream != nullptr) RunUntil(ev->stream, ev);
  delete ev;
  return kSuccess;
}
Result cuEventRecord(Event* ev, Stream* st) {
  if (ev == nullptr) return kInvalidHandle;
  std::lock_guard<std::mutex> l(S().mu);
  st = Resolve(st);
  if (ev->stream != nullptr) RunUntil(ev->stream, ev);  // re-recorded: the old point passes
  if (st != &S().legacy) {
    OrderAfterLegacy(S(), st);
  } else {
    // Pageable copies issued before are the legacy stream's work: the event covers them.
    while (!S().pageable.ops.empty()) {
      st->ops.push_back(std::move(S().pageable.ops.front()));
      S().pageable.ops.pop_front();
    }
  }
  ev->stream = st;
  ev->queried = false;
  st->ops.push_back(Op{nullptr, nullptr, 0, ev});
  return kSuccess;
}
// Work queued on `st` after this waits for `ev`: the fake runs the event's stream up to it now
// (earlier than the driver might, never later), and nothing else.
Result cuStreamWaitEvent(Stream* st, Event* ev, unsigned flags) {
  if (ev == nullptr) return kInvalidHandle;
  if (flags != 0) return kInvalidValue;
  std::lock_guard<std::mutex> l(S().mu);
  st = Resolve(st);
  if (ev->stream != nullptr) RunUntil(ev->stream, ev);
  return kSuccess;
}
Result cuEventQuery(Event* ev) {
  if (ev == nullptr) return kInvalidHandle;
  std::lock_guard<std::mutex> l(S().mu);
  if (ev->stream == nullptr) return kSuccess;
  if (!ev->queried) {  // the first look always finds the copy still running
    ev->queried = true;
    return kNotReady;
  }
  RunUntil(ev->stream, ev);
  return kSuccess;
}
Result cuEventSynchronize(Event* ev) {
  if (ev == nullptr) return kInvalidHandle;
  std::lock_guard<std::mutex> l(S().mu);
  if (ev->stream != nullptr) RunUntil(ev->stream, ev);
  return kSuccess;
}

Result cuMemcpyDtoHAsync_v2(void* dst, DevicePtr src, size_t n, Stream* st) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  const std::byte* from = Translate(s, src, n);
  if (from == nullptr || dst == nullptr) return kInvalidValue;
  const Result r = Enqueue(s, st, static_cast<std::byte*>(dst), from, n);
  if (r == kSuccess) ++s.copies_to_host, s.bytes_to_host += n;
  return r;
}
Result cuMemcpyHtoDAsync_v2(DevicePtr dst, const void* src, size_t n, Stream* st) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  std::byte* to = Translate(s, dst, n);
  if (to == nullptr || src == nullptr) return kInvalidValue;
  const Result r = Enqueue(s, st, to, static_cast<const std::byte*>(src), n);
  if (r == kSuccess) ++s.copies_to_device, s.bytes_to_device += n;
  return r;
}
Result cuMemcpyHtoD_v2(DevicePtr dst, const void* src, size_t n) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  std::byte* to = Translate(s, dst, n);
  if (to == nullptr || src == nullptr) return kInvalidValue;
  // Pageable source: read now, landed later.
  const auto* from = static_cast<const std::byte*>(src);
  Op op{to, nullptr, n, nullptr, std::vector<std::byte>(from, from + n)};
  s.pageable.ops.push_back(std::move(op));
  return kSuccess;
}
Result cuMemcpyDtoH_v2(void* dst, DevicePtr src, size_t n) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  // A synchronous copy on the legacy stream: after its earlier work and every blocking stream's.
  RunUntil(&s.pageable, nullptr);
  RunUntil(&s.legacy, nullptr);
  for (Stream* st : s.streams)
    if (st->blocking) RunUntil(st, nullptr);
  const std::byte* from = Translate(s, src, n);
  if (from == nullptr || dst == nullptr) return kInvalidValue;
  std::memcpy(dst, from, n);
  return kSuccess;
}

// For tests: what the fake saw (asynchronous copies and their bytes, live allocations, host
// ranges still registered).
struct gradlane_fake_cuda_counts_t {
  uint64_t copies_to_host, bytes_to_host, copies_to_device, bytes_to_device;
  uint64_t live_allocations, host_registered, dmabuf_exports, gpudirect_flushes;
};
void gradlane_fake_cuda_counts(gradlane_fake_cuda_counts_t* out) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  *out = {s.copies_to_host, s.bytes_to_host,   s.copies_to_device, s.bytes_to_device,
          s.allocs.size(),  s.host_registered, s.dmabuf_exports,   s.gpudirect_flushes};
}

}  // extern "C"
