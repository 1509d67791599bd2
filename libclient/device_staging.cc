// libclient/device_staging.cc — GPU tensors staged through the arena (device_staging.h).
#include "libclient/device_staging.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradlane::client {

class DeviceStaging::ContextScope {
 public:
  ContextScope(const CudaDriver& cuda, cu::Context context) : cuda_(cuda) {
    pushed_ = cuda_.CtxPushCurrent(context) == cu::kSuccess;
  }
  ~ContextScope() {
    cu::Context popped = nullptr;
    if (pushed_) cuda_.CtxPopCurrent(&popped);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  const CudaDriver& cuda_;
  bool pushed_ = false;
};

absl::StatusOr<DevicePointerInfo> InspectDevicePointer(const CudaDriver& cuda, cu::DevicePtr ptr,
                                                       uint64_t bytes) {
  unsigned memory_type = 0;
  cu::Result r = cuda.PointerGetAttribute(&memory_type, cu::kPointerMemoryType, ptr);
  if (r != cu::kSuccess) {
    return absl::InvalidArgumentError(absl::StrCat(
        "0x", absl::Hex(ptr), " is not memory CUDA knows (", cuda.Describe(r),
        "): pass a device pointer (cuMemAlloc, cudaMalloc, a CUDA tensor's data_ptr)"));
  }
  if (memory_type != cu::kMemoryTypeDevice) {
    return absl::InvalidArgumentError(
        absl::StrCat("0x", absl::Hex(ptr), " is host memory (CUDA memory type ", memory_type,
                     "): register it with gl_register_tensor, or pass device memory"));
  }
  DevicePointerInfo info;
  cu::DevicePtr start = 0;
  size_t size = 0;
  if ((r = cuda.PointerGetAttribute(&info.context, cu::kPointerContext, ptr)) != cu::kSuccess ||
      (r = cuda.PointerGetAttribute(&start, cu::kPointerRangeStart, ptr)) != cu::kSuccess ||
      (r = cuda.PointerGetAttribute(&size, cu::kPointerRangeSize, ptr)) != cu::kSuccess) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot query the allocation of 0x", absl::Hex(ptr), ": ", cuda.Describe(r)));
  }
  info.range_start = start;
  info.range_bytes = size;
  if (ptr - start > size || bytes > size - (ptr - start)) {
    return absl::InvalidArgumentError(absl::StrCat(bytes, " bytes at 0x", absl::Hex(ptr),
                                                   " run past the end of its allocation (", size,
                                                   " bytes at 0x", absl::Hex(start), ")"));
  }
  return info;
}

absl::StatusOr<std::unique_ptr<DeviceStaging>> DeviceStaging::Create(const CudaDriver& cuda,
                                                                     cu::Context context,
                                                                     void* arena,
                                                                     uint64_t arena_bytes,
                                                                     uint32_t completion_slots) {
  std::unique_ptr<DeviceStaging> s(new DeviceStaging(cuda, context));
  ContextScope scope(cuda, context);
  cu::Result r;
  // The copy to the arena must see what the caller's default stream computed or copied, so its
  // stream is a blocking one (on an H100 a copy on a non-blocking stream read the last bytes
  // of a just-returned cuMemcpyHtoD stale); the copy back must not queue behind the caller's
  // next compute, so that stream is not.
  if ((r = cuda.StreamCreate(&s->to_arena_, cu::kStreamDefault)) != cu::kSuccess ||
      (r = cuda.StreamCreate(&s->to_arena_after_event_, cu::kStreamNonBlocking)) != cu::kSuccess ||
      (r = cuda.StreamCreate(&s->to_device_, cu::kStreamNonBlocking)) != cu::kSuccess) {
    return absl::InternalError(absl::StrCat("cuStreamCreate: ", cuda.Describe(r)));
  }
  s->slots_.resize(std::max<uint32_t>(1, completion_slots));
  for (Slot& slot : s->slots_) {
    if ((r = cuda.EventCreate(&slot.event, cu::kEventDisableTiming)) != cu::kSuccess) {
      return absl::InternalError(absl::StrCat("cuEventCreate: ", cuda.Describe(r)));
    }
  }
  // Pinned, the copies are DMA transfers at the link's rate; refused (a memlock limit, a
  // driver that cannot pin shared mappings) they go through the driver's bounce buffers.
  s->arena_ = arena;
  s->pinned_ =
      cuda.MemHostRegister(arena, arena_bytes, cu::kMemHostRegisterPortable) == cu::kSuccess;
  return s;
}

DeviceStaging::~DeviceStaging() {
  ContextScope scope(cuda_, context_);
  for (cu::Stream st : {to_arena_, to_arena_after_event_, to_device_}) {
    if (st == nullptr) continue;
    cuda_.StreamSynchronize(st);
    cuda_.StreamDestroy(st);
  }
  for (Slot& slot : slots_) {
    if (slot.event != nullptr) cuda_.EventDestroy(slot.event);
  }
  if (pinned_) cuda_.MemHostUnregister(arena_);
}

void DeviceStaging::Add(uint32_t id, cu::DevicePtr device, std::byte* staging, uint64_t bytes) {
  if (tensors_.size() <= id) tensors_.resize(id + 1);
  tensors_[id] = Tensor{device, staging, bytes};
}

bool DeviceStaging::IsDirect(uint32_t id) const {
  if (id >= tensors_.size() || tensors_[id].map == nullptr) return false;
  auto& ready = const_cast<uint32_t&>(tensors_[id].map->ready);
  return std::atomic_ref<uint32_t>(ready).load(std::memory_order_acquire) == 1;
}

template <typename Fn>
DeviceStaging::Staging DeviceStaging::ForEachStagedPiece(const Tensor& t, uint64_t offset,
                                                         uint64_t length, uint64_t* staged,
                                                         uint64_t* direct_bytes, Fn&& fn) {
  // The map is the daemon's, in shared memory, written once before `ready`. One that does not
  // describe this tensor copies nothing: staging or copying back whole ranges would be wrong
  // too once the daemon sends from and writes into GPU memory, so the caller fails instead.
  const gl_stage_map* m = t.map;
  bool direct =
      m != nullptr &&
      std::atomic_ref<uint32_t>(const_cast<uint32_t&>(m->ready)).load(std::memory_order_acquire) ==
          1;
  if (!direct) {
    fn(offset, length);
    *staged += length;
    return Staging::kWhole;
  }
  const uint64_t part = m->partition_bytes;
  const uint32_t parts = m->num_partitions;
  if (part == 0 || parts > t.map_bits || (t.bytes - 1) / part + 1 != parts) {
    return Staging::kBrokenMap;
  }
  const auto* bits = reinterpret_cast<const uint8_t*>(m) + sizeof(gl_stage_map);
  const uint64_t end = offset + length;
  uint64_t run_begin = 0, run_end = 0;  // the current run of staged bytes
  for (uint64_t p = offset / part; p < parts && p * part < end; ++p) {
    const uint64_t b = std::max(offset, p * part), e = std::min(end, (p + 1) * part);
    if ((bits[p / 8] >> (p % 8) & 1) == 0) {
      *direct_bytes += e - b;
      continue;
    }
    if (run_end == b && run_end != run_begin) {
      run_end = e;
    } else {
      if (run_end != run_begin) fn(run_begin, run_end - run_begin);
      run_begin = b;
      run_end = e;
    }
    *staged += e - b;
  }
  if (run_end != run_begin) fn(run_begin, run_end - run_begin);
  return Staging::kByMap;
}

absl::Status DeviceStaging::StageIn(uint32_t id, uint64_t offset, uint64_t length,
                                    cu::Event after) {
  const Tensor& t = tensors_[id];
  ContextScope scope(cuda_, context_);
  cu::Result r = cu::kSuccess;
  cu::Stream stream = to_arena_;
  if (after != nullptr) {
    stream = to_arena_after_event_;
    if ((r = cuda_.StreamWaitEvent(stream, after, 0)) != cu::kSuccess) {
      return absl::InternalError(
          absl::StrCat("waiting for the CUDA event of tensor ", id, ": ", cuda_.Describe(r)));
    }
  } else if ((r = cuda_.StreamSynchronize(cu::kStreamLegacy)) != cu::kSuccess) {
    // Waiting on the host as well as through the blocking stream: CUDA documents that a
    // cuMemcpyHtoD from pageable memory may return before its last bytes land, and says
    // nothing of how a blocking stream orders after them; a legacy-stream synchronize covers
    // them explicitly. It costs one driver call, and gl_post waits for its copy anyway.
    return absl::InternalError(absl::StrCat("waiting for the legacy default stream (tensor ", id,
                                            "): ", cuda_.Describe(r)));
  }
  // A range the daemon will refuse is not copied (its completion says why); the event is
  // still waited for, so the call's timing does not depend on the range.
  const bool in_range = length != 0 && offset <= t.bytes && length <= t.bytes - offset;
  if (in_range) {
    const Staging how = ForEachStagedPiece(
        t, offset, length, &staged_bytes_, &direct_bytes_, [&](uint64_t begin, uint64_t bytes) {
          if (r == cu::kSuccess) {
            r = cuda_.MemcpyDtoHAsync(t.staging + begin, t.device + begin, bytes, stream);
          }
        });
    if (how == Staging::kBrokenMap) {
      return absl::InternalError(
          absl::StrCat("the daemon's stage map of tensor ", id, " does not describe it"));
    }
  }
  // Also with nothing to copy (GPUDirect): the NIC reads the bytes once the post is in, so the
  // work that computes them must be finished first.
  if (r == cu::kSuccess) r = cuda_.StreamSynchronize(stream);
  if (r != cu::kSuccess) {
    return absl::InternalError(absl::StrCat(in_range ? "copying " : "waiting to copy ", length,
                                            " bytes of tensor ", id,
                                            " from the GPU: ", cuda_.Describe(r)));
  }
  return absl::OkStatus();
}

void DeviceStaging::FailSlot(Slot& s, const std::string& why) {
  s.cqe.status = GL_E_DEVICE;
  s.copying = false;
  last_error_ = why;
}

void DeviceStaging::Accept(const gl_cqe& e) {
  Slot& s = slots_[(head_ + count_) % slots_.size()];
  ++count_;
  s.cqe = e;
  s.copying = false;
  if (e.status != GL_OK || !IsDevice(e.tensor_id)) return;
  const Tensor& t = tensors_[e.tensor_id];
  // The daemon completes only ranges it accepted; clamping keeps a confused one from making us
  // write past the tensor.
  const uint64_t begin = std::min(e.offset, t.bytes);
  const uint64_t length = std::min(e.length, t.bytes - begin);
  if (length == 0) return;
  ContextScope scope(cuda_, context_);
  cu::Result r = cu::kSuccess;
  bool copied = false;
  // GPUDirect: the other shards' results are in GPU memory already (their NICs wrote them);
  // only what this host's shard reduced is copied, or stale arena bytes would overwrite them.
  const Staging how = ForEachStagedPiece(
      t, begin, length, &copied_back_bytes_, &written_direct_bytes_,
      [&](uint64_t from, uint64_t bytes) {
        if (r == cu::kSuccess) {
          r = cuda_.MemcpyHtoDAsync(t.device + from, t.staging + from, bytes, to_device_);
        }
        copied = true;
      });
  if (how == Staging::kBrokenMap) {
    FailSlot(s, absl::StrCat("the daemon's stage map of tensor ", e.tensor_id,
                             " does not describe it"));
    return;
  }
  if (how == Staging::kByMap && r == cu::kSuccess && flush_nic_writes_) {
    // The NIC's writes visible to the work the caller issues after the completion.
    r = cuda_.FlushGPUDirectRDMAWrites(cu::kFlushTargetCurrentContext, cu::kFlushToOwner);
  }
  if (copied && r == cu::kSuccess) r = cuda_.EventRecord(s.event, to_device_);
  if (r != cu::kSuccess) {
    FailSlot(s, absl::StrCat("copying the result of tensor ", e.tensor_id,
                             " to the GPU: ", cuda_.Describe(r)));
    return;
  }
  s.copying = copied;
}

bool DeviceStaging::TakeReady(gl_cqe* out) {
  if (count_ == 0) return false;
  Slot& s = slots_[head_];
  if (s.copying) {
    const cu::Result r = cuda_.EventQuery(s.event);
    if (r == cu::kErrorNotReady) return false;
    if (r != cu::kSuccess) {
      FailSlot(s, absl::StrCat("copying the result of tensor ", s.cqe.tensor_id,
                               " to the GPU: ", cuda_.Describe(r)));
    }
    s.copying = false;
  }
  *out = s.cqe;
  head_ = (head_ + 1) % slots_.size();
  --count_;
  return true;
}

void DeviceStaging::WaitForHead() {
  if (count_ == 0 || !slots_[head_].copying) return;
  // An error is not lost: TakeReady's query reports it.
  cuda_.EventSynchronize(slots_[head_].event);
}

}  // namespace gradlane::client
